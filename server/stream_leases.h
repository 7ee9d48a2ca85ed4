// StreamLeases: ties the data streams (PutBlocks, GetBlocks) to their caller's lease.
//
// A stream's blocks are held by a transfer sequence of its own (server/block_streams.h), which no
// lease expiry touches, so that the sweep never frees a block a stream is still writing into or
// sending from. Without more, a stream whose client stalls would outlive the session it names,
// keep its blocks referenced and even publish them after the lease ended. So each stream binds
// itself here under its session; when that session ends (expired or closed), every stream bound
// to it is told, and ends itself (ABORTED) so that its OnDone releases the blocks at once.
//
// The notice (`on_lease_end`) runs on this object's own thread, never on the thread that ended the
// session (the reaper, or a CloseSession handler that must not wait on a stream), at most once per
// binding, and never after Unbind has returned: a stream unbinds in OnDone, before it is deleted.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_SERVER_STREAM_LEASES_H_
#define KVCACHE_SERVER_STREAM_LEASES_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/session.h"

namespace kvcache {

class StreamLeases {
 public:
  class Binding {
   public:
    // True once the stream's session has ended; set before on_lease_end runs.
    bool lease_ended() const { return lease_ended_.load(std::memory_order_acquire); }

   private:
    friend class StreamLeases;
    Binding(uint64_t session_id, std::function<void()> on_lease_end)
        : session_id_(session_id), on_lease_end_(std::move(on_lease_end)) {}

    const uint64_t session_id_;
    const std::function<void()> on_lease_end_;
    std::atomic<bool> lease_ended_{false};

    absl::Mutex mu_;
    bool unbound_ ABSL_GUARDED_BY(mu_) = false;
    bool notifying_ ABSL_GUARDED_BY(mu_) = false;
  };

  StreamLeases();
  ~StreamLeases();  // REQUIRES: every binding unbound (the server has shut down)
  StreamLeases(const StreamLeases&) = delete;
  StreamLeases& operator=(const StreamLeases&) = delete;

  // Binds a stream to `session`. ABORTED if the session has already ended (then nothing is bound
  // and `on_lease_end` never runs).
  absl::StatusOr<std::shared_ptr<Binding>> Bind(const Session& session,
                                                std::function<void()> on_lease_end);
  // After it returns, the binding's on_lease_end is not running and never will. Idempotent.
  void Unbind(Binding& binding);

  // `session_id` has ended (its `closed` is set): notifies its streams, asynchronously.
  void SessionEnded(uint64_t session_id);

  // Streams bound now (for tests).
  size_t bound() const;

 private:
  void NotifyLoop();
  void Notify(Binding& binding);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<std::shared_ptr<Binding>>> by_session_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Binding>> to_notify_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread notifier_;  // started last in the constructor
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_STREAM_LEASES_H_
