#include "ctl/connection.h"

#include <grpcpp/create_channel.h>

#include <utility>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& target,
                                                             const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, CreateDaemonChannel(target, options));
  RETURN_IF_ERROR(WaitForDaemon(*channel, target, options));
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
