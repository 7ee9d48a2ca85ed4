// CacheManager: the daemon's core without gRPC — its pools, its sessions and its epoch. Routes
// each request to its session and pool and releases the sequences of sessions that end, whether
// closed by the client or expired by the reaper.
//
// Requests that carry an epoch other than 0 or the manager's are answered FAILED_PRECONDITION:
// the client's tables came from an earlier daemon.
//
// Device faults latch daemon-wide: every pool shares the manager's DeviceFaultLatch, because a
// daemon places all its pools on one device (DaemonOptions::device) and a sticky CUDA error breaks
// the process's context on that device for every pool at once. Once latched, each pool refuses
// its block calls with UNAVAILABLE (pool.h); sessions, rendezvous and the read-only descriptions
// keep working, so clients can end their leases and operators can still look.
//
// Thread safety: thread-safe. Pools are added before serving starts (AddPool is not safe against
// concurrent requests). Lock order: a session's registry lock is never held while a pool's is
// taken.
#ifndef KVCACHE_CACHE_CACHE_MANAGER_H_
#define KVCACHE_CACHE_CACHE_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/device_fault_latch.h"
#include "cache/kv_event_log.h"
#include "cache/pool.h"
#include "cache/rendezvous_registry.h"
#include "cache/session_registry.h"
#include "cache/tenant_quotas.h"
#include "common/clock.h"

namespace kvcache {

class CacheManager {
 public:
  // `event_log_capacity`: how many KV events are kept for watchers to resume from.
  // `record_events` false: pools report nothing to events() (the benchmarks' baseline).
  CacheManager(const SessionLimits& limits, const Clock* clock, uint64_t epoch,
               size_t event_log_capacity = KvEventLog::kDefaultCapacity, bool record_events = true);
  ~CacheManager();

  // A fresh nonzero epoch for a daemon start.
  static uint64_t NewEpoch();

  uint64_t epoch() const { return epoch_; }
  const Clock* clock() const { return clock_; }
  SessionRegistry& sessions() { return sessions_; }
  RendezvousRegistry& rendezvous() { return rendezvous_; }
  // The tenants' limits (set from the identity file) and their use of the daemon-wide ones.
  TenantQuotas& quotas() { return quotas_; }
  // Every pool's index changes, in one sequence.
  KvEventLog& events() { return events_; }
  // Shared by every pool; the daemon listens on it to report NOT_SERVING.
  DeviceFaultLatch& device_faults() { return *device_faults_; }

  // INVALID_ARGUMENT for a bad layout or a duplicate name; RESOURCE_EXHAUSTED without memory.
  absl::Status AddPool(const PoolOptions& options, std::unique_ptr<PoolMemory> memory);
  std::vector<Pool*> pools() const;
  // NOT_FOUND with the known names when there is no such pool.
  absl::StatusOr<Pool*> FindPool(absl::string_view name) const;
  // The pool a sequence id belongs to; NOT_FOUND if the id names none.
  absl::StatusOr<Pool*> PoolOfSequence(uint64_t sequence_id) const;

  // FAILED_PRECONDITION unless `epoch` is 0 or this manager's.
  absl::Status CheckEpoch(uint64_t epoch) const;
  // The live session for a request by `principal`, after the epoch check. PERMISSION_DENIED
  // when another identity opened it.
  absl::StatusOr<std::shared_ptr<Session>> SessionFor(uint64_t session_id, uint64_t epoch,
                                                      absl::string_view principal) const;
  // Closes `principal`'s session and releases its sequences in every pool; returns how many.
  // Idempotent: an ended session answers 0; an id never issued is NOT_FOUND; another identity's
  // session is PERMISSION_DENIED and stays open.
  absl::StatusOr<uint32_t> CloseSession(uint64_t session_id, uint64_t epoch,
                                        absl::string_view principal);
  // Releases the sequences of every session whose lease has expired, and the pins whose TTL has
  // passed (Pool::ExpirePins); returns how many sessions.
  size_t ExpireSessions();

  // Runs ExpireSessions every `period` on a background thread until the manager is destroyed.
  void StartReaper(absl::Duration period);

  // Called with a session's id once it has ended (closed or expired) and its sequences are
  // released, on the thread that ended it: the daemon ends the session's data streams with it.
  // REQUIRES: set before the manager serves (before StartReaper and any call).
  void SetSessionEndedListener(std::function<void(uint64_t session_id)> listener) {
    session_ended_ = std::move(listener);
  }

 private:
  uint32_t ReleaseSessionEverywhere(const Session& session);
  void ReaperLoop(absl::Duration period);

  const uint64_t epoch_;
  const std::shared_ptr<DeviceFaultLatch> device_faults_ =  // own synchronization
      std::make_shared<DeviceFaultLatch>();
  const Clock* const clock_;
  const bool record_events_;
  TenantQuotas quotas_;                          // own synchronization
  KvEventLog events_;                            // own synchronization; outlives the pools
  std::vector<std::unique_ptr<Pool>> pools_;     // constant once serving starts
  SessionRegistry sessions_;                     // own synchronization
  RendezvousRegistry rendezvous_;                // own synchronization
  std::function<void(uint64_t)> session_ended_;  // constant once serving starts

  absl::Mutex reaper_mu_;
  bool stopping_ ABSL_GUARDED_BY(reaper_mu_) = false;
  std::thread reaper_;
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_CACHE_MANAGER_H_
