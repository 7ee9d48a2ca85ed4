// Each CUDA block kernel against its CPU reference: block sizes that are and are not multiples of
// 16, aligned and misaligned pointers (vector and byte paths), random ids with -1 slots. Skips
// when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "kernels/block_copy.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::kernels {
namespace {

using Bytes = std::vector<uint8_t>;

// Device allocation with `offset` bytes of deliberate misalignment in front of the data.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, size_t offset = 0) : offset_(offset) {
    if (cudaMalloc(&base_, bytes + offset + 1) != cudaSuccess) base_ = nullptr;
  }
  ~DeviceBuffer() {
    if (base_ != nullptr) cudaFree(base_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = uint8_t>
  T* get() const {
    if (base_ == nullptr) return nullptr;
    return reinterpret_cast<T*>(static_cast<uint8_t*>(base_) + offset_);
  }

 private:
  void* base_ = nullptr;
  size_t offset_;
};

struct Case {
  uint64_t block_bytes;
  size_t misalign;  // bytes added to every device pointer; nonzero forces the byte loop
};

class BlockCopyGpuTest : public ::testing::TestWithParam<Case> {
 protected:
  static constexpr uint32_t kNumBlocks = 48;

  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    rng_.seed(GetParam().block_bytes * 31 + GetParam().misalign);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  uint64_t block_bytes() const { return GetParam().block_bytes; }
  Bytes RandomBytes(size_t n) {
    Bytes b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng_());
    return b;
  }
  // `count` ids: distinct blocks where `distinct`, else with repeats; about 1 in 6 is -1.
  std::vector<int64_t> RandomIds(size_t count, bool distinct) {
    std::vector<int64_t> perm(kNumBlocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    std::vector<int64_t> ids(count);
    for (size_t i = 0; i < count; ++i) {
      ids[i] = distinct ? perm[i] : static_cast<int64_t>(rng_() % kNumBlocks);
      if (rng_() % 6 == 0) ids[i] = kSkipBlock;
    }
    return ids;
  }
  void Upload(void* dst, const void* src, size_t n) {
    ASSERT_EQ(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_), cudaSuccess);
  }
  Bytes Download(const uint8_t* src, size_t n) {
    Bytes out(n);
    EXPECT_EQ(cudaMemcpyAsync(out.data(), src, n, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return out;
  }

  cudaStream_t stream_ = nullptr;
  std::mt19937_64 rng_;
};

TEST_P(BlockCopyGpuTest, CopyMatchesCpu) {
  const size_t pool_bytes = kNumBlocks * block_bytes();
  Bytes host = RandomBytes(pool_bytes);
  // 40 distinct blocks: the first 20 are sources, the last 20 destinations (a valid copy).
  const std::vector<int64_t> ids = RandomIds(40, /*distinct=*/true);
  const std::vector<int64_t> src(ids.begin(), ids.begin() + 20), dst(ids.begin() + 20, ids.end());
  DeviceBuffer pool(pool_bytes, GetParam().misalign);
  DeviceBuffer d_src(src.size() * 8), d_dst(dst.size() * 8);
  ASSERT_NE(pool.get(), nullptr);
  Upload(pool.get(), host.data(), pool_bytes);
  Upload(d_src.get(), src.data(), src.size() * 8);
  Upload(d_dst.get(), dst.data(), dst.size() * 8);
  ASSERT_OK(CopyBlocksCuda(pool.get(), block_bytes(), kNumBlocks, d_src.get<int64_t>(),
                           d_dst.get<int64_t>(), src.size(), stream_));
  ASSERT_OK(CopyBlocksCpu(host.data(), block_bytes(), kNumBlocks, src, dst));
  EXPECT_TRUE(Download(pool.get(), pool_bytes) == host);
}

TEST_P(BlockCopyGpuTest, GatherMatchesCpu) {
  const size_t pool_bytes = kNumBlocks * block_bytes();
  const Bytes host_pool = RandomBytes(pool_bytes);
  const std::vector<int64_t> ids = RandomIds(37, /*distinct=*/false);
  const size_t out_bytes = ids.size() * block_bytes();
  Bytes host_out = RandomBytes(out_bytes);  // -1 slots must keep these bytes
  DeviceBuffer pool(pool_bytes, GetParam().misalign), out(out_bytes, GetParam().misalign);
  DeviceBuffer d_ids(ids.size() * 8);
  Upload(pool.get(), host_pool.data(), pool_bytes);
  Upload(out.get(), host_out.data(), out_bytes);
  Upload(d_ids.get(), ids.data(), ids.size() * 8);
  ASSERT_OK(GatherBlocksCuda(pool.get(), block_bytes(), kNumBlocks, d_ids.get<int64_t>(),
                             ids.size(), out.get(), stream_));
  ASSERT_OK(GatherBlocksCpu(host_pool.data(), block_bytes(), kNumBlocks, ids, host_out.data()));
  EXPECT_TRUE(Download(out.get(), out_bytes) == host_out);
}

TEST_P(BlockCopyGpuTest, ScatterMatchesCpu) {
  const size_t pool_bytes = kNumBlocks * block_bytes();
  Bytes host_pool = RandomBytes(pool_bytes);
  const std::vector<int64_t> ids = RandomIds(29, /*distinct=*/true);
  const size_t in_bytes = ids.size() * block_bytes();
  const Bytes host_in = RandomBytes(in_bytes);
  DeviceBuffer pool(pool_bytes, GetParam().misalign), in(in_bytes, GetParam().misalign);
  DeviceBuffer d_ids(ids.size() * 8);
  Upload(pool.get(), host_pool.data(), pool_bytes);
  Upload(in.get(), host_in.data(), in_bytes);
  Upload(d_ids.get(), ids.data(), ids.size() * 8);
  ASSERT_OK(ScatterBlocksCuda(in.get(), block_bytes(), kNumBlocks, d_ids.get<int64_t>(), ids.size(),
                              pool.get(), stream_));
  ASSERT_OK(ScatterBlocksCpu(host_in.data(), block_bytes(), kNumBlocks, ids, host_pool.data()));
  EXPECT_TRUE(Download(pool.get(), pool_bytes) == host_pool);
}

// Ids the host path would reject are skipped on the device (documented), never accessed.
TEST_P(BlockCopyGpuTest, OutOfRangeDeviceIdsAreSkipped) {
  const size_t pool_bytes = kNumBlocks * block_bytes();
  Bytes host_pool = RandomBytes(pool_bytes);
  const std::vector<int64_t> ids = {-7, kNumBlocks, 3, int64_t{1} << 40, 0};
  const std::vector<int64_t> as_skips = {-1, -1, 3, -1, 0};
  const size_t in_bytes = ids.size() * block_bytes();
  const Bytes host_in = RandomBytes(in_bytes);
  DeviceBuffer pool(pool_bytes, GetParam().misalign), in(in_bytes, GetParam().misalign);
  DeviceBuffer d_ids(ids.size() * 8);
  Upload(pool.get(), host_pool.data(), pool_bytes);
  Upload(in.get(), host_in.data(), in_bytes);
  Upload(d_ids.get(), ids.data(), ids.size() * 8);
  ASSERT_OK(ScatterBlocksCuda(in.get(), block_bytes(), kNumBlocks, d_ids.get<int64_t>(), ids.size(),
                              pool.get(), stream_));
  ASSERT_OK(
      ScatterBlocksCpu(host_in.data(), block_bytes(), kNumBlocks, as_skips, host_pool.data()));
  EXPECT_TRUE(Download(pool.get(), pool_bytes) == host_pool);
}

INSTANTIATE_TEST_SUITE_P(Sizes, BlockCopyGpuTest,
                         ::testing::Values(Case{1, 0}, Case{15, 0}, Case{16, 0}, Case{48, 0},
                                           Case{100, 0}, Case{4096, 0}, Case{4100, 0},
                                           Case{65536, 0}, Case{65536 + 8, 0}, Case{4096, 1},
                                           Case{65536, 8}, Case{2 * 1024 * 1024, 0},
                                           // Several 64 KiB slices with a tail shorter than one
                                           // unrolled step, in the vector and the byte paths.
                                           Case{3 * 65536 + 112, 0}, Case{200003, 0},
                                           Case{2 * 1024 * 1024, 8}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "b" + std::to_string(info.param.block_bytes) + "_off" +
                                  std::to_string(info.param.misalign);
                         });

TEST(BlockCopyGpu, EmptyLaunchIsOk) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  EXPECT_OK(GatherBlocksCuda(nullptr, 16, 4, nullptr, 0, nullptr, nullptr));
}

}  // namespace
}  // namespace kvcache::kernels
