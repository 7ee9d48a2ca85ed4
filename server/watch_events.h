// WatchEventsReactor: serves one KvCache.WatchEvents stream from the daemon's KvEventLog
// (cache/kv_event_log.h): a snapshot when the watcher's start is no longer held, else the events
// from its start, then live events as they are appended, filtered to what the caller may see.
//
// Each watcher has a thread of its own that waits on the log and writes one response at a time:
// watchers are few (routers, indexers, kvcachectl), and a slow one then never holds up a pool or
// another watcher. A watcher that falls behind the log's buffer while connected gets a fresh
// snapshot, so it never misses an event. The daemon bounds the number of watchers.
//
// Thread safety: the stream's thread and gRPC's callbacks share only cancelled_/write state under
// mu_.
#ifndef KVCACHE_SERVER_WATCH_EVENTS_H_
#define KVCACHE_SERVER_WATCH_EVENTS_H_

#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cache/kv_event_log.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/call_limits.h"

namespace kvcache {

// Converts one log event (used by the snapshot and the live stream alike).
void ToProto(const KvEvent& event, v1::KvEvent* out);

class WatchEventsReactor final : public grpc::ServerWriteReactor<v1::WatchEventsResponse> {
 public:
  // Events per response message, snapshot blocks included.
  static constexpr size_t kMaxEventsPerResponse = 256;

  // `active` counts the daemon's watchers: incremented by the caller, decremented at OnDone.
  // `stopping` set: the daemon shuts down and every stream ends UNAVAILABLE at once, rather than
  // holding the shutdown for its whole grace period.
  WatchEventsReactor(KvEventLog* log, uint64_t epoch, std::atomic<int>* active,
                     const std::atomic<bool>* stopping);

  // Starts streaming from `start_sequence` of `start_epoch`, as the request said (a snapshot
  // when `need_snapshot` or when the log no longer holds it), holding `stream` (its place among
  // the daemon's long calls) until done.
  void Start(uint64_t start_sequence, uint64_t start_epoch, bool need_snapshot,
             KvEventFilter filter, CallLimits::Ticket stream);
  // Ends the call before streaming (bad request, no permission).
  void Reject(const grpc::Status& status);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void Run(uint64_t start_sequence, uint64_t start_epoch, bool need_snapshot);
  // Sends a snapshot; returns the sequence to go on from, or nullopt when the stream broke.
  // Until its last message the responses carry (resume_sequence, resume_epoch), a point that
  // gets a new snapshot, so a watcher cut off halfway never resumes on half an index.
  std::optional<uint64_t> SendSnapshot(uint64_t resume_sequence, uint64_t resume_epoch);
  bool ending() const;  // cancelled, or the daemon stops
  // Writes one response and waits for it to be sent; false when the stream is broken or
  // cancelled.
  // Stamps the log's head on it.
  bool WriteAndWait(v1::WatchEventsResponse& response);
  bool cancelled() const;

  KvEventLog* const log_;
  const uint64_t epoch_;
  std::atomic<int>* const active_;
  const std::atomic<bool>* const stopping_;
  KvEventFilter filter_;
  CallLimits::Ticket stream_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_WATCH_EVENTS_H_
