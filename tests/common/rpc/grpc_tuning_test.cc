// Each case runs in a fresh process (a death test re-executes this binary), since gRPC reads its
// settings once, when it starts. The child reports what gRPC runs; the parent matches it.
#include "common/rpc/grpc_tuning.h"

#include <grpc/grpc.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>

// gRPC's own name for the engine it picked (src/core/lib/iomgr/ev_posix.h; not in its public
// headers, exported by libgrpc).
const char* grpc_get_poll_strategy_name();

namespace kvcache {
namespace {

// Sets the environment of a fresh process; at debug verbosity gRPC lists its experiments.
void SetEnvironment(const char* poll_strategy, const char* experiments) {
  setenv("GRPC_VERBOSITY", "DEBUG", 1);
  if (poll_strategy == nullptr)
    unsetenv("GRPC_POLL_STRATEGY");
  else
    setenv("GRPC_POLL_STRATEGY", poll_strategy, 1);
  if (experiments == nullptr)
    unsetenv("GRPC_EXPERIMENTS");
  else
    setenv("GRPC_EXPERIMENTS", experiments, 1);
}

// Starts gRPC and prints what it runs.
[[noreturn]] void StartGrpcAndReport(bool tuned) {
  if (!grpc_is_initialized()) grpc_init();
  std::fprintf(stderr, "tuned %d, engine %s\n", tuned, grpc_get_poll_strategy_name());
  std::_Exit(0);
}

class GrpcTuningTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(GrpcTuningTest, PicksPollAndWholeMessageReadsWhenNothingWasChosen) {
  EXPECT_EXIT(
      {
        SetEnvironment(nullptr, nullptr);
        StartGrpcAndReport(TuneGrpcForBlockStreams());
      },
      ::testing::ExitedWithCode(0), "tcp_read_chunks +OFF(.|\n)*tuned 1, engine poll");
}

TEST_F(GrpcTuningTest, TheOperatorsChoicesWin) {
  EXPECT_EXIT(
      {
        SetEnvironment("epoll1", nullptr);
        StartGrpcAndReport(TuneGrpcForBlockStreams());
      },
      ::testing::ExitedWithCode(0), "tcp_read_chunks +OFF(.|\n)*tuned 0, engine epoll1");
  EXPECT_EXIT(
      {
        SetEnvironment(nullptr, "tcp_rcv_lowat");
        StartGrpcAndReport(TuneGrpcForBlockStreams());
      },
      ::testing::ExitedWithCode(0), "tcp_read_chunks +ON(.|\n)*tuned 0, engine poll");
}

TEST_F(GrpcTuningTest, TooLateOnceGrpcStarted) {
  EXPECT_EXIT(
      {
        SetEnvironment(nullptr, nullptr);
        grpc_init();
        StartGrpcAndReport(TuneGrpcForBlockStreams());
      },
      ::testing::ExitedWithCode(0), "tcp_read_chunks +ON(.|\n)*tuned 0, engine epoll1");
}

}  // namespace
}  // namespace kvcache
