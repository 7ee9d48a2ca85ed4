// FakeSessionService: a base for fake daemons in tests that exercise one call against a client.
// Its session calls always succeed (session 1, a 60 s lease) at a fixed epoch, and DescribePool
// describes the one pool it is given (FakePool); the subclass overrides the calls under test and
// answers them with epoch().
//
// Thread safety: thread-safe (nothing changes after construction).
#ifndef KVCACHE_TESTS_TESTING_FAKE_SESSION_SERVICE_H_
#define KVCACHE_TESTS_TESTING_FAKE_SESSION_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "common/pool_layout.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache::testing {

// A pool of `num_blocks` blocks laid out as `layout`, as a daemon describes it (layout fields,
// block bytes and fingerprint); the caller adds a name, memory kind or mapping as it needs.
inline v1::PoolInfo FakePool(const PoolLayout& layout, uint32_t num_blocks) {
  v1::PoolInfo pool;
  v1::PoolLayout* proto = pool.mutable_layout();
  proto->set_num_layers(layout.num_layers);
  proto->set_num_kv_heads(layout.num_kv_heads);
  proto->set_head_dim(layout.head_dim);
  proto->set_block_size(layout.block_size);
  proto->set_dtype(static_cast<v1::DType>(layout.dtype));
  proto->set_block_bytes(layout.BlockBytes());
  proto->set_fingerprint(layout.Fingerprint());
  pool.set_num_blocks(num_blocks);
  return pool;
}

class FakeSessionService : public v1::KvCache::Service {
 public:
  // DescribePool answers with `pool`: under the name asked for when `pool` has none, else only
  // for its own name (any other is NOT_FOUND). Without a pool, DescribePool is UNIMPLEMENTED, as
  // is every call the fake does not serve.
  explicit FakeSessionService(uint64_t epoch, std::optional<v1::PoolInfo> pool = std::nullopt)
      : epoch_(epoch), pool_(std::move(pool)) {}

  uint64_t epoch() const { return epoch_; }

  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest*,
                           v1::OpenSessionResponse* response) override {
    response->set_epoch(epoch_);
    response->set_session_id(1);
    response->set_ttl_ms(60000);
    return grpc::Status::OK;
  }
  grpc::Status KeepAlive(grpc::ServerContext*, const v1::KeepAliveRequest*,
                         v1::KeepAliveResponse* response) override {
    response->set_epoch(epoch_);
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse* response) override {
    response->set_epoch(epoch_);
    return grpc::Status::OK;
  }
  grpc::Status DescribePool(grpc::ServerContext* context, const v1::DescribePoolRequest* request,
                            v1::DescribePoolResponse* response) override {
    if (!pool_.has_value()) return v1::KvCache::Service::DescribePool(context, request, response);
    if (!pool_->name().empty() && request->pool() != pool_->name()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no pool");
    }
    response->set_epoch(epoch_);
    *response->mutable_pool() = *pool_;
    if (pool_->name().empty()) response->mutable_pool()->set_name(request->pool());
    return grpc::Status::OK;
  }

 private:
  const uint64_t epoch_;
  const std::optional<v1::PoolInfo> pool_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_FAKE_SESSION_SERVICE_H_
