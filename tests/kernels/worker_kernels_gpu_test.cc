// Each worker kernel (kernels/worker_kernels.h) against the worker model's CPU code on random
// inputs over several sizes and, for the pool kernels, every pool dtype. Skips when no CUDA
// device is present.
//
// What "matches" means:
//  - WriteKvCuda: byte for byte (memcmp of the whole pool) with PagedKv::WriteK / WriteV,
//    special values (NaN, inf, subnormals, rounding ties, saturation) included.
//  - MoeRouteCuda: the same expert ids in the same order (ties and NaN included); weights within
//    a 1e-5 relative tolerance (in practice equal: same order, exp correctly rounded on both).
//  - RmsNormCuda, RopeCuda: within 1e-5 relative (in practice equal or within an ulp: the only
//    differences are the double sum's order and CUDA's double pow / sin / cos).
//  - LinearCuda, GatherRowsCuda, MoeCombineCuda: bit for bit (memcmp) with worker::MatVec (+ the
//    residual add), the row copy, and the in-order weighted sum; LinearCuda also bit for bit
//    between a batch and its rows computed one at a time (batch invariance).
//  - PagedAttentionCuda, ExpertSwiGluCuda: within 2e-5 relative to the output's magnitude.
//    Bit-exactness with the CPU is NOT expected here: the dot products are summed by warp trees
//    (with FMA) instead of the CPU's eight lanes, and attention uses an online softmax over tiles
//    (rescaled running sums, one division at the end) instead of the CPU's softmax-then-sum.
// The float tolerance is |got - want| <= rtol * (|want| + max_i |want_i|): relative to the value
// and to the array's magnitude, so outputs that cancel to near zero are not held to a relative
// bound no summation order could meet.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_device.h"
#include "common/pool_layout.h"
#include "kernels/worker_kernels.h"
#include "model/ops.h"
#include "model/paged_kv.h"
#include "tests/testing/device_array.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::kernels {
namespace {

using ::kvcache::testing::DeviceArray;
using ::kvcache::testing::ExpectAllNear;

constexpr float kNear = 1e-5f;    // RmsNorm, RoPE, routing weights
constexpr float kSummed = 2e-5f;  // attention, expert matvecs (other summation order)

class WorkerKernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      cudaStreamDestroy(stream_);
    }
  }

  std::vector<float> Uniform(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  std::vector<uint8_t> RandomBytes(size_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng_());
    return v;
  }

  cudaStream_t stream_ = nullptr;
  std::mt19937 rng_{12345};
};

// ---------------------------------------------------------------------------------------------
// RMSNorm: worker::RmsNorm per row.
// ---------------------------------------------------------------------------------------------

TEST_F(WorkerKernelsGpuTest, RmsNormMatchesCpu) {
  struct Shape {
    uint32_t rows, dim;
  };
  for (const Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{4, 32}, Shape{5, 128}, Shape{17, 1000},
                        Shape{2, 4097}, Shape{64, 2048}, Shape{300, 128}}) {
    for (const bool in_place : {false, true}) {
      const std::string what =
          absl::StrCat("rows=", s.rows, " dim=", s.dim, in_place ? " in place" : "");
      const float eps = 1e-6f;
      const std::vector<float> x = Uniform(size_t{s.rows} * s.dim, -3, 3);
      const std::vector<float> weight = Uniform(s.dim, 0.5f, 1.5f);
      std::vector<float> want(x.size());
      for (uint32_t r = 0; r < s.rows; ++r) {
        worker::RmsNorm(&x[size_t{r} * s.dim], weight.data(), s.dim, eps, &want[size_t{r} * s.dim]);
      }
      DeviceArray<float> d_x(x), d_w(weight), d_out(x.size());
      float* out = in_place ? d_x.get() : d_out.get();
      ASSERT_OK(RmsNormCuda(d_x.get(), d_w.get(), eps, s.rows, s.dim, out, stream_));
      ExpectAllNear(in_place ? d_x.Download() : d_out.Download(), want, kNear, what);
    }
  }
}

TEST_F(WorkerKernelsGpuTest, RmsNormOnTheDefaultStream) {
  const std::vector<float> x = Uniform(6 * 64, -1, 1);
  const std::vector<float> weight = Uniform(64, 0.5f, 1.5f);
  std::vector<float> want(x.size());
  for (size_t r = 0; r < 6; ++r) {
    worker::RmsNorm(&x[r * 64], weight.data(), 64, 1e-5f, &want[r * 64]);
  }
  DeviceArray<float> d_x(x), d_w(weight), d_out(x.size());
  ASSERT_OK(RmsNormCuda(d_x.get(), d_w.get(), 1e-5f, 6, 64, d_out.get(), nullptr));
  ExpectAllNear(d_out.Download(), want, kNear, "default stream");
}

// ---------------------------------------------------------------------------------------------
// RoPE: worker::RopeInverseFrequencies + RopeCosSin + ApplyRope per token and head.
// ---------------------------------------------------------------------------------------------

// RopeCuda, and PartialRopeCuda (rotary_dim < head_dim: the other dims pass through).
TEST_F(WorkerKernelsGpuTest, RopeMatchesCpu) {
  struct Shape {
    uint32_t tokens, heads, head_dim, rotary_dim;
    double theta;
  };
  for (const Shape s :
       {Shape{1, 1, 2, 2, 10000}, Shape{3, 4, 8, 8, 10000}, Shape{7, 16, 128, 128, 1e6},
        Shape{5, 2, 256, 256, 10000}, Shape{2, 3, 1024, 1024, 5e5}, Shape{40, 4, 64, 64, 10000},
        Shape{3, 1, 6, 6, 10000}, Shape{9, 4, 16, 4, 10000}, Shape{6, 2, 256, 64, 1e7},
        Shape{3, 3, 10, 2, 10000}}) {
    const std::string what =
        absl::StrCat("tokens=", s.tokens, " heads=", s.heads, " head_dim=", s.head_dim,
                     " rotary_dim=", s.rotary_dim, " theta=", s.theta);
    std::vector<float> x = Uniform(size_t{s.tokens} * s.heads * s.head_dim, -2, 2);
    std::vector<uint32_t> positions(s.tokens);
    std::uniform_int_distribution<uint32_t> pos_dist(0, 40000);
    for (uint32_t& p : positions) p = pos_dist(rng_);
    positions[0] = 0;  // the identity
    DeviceArray<float> d_x(x);
    DeviceArray<uint32_t> d_pos(positions);
    if (s.rotary_dim == s.head_dim) {
      ASSERT_OK(RopeCuda(d_x.get(), d_pos.get(), s.tokens, s.heads, s.head_dim, s.theta, stream_));
    } else {
      ASSERT_OK(PartialRopeCuda(d_x.get(), d_pos.get(), s.tokens, s.heads, s.head_dim, s.rotary_dim,
                                s.theta, stream_));
    }

    const std::vector<double> inv_freq = worker::RopeInverseFrequencies(s.rotary_dim, s.theta);
    std::vector<float> cos(s.rotary_dim / 2), sin(s.rotary_dim / 2);
    for (uint32_t t = 0; t < s.tokens; ++t) {
      worker::RopeCosSin(positions[t], inv_freq, cos.data(), sin.data());
      for (uint32_t h = 0; h < s.heads; ++h) {
        worker::ApplyRope(&x[(size_t{t} * s.heads + h) * s.head_dim], s.rotary_dim, cos.data(),
                          sin.data());
      }
    }
    ExpectAllNear(d_x.Download(), x, kNear, what);
  }
}

// ---------------------------------------------------------------------------------------------
// KV write: PagedKv::WriteK / WriteV, byte for byte.
// ---------------------------------------------------------------------------------------------

struct PoolCase {
  uint32_t layers, kv_heads, head_dim, block_size;
};

std::vector<PoolCase> PoolCases() {
  return {{1, 1, 1, 1}, {3, 2, 8, 4}, {2, 4, 128, 16}, {2, 8, 64, 32}, {2, 1, 3, 5}};
}

PoolLayout MakeLayout(const PoolCase& c, DType dtype) {
  PoolLayout layout;
  layout.num_layers = c.layers;
  layout.num_kv_heads = c.kv_heads;
  layout.head_dim = c.head_dim;
  layout.block_size = c.block_size;
  layout.dtype = dtype;
  return layout;
}

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                DType::kFp8E4M3};

// Values that exercise every conversion path: zeros, infinities, NaNs, fp32 subnormals, fp16 /
// fp8 subnormals, exact rounding ties for bf16 and fp16, values around the fp8 saturation (448)
// and fp16 overflow (65504 / 65520) points, then random magnitudes from 1e-8 to 1e5.
std::vector<float> KvValues(size_t n, std::mt19937& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> specials = {
      0.0f, -0.0f, inf, -inf, nan, -nan,
      // fp32 subnormals; fp16 subnormal range and its underflow edge (2^-25 = 2.98e-8).
      1e-40f, -1e-42f, 6e-8f, 3e-8f, 2.9e-8f,
      // fp8 subnormal range (2^-9 = 0.001953125) and its edges.
      0.0009765625f, 0.001953125f, 0.0029296875f,
      // Ties: bf16 at 1 + 2^-8 (to even: 1) and 1 + 3 * 2^-8 (up); fp16 at 1 + 2^-11;
      // fp8 at 1 + 2^-4 and 1 + 3 * 2^-4.
      1.00390625f, 1.01171875f, 1.00048828125f, 1.0625f, 1.1875f,
      // fp8 saturation (448) and fp16 overflow (65504 max, 65520 rounds to inf).
      448.0f, 449.0f, 464.0f, 480.0f, -1000.0f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 3.4e38f,
      0.1f, -0.3f};
  std::vector<float> v(n);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> scale_exp(-8, 5);
  for (size_t i = 0; i < n; ++i) {
    if (i % 3 == 0) {
      v[i] = specials[(i / 3) % specials.size()];
    } else {
      v[i] = unit(rng) * std::pow(10.0f, static_cast<float>(scale_exp(rng)));
    }
  }
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

TEST_F(WorkerKernelsGpuTest, WriteKvMatchesPagedKvByteForByte) {
  constexpr uint64_t kPoolBlocks = 9;
  for (const PoolCase& c : PoolCases()) {
    for (const DType dtype : kAllDTypes) {
      const PoolLayout layout = MakeLayout(c, dtype);
      for (uint32_t layer = 0; layer < c.layers; layer += std::max(1u, c.layers - 1)) {
        const std::string what = absl::StrCat(layout.DebugString(), " layer=", layer);
        const uint32_t token_elems = c.kv_heads * c.head_dim;
        const uint64_t num_slots = kPoolBlocks * c.block_size;
        // Distinct slots in random order, some skipped; plus slots outside the pool, which the
        // kernel documents as skips.
        std::vector<int64_t> slots(num_slots);
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng_);
        slots.resize(std::min<uint64_t>(num_slots, 23));
        for (size_t i = 0; i < slots.size(); i += 4) slots[i] = kSkipSlot;
        slots.push_back(static_cast<int64_t>(num_slots));  // one past the pool
        slots.push_back(-5);
        std::shuffle(slots.begin(), slots.end(), rng_);
        const uint32_t num_tokens = static_cast<uint32_t>(slots.size());
        const std::vector<float> k = KvValues(size_t{num_tokens} * token_elems, rng_);
        const std::vector<float> v = KvValues(size_t{num_tokens} * token_elems, rng_);
        std::vector<uint8_t> pool = RandomBytes(kPoolBlocks * layout.BlockBytes());

        DeviceArray<uint8_t> d_pool(pool);
        DeviceArray<float> d_k(k), d_v(v);
        DeviceArray<int64_t> d_slots(slots);
        ASSERT_OK(WriteKvCuda(d_k.get(), d_v.get(), d_slots.get(), num_tokens, layer, layout,
                              kPoolBlocks, d_pool.get(), stream_));

        // CPU: a one-entry block table per token puts it at block slot / block_size.
        for (uint32_t t = 0; t < num_tokens; ++t) {
          if (slots[t] < 0 || static_cast<uint64_t>(slots[t]) >= num_slots) continue;
          const uint32_t block = static_cast<uint32_t>(slots[t] / c.block_size);
          const uint32_t in_block = static_cast<uint32_t>(slots[t] % c.block_size);
          worker::PagedKv view(pool.data(), layout, absl::MakeConstSpan(&block, 1));
          ASSERT_OK(view.WriteK(layer, in_block, &k[size_t{t} * token_elems]));
          ASSERT_OK(view.WriteV(layer, in_block, &v[size_t{t} * token_elems]));
        }
        const std::vector<uint8_t> got = d_pool.Download();
        ASSERT_EQ(got.size(), pool.size());
        EXPECT_EQ(std::memcmp(got.data(), pool.data(), pool.size()), 0) << what;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Paged attention: Qwen3MoeModel::Attention's loop over K/V read back through PagedKv.
// ---------------------------------------------------------------------------------------------

// The CPU reference, written as qwen3_moe.cc's attention (Dot, scale, Softmax, then sum of
// p * v in position order), with the kernel's documented device-index semantics: positions whose
// block id is outside the pool are left out; a bad seq id or a position past the table's capacity
// gives NaN.
std::vector<float> ReferenceAttention(std::vector<uint8_t>& pool, const PoolLayout& layout,
                                      uint64_t num_pool_blocks, uint32_t layer,
                                      const std::vector<float>& q,
                                      const std::vector<uint32_t>& positions,
                                      const std::vector<uint32_t>& seq_ids,
                                      const std::vector<uint32_t>& tables, uint32_t num_seqs,
                                      uint32_t max_blocks, uint32_t q_heads) {
  const uint32_t head_dim = layout.head_dim;
  const uint32_t kv_dim = layout.num_kv_heads * head_dim;
  const uint32_t group = q_heads / layout.num_kv_heads;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  std::vector<float> out(q.size());
  for (size_t t = 0; t < positions.size(); ++t) {
    const uint32_t seq = seq_ids.empty() ? 0 : seq_ids[t];
    const uint64_t position = positions[t];
    float* out_token = &out[t * q_heads * head_dim];
    if (seq >= num_seqs || position >= uint64_t{max_blocks} * layout.block_size) {
      std::fill(out_token, out_token + size_t{q_heads} * head_dim,
                std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const absl::Span<const uint32_t> table(&tables[size_t{seq} * max_blocks], max_blocks);
    worker::PagedKv kv(pool.data(), layout, table);
    std::vector<float> keys, values, key(kv_dim), value(kv_dim);
    for (uint64_t p = 0; p <= position; ++p) {
      if (table[p / layout.block_size] >= num_pool_blocks) continue;  // masked
      EXPECT_OK(kv.ReadK(layer, p, key.data()));
      EXPECT_OK(kv.ReadV(layer, p, value.data()));
      keys.insert(keys.end(), key.begin(), key.end());
      values.insert(values.end(), value.begin(), value.end());
    }
    const size_t visible = keys.size() / kv_dim;
    std::vector<float> scores(visible);
    for (uint32_t h = 0; h < q_heads; ++h) {
      const float* q_head = &q[(t * q_heads + h) * head_dim];
      const size_t kv_offset = size_t{h / group} * head_dim;
      float* o = out_token + size_t{h} * head_dim;
      if (visible == 0) {
        std::fill(o, o + head_dim, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      for (size_t p = 0; p < visible; ++p) {
        scores[p] = worker::Dot(q_head, &keys[p * kv_dim + kv_offset], head_dim) * scale;
      }
      worker::Softmax(scores.data(), visible);
      std::fill(o, o + head_dim, 0.0f);
      for (size_t p = 0; p < visible; ++p) {
        const float* val = &values[p * kv_dim + kv_offset];
        for (uint32_t d = 0; d < head_dim; ++d) o[d] += scores[p] * val[d];
      }
    }
  }
  return out;
}

struct AttentionCase {
  uint32_t q_heads, kv_heads, head_dim, block_size;
  std::vector<uint32_t> seq_lens;  // tokens already in each sequence's K/V (context lengths)
  uint32_t queries_per_seq;        // the last queries_per_seq positions of each sequence query
};

std::string Describe(const AttentionCase& c, DType dtype) {
  return absl::StrCat("q_heads=", c.q_heads, " kv_heads=", c.kv_heads, " head_dim=", c.head_dim,
                      " block_size=", c.block_size, " seqs=", c.seq_lens.size(),
                      " dtype=", DTypeName(dtype));
}

class PagedAttentionGpuTest : public WorkerKernelsGpuTest {
 protected:
  // Builds a pool with `c`'s sequences in random, interleaved blocks (both layers written, the
  // rest random bytes), runs the kernel and the reference, and compares.
  void Run(const AttentionCase& c, DType dtype, bool corrupt_indices = false) {
    constexpr uint32_t kLayers = 2;
    constexpr uint32_t kLayer = 1;
    const PoolLayout layout =
        MakeLayout(PoolCase{kLayers, c.kv_heads, c.head_dim, c.block_size}, dtype);
    const std::string what = Describe(c, dtype) + (corrupt_indices ? " corrupt" : "");
    const uint32_t num_seqs = static_cast<uint32_t>(c.seq_lens.size());
    uint32_t max_blocks = 0;
    uint64_t blocks_needed = 0;
    for (uint32_t len : c.seq_lens) {
      const uint32_t blocks = (len + c.block_size - 1) / c.block_size;
      max_blocks = std::max(max_blocks, blocks + 1);  // one padding entry at least
      blocks_needed += blocks;
    }
    const uint64_t num_pool_blocks = blocks_needed + 3;
    std::vector<uint32_t> free_blocks(num_pool_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0u);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng_);
    // Padding entries point far outside the pool: the kernel must never read them.
    std::vector<uint32_t> tables(size_t{num_seqs} * max_blocks, 0xfffffff0u);
    std::vector<uint8_t> pool = RandomBytes(num_pool_blocks * layout.BlockBytes());
    const uint32_t kv_dim = c.kv_heads * c.head_dim;
    size_t next_free = 0;
    for (uint32_t s = 0; s < num_seqs; ++s) {
      const uint32_t blocks = (c.seq_lens[s] + c.block_size - 1) / c.block_size;
      for (uint32_t b = 0; b < blocks; ++b)
        tables[size_t{s} * max_blocks + b] = free_blocks[next_free++];
      worker::PagedKv kv(pool.data(), layout,
                         absl::MakeConstSpan(&tables[size_t{s} * max_blocks], blocks));
      for (uint32_t p = 0; p < c.seq_lens[s]; ++p) {
        for (uint32_t l = 0; l < kLayers; ++l) {
          const std::vector<float> k = Uniform(kv_dim, -1, 1);
          const std::vector<float> v = Uniform(kv_dim, -2, 2);
          ASSERT_OK(kv.WriteK(l, p, k.data()));
          ASSERT_OK(kv.WriteV(l, p, v.data()));
        }
      }
    }
    // Queries: the last queries_per_seq positions of each sequence, interleaved across sequences.
    std::vector<uint32_t> positions, seq_ids;
    for (uint32_t i = 0; i < c.queries_per_seq; ++i) {
      for (uint32_t s = 0; s < num_seqs; ++s) {
        if (i >= c.seq_lens[s]) continue;
        positions.push_back(c.seq_lens[s] - 1 - i);
        seq_ids.push_back(s);
      }
    }
    if (corrupt_indices) {
      // A seq id out of range, a position past the table, and a table entry outside the pool.
      seq_ids[0] = num_seqs;
      if (positions.size() > 1) positions[1] = max_blocks * c.block_size;
      tables[0] = static_cast<uint32_t>(num_pool_blocks + 7);
    } else {
      ASSERT_OK(ValidatePagedAttentionInputs(positions, seq_ids, tables, num_seqs, max_blocks,
                                             c.block_size, num_pool_blocks));
    }
    const uint32_t num_tokens = static_cast<uint32_t>(positions.size());
    const std::vector<float> q = Uniform(size_t{num_tokens} * c.q_heads * c.head_dim, -1, 1);
    // A single sequence runs without seq ids (the nullptr form).
    const bool no_seq_ids = num_seqs == 1 && !corrupt_indices;

    DeviceArray<uint8_t> d_pool(pool);
    DeviceArray<float> d_q(q), d_out(q.size());
    DeviceArray<uint32_t> d_pos(positions), d_seq(seq_ids), d_tables(tables);
    ASSERT_OK(PagedAttentionCuda(d_q.get(), d_pos.get(), no_seq_ids ? nullptr : d_seq.get(),
                                 d_tables.get(), num_tokens, c.q_heads, num_seqs, max_blocks,
                                 kLayer, layout, num_pool_blocks, d_pool.get(), d_out.get(),
                                 stream_));
    const std::vector<float> want = ReferenceAttention(
        pool, layout, num_pool_blocks, kLayer, q, positions,
        no_seq_ids ? std::vector<uint32_t>{} : seq_ids, tables, num_seqs, max_blocks, c.q_heads);
    ExpectAllNear(d_out.Download(), want, kSummed, what);
  }
};

std::vector<AttentionCase> AttentionCases() {
  return {
      // Prefill of one sequence: every position queries.
      {4, 2, 8, 4, {13}, 13},
      // Decode past one tile (256 positions): two and four tiles, MQA.
      {8, 1, 128, 16, {300}, 1},
      {2, 2, 64, 16, {1000}, 2},
      // One-token blocks; head_dim below a warp and odd.
      {2, 2, 3, 1, {9}, 9},
      {6, 3, 20, 1, {40}, 5},
      // Several sequences of different lengths, chunked-prefill style queries.
      {16, 4, 128, 16, {37, 1, 260, 16}, 6},
      // The largest head_dim the kernel takes.
      {2, 1, 1024, 8, {20}, 3},
      // Position 0 alone (context of one).
      {4, 4, 32, 16, {1}, 1},
  };
}

TEST_F(PagedAttentionGpuTest, MatchesCpuForEveryDType) {
  for (const AttentionCase& c : AttentionCases()) {
    for (const DType dtype : kAllDTypes) Run(c, dtype);
  }
}

TEST_F(PagedAttentionGpuTest, BadDeviceIndicesGiveNaNOrMaskInsteadOfFaulting) {
  Run({4, 2, 16, 4, {10, 30}, 4}, DType::kBFloat16, /*corrupt_indices=*/true);
  Run({2, 1, 64, 16, {100, 5}, 5}, DType::kFloat32, /*corrupt_indices=*/true);
}

// WriteKvCuda then PagedAttentionCuda on one stream, as a decode step runs: the new token's K/V
// are visible to its own query.
TEST_F(PagedAttentionGpuTest, WriteThenAttendOnOneStream) {
  const PoolLayout layout = MakeLayout(PoolCase{2, 2, 64, 16}, DType::kBFloat16);
  constexpr uint64_t kPoolBlocks = 6;
  const std::vector<uint32_t> table = {4, 1, 3};
  constexpr uint32_t kLen = 40, kQHeads = 4, kLayer = 1;
  const uint32_t kv_dim = layout.num_kv_heads * layout.head_dim;
  std::vector<uint8_t> pool(kPoolBlocks * layout.BlockBytes(), 0);
  const std::vector<float> k = Uniform(size_t{kLen} * kv_dim, -1, 1);
  const std::vector<float> v = Uniform(size_t{kLen} * kv_dim, -1, 1);
  std::vector<int64_t> slots(kLen);
  for (uint32_t p = 0; p < kLen; ++p) {
    slots[p] = int64_t{table[p / 16]} * 16 + p % 16;
  }
  std::vector<uint32_t> positions(kLen);
  std::iota(positions.begin(), positions.end(), 0u);
  const std::vector<float> q = Uniform(size_t{kLen} * kQHeads * layout.head_dim, -1, 1);

  DeviceArray<uint8_t> d_pool(pool);
  DeviceArray<float> d_k(k), d_v(v), d_q(q), d_out(q.size());
  DeviceArray<int64_t> d_slots(slots);
  DeviceArray<uint32_t> d_pos(positions), d_table(table);
  ASSERT_OK(WriteKvCuda(d_k.get(), d_v.get(), d_slots.get(), kLen, kLayer, layout, kPoolBlocks,
                        d_pool.get(), stream_));
  ASSERT_OK(PagedAttentionCuda(d_q.get(), d_pos.get(), nullptr, d_table.get(), kLen, kQHeads, 1, 3,
                               kLayer, layout, kPoolBlocks, d_pool.get(), d_out.get(), stream_));

  worker::PagedKv kv(pool.data(), layout, table);
  for (uint32_t p = 0; p < kLen; ++p) {
    ASSERT_OK(kv.WriteK(kLayer, p, &k[size_t{p} * kv_dim]));
    ASSERT_OK(kv.WriteV(kLayer, p, &v[size_t{p} * kv_dim]));
  }
  EXPECT_TRUE(d_pool.Download() == pool);
  const std::vector<float> want =
      ReferenceAttention(pool, layout, kPoolBlocks, kLayer, q, positions, {}, table, 1, 3, kQHeads);
  ExpectAllNear(d_out.Download(), want, kSummed, "write then attend");
}

// A pool of pages with bytes past the KV (the hybrid's [kv | state], page stride > KV block):
// WriteKvCuda and PagedAttentionCuda give bit-identical attention and KV bytes to an unstrided
// pool, the KV at each page's start, and leave the bytes past it untouched.
TEST_F(PagedAttentionGpuTest, AStridedPoolIsBitIdenticalToAnUnstridedOne) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFp8E4M3}) {
    const std::string what(DTypeName(dtype));
    const PoolLayout layout = MakeLayout(PoolCase{2, 2, 64, 16}, dtype);
    constexpr uint64_t kPoolBlocks = 6;
    const std::vector<uint32_t> table = {4, 1, 3};
    constexpr uint32_t kLen = 40, kQHeads = 4, kLayer = 1;
    const uint64_t kv_bytes = layout.BlockBytes();
    const uint64_t stride = kv_bytes + 3 * 256;  // a state part of 768 bytes after each page's KV
    const uint32_t kv_dim = layout.num_kv_heads * layout.head_dim;
    const std::vector<float> k = Uniform(size_t{kLen} * kv_dim, -1, 1);
    const std::vector<float> v = Uniform(size_t{kLen} * kv_dim, -1, 1);
    const std::vector<float> q = Uniform(size_t{kLen} * kQHeads * layout.head_dim, -1, 1);
    std::vector<int64_t> slots(kLen);
    for (uint32_t p = 0; p < kLen; ++p) slots[p] = int64_t{table[p / 16]} * 16 + p % 16;
    std::vector<uint32_t> positions(kLen);
    std::iota(positions.begin(), positions.end(), 0u);
    DeviceArray<float> d_k(k), d_v(v), d_q(q), d_plain_out(q.size()), d_strided_out(q.size());
    DeviceArray<int64_t> d_slots(slots);
    DeviceArray<uint32_t> d_pos(positions), d_table(table);

    DeviceArray<uint8_t> d_plain(std::vector<uint8_t>(kPoolBlocks * kv_bytes, 0));
    ASSERT_OK(WriteKvCuda(d_k.get(), d_v.get(), d_slots.get(), kLen, kLayer, layout, kPoolBlocks,
                          d_plain.get(), stream_));
    ASSERT_OK(PagedAttentionCuda(d_q.get(), d_pos.get(), nullptr, d_table.get(), kLen, kQHeads, 1,
                                 3, kLayer, layout, kPoolBlocks, d_plain.get(), d_plain_out.get(),
                                 stream_));
    // Zero KV (as the plain pool's), random bytes past it.
    std::vector<uint8_t> strided_before = RandomBytes(kPoolBlocks * stride);
    for (uint64_t b = 0; b < kPoolBlocks; ++b) {
      std::fill_n(strided_before.begin() + b * stride, kv_bytes, uint8_t{0});
    }
    DeviceArray<uint8_t> d_strided(strided_before);
    ASSERT_OK(WriteKvCuda(d_k.get(), d_v.get(), d_slots.get(), kLen, kLayer, layout, kPoolBlocks,
                          d_strided.get(), stream_, stride));
    ASSERT_OK(PagedAttentionCuda(d_q.get(), d_pos.get(), nullptr, d_table.get(), kLen, kQHeads, 1,
                                 3, kLayer, layout, kPoolBlocks, d_strided.get(),
                                 d_strided_out.get(), stream_, stride));
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);

    const std::vector<float> plain_out = d_plain_out.Download();
    const std::vector<float> strided_out = d_strided_out.Download();
    ASSERT_EQ(plain_out.size(), strided_out.size());
    EXPECT_EQ(std::memcmp(plain_out.data(), strided_out.data(), plain_out.size() * sizeof(float)),
              0)
        << what;
    const std::vector<uint8_t> plain = d_plain.Download();
    const std::vector<uint8_t> strided = d_strided.Download();
    for (uint64_t b = 0; b < kPoolBlocks; ++b) {
      const bool written = std::find(table.begin(), table.end(), b) != table.end();
      const uint8_t* page = strided.data() + b * stride;
      const uint8_t* page_before = strided_before.data() + b * stride;
      // The KV is the plain pool's block, byte for byte; every byte past it is untouched.
      EXPECT_EQ(std::memcmp(page, plain.data() + b * kv_bytes, kv_bytes), 0)
          << what << " block " << b << (written ? " (written)" : " (not in the table)");
      EXPECT_EQ(std::memcmp(page + kv_bytes, page_before + kv_bytes, stride - kv_bytes), 0)
          << what << " block " << b << ": the bytes past the KV";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// MoE routing: worker::Softmax + worker::TopK + Qwen3MoeModel::Moe's renormalization.
// ---------------------------------------------------------------------------------------------

void ReferenceRoute(const std::vector<float>& logits, uint32_t num_experts, uint32_t top_k,
                    bool norm, std::vector<uint32_t>& ids, std::vector<float>& weights) {
  const size_t tokens = logits.size() / num_experts;
  ids.assign(tokens * top_k, 0);
  weights.assign(tokens * top_k, 0);
  std::vector<float> probs(num_experts);
  for (size_t t = 0; t < tokens; ++t) {
    std::copy_n(&logits[t * num_experts], num_experts, probs.begin());
    worker::Softmax(probs.data(), num_experts);
    const std::vector<uint32_t> selected = worker::TopK(probs.data(), num_experts, top_k);
    float weight_sum = 0;
    for (uint32_t e : selected) weight_sum += probs[e];
    for (uint32_t j = 0; j < top_k; ++j) {
      ids[t * top_k + j] = selected[j];
      weights[t * top_k + j] = norm ? probs[selected[j]] / weight_sum : probs[selected[j]];
    }
  }
}

TEST_F(WorkerKernelsGpuTest, MoeRouteMatchesCpu) {
  struct Shape {
    uint32_t tokens, experts, top_k;
    bool norm;
  };
  for (const Shape s : {Shape{1, 1, 1, true}, Shape{5, 8, 2, true}, Shape{7, 128, 8, true},
                        Shape{3, 128, 8, false}, Shape{4, 60, 4, true}, Shape{2, 4096, 16, true},
                        Shape{9, 33, 33, false}, Shape{70, 64, 6, true}}) {
    const std::string what = absl::StrCat("tokens=", s.tokens, " experts=", s.experts,
                                          " top_k=", s.top_k, " norm=", s.norm);
    // Logits 0.01 apart in a random order, so that no two distinct probabilities are within
    // rounding of each other; then deliberate exact ties (equal logits give equal
    // probabilities on both sides, which must break by lowest index).
    std::vector<float> logits(size_t{s.tokens} * s.experts);
    std::vector<float> row(s.experts);
    for (uint32_t t = 0; t < s.tokens; ++t) {
      for (uint32_t e = 0; e < s.experts; ++e) row[e] = 0.01f * static_cast<float>(e) - 3.0f;
      std::shuffle(row.begin(), row.end(), rng_);
      if (s.experts >= 4) {
        const uint32_t top =
            static_cast<uint32_t>(std::max_element(row.begin(), row.end()) - row.begin());
        row[(top + 1) % s.experts] = row[top];  // a tie for first place
        row[(top + 3) % s.experts] = row[(top + 2) % s.experts];
      }
      if (t % 5 == 4) std::fill(row.begin(), row.end(), 0.5f);  // all equal: ids 0..k-1
      if (t % 11 == 10) row[s.experts / 2] = std::numeric_limits<float>::quiet_NaN();
      std::copy(row.begin(), row.end(), &logits[size_t{t} * s.experts]);
    }
    std::vector<uint32_t> want_ids;
    std::vector<float> want_weights;
    ReferenceRoute(logits, s.experts, s.top_k, s.norm, want_ids, want_weights);

    DeviceArray<float> d_logits(logits), d_weights(want_weights.size());
    DeviceArray<uint32_t> d_ids(want_ids.size());
    ASSERT_OK(MoeRouteCuda(d_logits.get(), s.tokens, s.experts, s.top_k, s.norm, d_ids.get(),
                           d_weights.get(), stream_));
    EXPECT_EQ(d_ids.Download(), want_ids) << what;
    ExpectAllNear(d_weights.Download(), want_weights, kNear, what);
  }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU expert: worker::MatVec (gate, up), worker::SwiGlu, worker::MatVec (down).
// ---------------------------------------------------------------------------------------------

TEST_F(WorkerKernelsGpuTest, ExpertSwiGluMatchesCpu) {
  struct Shape {
    uint32_t rows, hidden, intermediate;
  };
  for (const Shape s : {Shape{1, 1, 1}, Shape{3, 16, 8}, Shape{4, 64, 96}, Shape{5, 2048, 768},
                        Shape{2, 33, 65}, Shape{9, 100, 1}, Shape{1, 1, 300}}) {
    const std::string what =
        absl::StrCat("rows=", s.rows, " hidden=", s.hidden, " intermediate=", s.intermediate);
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.hidden));
    const std::vector<float> x = Uniform(size_t{s.rows} * s.hidden, -2, 2);
    const std::vector<float> gate = Uniform(size_t{s.intermediate} * s.hidden, -bound, bound);
    const std::vector<float> up = Uniform(size_t{s.intermediate} * s.hidden, -bound, bound);
    const float down_bound = 1.0f / std::sqrt(static_cast<float>(s.intermediate));
    const std::vector<float> down =
        Uniform(size_t{s.hidden} * s.intermediate, -down_bound, down_bound);

    std::vector<float> want_act(size_t{s.rows} * s.intermediate), want(size_t{s.rows} * s.hidden);
    std::vector<float> up_out(s.intermediate);
    for (uint32_t r = 0; r < s.rows; ++r) {
      float* act = &want_act[size_t{r} * s.intermediate];
      worker::MatVec(gate.data(), &x[size_t{r} * s.hidden], s.intermediate, s.hidden, act);
      worker::MatVec(up.data(), &x[size_t{r} * s.hidden], s.intermediate, s.hidden, up_out.data());
      worker::SwiGlu(act, up_out.data(), s.intermediate, act);
      worker::MatVec(down.data(), act, s.hidden, s.intermediate, &want[size_t{r} * s.hidden]);
    }

    DeviceArray<float> d_x(x), d_gate(gate), d_up(up), d_down(down);
    DeviceArray<float> d_ws(want_act.size()), d_out(want.size());
    ASSERT_OK(ExpertSwiGluCuda(d_x.get(), d_gate.get(), d_up.get(), d_down.get(), s.rows, s.hidden,
                               s.intermediate, d_ws.get(), d_out.get(), stream_));
    ExpectAllNear(d_ws.Download(), want_act, kSummed, what + " (workspace)");
    ExpectAllNear(d_out.Download(), want, kSummed, what);
  }
}

// ---------------------------------------------------------------------------------------------
// Linear: worker::MatVec per row (and `out += ...`), bit for bit; batch-invariant.
// ---------------------------------------------------------------------------------------------

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(WorkerKernelsGpuTest, LinearMatchesMatVecBitForBit) {
  struct Shape {
    uint32_t rows, in, out;
  };
  // Widths around the 8-lane, 32-deep and 32-wide tile edges; 524296 rows exceed the 65535-block
  // grid's 524280 rows, so the grid-stride loop runs.
  for (const Shape s : {Shape{1, 1, 1}, Shape{1, 64, 256}, Shape{9, 33, 70}, Shape{40, 64, 64},
                        Shape{17, 7, 3}, Shape{3, 100, 33}, Shape{8, 32, 32}, Shape{2, 2048, 5},
                        Shape{513, 64, 8}, Shape{524296, 1, 2}}) {
    const std::string what = absl::StrCat("rows=", s.rows, " in=", s.in, " out=", s.out);
    const std::vector<float> x = Uniform(size_t{s.rows} * s.in, -2, 2);
    const std::vector<float> w = Uniform(size_t{s.out} * s.in, -1, 1);
    const std::vector<float> base = Uniform(size_t{s.rows} * s.out, -1, 1);
    std::vector<float> want(base.size());
    for (uint32_t r = 0; r < s.rows; ++r) {
      worker::MatVec(w.data(), &x[size_t{r} * s.in], s.out, s.in, &want[size_t{r} * s.out]);
    }
    std::vector<float> want_sum(base.size());
    for (size_t i = 0; i < base.size(); ++i) want_sum[i] = base[i] + want[i];

    DeviceArray<float> d_x(x), d_w(w), d_out(base.size());
    ASSERT_OK(LinearCuda(d_x.get(), d_w.get(), s.rows, s.in, s.out, false, d_out.get(), stream_));
    EXPECT_TRUE(SameBits(d_out.Download(), want)) << what;
    d_out.Upload(base);
    ASSERT_OK(LinearCuda(d_x.get(), d_w.get(), s.rows, s.in, s.out, true, d_out.get(), stream_));
    EXPECT_TRUE(SameBits(d_out.Download(), want_sum)) << what << " (accumulate)";
  }
}

TEST_F(WorkerKernelsGpuTest, LinearIsBatchInvariant) {
  const uint32_t rows = 37, in = 96, out = 80;
  const std::vector<float> x = Uniform(size_t{rows} * in, -2, 2);
  const std::vector<float> w = Uniform(size_t{out} * in, -1, 1);
  DeviceArray<float> d_x(x), d_w(w), d_batch(size_t{rows} * out), d_single(size_t{rows} * out);
  ASSERT_OK(LinearCuda(d_x.get(), d_w.get(), rows, in, out, false, d_batch.get(), stream_));
  for (uint32_t r = 0; r < rows; ++r) {
    ASSERT_OK(LinearCuda(d_x.get() + size_t{r} * in, d_w.get(), 1, in, out, false,
                         d_single.get() + size_t{r} * out, stream_));
  }
  EXPECT_TRUE(SameBits(d_batch.Download(), d_single.Download()));
}

// ---------------------------------------------------------------------------------------------
// Row gather (embedding lookup, MoE grouping) and MoE combine.
// ---------------------------------------------------------------------------------------------

TEST_F(WorkerKernelsGpuTest, GatherRowsCopiesRowsAndPoisonsBadIds) {
  const uint32_t src_rows = 50, cols = 300;
  const std::vector<float> src = Uniform(size_t{src_rows} * cols, -5, 5);
  const std::vector<uint32_t> ids = {49, 0, 7, 7, 50, 0xffffffffu, 3};
  DeviceArray<float> d_src(src), d_out(ids.size() * cols);
  DeviceArray<uint32_t> d_ids(ids);
  ASSERT_OK(
      GatherRowsCuda(d_src.get(), src_rows, cols, d_ids.get(), ids.size(), d_out.get(), stream_));
  const std::vector<float> got = d_out.Download();
  for (size_t r = 0; r < ids.size(); ++r) {
    for (uint32_t i = 0; i < cols; ++i) {
      const float value = got[r * cols + i];
      if (ids[r] >= src_rows) {
        ASSERT_TRUE(std::isnan(value)) << "row " << r;
      } else {
        ASSERT_EQ(std::memcmp(&value, &src[size_t{ids[r]} * cols + i], sizeof(float)), 0)
            << "row " << r << " col " << i;
      }
    }
  }
}

TEST_F(WorkerKernelsGpuTest, MoeCombineSumsInOrderAndAddsTheResidual) {
  const uint32_t tokens = 19, top_k = 3, hidden = 300, expert_rows = tokens * top_k;
  const std::vector<float> expert_out = Uniform(size_t{expert_rows} * hidden, -3, 3);
  const std::vector<float> weights = Uniform(size_t{tokens} * top_k, 0, 1);
  std::vector<uint32_t> rows(size_t{tokens} * top_k);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint32_t>((i * 7) % expert_rows);
  rows[5] = expert_rows;  // out of range: token 1 becomes NaN
  std::vector<float> x = Uniform(size_t{tokens} * hidden, -1, 1);
  std::vector<float> want = x;
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint32_t i = 0; i < hidden; ++i) {
      float acc = 0.0f;
      for (uint32_t j = 0; j < top_k; ++j) {
        const uint32_t row = rows[size_t{t} * top_k + j];
        const float value = row < expert_rows ? expert_out[size_t{row} * hidden + i] : NAN;
        const float product = value * weights[size_t{t} * top_k + j];
        acc = acc + product;
      }
      want[size_t{t} * hidden + i] = want[size_t{t} * hidden + i] + acc;
    }
  }
  DeviceArray<float> d_expert(expert_out), d_weights(weights), d_x(x);
  DeviceArray<uint32_t> d_rows(rows);
  ASSERT_OK(MoeCombineCuda(d_expert.get(), expert_rows, hidden, d_rows.get(), d_weights.get(),
                           tokens, top_k, d_x.get(), stream_));
  const std::vector<float> got = d_x.Download();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << i;
    } else {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << i;
    }
  }
}

}  // namespace
}  // namespace kvcache::kernels
