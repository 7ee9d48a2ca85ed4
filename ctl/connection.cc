#include "ctl/connection.h"

#include <grpcpp/create_channel.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"

namespace kvcache::ctl {

absl::string_view HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case HealthStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

namespace {

// The socket path of a unix: target, or "" for another kind of target.
std::string UnixSocketPath(absl::string_view target) {
  if (absl::ConsumePrefix(&target, "unix://")) return std::string(target);
  if (absl::ConsumePrefix(&target, "unix:")) return std::string(target);
  return "";
}

// Waits up to options.connect_timeout for `channel` to be READY, and fails at once when a
// connection attempt fails (TRANSIENT_FAILURE: refused, unresolvable, TLS rejected) rather than
// retrying until the deadline, with gRPC's reason: one call that does not wait for the channel.
absl::Status WaitUntilConnected(grpc::Channel& channel, const std::string& target,
                                const ClientOptions& options) {
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
       state != GRPC_CHANNEL_READY; state = channel.GetState(/*try_to_connect=*/true)) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      grpc::ClientContext context;
      context.set_wait_for_ready(false);
      context.set_deadline(absl::ToChronoTime(deadline));
      const grpc::Status status = grpc::health::v1::Health::NewStub(channel.shared_from_this())
                                      ->Check(&context, request, &response);
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        return absl::UnavailableError(absl::StrCat(
            "cannot connect to the kvcache daemon at ", target, ": ", status.error_message(),
            options.tls.enabled && !absl::StrContains(status.error_message(), "Connection refused")
                ? " (over TLS: is the daemon's certificate trusted and named as "
                  "the target, and is the client certificate one it accepts?)"
                : ""));
      }
      return absl::OkStatus();  // it connected meanwhile; the call's own answer comes later
    }
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      return WaitForDaemon(channel, target, options);  // past the deadline: its message
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ProbeUnixSocket(absl::string_view target) {
  const std::string path = UnixSocketPath(target);
  if (path.empty()) return absl::OkStatus();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) return absl::OkStatus();  // gRPC will say why
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();
  const int result = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int error = errno;
  close(fd);
  if (result == 0) return absl::OkStatus();
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(
          absl::StrCat("no such socket: ", path, " (is the daemon running, with this --listen?)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(
          "permission denied: ", path, " (uid ", getuid(),
          " may not open the socket or search a folder above it; run as the daemon's user or "
          "widen the socket's mode)"));
    case ECONNREFUSED: {
      struct stat info;
      if (stat(path.c_str(), &info) == 0 && !S_ISSOCK(info.st_mode)) {
        return absl::FailedPreconditionError(absl::StrCat("not a socket: ", path));
      }
      return absl::UnavailableError(absl::StrCat(
          "connection refused: ", path,
          " (a socket file with no daemon listening: a stale one left by a daemon that died?)"));
    }
    default:
      // EAGAIN (a full backlog: a busy daemon) and the rest: let gRPC try.
      return absl::OkStatus();
  }
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& target,
                                                             const ClientOptions& options) {
  RETURN_IF_ERROR(ProbeUnixSocket(target));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, CreateDaemonChannel(target, options));
  RETURN_IF_ERROR(WaitUntilConnected(*channel, target, options));
  return std::unique_ptr<Connection>(new Connection(std::move(channel), options));
}

Connection::Connection(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options)
    : options_(options),
      client_(std::make_unique<KvCacheClient>(channel, options)),
      stub_(v1::KvCache::NewStub(channel)),
      health_(grpc::health::v1::Health::NewStub(channel)) {}

void Connection::Prepare(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.bearer_token));
  }
}

absl::StatusOr<v1::GetStatsResponse> Connection::GetStats(absl::string_view pool,
                                                          absl::string_view tenant) {
  v1::GetStatsRequest request;
  request.set_pool(std::string(pool));
  request.set_tenant(std::string(tenant));
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  Prepare(&context);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->GetStats(&context, request, &response)));
  return response;
}

absl::StatusOr<HealthStatus> Connection::CheckHealth(absl::string_view service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(std::string(service));
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  Prepare(&context);
  const grpc::Status status = health_->Check(&context, request, &response);
  // The health service's way of saying it has no such service (grpc/health/v1/health.proto).
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return HealthStatus::kServiceUnknown;
  RETURN_IF_ERROR(FromGrpcStatus(status));
  switch (response.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return HealthStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return HealthStatus::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return HealthStatus::kServiceUnknown;
    default:
      return HealthStatus::kUnknown;
  }
}

}  // namespace kvcache::ctl
