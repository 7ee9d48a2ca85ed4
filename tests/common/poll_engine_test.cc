// Each case runs in a fresh process (a death test re-executes this binary), since gRPC reads
// GRPC_POLL_STRATEGY once, when it starts.
#include "common/poll_engine.h"

#include <stdlib.h>

#include <cstdio>
#include <cstring>

#include <grpc/grpc.h>
#include <gtest/gtest.h>

// gRPC's own name for the engine it picked (src/core/lib/iomgr/ev_posix.h; not in its public
// headers, exported by libgrpc).
const char* grpc_get_poll_strategy_name();

namespace kvcache {
namespace {

// Starts gRPC and exits 0 when it runs `expected`, 1 (saying which it runs) otherwise.
[[noreturn]] void ExitWithEngineCheck(bool tuned, bool expected_tuned, const char* expected) {
  if (!grpc_is_initialized()) grpc_init();
  const char* engine = grpc_get_poll_strategy_name();
  std::fprintf(stderr, "returned %d, gRPC runs %s\n", tuned, engine);
  std::_Exit(tuned == expected_tuned && std::strcmp(engine, expected) == 0 ? 0 : 1);
}

class PollEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(PollEngineTest, PicksPollWhenNothingChoseAnEngine) {
  EXPECT_EXIT(
      {
        unsetenv("GRPC_POLL_STRATEGY");
        ExitWithEngineCheck(UsePollEngineForBlockStreams(), true, "poll");
      },
      ::testing::ExitedWithCode(0), "returned 1, gRPC runs poll");
}

TEST_F(PollEngineTest, TheOperatorsChoiceWins) {
  EXPECT_EXIT(
      {
        setenv("GRPC_POLL_STRATEGY", "epoll1", 1);
        ExitWithEngineCheck(UsePollEngineForBlockStreams(), false, "epoll1");
      },
      ::testing::ExitedWithCode(0), "gRPC runs epoll1");
  EXPECT_EXIT(
      {
        setenv("GRPC_POLL_STRATEGY", "poll", 1);
        ExitWithEngineCheck(UsePollEngineForBlockStreams(), true, "poll");
      },
      ::testing::ExitedWithCode(0), "gRPC runs poll");
}

TEST_F(PollEngineTest, TooLateOnceGrpcStarted) {
  EXPECT_EXIT(
      {
        unsetenv("GRPC_POLL_STRATEGY");
        grpc_init();
        ExitWithEngineCheck(UsePollEngineForBlockStreams(), false, "epoll1");
      },
      ::testing::ExitedWithCode(0), "returned 0, gRPC runs epoll1");
}

}  // namespace
}  // namespace kvcache
