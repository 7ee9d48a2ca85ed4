// DeviceKvPool (model/cuda/device_kv_pool.h), the private device pool of in-process GPU runs.
//
// DeviceKvPoolTest (label unit): every build and machine has its one right answer — the argument
// checks (before the build or any device is looked at), then FAILED_PRECONDITION "built without
// CUDA" without CUDA, or "no CUDA device" without a GPU.
// DeviceKvPoolGpuTest (label gpu; skips with no CUDA device): the pool is zero-filled device
// memory on the asked device, and a move hands the allocation over.
#include "model/cuda/device_kv_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "tests/testing/status_matchers.h"

#if KVCACHE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr PoolLayout kLayout{.num_layers = 3,
                             .num_kv_heads = 2,
                             .head_dim = 16,
                             .block_size = 16,
                             .dtype = DType::kBFloat16};

TEST(DeviceKvPoolTest, CreateAnswersForTheBuildAndTheMachine) {
  // The arguments are checked before the build or a device is looked at.
  EXPECT_THAT(DeviceKvPool::Create(0, kLayout, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DeviceKvPool::Create(-1, kLayout, 4), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DeviceKvPool::Create(0, PoolLayout{}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
  if (!BuiltWithCuda()) {
    EXPECT_THAT(DeviceKvPool::Create(0, kLayout, 4),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("built without CUDA")));
  } else if (!CudaDeviceAvailable()) {
    EXPECT_THAT(DeviceKvPool::Create(0, kLayout, 4),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no CUDA device")));
  } else {
    EXPECT_OK(DeviceKvPool::Create(0, kLayout, 4));
    EXPECT_THAT(DeviceKvPool::Create(1 << 20, kLayout, 4),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("does not exist")));
  }
}

#if KVCACHE_WITH_CUDA

TEST(DeviceKvPoolGpuTest, IsZeroFilledDeviceMemoryAndMovesItsAllocation) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<DeviceKvPool> created = DeviceKvPool::Create(0, kLayout, 5);
  ASSERT_OK(created);
  DeviceKvPool pool = *std::move(created);
  ASSERT_NE(pool.base(), nullptr);
  EXPECT_EQ(pool.device(), 0);
  EXPECT_EQ(pool.num_blocks(), 5u);
  EXPECT_EQ(pool.layout().BlockBytes(), kLayout.BlockBytes());

  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, pool.base()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);

  std::vector<uint8_t> bytes(5 * kLayout.BlockBytes(), 0xff);
  ASSERT_EQ(cudaMemcpy(bytes.data(), pool.base(), bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; }));

  uint8_t* const base = pool.base();
  DeviceKvPool moved = std::move(pool);
  EXPECT_EQ(moved.base(), base);
  EXPECT_EQ(pool.base(), nullptr);  // NOLINT(bugprone-use-after-move): documented state
  absl::StatusOr<DeviceKvPool> other = DeviceKvPool::Create(0, kLayout, 1);
  ASSERT_OK(other);
  moved = *std::move(other);  // frees the first allocation
  EXPECT_NE(moved.base(), nullptr);
  EXPECT_EQ(moved.num_blocks(), 1u);
}

#endif  // KVCACHE_WITH_CUDA

}  // namespace
}  // namespace kvcache::worker
