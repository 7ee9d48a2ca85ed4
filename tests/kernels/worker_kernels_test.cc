// Host-side parts of kernels/worker_kernels.h that need no device, in every build: the Validate*
// checks of the device index arrays, and the launchers' argument checks with their exact codes
// and messages. On a machine without a device, a well-formed launch must come back
// FAILED_PRECONDITION (with the CUDA error text, or "built without CUDA").
// The launchers never touch memory on the host, so the "device pointers" here are fake addresses;
// no case that reaches a launch runs where a device exists.
#include "kernels/worker_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::kernels {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// ValidateSlotMapping
// ---------------------------------------------------------------------------------------------

TEST(ValidateSlotMappingTest, AcceptsDistinctSlotsAndSkips) {
  // 3 blocks of 4 tokens: slots [0, 12).
  const std::vector<int64_t> slots = {0, 11, kSkipSlot, 5, kSkipSlot, 4};
  EXPECT_OK(ValidateSlotMapping(slots, 3, 4));
  EXPECT_OK(ValidateSlotMapping({}, 3, 4));
  EXPECT_OK(ValidateSlotMapping(std::vector<int64_t>{kSkipSlot, kSkipSlot}, 0, 4));
}

TEST(ValidateSlotMappingTest, RejectsOutOfRangeSlots) {
  EXPECT_THAT(ValidateSlotMapping(std::vector<int64_t>{0, 12}, 3, 4),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("slot_mapping[1] = 12")));
  EXPECT_THAT(ValidateSlotMapping(std::vector<int64_t>{-2}, 3, 4),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("slot_mapping[0] = -2")));
  EXPECT_THAT(ValidateSlotMapping(std::vector<int64_t>{0}, 0, 4),
              StatusIs(absl::StatusCode::kOutOfRange));
}

TEST(ValidateSlotMappingTest, RejectsRepeatedSlots) {
  EXPECT_THAT(ValidateSlotMapping(std::vector<int64_t>{3, kSkipSlot, 7, 3}, 3, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("slot_mapping[0] and slot_mapping[3] both write slot 3")));
}

TEST(ValidateSlotMappingTest, RejectsZeroBlockSizeAndSaturatesHugePools) {
  EXPECT_THAT(ValidateSlotMapping(std::vector<int64_t>{0}, 3, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
  // num_pool_blocks * block_size overflows: every non-negative int64 slot is in range.
  EXPECT_OK(ValidateSlotMapping(std::vector<int64_t>{std::numeric_limits<int64_t>::max()},
                                std::numeric_limits<uint64_t>::max(), 16));
}

// ---------------------------------------------------------------------------------------------
// ValidatePagedAttentionInputs
// ---------------------------------------------------------------------------------------------

// Two sequences, tables of 3 entries, blocks of 4 tokens, a pool of 10 blocks. Sequence 1's last
// entry is padding (99) that no token reads.
class ValidateAttentionTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kSeqs = 2, kMaxBlocks = 3, kBlockSize = 4, kPoolBlocks = 10;
  std::vector<uint32_t> tables_ = {0, 5, 9, /**/ 2, 3, 99};
};

TEST_F(ValidateAttentionTest, AcceptsReadEntriesInThePool) {
  const std::vector<uint32_t> positions = {11, 0, 7, 5};
  const std::vector<uint32_t> seq_ids = {0, 0, 1, 1};
  EXPECT_OK(ValidatePagedAttentionInputs(positions, seq_ids, tables_, kSeqs, kMaxBlocks, kBlockSize,
                                         kPoolBlocks));
  // No seq ids: every token is in sequence 0.
  EXPECT_OK(ValidatePagedAttentionInputs(positions, {}, tables_, kSeqs, kMaxBlocks, kBlockSize,
                                         kPoolBlocks));
  EXPECT_OK(
      ValidatePagedAttentionInputs({}, {}, tables_, kSeqs, kMaxBlocks, kBlockSize, kPoolBlocks));
}

TEST_F(ValidateAttentionTest, RejectsAReadEntryOutsideThePool) {
  const std::vector<uint32_t> positions = {3, 8};
  const std::vector<uint32_t> seq_ids = {0, 1};
  EXPECT_THAT(ValidatePagedAttentionInputs(positions, seq_ids, tables_, kSeqs, kMaxBlocks,
                                           kBlockSize, kPoolBlocks),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("block_tables[1][2] = 99 (read by token 1)")));
  // A pool of 9 blocks makes sequence 0's entry 2 (block 9) bad once position 8+ reads it.
  EXPECT_OK(ValidatePagedAttentionInputs(std::vector<uint32_t>{7}, {}, tables_, kSeqs, kMaxBlocks,
                                         kBlockSize, 9));
  EXPECT_THAT(ValidatePagedAttentionInputs(std::vector<uint32_t>{8}, {}, tables_, kSeqs, kMaxBlocks,
                                           kBlockSize, 9),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("block_tables[0][2] = 9")));
}

TEST_F(ValidateAttentionTest, RejectsPositionsPastCapacityAndBadSeqIds) {
  EXPECT_THAT(ValidatePagedAttentionInputs(std::vector<uint32_t>{12}, {}, tables_, kSeqs,
                                           kMaxBlocks, kBlockSize, kPoolBlocks),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("positions[0] = 12")));
  EXPECT_THAT(ValidatePagedAttentionInputs(std::vector<uint32_t>{0, 1}, std::vector<uint32_t>{0, 2},
                                           tables_, kSeqs, kMaxBlocks, kBlockSize, kPoolBlocks),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seq_ids[1] = 2")));
}

TEST_F(ValidateAttentionTest, RejectsMismatchedSizesAndZeroDimensions) {
  const std::vector<uint32_t> positions = {0, 1};
  EXPECT_THAT(ValidatePagedAttentionInputs(positions, std::vector<uint32_t>{0}, tables_, kSeqs,
                                           kMaxBlocks, kBlockSize, kPoolBlocks),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 seq ids for 2")));
  EXPECT_THAT(
      ValidatePagedAttentionInputs(positions, {}, tables_, kSeqs, 2, kBlockSize, kPoolBlocks),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_tables has 6")));
  for (const auto& [seqs, max_blocks, block_size] :
       std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>{{0, 3, 4}, {2, 0, 4}, {2, 3, 0}}) {
    EXPECT_THAT(ValidatePagedAttentionInputs(positions, {}, tables_, seqs, max_blocks, block_size,
                                             kPoolBlocks),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be > 0")));
  }
}

// ---------------------------------------------------------------------------------------------
// Launcher argument checks
// ---------------------------------------------------------------------------------------------

// A host-side argument error: INVALID_ARGUMENT whose message contains `what`. The checks run
// before the launch (worker_kernels_args.cc), so every build answers the same.
void ExpectArgError(const absl::Status& status, const std::string& what) {
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(what)));
}

// Fake, suitably aligned device addresses. Never dereferenced on the host.
template <typename T>
T* Fake(uintptr_t address = 0x10000) {
  return reinterpret_cast<T*>(address);
}

PoolLayout SmallLayout(DType dtype = DType::kBFloat16) {
  PoolLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 8;
  layout.block_size = 4;
  layout.dtype = dtype;
  return layout;
}

TEST(WorkerKernelArgsTest, RmsNorm) {
  const float* x = Fake<const float>();
  const float* w = Fake<const float>();
  float* out = Fake<float>();
  ExpectArgError(RmsNormCuda(x, w, 1e-6f, 4, 0, out, nullptr), "RmsNormCuda: dim must be > 0");
  ExpectArgError(RmsNormCuda(x, w, 1e-6f, 0, 0, out, nullptr), "dim must be > 0");
  EXPECT_OK(RmsNormCuda(nullptr, nullptr, 1e-6f, 0, 16, nullptr, nullptr));
  ExpectArgError(RmsNormCuda(nullptr, w, 1e-6f, 4, 16, out, nullptr), "RmsNormCuda: x is null");
  ExpectArgError(RmsNormCuda(x, nullptr, 1e-6f, 4, 16, out, nullptr), "weight is null");
  ExpectArgError(RmsNormCuda(x, w, 1e-6f, 4, 16, nullptr, nullptr), "out is null");
}

TEST(WorkerKernelArgsTest, Rope) {
  float* x = Fake<float>();
  const uint32_t* pos = Fake<const uint32_t>();
  ExpectArgError(RopeCuda(x, pos, 3, 0, 8, 1e4, nullptr), "RopeCuda: num_heads must be > 0");
  for (uint32_t head_dim : {0u, 7u, kMaxCudaHeadDim + 2}) {
    ExpectArgError(RopeCuda(x, pos, 3, 2, head_dim, 1e4, nullptr), "must be even and in [2, 1024]");
  }
  for (double theta : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
    ExpectArgError(RopeCuda(x, pos, 3, 2, 8, theta, nullptr), "must be positive and finite");
  }
  EXPECT_OK(RopeCuda(nullptr, nullptr, 0, 2, 8, 1e4, nullptr));
  ExpectArgError(RopeCuda(nullptr, pos, 3, 2, 8, 1e4, nullptr), "RopeCuda: x is null");
  for (uint32_t rotary_dim : {0u, 3u, 10u}) {
    ExpectArgError(
        PartialRopeCuda(x, pos, 3, 2, 8, rotary_dim, 1e4, nullptr),
        "rotary_dim " + std::to_string(rotary_dim) + " must be even and in [2, head_dim 8]");
  }
  ExpectArgError(RopeCuda(x, nullptr, 3, 2, 8, 1e4, nullptr), "positions is null");
}

TEST(WorkerKernelArgsTest, WriteKvLayoutAndPool) {
  const float* k = Fake<const float>();
  const float* v = Fake<const float>();
  const int64_t* slots = Fake<const int64_t>();
  uint8_t* pool = Fake<uint8_t>();
  PoolLayout bad = SmallLayout();
  bad.head_dim = 0;
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, bad, 8, pool, nullptr),
                 "WriteKvCuda: layout fields must be in [1, 65536]");
  bad = SmallLayout();
  bad.block_size = 70000;
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, bad, 8, pool, nullptr), "layout fields");
  bad = SmallLayout();
  bad.dtype = static_cast<DType>(99);
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, bad, 8, pool, nullptr), "unknown dtype 99");
  bad = SmallLayout();
  bad.num_layers = 1024;
  bad.num_kv_heads = 64;
  bad.head_dim = 256;
  bad.block_size = 64;  // 1024 * 2 * 64 * 64 * 256 * 2 bytes = 4 GiB
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, bad, 8, pool, nullptr), "exceeds 1 GiB");
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 2, SmallLayout(), 8, pool, nullptr),
                 "layer 2 out of range: the pool has 2");
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, SmallLayout(), 0, pool, nullptr),
                 "num_pool_blocks must be > 0");
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, SmallLayout(),
                             std::numeric_limits<uint64_t>::max() / 2, pool, nullptr),
                 "overflows uint64");
  // The layout is checked even with no tokens; then nothing else is.
  ExpectArgError(WriteKvCuda(nullptr, nullptr, nullptr, 0, 0, bad, 8, nullptr, nullptr),
                 "exceeds 1 GiB");
  EXPECT_OK(WriteKvCuda(nullptr, nullptr, nullptr, 0, 0, SmallLayout(), 8, nullptr, nullptr));
}

// A pool whose pages hold more than the KV (the hybrid's [kv | state]) gives its page stride; one
// below the KV block, or not a multiple of the element size, is refused by both kernels.
TEST(WorkerKernelArgsTest, PageStrideBelowTheKvBlockOrMisalignedIsRefused) {
  const float* k = Fake<const float>();
  const float* v = Fake<const float>();
  const int64_t* slots = Fake<const int64_t>();
  const uint32_t* pos = Fake<const uint32_t>();
  const uint32_t* tables = Fake<const uint32_t>();
  const float* q = Fake<const float>();
  float* out = Fake<float>();
  uint8_t* pool = Fake<uint8_t>();
  const PoolLayout layout = SmallLayout();
  const uint64_t kv_bytes = layout.BlockBytes();
  const std::string below = "page stride " + std::to_string(kv_bytes - 2) + " is below";
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, layout, 8, pool, nullptr, kv_bytes - 2), below);
  ExpectArgError(PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 0, layout, 8, pool, out,
                                    nullptr, kv_bytes - 2),
                 below);
  if (DTypeBytes(layout.dtype) > 1) {
    ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, layout, 8, pool, nullptr, kv_bytes + 1),
                   "not a multiple");
  }
  // The pool size counts pages, not KV blocks.
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, layout, std::numeric_limits<uint64_t>::max() / 4,
                             pool, nullptr, kv_bytes * 8),
                 "overflows uint64");
}

TEST(WorkerKernelArgsTest, WriteKvPointers) {
  const float* k = Fake<const float>();
  const float* v = Fake<const float>();
  const int64_t* slots = Fake<const int64_t>();
  uint8_t* pool = Fake<uint8_t>();
  const PoolLayout layout = SmallLayout();
  ExpectArgError(WriteKvCuda(nullptr, v, slots, 3, 0, layout, 8, pool, nullptr), "k is null");
  ExpectArgError(WriteKvCuda(k, nullptr, slots, 3, 0, layout, 8, pool, nullptr), "v is null");
  ExpectArgError(WriteKvCuda(k, v, nullptr, 3, 0, layout, 8, pool, nullptr),
                 "slot_mapping is null");
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, layout, 8, nullptr, nullptr), "pool is null");
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, layout, 8, Fake<uint8_t>(0x10001), nullptr),
                 "pool is not aligned to its 2-byte elements");
  ExpectArgError(WriteKvCuda(k, v, slots, 3, 0, SmallLayout(DType::kFloat32), 8,
                             Fake<uint8_t>(0x10002), nullptr),
                 "4-byte elements");
}

TEST(WorkerKernelArgsTest, PagedAttention) {
  const float* q = Fake<const float>();
  const uint32_t* pos = Fake<const uint32_t>();
  const uint32_t* tables = Fake<const uint32_t>();
  const uint8_t* pool = Fake<const uint8_t>();
  float* out = Fake<float>();
  const PoolLayout layout = SmallLayout();  // 2 kv heads
  PoolLayout bad = layout;
  bad.num_kv_heads = 0;
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 0, bad, 8, pool, out, nullptr),
      "PagedAttentionCuda: layout fields");
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 5, layout, 8, pool, out, nullptr),
      "layer 5 out of range");
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 0, layout, 0, pool, out, nullptr),
      "num_pool_blocks must be > 0");
  for (uint32_t q_heads : {0u, 3u}) {
    ExpectArgError(PagedAttentionCuda(q, pos, nullptr, tables, 2, q_heads, 1, 3, 0, layout, 8, pool,
                                      out, nullptr),
                   "must be a positive multiple of num_kv_heads 2");
  }
  bad = layout;
  bad.head_dim = kMaxCudaHeadDim + 1;
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 0, bad, 8, pool, out, nullptr),
      "head_dim 1025 exceeds the kernel's 1024");
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 0, 3, 0, layout, 8, pool, out, nullptr),
      "num_seqs (0) and max_blocks_per_seq (3) must be > 0");
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 0, 0, layout, 8, pool, out, nullptr),
      "must be > 0");
  EXPECT_OK(PagedAttentionCuda(nullptr, nullptr, nullptr, nullptr, 0, 4, 1, 3, 0, layout, 8,
                               nullptr, nullptr, nullptr));
  ExpectArgError(PagedAttentionCuda(nullptr, pos, nullptr, tables, 2, 4, 1, 3, 0, layout, 8, pool,
                                    out, nullptr),
                 "q is null");
  ExpectArgError(
      PagedAttentionCuda(q, nullptr, nullptr, tables, 2, 4, 1, 3, 0, layout, 8, pool, out, nullptr),
      "positions is null");
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, nullptr, 2, 4, 1, 3, 0, layout, 8, pool, out, nullptr),
      "block_tables is null");
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 0, layout, 8, nullptr, out, nullptr),
      "pool is null");
  ExpectArgError(
      PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 0, layout, 8, pool, nullptr, nullptr),
      "out is null");
  ExpectArgError(PagedAttentionCuda(q, pos, nullptr, tables, 2, 4, 1, 3, 0, layout, 8,
                                    Fake<const uint8_t>(0x10003), out, nullptr),
                 "not aligned");
}

TEST(WorkerKernelArgsTest, MoeRoute) {
  const float* logits = Fake<const float>();
  uint32_t* ids = Fake<uint32_t>();
  float* weights = Fake<float>();
  for (const auto& [experts, top_k] : std::vector<std::pair<uint32_t, uint32_t>>{
           {0, 0}, {0, 1}, {8, 0}, {8, 9}, {kMaxCudaExperts + 1, 2}}) {
    ExpectArgError(MoeRouteCuda(logits, 3, experts, top_k, true, ids, weights, nullptr),
                   "MoeRouteCuda: need 1 <= top_k");
  }
  EXPECT_OK(MoeRouteCuda(nullptr, 0, 8, 2, true, nullptr, nullptr, nullptr));
  ExpectArgError(MoeRouteCuda(nullptr, 3, 8, 2, true, ids, weights, nullptr), "logits is null");
  ExpectArgError(MoeRouteCuda(logits, 3, 8, 2, true, nullptr, weights, nullptr),
                 "topk_ids is null");
  ExpectArgError(MoeRouteCuda(logits, 3, 8, 2, false, ids, nullptr, nullptr),
                 "topk_weights is null");
}

TEST(WorkerKernelArgsTest, ExpertSwiGlu) {
  const float* x = Fake<const float>();
  const float* w = Fake<const float>();
  float* ws = Fake<float>();
  float* out = Fake<float>();
  ExpectArgError(ExpertSwiGluCuda(x, w, w, w, 2, 0, 8, ws, out, nullptr),
                 "ExpertSwiGluCuda: hidden (0) and intermediate (8) must be > 0");
  ExpectArgError(ExpertSwiGluCuda(x, w, w, w, 2, 8, 0, ws, out, nullptr), "must be > 0");
  EXPECT_OK(
      ExpertSwiGluCuda(nullptr, nullptr, nullptr, nullptr, 0, 8, 8, nullptr, nullptr, nullptr));
  ExpectArgError(ExpertSwiGluCuda(nullptr, w, w, w, 2, 8, 8, ws, out, nullptr), "x is null");
  ExpectArgError(ExpertSwiGluCuda(x, nullptr, w, w, 2, 8, 8, ws, out, nullptr),
                 "gate_proj is null");
  ExpectArgError(ExpertSwiGluCuda(x, w, nullptr, w, 2, 8, 8, ws, out, nullptr), "up_proj is null");
  ExpectArgError(ExpertSwiGluCuda(x, w, w, nullptr, 2, 8, 8, ws, out, nullptr),
                 "down_proj is null");
  ExpectArgError(ExpertSwiGluCuda(x, w, w, w, 2, 8, 8, nullptr, out, nullptr), "workspace is null");
  ExpectArgError(ExpertSwiGluCuda(x, w, w, w, 2, 8, 8, ws, nullptr, nullptr), "out is null");
}

TEST(WorkerKernelArgsTest, Linear) {
  const float* x = Fake<const float>();
  const float* w = Fake<const float>();
  float* out = Fake<float>();
  ExpectArgError(LinearCuda(x, w, 2, 0, 8, false, out, nullptr),
                 "LinearCuda: in_features (0) and out_features (8) must be > 0");
  ExpectArgError(LinearCuda(x, w, 2, 8, 0, true, out, nullptr), "must be > 0");
  EXPECT_OK(LinearCuda(nullptr, nullptr, 0, 8, 8, false, nullptr, nullptr));
  ExpectArgError(LinearCuda(nullptr, w, 2, 8, 8, false, out, nullptr), "LinearCuda: x is null");
  ExpectArgError(LinearCuda(x, nullptr, 2, 8, 8, false, out, nullptr), "weight is null");
  ExpectArgError(LinearCuda(x, w, 2, 8, 8, false, nullptr, nullptr), "out is null");
}

TEST(WorkerKernelArgsTest, GatherRows) {
  const float* src = Fake<const float>();
  const uint32_t* ids = Fake<const uint32_t>();
  float* out = Fake<float>();
  ExpectArgError(GatherRowsCuda(src, 10, 0, ids, 2, out, nullptr),
                 "GatherRowsCuda: cols (0) and num_src_rows (10) must be > 0");
  ExpectArgError(GatherRowsCuda(src, 0, 4, ids, 2, out, nullptr), "must be > 0");
  EXPECT_OK(GatherRowsCuda(nullptr, 10, 4, nullptr, 0, nullptr, nullptr));
  ExpectArgError(GatherRowsCuda(nullptr, 10, 4, ids, 2, out, nullptr), "src is null");
  ExpectArgError(GatherRowsCuda(src, 10, 4, nullptr, 2, out, nullptr), "row_ids is null");
  ExpectArgError(GatherRowsCuda(src, 10, 4, ids, 2, nullptr, nullptr), "out is null");
}

TEST(WorkerKernelArgsTest, MoeCombine) {
  const float* y = Fake<const float>();
  const uint32_t* rows = Fake<const uint32_t>();
  const float* w = Fake<const float>();
  float* x = Fake<float>();
  ExpectArgError(MoeCombineCuda(y, 4, 8, rows, w, 2, 0, x, nullptr),
                 "MoeCombineCuda: top_k (0), hidden (8) and num_expert_rows (4) must be > 0");
  ExpectArgError(MoeCombineCuda(y, 4, 0, rows, w, 2, 2, x, nullptr), "must be > 0");
  ExpectArgError(MoeCombineCuda(y, 0, 8, rows, w, 2, 2, x, nullptr), "must be > 0");
  EXPECT_OK(MoeCombineCuda(nullptr, 4, 8, nullptr, nullptr, 0, 2, nullptr, nullptr));
  ExpectArgError(MoeCombineCuda(nullptr, 4, 8, rows, w, 2, 2, x, nullptr), "expert_out is null");
  ExpectArgError(MoeCombineCuda(y, 4, 8, nullptr, w, 2, 2, x, nullptr), "rows is null");
  ExpectArgError(MoeCombineCuda(y, 4, 8, rows, nullptr, 2, 2, x, nullptr), "weights is null");
  ExpectArgError(MoeCombineCuda(y, 4, 8, rows, w, 2, 2, nullptr, nullptr), "x is null");
}

// A well-formed call reaches the launch, which fails without a device: the error must come back
// with its text, not be swallowed, and as FAILED_PRECONDITION in every build — the CUDA error (no
// usable device or driver; common/cuda/cuda_status.h), or "built without CUDA". (With a device
// this would launch on fake pointers, so it only runs where there is none.)
TEST(WorkerKernelArgsTest, LaunchWithoutADeviceIsFailedPrecondition) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present";
  const auto launch_failed = [](const char* op) {
    return StatusIs(absl::StatusCode::kFailedPrecondition,
                    HasSubstr(BuiltWithCuda() ? std::string(op) + ": kernel launch failed: "
                                              : std::string("built without CUDA")));
  };
  float* f = Fake<float>();
  const uint32_t* u = Fake<const uint32_t>();
  EXPECT_THAT(RmsNormCuda(f, f, 1e-6f, 2, 16, f, nullptr), launch_failed("RmsNormCuda"));
  EXPECT_THAT(RopeCuda(f, u, 2, 2, 8, 1e4, nullptr), launch_failed("RopeCuda"));
  EXPECT_THAT(
      WriteKvCuda(f, f, Fake<const int64_t>(), 2, 1, SmallLayout(), 8, Fake<uint8_t>(), nullptr),
      launch_failed("WriteKvCuda"));
  EXPECT_THAT(PagedAttentionCuda(f, u, u, u, 2, 4, 1, 3, 1, SmallLayout(DType::kFp8E4M3), 8,
                                 Fake<const uint8_t>(), f, nullptr),
              launch_failed("PagedAttentionCuda"));
  EXPECT_THAT(MoeRouteCuda(f, 2, 8, 2, true, Fake<uint32_t>(), f, nullptr),
              launch_failed("MoeRouteCuda"));
  EXPECT_THAT(ExpertSwiGluCuda(f, f, f, f, 2, 8, 8, f, f, nullptr),
              launch_failed("ExpertSwiGluCuda"));
  EXPECT_THAT(LinearCuda(f, f, 2, 8, 8, true, f, nullptr), launch_failed("LinearCuda"));
  EXPECT_THAT(GatherRowsCuda(f, 4, 8, u, 2, f, nullptr), launch_failed("GatherRowsCuda"));
  EXPECT_THAT(MoeCombineCuda(f, 4, 8, u, f, 2, 2, f, nullptr), launch_failed("MoeCombineCuda"));
}

}  // namespace
}  // namespace kvcache::kernels
