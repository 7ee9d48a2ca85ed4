// KvCacheClient::PageReleases: ReadPagesInto's releases, sent by a thread of their own with
// synchronous calls, so that a read returns once its bytes are copied and verified instead of
// after a second round trip. A release that fails is dropped: the pins stay until the session
// ends, and the caller's next call meets a restart or a lost session itself. Private to the
// client (kv_cache_client.cc makes and destroys it, kv_cache_client_pages.cc uses it).
//
// Thread safety: thread-safe.
#ifndef KVCACHE_CLIENT_PAGE_RELEASES_H_
#define KVCACHE_CLIENT_PAGE_RELEASES_H_

#include <grpcpp/client_context.h>

#include <cstdint>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/kv_cache_client.h"

namespace kvcache {

class KvCacheClient::PageReleases {
 public:
  // `client` must outlive this; it is destroyed first of the client's parts.
  explicit PageReleases(KvCacheClient* client) : client_(client) {}
  // Drops what is still queued (the client closes its session next, which releases it), cancels
  // the release in flight and stops the thread.
  ~PageReleases();
  PageReleases(const PageReleases&) = delete;
  PageReleases& operator=(const PageReleases&) = delete;

  // Queues ReleaseSequence(sequence_id) of `session`; starts the thread on first use.
  void Send(const SessionRef& session, uint64_t sequence_id);
  // Returns once every release queued before it has been answered.
  void Await();

 private:
  void Loop();

  KvCacheClient* const client_;
  absl::Mutex mu_;
  std::deque<std::pair<SessionRef, uint64_t>> queued_ ABSL_GUARDED_BY(mu_);
  uint64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;  // queued or being sent
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;  // the release being sent
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_PAGE_RELEASES_H_
