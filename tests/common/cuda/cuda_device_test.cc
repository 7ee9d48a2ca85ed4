// common/cuda/cuda_device.h and not_built.h: each build and machine has its one right answer, so
// nothing here skips.
#include "common/cuda/cuda_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/cuda/not_built.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ParseCudaDeviceTest, ParsesCudaN) {
  EXPECT_EQ(*ParseCudaDevice("cuda:0"), 0);
  EXPECT_EQ(*ParseCudaDevice("cuda:3"), 3);
  EXPECT_THAT(ParseCudaDevice("gpu:0"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCudaDevice("cuda:-1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCudaDevice("cuda:"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(NotBuiltWithTest, IsFailedPreconditionNamingThePart) {
  EXPECT_THAT(NotBuiltWith("CUDA"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "built without CUDA"));
  EXPECT_THAT(
      NotBuiltWith("NCCL", "NcclChannel::Connect"),
      StatusIs(absl::StatusCode::kFailedPrecondition, "NcclChannel::Connect: built without NCCL"));
}

TEST(CudaDeviceTest, AnswersForTheBuildAndTheMachine) {
  EXPECT_THAT(CheckCudaDevice(-1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
  if (!BuiltWithCuda()) {
    EXPECT_FALSE(CudaDeviceAvailable());
    EXPECT_THAT(CudaDeviceCount(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "built without CUDA"));
    EXPECT_THAT(CheckCudaDevice(0),
                StatusIs(absl::StatusCode::kFailedPrecondition, "built without CUDA"));
    return;
  }
  if (!CudaDeviceAvailable()) {
    EXPECT_THAT(CudaDeviceCount(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no CUDA device: ")));
    EXPECT_THAT(CheckCudaDevice(0),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no CUDA device: ")));
    return;
  }
  ASSERT_OK(CudaDeviceCount());
  EXPECT_GE(*CudaDeviceCount(), 1);
  EXPECT_OK(CheckCudaDevice(0));
  EXPECT_THAT(CheckCudaDevice(*CudaDeviceCount()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("does not exist here")));
}

}  // namespace
}  // namespace kvcache
