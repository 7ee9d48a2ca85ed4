// The device fault latch (LevelDB's bg_error_): which failures latch, that the first one wins and
// stays, and when its listener runs. What pools answer once it latched is in cache_manager_test.
#include "cache/device_fault_latch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr auto kUnavailable = absl::StatusCode::kUnavailable;

TEST(DeviceFaultLatchTest, OnlyInternalAndDataLossAreDeviceFaults) {
  DeviceFaultLatch latch;
  // The caller's bug and transient shortages pass through unchanged and latch nothing.
  for (const absl::Status& status :
       {absl::OutOfRangeError("past the block"), absl::ResourceExhaustedError("no memory"),
        absl::FailedPreconditionError("no device"), absl::InvalidArgumentError("bad"),
        absl::OkStatus()}) {
    EXPECT_EQ(latch.Check(status, "p"), status);
    EXPECT_OK(latch.status());
  }
  EXPECT_THAT(latch.Check(absl::DataLossError("uncorrectable ECC error"), "p"),
              StatusIs(kUnavailable, HasSubstr("DATA_LOSS: uncorrectable ECC error")));
  DeviceFaultLatch other;
  EXPECT_THAT(other.Check(absl::InternalError("illegal address"), "p"),
              StatusIs(kUnavailable, HasSubstr("INTERNAL: illegal address")));
}

TEST(DeviceFaultLatchTest, TheFirstFaultStaysLatched) {
  DeviceFaultLatch latch;
  const absl::Status first = latch.Check(absl::InternalError("first"), "alpha");
  EXPECT_THAT(first, StatusIs(kUnavailable,
                              AllOf(HasSubstr("pool 'alpha'"), HasSubstr("INTERNAL: first"))));
  EXPECT_EQ(latch.status(), first);
  // A later fault, or a later success, changes nothing: the memory is not trusted again.
  EXPECT_EQ(latch.Check(absl::DataLossError("second"), "beta"), first);
  EXPECT_EQ(latch.Check(absl::OutOfRangeError("past the block"), "beta"),
            absl::OutOfRangeError("past the block"));
  EXPECT_EQ(latch.status(), first);
}

TEST(DeviceFaultLatchTest, TheListenerRunsOnceWithTheLatchedStatus) {
  DeviceFaultLatch latch;
  std::vector<absl::Status> heard;
  latch.SetListener([&](const absl::Status& latched) { heard.push_back(latched); });
  EXPECT_TRUE(heard.empty());
  const absl::Status first = latch.Check(absl::InternalError("first"), "p");
  latch.Check(absl::InternalError("second"), "p").IgnoreError();
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0], first);
}

TEST(DeviceFaultLatchTest, AListenerInstalledAfterTheFaultHearsItAtOnce) {
  DeviceFaultLatch latch;
  const absl::Status first = latch.Check(absl::InternalError("before serving"), "p");
  std::vector<absl::Status> heard;
  latch.SetListener([&](const absl::Status& latched) { heard.push_back(latched); });
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0], first);
}

}  // namespace
}  // namespace kvcache
