// HandleUnary: how every unary KvCache call is served (server/kv_cache_service.cc and
// server/page_calls.cc): authenticate, check the role, run the body, stamp the epoch (in the
// response and, for error replies that drop the body, in a trailer) and finish.
#ifndef KVCACHE_SERVER_UNARY_CALL_H_
#define KVCACHE_SERVER_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "auth/identity.h"
#include "common/rpc/grpc_status.h"
#include "server/proto_keys.h"

namespace kvcache {

// An error reply drops the response body; the epoch still reaches the client this way.
inline void AddEpochTrailer(grpc::CallbackServerContext* context, uint64_t epoch) {
  context->AddTrailingMetadata(std::string(kEpochMetadataKey), absl::StrCat(epoch));
}

// Authenticates the caller, checks that its role may call `method`, runs `body(caller)`
// (returning absl::Status), stamps the epoch and finishes the call.
template <typename Service, typename Response, typename Body>
grpc::ServerUnaryReactor* HandleUnary(const Service& service, grpc::CallbackServerContext* context,
                                      Response* response, uint64_t epoch, const char* method,
                                      Role needed, Body body) {
  const absl::StatusOr<Identity> caller = service.Caller(*context, method, needed);
  const absl::Status status = caller.ok() ? body(*caller) : caller.status();
  response->set_epoch(epoch);
  AddEpochTrailer(context, epoch);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_UNARY_CALL_H_
