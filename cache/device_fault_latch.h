// DeviceFaultLatch: the first unrecoverable failure of pool memory, kept for the rest of the
// daemon's life (LevelDB's latched bg_error_). A sticky CUDA error (an illegal address, a launch
// failure, an uncorrectable ECC error) leaves the process's CUDA context unusable until the
// process exits: every later copy fails too, and blocks the failed operation was writing hold
// bytes nobody can vouch for. Answering INTERNAL call after call while the health service says
// SERVING would keep routers sending work to a daemon that can only fail it.
//
// What latches: a PoolMemory operation that fails with INTERNAL or DATA_LOSS, the codes
// PoolMemory reserves for the memory itself failing (pool_memory.h). Its other codes are not
// faults of the device: OUT_OF_RANGE is the caller's bug, RESOURCE_EXHAUSTED and
// FAILED_PRECONDITION (no memory, no device) leave the memory as it was.
//
// Once latched, status() is UNAVAILABLE naming the fault, forever. UNAVAILABLE rather than
// FAILED_PRECONDITION (Abseil's status.h: "use FAILED_PRECONDITION if the client should not retry
// until the system state has been explicitly fixed"): the fix is a restart that an orchestrator
// makes on its own when the health service reports NOT_SERVING, so to a client this daemon is
// unavailable and another (or this one, restarted) will serve the retry. Our clients also read
// FAILED_PRECONDITION on a session call as "the daemon restarted" (epoch fencing), which would
// be false here; their keep-alive rides out UNAVAILABLE and sees the new epoch after the restart.
//
// Thread safety: thread-safe. The listener runs once, with no lock held.
#ifndef KVCACHE_CACHE_DEVICE_FAULT_LATCH_H_
#define KVCACHE_CACHE_DEVICE_FAULT_LATCH_H_

#include <atomic>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvcache {

class DeviceFaultLatch {
 public:
  // Called with the latched status (UNAVAILABLE, naming the fault).
  using Listener = std::function<void(const absl::Status& latched)>;

  // True for the codes a PoolMemory operation fails with when the memory itself failed.
  static bool IsDeviceFault(const absl::Status& status);

  // OK until a fault latched; then UNAVAILABLE naming the first fault.
  absl::Status status() const;

  // Returns `result` of a PoolMemory operation on `pool`. A device fault latches (the first one
  // wins) and is answered with status() instead, so the call that hit the fault reads like every
  // call after it.
  absl::Status Check(absl::Status result, absl::string_view pool);

  // `listener` runs once, on the thread that latched the fault — or here and now if a fault has
  // already latched, so one installed after serving started misses nothing. It must not block
  // (it may run on a gRPC reactor). An empty listener removes the previous one.
  void SetListener(Listener listener);

 private:
  // Set once, after fault_: status() on the request path reads it without taking mu_.
  std::atomic<bool> latched_{false};

  mutable absl::Mutex mu_;
  absl::Status fault_ ABSL_GUARDED_BY(mu_);  // OK, or the latched UNAVAILABLE; never cleared
  Listener listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_DEVICE_FAULT_LATCH_H_
