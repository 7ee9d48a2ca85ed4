// Daemon: a CacheManager served over gRPC on one listen address, with health checking and
// server reflection (grpc.reflection.v1alpha, what gRPC 1.51 serves).
// The gRPC health service (grpc.health.v1.Health) answers SERVING for "" and for
// "kvcache.v1.KvCache" until the daemon drains (Drain) or a device fault latches in the manager
// (cache/device_fault_latch.h), then NOT_SERVING for both, for good: a restart is the only repair.
// With health_listen the same statuses are served on a plaintext TCP port that serves nothing
// else (no KvCache, no reflection): Kubernetes' grpc probes reach neither a Unix socket nor TLS.
// Unix sockets are created owner-only (0600) in a directory the daemon makes owner-only if it is
// missing; a wider socket_mode (for peers of other uids) needs an identity file, which then
// authenticates them. A daemon on a Unix socket may also serve TCP (tcp_listen: one daemon per
// node for the pods on the node and for clients on other nodes). TCP serves TLS (server certificate
// and key; with a client CA, mutual TLS that requires and verifies client certificates); plaintext
// TCP only when asked for explicitly.
//
// Every call is authenticated (server/authenticator.h) against the identity file, reloaded by
// ReloadIdentities (SIGHUP in kvcache-manager), or without one against the default identity.
//
// Thread safety: Start, then Wait on one thread and Shutdown from another.
#ifndef KVCACHE_SERVER_DAEMON_H_
#define KVCACHE_SERVER_DAEMON_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "auth/identity_registry.h"
#include "cache/cache_manager.h"
#include "common/clock.h"
#include "common/rpc/listen_address.h"
#include "events/zmq_publisher.h"
#include "server/authenticator.h"
#include "server/call_limits.h"
#include "server/kv_cache_service.h"
#include "server/metrics.h"
#include "server/metrics_http_server.h"
#include "server/rpc_metrics.h"
#include "server/stream_leases.h"
#include "server/unix_listener.h"

namespace kvcache {

struct TlsServerOptions {
  std::string cert_file;       // PEM; TLS is on when set
  std::string key_file;        // PEM
  std::string client_ca_file;  // PEM; when set, clients must present a certificate it signed
};

struct DaemonOptions {
  std::string listen = DefaultListenAddress();
  // With a unix:// listen: "HOST:PORT" served as well, under the TCP rules (TLS, or
  // allow_insecure_tcp); empty: none.
  std::string tcp_listen;
  // "HOST:PORT" of the health-only plaintext port; empty: none. Port 0 picks one
  // (health_address() tells which).
  std::string health_listen;
  // "HOST:PORT" of the Prometheus /metrics HTTP port; empty: none (and no per-call RPC
  // accounting). Port 0 picks one (metrics_address() tells which).
  std::string metrics_listen;
  bool allow_insecure_tcp = false;
  TlsServerOptions tls;
  // The identity file (auth/identity_file.h); empty: every caller is tenant "default", worker.
  std::string identities_path;
  // Permissions of a Unix socket; wider than 0600 only with an identity file.
  mode_t socket_mode = 0600;
  // "host" (POSIX shared memory) or "cuda:N" (device memory exported over CUDA IPC).
  std::string device = "host";
  std::vector<PoolOptions> pools;
  SessionLimits session_limits;
  absl::Duration reaper_period = absl::Milliseconds(100);
  int max_message_bytes = 16 << 20;
  // Long calls (streams, watches, rendezvous waits) and put bytes, per connection and in total
  // (server/call_limits.h).
  CallLimitOptions call_limits;
  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: calls of every kind one connection may have open in
  // the daemon. A client's further calls wait in its own gRPC library, never in the daemon; more
  // than call_limits.max_streams_per_connection, so unary calls always have room beside them.
  int max_calls_per_connection = 256;
  // KV events kept for WatchEvents watchers (and the ZeroMQ replay socket) to resume from.
  size_t kv_events_buffer = KvEventLog::kDefaultCapacity;
  // False: pools report no KV events at all (the benchmarks' baseline; watchers see none).
  bool record_kv_events = true;
  // The ZeroMQ publisher of the KV events in vLLM's format (events/zmq_publisher.h); off when
  // kv_events.endpoint is empty.
  ZmqPublisherOptions kv_events;
  // Session leases expire on this clock; tests pass a FakeClock. Must outlive the daemon.
  const Clock* clock = RealClock::Get();
  // Test hook (fault injection): replaces each pool's memory, once created, with what it returns.
  std::function<std::unique_ptr<PoolMemory>(const PoolOptions&, std::unique_ptr<PoolMemory>)>
      wrap_pool_memory;
  // Test hook: server interceptors run after the daemon's own (e.g. one that holds calls back
  // before their handlers, as a saturated server would).
  std::function<
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>()>
      testing_interceptors;
};

class Daemon {
 public:
  // INVALID_ARGUMENT for bad options or identity file; UNAVAILABLE when the address cannot be
  // bound; ALREADY_EXISTS when a live daemon with the same listen address holds a pool's shared
  // memory (HostPoolMemory::CreateShared; what a dead one left is reclaimed).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  const std::string& address() const { return address_; }
  // "HOST:PORT" of tcp_listen next to a Unix socket; empty without one.
  const std::string& tcp_address() const { return tcp_address_; }
  // "HOST:PORT" of the TCP listener, --listen's or tcp_listen's, when it serves without TLS
  // (allow_insecure_tcp); empty when there is none or it is TLS.
  const std::string& plaintext_tcp_address() const { return plaintext_tcp_address_; }
  // "HOST:PORT" of the health-only port; empty without one.
  const std::string& health_address() const { return health_address_; }
  // "HOST:PORT" of /metrics; empty without it.
  const std::string& metrics_address() const { return metrics_address_; }
  CacheManager& manager() { return *manager_; }
  const CallLimits& call_limits() const { return *call_limits_; }
  // Reads the identity file again and installs it with its quotas; on error the previous one
  // stays. FAILED_PRECONDITION when the daemon runs without one.
  absl::Status ReloadIdentities();
  void Wait() { server_->Wait(); }
  // Reports NOT_SERVING for every service on both health services and refuses new sessions
  // (UNAVAILABLE) while the daemon keeps serving the open ones, so load balancers, kubelet and
  // clients move new work elsewhere before Shutdown.
  void Drain();
  // Stops accepting calls, finishes those in flight (up to `grace`) and removes the socket file.
  // The health-only port closes last, so probes see NOT_SERVING to the end.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  Daemon() = default;
  // The manager's fault listener: reports NOT_SERVING. Runs on the thread that latched the fault
  // (a reactor); SetServingStatus only takes the health service's own short lock.
  void ReportNotServing();
  // The health-only server on `listen`; sets health_address_.
  absl::Status StartHealthServer(const std::string& listen);

  std::string address_;
  std::string tcp_address_;
  std::string plaintext_tcp_address_;
  std::string health_address_;
  std::string metrics_address_;
  std::string socket_path_;  // empty for TCP
  std::string identities_path_;
  // The data streams' bindings to their sessions; declared before manager_, whose reaper reports
  // ended sessions to it, so that it outlives the manager.
  StreamLeases stream_leases_;
  std::unique_ptr<CacheManager> manager_;
  IdentityRegistry identities_;  // own synchronization
  // server_'s health service, set once serving starts and cleared at Shutdown. Declared before
  // server_ so that it outlives every reactor that may report a fault.
  absl::Mutex health_mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(health_mu_) = nullptr;
  grpc::HealthCheckServiceInterface* port_health_ ABSL_GUARDED_BY(health_mu_) = nullptr;
  // For a Unix socket; gRPC listens on TCP itself. Declared before the authenticator that asks
  // it for peers' credentials.
  std::unique_ptr<UnixListener> unix_listener_;
  std::unique_ptr<Authenticator> authenticator_;
  // Declared before service_, whose calls hold its tickets.
  std::unique_ptr<CallLimits> call_limits_;
  std::unique_ptr<KvCacheService> service_;
  // With metrics_listen: the per-call accounting (an interceptor of server_) and the exposition.
  std::unique_ptr<RpcMetrics> rpc_metrics_;
  std::shared_ptr<DaemonMetrics> metrics_;
  std::unique_ptr<MetricsHttpServer> metrics_server_;
  std::unique_ptr<ZmqEventPublisher> zmq_publisher_;
  std::unique_ptr<grpc::Server> server_;
  // Answers every call but health's on the health-only port UNIMPLEMENTED; gRPC also needs a
  // callback service there to poll for calls at all.
  std::unique_ptr<grpc::CallbackGenericService> unimplemented_;
  std::unique_ptr<grpc::Server> health_server_;  // the health-only port, if any
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_DAEMON_H_
