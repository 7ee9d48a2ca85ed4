// For tests that run a gRPC server and its clients in one process and tear them down per test.
#ifndef KVCACHE_TESTS_TESTING_GRPC_KEPT_ALIVE_H_
#define KVCACHE_TESTS_TESTING_GRPC_KEPT_ALIVE_H_

#include <grpc/grpc.h>

namespace kvcache::testing {

// Holds one gRPC library reference until the test binary exits. Without it, the test's last
// server or channel to go runs gRPC's whole clean-up, which joins gRPC's executor threads; after
// a write that found the socket full, one of them sits in tcp_posix's backup poller for up to
// 10 s, and the teardown waits it out (seen: 10 s for every test that moved MiBs, on a 16-core
// host). With the reference held the clean-up never runs; the process's exit ends those threads.
inline void KeepGrpcInitialized() {
  static const bool initialized = [] {
    grpc_init();
    return true;
  }();
  (void)initialized;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_GRPC_KEPT_ALIVE_H_
