// RpcMetrics: calls served, by method and status code, and their latency, recorded by a gRPC
// server interceptor for every method of the daemon (KvCache, health, reflection) whatever its
// shape (unary, streams), from the call's arrival to its status being sent.
//
// Per call: one interceptor object, two clock reads, two relaxed atomic adds; no lock. Methods
// come from a fixed table built at construction (the generated descriptors), so a scrape never
// sees a label it did not expect and a client cannot grow the table.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_SERVER_RPC_METRICS_H_
#define KVCACHE_SERVER_RPC_METRICS_H_

#include <grpcpp/support/server_interceptor.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/histogram.h"

namespace kvcache {

// gRPC's codes, OK (0) to UNAUTHENTICATED (16).
inline constexpr int kNumGrpcCodes = 17;
// "OK", "CANCELLED", ... as gRPC names them.
const char* GrpcCodeName(int code);

class RpcMetrics {
 public:
  RpcMetrics();

  struct Method {
    std::string label;  // "OpenSequence" for KvCache's, else "grpc.health.v1.Health/Check"
    std::array<std::atomic<uint64_t>, kNumGrpcCodes> calls{};
    Histogram duration{LatencyBucketsSeconds()};
  };

  // The method's slot for a full gRPC path ("/kvcache.v1.KvCache/Ping"); null for one not served.
  Method* Find(absl::string_view path);
  const std::vector<std::unique_ptr<Method>>& methods() const { return methods_; }

  // The interceptor factory to give the server builder (experimental().SetInterceptorCreators).
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();

 private:
  std::vector<std::unique_ptr<Method>> methods_;
  absl::flat_hash_map<std::string, Method*> by_path_;  // constant after construction
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_RPC_METRICS_H_
