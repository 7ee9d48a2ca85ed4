#include "server/call_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;
using Resource = CallLimits::Resource;

CallLimitOptions SmallLimits() {
  return CallLimitOptions{.max_streams_per_connection = 2,
                          .max_streams = 3,
                          .max_put_bytes_per_connection = 100,
                          .max_put_bytes = 150};
}

TEST(CallLimitsTest, AConnectionPastItsStreamsIsRefusedWithResourceExhausted) {
  CallLimits limits(SmallLimits());
  std::vector<CallLimits::Ticket> held;
  for (int i = 0; i < 2; ++i) {
    auto ticket = limits.AdmitStream("fd:7", "PutBlocks");
    ASSERT_OK(ticket);
    held.push_back(*std::move(ticket));
  }
  EXPECT_THAT(limits.AdmitStream("fd:7", "GetBlocks"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("GetBlocks: this connection holds 2 streams of its 2")));
  // Another connection is not affected.
  EXPECT_OK(limits.AdmitStream("fd:8", "GetBlocks"));
  EXPECT_EQ(limits.Usage().refused_streams, 1u);
  EXPECT_EQ(limits.HeldBy("fd:7", Resource::kStreams), 2u);
}

TEST(CallLimitsTest, TheDaemonPastItsStreamsIsUnavailable) {
  CallLimits limits(SmallLimits());
  std::vector<CallLimits::Ticket> held;
  for (const char* connection : {"fd:1", "fd:2", "fd:3"}) {
    auto ticket = limits.AdmitStream(connection, "WatchEvents");
    ASSERT_OK(ticket);
    held.push_back(*std::move(ticket));
  }
  EXPECT_THAT(limits.AdmitStream("fd:4", "WatchEvents"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("the daemon holds 3 streams of its 3 (--max_streams)")));
  EXPECT_EQ(limits.Usage().streams, 3u);
  held.pop_back();  // a call ends: its place is free again
  EXPECT_OK(limits.AdmitStream("fd:4", "WatchEvents"));
}

TEST(CallLimitsTest, PutBytesAreBoundedPerConnectionAndInTotal) {
  CallLimits limits(SmallLimits());
  auto first = limits.AdmitPutBytes("fd:1", 80);
  ASSERT_OK(first);
  EXPECT_THAT(limits.AdmitPutBytes("fd:1", 30),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("this connection holds 80 bytes of its 100")));
  auto second = limits.AdmitPutBytes("fd:2", 70);
  ASSERT_OK(second);
  EXPECT_THAT(limits.AdmitPutBytes("fd:3", 1),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("(--max_put_bytes)")));
  EXPECT_EQ(limits.Usage().put_bytes, 150u);
  EXPECT_EQ(limits.Usage().refused_puts, 2u);
  first->Release();
  EXPECT_EQ(limits.Usage().put_bytes, 70u);
  EXPECT_EQ(limits.HeldBy("fd:1", Resource::kPutBytes), 0u);
  EXPECT_OK(limits.AdmitPutBytes("fd:3", 80));
}

TEST(CallLimitsTest, APutLargerThanEitherBoundAloneSaysSo) {
  CallLimits limits(SmallLimits());
  EXPECT_THAT(limits.AdmitPutBytes("fd:1", 101),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("a put of 101 bytes exceeds the daemon's put bound of 100")));
  EXPECT_EQ(limits.Usage().put_bytes, 0u);
}

TEST(CallLimitsTest, TicketsGiveBackExactlyOnceWhereverTheyMove) {
  CallLimits limits(SmallLimits());
  {
    auto ticket = limits.AdmitStream("fd:1", "PutBlocks");
    ASSERT_OK(ticket);
    CallLimits::Ticket moved = *std::move(ticket);
    CallLimits::Ticket assigned;
    assigned = std::move(moved);
    EXPECT_EQ(limits.Usage().streams, 1u);
    assigned.Release();
    assigned.Release();
    EXPECT_EQ(limits.Usage().streams, 0u);
  }
  EXPECT_EQ(limits.Usage().streams, 0u);
  // A connection that holds nothing has no entry left: a reused name starts from zero.
  EXPECT_EQ(limits.HeldBy("fd:1", Resource::kStreams), 0u);
}

}  // namespace
}  // namespace kvcache
