// CPU reference of the block copy kernels against a naive byte-by-byte model, over several block
// sizes and element sizes; every argument error with its exact code and message. Also the CUDA
// launchers' host-side checks (no device needed, every build).
#include "kernels/block_copy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::kernels {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

// A block size to sweep: a name, the element size (the dtype's width) and the element count.
struct BlockShape {
  std::string name;
  uint32_t elem_bytes;
  uint64_t elems;
  uint64_t BlockBytes() const { return elem_bytes * elems; }
};

// Fills `pool` with typed elements of `elem_bytes`, distinct per block and position, so a copy to
// the wrong place or with the wrong length shows in a byte comparison.
void FillTyped(Bytes& pool, uint32_t elem_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  const uint64_t n = pool.size() / elem_bytes;
  for (uint64_t i = 0; i < n; ++i) {
    uint8_t* p = pool.data() + i * elem_bytes;
    if (elem_bytes == 2) {  // fp16/bf16-sized
      const uint16_t v = static_cast<uint16_t>(rng());
      std::memcpy(p, &v, sizeof(v));
    } else if (elem_bytes == 4) {  // fp32
      const float v = static_cast<float>(rng()) * 0.5f;
      std::memcpy(p, &v, sizeof(v));
    } else {  // fp8 and anything else: raw bytes
      for (uint32_t b = 0; b < elem_bytes; ++b) p[b] = static_cast<uint8_t>(rng());
    }
  }
  for (uint64_t i = n * elem_bytes; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(rng());
}

// The naive model: one byte at a time, straight from the contract.
void NaiveCopyBlock(const uint8_t* src, uint8_t* dst, uint64_t block_bytes) {
  for (uint64_t b = 0; b < block_bytes; ++b) dst[b] = src[b];
}

class BlockCopyCpuTest : public ::testing::TestWithParam<BlockShape> {
 protected:
  static constexpr uint32_t kNumBlocks = 8;
  uint64_t block_bytes() const { return GetParam().BlockBytes(); }
  Bytes MakePool(uint32_t seed) const {
    Bytes pool(kNumBlocks * block_bytes());
    FillTyped(pool, GetParam().elem_bytes, seed);
    return pool;
  }
  uint8_t* Block(Bytes& buf, int64_t i) const { return buf.data() + i * block_bytes(); }
  const uint8_t* Block(const Bytes& buf, int64_t i) const { return buf.data() + i * block_bytes(); }
};

TEST_P(BlockCopyCpuTest, CopyMatchesNaiveAndSkipsSentinel) {
  Bytes pool = MakePool(1);
  Bytes expected = pool;
  const std::vector<int64_t> src = {0, 3, -1, 5, 2};
  const std::vector<int64_t> dst = {1, 6, 4, 7, -1};
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == -1 || dst[i] == -1) continue;
    NaiveCopyBlock(Block(expected, src[i]), Block(expected, dst[i]), block_bytes());
  }
  ASSERT_OK(CopyBlocksCpu(pool.data(), block_bytes(), kNumBlocks, src, dst));
  EXPECT_TRUE(pool == expected);
  // Pair 2 (src -1) left block 4 as it was; pair 0 made block 1 equal to block 0.
  const Bytes original = MakePool(1);
  EXPECT_EQ(std::memcmp(Block(pool, 4), Block(original, 4), block_bytes()), 0);
  EXPECT_EQ(std::memcmp(Block(pool, 1), Block(pool, 0), block_bytes()), 0);
}

TEST_P(BlockCopyCpuTest, GatherMatchesNaiveLeavesSkippedSlotUntouched) {
  const Bytes pool = MakePool(2);
  const std::vector<int64_t> ids = {5, -1, 0, 5, 7};
  Bytes out(ids.size() * block_bytes(), 0xAB);
  Bytes expected = out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == -1) continue;
    NaiveCopyBlock(Block(pool, ids[i]), Block(expected, i), block_bytes());
  }
  ASSERT_OK(GatherBlocksCpu(pool.data(), block_bytes(), kNumBlocks, ids, out.data()));
  EXPECT_TRUE(out == expected);
  EXPECT_EQ(out[1 * block_bytes()], 0xAB);
  EXPECT_EQ(out[2 * block_bytes() - 1], 0xAB);
}

TEST_P(BlockCopyCpuTest, ScatterMatchesNaiveAndSkipsSentinel) {
  Bytes pool = MakePool(3);
  const std::vector<int64_t> ids = {2, -1, 6, -1, 0};
  Bytes in(ids.size() * block_bytes());
  FillTyped(in, GetParam().elem_bytes, 4);
  Bytes expected = pool;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == -1) continue;
    NaiveCopyBlock(Block(in, i), Block(expected, ids[i]), block_bytes());
  }
  ASSERT_OK(ScatterBlocksCpu(in.data(), block_bytes(), kNumBlocks, ids, pool.data()));
  EXPECT_TRUE(pool == expected);
}

TEST_P(BlockCopyCpuTest, GatherThenScatterMovesBlocksBetweenPools) {
  const Bytes a = MakePool(5);
  Bytes b = MakePool(6);
  const std::vector<int64_t> from = {7, 1, 4};
  const std::vector<int64_t> to = {0, 5, 3};
  Bytes staging(from.size() * block_bytes());
  ASSERT_OK(GatherBlocksCpu(a.data(), block_bytes(), kNumBlocks, from, staging.data()));
  ASSERT_OK(ScatterBlocksCpu(staging.data(), block_bytes(), kNumBlocks, to, b.data()));
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_EQ(std::memcmp(Block(b, to[i]), Block(a, from[i]), block_bytes()), 0) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, BlockCopyCpuTest,
    ::testing::Values(BlockShape{"one_byte", 1, 1}, BlockShape{"b16_fp8", 1, 16},
                      BlockShape{"b16_fp32", 4, 4}, BlockShape{"odd_fp16", 2, 7},
                      BlockShape{"4KiB_plus4_fp32", 4, 1025},  // 4100 B: not a multiple of 16
                      BlockShape{"4KiB_fp16", 2, 2048},
                      // 2 layers * K,V * 16 tokens * 8 heads * 64 dims of fp16 = 64 KiB.
                      BlockShape{"64KiB_fp16", 2, 2 * 2 * 16 * 8 * 64},
                      BlockShape{"64KiB_fp8", 1, 64 * 1024}, BlockShape{"64KiB_fp32", 4, 16384}),
    [](const ::testing::TestParamInfo<BlockShape>& info) { return info.param.name; });

// --- Empty calls and the sentinel. ---

TEST(BlockCopyCpu, EmptyCallsAreOkEvenWithNullBuffers) {
  EXPECT_OK(CopyBlocksCpu(nullptr, 16, 4, {}, {}));
  EXPECT_OK(GatherBlocksCpu(nullptr, 16, 4, {}, nullptr));
  EXPECT_OK(ScatterBlocksCpu(nullptr, 16, 4, {}, nullptr));
}

TEST(BlockCopyCpu, AllSkippedChangesNothing) {
  Bytes pool(4 * 16);
  FillTyped(pool, 1, 9);
  const Bytes before = pool;
  const std::vector<int64_t> skip = {-1, -1};
  ASSERT_OK(CopyBlocksCpu(pool.data(), 16, 4, skip, std::vector<int64_t>{0, 1}));
  ASSERT_OK(CopyBlocksCpu(pool.data(), 16, 4, std::vector<int64_t>{0, 1}, skip));
  ASSERT_OK(ScatterBlocksCpu(Bytes(32).data(), 16, 4, skip, pool.data()));
  EXPECT_TRUE(pool == before);
  EXPECT_EQ(kSkipBlock, -1);
}

TEST(BlockCopyCpu, SkippedPairsDoNotCountAsWritesOrReads) {
  Bytes pool(4 * 16);
  FillTyped(pool, 1, 10);
  // dst 2 appears twice and block 1 is both a src and a dst, but only in skipped pairs.
  const std::vector<int64_t> src = {0, -1, 1};
  const std::vector<int64_t> dst = {2, 2, -1};
  EXPECT_OK(CopyBlocksCpu(pool.data(), 16, 4, src, dst));
  EXPECT_OK(
      CopyBlocksCpu(pool.data(), 16, 4, std::vector<int64_t>{0, -1}, std::vector<int64_t>{3, 0}));
}

TEST(BlockCopyCpu, GatherMayReadABlockTwiceScatterSkipsRepeatedSentinel) {
  Bytes pool(4 * 16);
  FillTyped(pool, 1, 11);
  Bytes out(3 * 16);
  ASSERT_OK(GatherBlocksCpu(pool.data(), 16, 4, std::vector<int64_t>{3, 3, 3}, out.data()));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(std::memcmp(&out[i * 16], &pool[3 * 16], 16), 0);
  EXPECT_OK(ScatterBlocksCpu(out.data(), 16, 4, std::vector<int64_t>{-1, 1, -1}, pool.data()));
}

// --- Errors: exact codes and messages; nothing is written on error. ---

class BlockCopyCpuErrors : public ::testing::Test {
 protected:
  static constexpr uint32_t kNumBlocks = 8;
  static constexpr uint64_t kBlockBytes = 16;
  void SetUp() override {
    pool_.resize(kNumBlocks * kBlockBytes);
    FillTyped(pool_, 1, 12);
    before_ = pool_;
  }
  void TearDown() override { EXPECT_TRUE(pool_ == before_) << "a failed call wrote the pool"; }
  absl::Status Copy(std::vector<int64_t> src, std::vector<int64_t> dst) {
    return CopyBlocksCpu(pool_.data(), kBlockBytes, kNumBlocks, src, dst);
  }
  absl::Status Scatter(std::vector<int64_t> ids) {
    Bytes in(ids.size() * kBlockBytes, 0xEE);
    return ScatterBlocksCpu(in.data(), kBlockBytes, kNumBlocks, ids, pool_.data());
  }
  absl::Status Gather(std::vector<int64_t> ids, Bytes* out) {
    out->assign(ids.size() * kBlockBytes, 0);
    return GatherBlocksCpu(pool_.data(), kBlockBytes, kNumBlocks, ids, out->data());
  }
  Bytes pool_;
  Bytes before_;
};

TEST_F(BlockCopyCpuErrors, CopyLengthMismatch) {
  EXPECT_THAT(Copy({0, 1}, {2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "src has 2 ids but dst has 1"));
}

TEST_F(BlockCopyCpuErrors, CopyIdOutOfRange) {
  EXPECT_THAT(Copy({0, 8}, {1, 2}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "src[1] = 8 is out of range [0, 8) (use -1 to skip a slot)"));
  EXPECT_THAT(Copy({0, 1}, {2, -2}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "dst[1] = -2 is out of range [0, 8) (use -1 to skip a slot)"));
  // Range is checked even in a pair whose other side is skipped.
  EXPECT_THAT(Copy({-1}, {100}), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("dst[0]")));
  EXPECT_THAT(Copy({std::numeric_limits<int64_t>::min()}, {0}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("src[0]")));
}

TEST_F(BlockCopyCpuErrors, CopyDstWrittenTwice) {
  EXPECT_THAT(Copy({0, 1, 2}, {4, 5, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "block 4 is written twice (as dst of pairs 0 and 2)"));
}

TEST_F(BlockCopyCpuErrors, CopyDstIsAlsoSrc) {
  EXPECT_THAT(Copy({0, 3}, {3, 5}), StatusIs(absl::StatusCode::kInvalidArgument,
                                             "block 3 is both a src (pair 1) and a dst (pair 0)"));
  EXPECT_THAT(Copy({2}, {2}), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "block 2 is both a src (pair 0) and a dst (pair 0)"));
}

TEST_F(BlockCopyCpuErrors, CopyBadGeometryAndNullPool) {
  const std::vector<int64_t> src = {0}, dst = {1};
  EXPECT_THAT(
      CopyBlocksCpu(pool_.data(), 0, kNumBlocks, src, dst),
      StatusIs(absl::StatusCode::kInvalidArgument, "CopyBlocksCpu: block_bytes must be > 0"));
  EXPECT_THAT(CopyBlocksCpu(pool_.data(), std::numeric_limits<uint64_t>::max() / 2, 3, src, dst),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows uint64")));
  EXPECT_THAT(CopyBlocksCpu(nullptr, kBlockBytes, kNumBlocks, src, dst),
              StatusIs(absl::StatusCode::kInvalidArgument, "CopyBlocksCpu: pool is null"));
}

TEST_F(BlockCopyCpuErrors, GatherErrors) {
  Bytes out;
  EXPECT_THAT(Gather({1, 9}, &out),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "block_ids[1] = 9 is out of range [0, 8) (use -1 to skip a slot)"));
  EXPECT_THAT(Gather({-3}, &out), StatusIs(absl::StatusCode::kOutOfRange,
                                           HasSubstr("block_ids[0] = -3 is out of range")));
  const std::vector<int64_t> ids = {0};
  EXPECT_THAT(GatherBlocksCpu(pool_.data(), kBlockBytes, kNumBlocks, ids, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "GatherBlocksCpu: out is null"));
  EXPECT_THAT(GatherBlocksCpu(nullptr, kBlockBytes, kNumBlocks, ids, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, "GatherBlocksCpu: pool is null"));
  EXPECT_THAT(
      GatherBlocksCpu(pool_.data(), 0, kNumBlocks, ids, out.data()),
      StatusIs(absl::StatusCode::kInvalidArgument, "GatherBlocksCpu: block_bytes must be > 0"));
  const std::vector<int64_t> three = {0, 0, 0};
  EXPECT_THAT(
      GatherBlocksCpu(pool_.data(), std::numeric_limits<uint64_t>::max() / 2, 2, three, out.data()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slots")));
}

TEST_F(BlockCopyCpuErrors, ScatterErrors) {
  EXPECT_THAT(Scatter({2, 5, 2}), StatusIs(absl::StatusCode::kInvalidArgument,
                                           "block 2 is written twice (by slots 0 and 2)"));
  EXPECT_THAT(Scatter({8}),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "block_ids[0] = 8 is out of range [0, 8) (use -1 to skip a slot)"));
  const std::vector<int64_t> ids = {0};
  Bytes in(kBlockBytes);
  EXPECT_THAT(ScatterBlocksCpu(nullptr, kBlockBytes, kNumBlocks, ids, pool_.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, "ScatterBlocksCpu: in is null"));
  EXPECT_THAT(ScatterBlocksCpu(in.data(), kBlockBytes, kNumBlocks, ids, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "ScatterBlocksCpu: pool is null"));
  EXPECT_THAT(
      ScatterBlocksCpu(in.data(), 0, kNumBlocks, ids, pool_.data()),
      StatusIs(absl::StatusCode::kInvalidArgument, "ScatterBlocksCpu: block_bytes must be > 0"));
}

TEST(ValidateIds, HostChecksUsableBeforeUpload) {
  const std::vector<int64_t> a = {0, 1}, b = {2, 3};
  EXPECT_OK(ValidateCopyIds(4, a, b));
  EXPECT_THAT(ValidateCopyIds(4, a, a), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(ValidateBlockIds(4, std::vector<int64_t>{1, 1, -1}, /*unique_targets=*/false));
  EXPECT_THAT(
      ValidateBlockIds(4, std::vector<int64_t>{1, 1}, /*unique_targets=*/true),
      StatusIs(absl::StatusCode::kInvalidArgument, "block 1 is written twice (by slots 0 and 1)"));
  EXPECT_THAT(ValidateBlockIds(0, std::vector<int64_t>{0}, false),
              StatusIs(absl::StatusCode::kOutOfRange));
}

// --- The CUDA entry points without a device. ---

// Checked on the host (block_copy.cc) before anything is enqueued: no device is needed, and a
// build without CUDA answers the same.
TEST(BlockCopyCudaHost, LauncherChecks) {
  uint8_t* const fake = reinterpret_cast<uint8_t*>(uintptr_t{256});  // never dereferenced
  const int64_t* const fake_ids = reinterpret_cast<const int64_t*>(uintptr_t{512});
  EXPECT_OK(CopyBlocksCuda(nullptr, 16, 4, nullptr, nullptr, 0, nullptr));
  EXPECT_OK(GatherBlocksCuda(nullptr, 16, 4, nullptr, 0, nullptr, nullptr));
  EXPECT_OK(ScatterBlocksCuda(nullptr, 16, 4, nullptr, 0, nullptr, nullptr));
  EXPECT_THAT(
      CopyBlocksCuda(fake, 0, 4, fake_ids, fake_ids, 1, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, "CopyBlocksCuda: block_bytes must be > 0"));
  EXPECT_THAT(CopyBlocksCuda(fake, 16, 4, nullptr, fake_ids, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "CopyBlocksCuda: src_ids is null"));
  EXPECT_THAT(CopyBlocksCuda(fake, 16, 4, fake_ids, nullptr, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "CopyBlocksCuda: dst_ids is null"));
  EXPECT_THAT(CopyBlocksCuda(nullptr, 16, 4, fake_ids, fake_ids, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "CopyBlocksCuda: pool is null"));
  EXPECT_THAT(GatherBlocksCuda(fake, 16, 4, fake_ids, 1, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "GatherBlocksCuda: out is null"));
  EXPECT_THAT(GatherBlocksCuda(fake, 16, 4, nullptr, 1, fake, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "GatherBlocksCuda: block_ids is null"));
  EXPECT_THAT(GatherBlocksCuda(fake, std::numeric_limits<uint64_t>::max() / 2, 3, fake_ids, 1, fake,
                               nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows uint64")));
  EXPECT_THAT(ScatterBlocksCuda(nullptr, 16, 4, fake_ids, 1, fake, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "ScatterBlocksCuda: in is null"));
  EXPECT_THAT(ScatterBlocksCuda(fake, 16, 4, fake_ids, 1, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "ScatterBlocksCuda: pool is null"));
}

// A well-formed call reaches the launch, which fails without a device: FAILED_PRECONDITION in
// every build, with the CUDA error's text or "built without CUDA". (With a device this would
// launch on fake pointers, so it only runs where there is none.)
TEST(BlockCopyCudaHost, LaunchWithoutADeviceIsFailedPrecondition) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present";
  uint8_t* const fake = reinterpret_cast<uint8_t*>(uintptr_t{256});  // never dereferenced
  const int64_t* const fake_ids = reinterpret_cast<const int64_t*>(uintptr_t{512});
  const auto launch_failed = [](const char* op) {
    return StatusIs(absl::StatusCode::kFailedPrecondition,
                    HasSubstr(BuiltWithCuda() ? std::string(op) + ": kernel launch failed: "
                                              : std::string("built without CUDA")));
  };
  EXPECT_THAT(CopyBlocksCuda(fake, 16, 4, fake_ids, fake_ids, 1, nullptr),
              launch_failed("CopyBlocksCuda"));
  EXPECT_THAT(GatherBlocksCuda(fake, 16, 4, fake_ids, 1, fake, nullptr),
              launch_failed("GatherBlocksCuda"));
  EXPECT_THAT(ScatterBlocksCuda(fake, 16, 4, fake_ids, 1, fake, nullptr),
              launch_failed("ScatterBlocksCuda"));
}

}  // namespace
}  // namespace kvcache::kernels