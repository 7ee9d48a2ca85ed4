// Daemon: a CacheManager served over gRPC on one listen address, with health checking.
// The gRPC health service (grpc.health.v1.Health) answers SERVING for "" and for
// "kvcache.v1.KvCache" until a device fault latches in the manager (cache/device_fault_latch.h),
// then NOT_SERVING for both, for good: a restart is the only repair.
// Unix sockets are created owner-only (0600) in a directory the daemon makes owner-only if it is
// missing. TCP listens insecurely only when asked for explicitly (TLS comes with the security
// work); the caller decides that.
//
// Thread safety: Start, then Wait on one thread and Shutdown from another.
#ifndef KVCACHE_SERVER_DAEMON_H_
#define KVCACHE_SERVER_DAEMON_H_

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/cache_manager.h"
#include "common/clock.h"
#include "common/rpc/listen_address.h"
#include "server/kv_cache_service.h"
#include "server/unix_listener.h"

namespace kvcache {

struct DaemonOptions {
  std::string listen = DefaultListenAddress();
  bool allow_insecure_tcp = false;
  // "host" (POSIX shared memory) or "cuda:N" (device memory exported over CUDA IPC).
  std::string device = "host";
  std::vector<PoolOptions> pools;
  SessionLimits session_limits;
  absl::Duration reaper_period = absl::Milliseconds(100);
  int max_message_bytes = 16 << 20;
  // Session leases expire on this clock; tests pass a FakeClock. Must outlive the daemon.
  const Clock* clock = RealClock::Get();
  // Test hook (fault injection): replaces each pool's memory, once created, with what it returns.
  std::function<std::unique_ptr<PoolMemory>(const PoolOptions&, std::unique_ptr<PoolMemory>)>
      wrap_pool_memory;
};

class Daemon {
 public:
  // INVALID_ARGUMENT for bad options; UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  const std::string& address() const { return address_; }
  CacheManager& manager() { return *manager_; }
  void Wait() { server_->Wait(); }
  // Stops accepting calls, finishes those in flight (up to `grace`) and removes the socket file.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  Daemon() = default;
  // The manager's fault listener: reports NOT_SERVING. Runs on the thread that latched the fault
  // (a reactor); SetServingStatus only takes the health service's own short lock.
  void ReportNotServing();

  std::string address_;
  std::string socket_path_;  // empty for TCP
  std::unique_ptr<CacheManager> manager_;
  // server_'s health service, set once serving starts and cleared at Shutdown. Declared before
  // server_ so that it outlives every reactor that may report a fault.
  absl::Mutex health_mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(health_mu_) = nullptr;
  std::unique_ptr<KvCacheService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixListener> unix_listener_;  // for a Unix socket; gRPC listens on TCP itself
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_H_
