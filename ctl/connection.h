// Connection: kvcachectl's one channel to the daemon, shared by
//   - a KvCacheClient (client/kv_cache_client.h) for the calls it offers as they are;
//   - the raw kvcache.v1 stub for GetStats with a tenant, which KvCacheClient::GetStats does not
//     take (and whose answer names each figure's tenant, which its PoolStats drops);
//   - the grpc.health.v1.Health stub, which the daemon serves on the same listener.
//
// The channel is the client library's (CreateDaemonChannel: TLS, message limits, reconnect
// backoff), shared by the KvCacheClient, the typed stub and the health stub, and every call
// carries the bearer token.
//
// Error codes: Open answers INVALID_ARGUMENT for unusable options (TLS for a unix:// target, an
// unreadable or non-PEM TLS file, a certificate without its key, a token a header cannot carry);
// for a unix:// target whose socket cannot be connected to, at once, ProbeUnixSocket's code; and
// UNAVAILABLE when the daemon cannot be reached: at once when the connection fails (refused,
// unresolvable, TLS rejected), else after options.connect_timeout. The calls pass the daemon's
// codes on unchanged, DEADLINE_EXCEEDED after options.rpc_timeout.
//
// Thread safety: thread-safe, as KvCacheClient is.
#ifndef KVCACHE_CTL_CONNECTION_H_
#define KVCACHE_CTL_CONNECTION_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/kv_cache_client.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache::ctl {

// What grpc.health.v1.Health/Check said about a service.
enum class HealthStatus {
  kServing,
  kNotServing,
  kServiceUnknown,  // the daemon answered NOT_FOUND: it serves no such service name
  kUnknown,         // the daemon said UNKNOWN
};
absl::string_view HealthStatusName(HealthStatus status);

// For a "unix:PATH" or "unix://ABSOLUTE_PATH" target, tries connect(2) on the socket once and
// says precisely why it fails, where gRPC would retry until its deadline and then name no cause:
// NOT_FOUND "no such socket: PATH" (nothing at the path, or a folder on it missing), UNAVAILABLE
// "connection refused: PATH" (a socket file no daemon listens on: a stale one), PERMISSION_DENIED
// (the caller may not open the socket or search a folder above it), FAILED_PRECONDITION for a
// path that is not a socket. OK when the connection is accepted, and for any other target.
absl::Status ProbeUnixSocket(absl::string_view target);

class Connection {
 public:
  // Connects to `target` ("unix:///path/kv.sock" or "host:port") and waits up to
  // options.connect_timeout for the channel to be ready.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const std::string& target,
                                                          const ClientOptions& options);

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  KvCacheClient& client() { return *client_; }

  // GetStats for `pool` (empty: every pool) and `tenant` (empty: the caller's; an admin's: the
  // whole daemon).
  absl::StatusOr<v1::GetStatsResponse> GetStats(absl::string_view pool, absl::string_view tenant);

  // grpc.health.v1.Health/Check for `service` ("" is the whole daemon, "kvcache.v1.KvCache" its
  // API). The daemon's NOT_FOUND is kServiceUnknown, not an error.
  absl::StatusOr<HealthStatus> CheckHealth(absl::string_view service);

 private:
  Connection(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options);

  // A call's context: its deadline and the authorization header, as KvCacheClient's.
  void Prepare(grpc::ClientContext* context) const;

  const ClientOptions options_;
  std::unique_ptr<KvCacheClient> client_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace kvcache::ctl

#endif  // KVCACHE_CTL_CONNECTION_H_
