// HandleUnary: how every unary KvCache call is served (server/kv_cache_service.cc and
// server/page_calls.cc): authenticate, check the role, run the body, stamp the epoch (in the
// response and, for error replies that drop the body, in a trailer) and finish.
#ifndef KVCACHE_SERVER_UNARY_CALL_H_
#define KVCACHE_SERVER_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "auth/identity.h"
#include "common/rpc/grpc_status.h"
#include "server/proto_convert.h"

namespace kvcache {

// An error reply drops the response body; the epoch still reaches the client this way.
inline void AddEpochTrailer(grpc::CallbackServerContext* context, uint64_t epoch) {
  context->AddTrailingMetadata(std::string(kEpochMetadataKey), absl::StrCat(epoch));
}

// Authenticates the caller, checks that its role may call `method`, runs `body(caller)`
// (returning absl::Status) and stamps the epoch; returns the call's status.
template <typename Service, typename Response, typename Body>
absl::Status RunUnaryBody(const Service& service, grpc::CallbackServerContext* context,
                          Response* response, uint64_t epoch, const char* method, Role needed,
                          Body body) {
  const absl::StatusOr<Identity> caller = service.Caller(*context, method, needed);
  const absl::Status status = caller.ok() ? body(*caller) : caller.status();
  response->set_epoch(epoch);
  AddEpochTrailer(context, epoch);
  return status;
}

inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                             const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Authenticates the caller, checks that its role may call `method`, runs `body(caller)`
// (returning absl::Status), stamps the epoch and finishes the call.
template <typename Service, typename Response, typename Body>
grpc::ServerUnaryReactor* HandleUnary(const Service& service, grpc::CallbackServerContext* context,
                                      Response* response, uint64_t epoch, const char* method,
                                      Role needed, Body body) {
  return FinishUnary(context,
                     RunUnaryBody(service, context, response, epoch, method, needed, body));
}

// A unary call's reactor that runs `on_done` once gRPC is done with the call: for a reply whose
// slices point into memory that must stay put until it is sent.
class UnaryReactorWithCleanup final : public grpc::ServerUnaryReactor {
 public:
  explicit UnaryReactorWithCleanup(std::function<void()> on_done) : on_done_(std::move(on_done)) {}
  void OnDone() override {
    on_done_();
    delete this;
  }

 private:
  const std::function<void()> on_done_;
};

// HandleUnary for a call served raw (grpc::ByteBuffer in and out), whose bytes fields go
// uncopied: `body(caller, &reply, &tail, &on_done)` fills the reply's other fields and may add
// slices that follow them on the wire, each a whole field (a tag and length, then bytes), and set
// `on_done` to run once gRPC is done with them. The reply is sent only when the body succeeds.
template <typename Response, typename Service, typename Body>
grpc::ServerUnaryReactor* HandleRawUnary(const Service& service,
                                         grpc::CallbackServerContext* context,
                                         grpc::ByteBuffer* raw_response, uint64_t epoch,
                                         const char* method, Role needed, Body body) {
  Response response;
  std::vector<grpc::Slice> tail;
  std::function<void()> on_done;
  const absl::Status status = RunUnaryBody(
      service, context, &response, epoch, method, needed,
      [&](const Identity& caller) { return body(caller, &response, &tail, &on_done); });
  if (status.ok()) {
    std::vector<grpc::Slice> slices;
    slices.reserve(tail.size() + 1);
    slices.emplace_back(response.SerializeAsString());
    for (grpc::Slice& slice : tail) slices.push_back(std::move(slice));
    *raw_response = grpc::ByteBuffer(slices.data(), slices.size());
  }
  if (!on_done) return FinishUnary(context, status);
  grpc::ServerUnaryReactor* reactor = new UnaryReactorWithCleanup(std::move(on_done));
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_UNARY_CALL_H_
