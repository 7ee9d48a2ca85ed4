// The one place where absl::Status and grpc::Status are converted into each other. Codes map 1:1
// (both follow google.rpc.Code); the message is carried unchanged.
#ifndef KVCACHE_COMMON_RPC_GRPC_STATUS_H_
#define KVCACHE_COMMON_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvcache {

// Trailing metadata on every unary reply: the daemon's epoch in decimal, present on errors too.
inline constexpr absl::string_view kEpochMetadataKey = "kvcache-epoch";

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_GRPC_STATUS_H_
