// FakeSessionService: a base for fake daemons in tests that exercise one call against a client.
// Its session calls always succeed (session 1, a 60 s lease) at a fixed epoch; the subclass
// overrides the calls under test and answers them with epoch().
#ifndef KVCACHE_TESTS_TESTING_FAKE_SESSION_SERVICE_H_
#define KVCACHE_TESTS_TESTING_FAKE_SESSION_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache::testing {

class FakeSessionService : public v1::KvCache::Service {
 public:
  explicit FakeSessionService(uint64_t epoch) : epoch_(epoch) {}

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

 private:
  const uint64_t epoch_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_FAKE_SESSION_SERVICE_H_
