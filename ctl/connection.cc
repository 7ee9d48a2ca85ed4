#include "ctl/connection.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/read_file.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/http2_tuning.h"
#include "common/status_macros.h"

namespace kvcache::ctl {
namespace {

// A daemon restarting on the same machine is back within a second, and `events --follow` should
// see it then, not after gRPC's default 1 s..120 s backoff (KvCacheClient::Connect's values).
// Unlike Connect, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left alone: gRPC 1.51 takes it as the
// shortest time a connection attempt may take, handshake included, and at 100 ms attempts to a
// daemon that is just starting (or a loaded machine) time out "before receiving SETTINGS frame"
// over and over; gRPC's default of 20 s lets them finish.
constexpr int kInitialReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 2000;

bool IsUnixTarget(absl::string_view target) {
  return absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:");
}

// A PEM file's text; the error names the file, never its contents (it may be a private key).
absl::StatusOr<std::string> ReadPemFile(absl::string_view what, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS ", what, " file: ", text.status().message()));
  }
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " file '", path, "' holds no PEM block"));
  }
  return text;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(
    const std::string& target, const ClientTlsOptions& tls, grpc::ChannelArguments* args) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  if (IsUnixTarget(target)) {
    return absl::InvalidArgumentError(absl::StrCat("TLS is for TCP targets; ", target,
                                                   " is a local socket: connect without TLS"));
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("a TLS client certificate goes with its key: give both");
  }
  grpc::SslCredentialsOptions ssl;
  if (!tls.ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile("CA", tls.ca_file));
  }
  if (!tls.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile("certificate", tls.cert_file));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile("key", tls.key_file));
  }
  if (!tls.server_name.empty()) args->SetSslTargetNameOverride(tls.server_name);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (credentials == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("gRPC refused the TLS files for ", target));
  }
  return credentials;
}

}  // namespace

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

absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelFor(const std::string& target,
                                                          const ClientOptions& options) {
  RETURN_IF_ERROR(CheckBearerToken(options.bearer_token));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kHttp2WindowBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kInitialReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   Credentials(target, options.tls, &args));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(target, credentials, args);
  if (channel == nullptr) return absl::InvalidArgumentError(absl::StrCat("bad target ", target));
  return channel;
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& target,
                                                             const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, ChannelFor(target, options));
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to the kvcache daemon at ", target, " within ",
        absl::FormatDuration(options.connect_timeout),
        options.tls.enabled ? " (over TLS: is the daemon's certificate trusted and named as the "
                              "target, and is the client certificate one it accepts?)"
                            : ""));
  }
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
