// CudaQwen3MoeModel (model/cuda/qwen3_moe_cuda.h) against the CPU model (model/qwen3_moe.h).
//
// Label unit (every build, every machine): CudaQwen3MoeModelTest — what Create answers for this
// build and machine (FAILED_PRECONDITION "built without CUDA" / "no CUDA device", never a skip);
// MoeDispatchPlanTest — the host-side grouping of routed tokens by expert.
//
// Label gpu (CUDA builds; every case skips without a device): CudaQwen3MoeModelGpuTest, on the
// tiny checkpoint, for fp32 and bf16 pools, the GPU model in a cudaMalloc'ed pool against the CPU
// model in a host pool with the same block table:
//  - logits within kLogitTolerance * max |logit| (max abs difference), same argmax;
//  - layer 0's K/V bytes identical to the CPU's (embedding, RMSNorm, the Dot-ordered projections,
//    RoPE and the KV write are bit-exact in practice), all layers within a stated tolerance;
//  - greedy decoding produces the same tokens;
//  - one-shot, chunked and token-by-token prefill, and prefill over prefix blocks computed by
//    another sequence (shared or byte-copied), are bit-identical on the GPU (logits and KV bytes);
//  - bad requests get exactly the CPU model's codes and messages, plus the device-only checks,
//    and leave the pool untouched.
#include "model/cuda/qwen3_moe_cuda.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"
#include "model/cuda/moe_dispatch.h"
#include "model/sampler.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

#if KVCACHE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::kvcache::worker::testing::BitIdentical;
using ::kvcache::worker::testing::HostPool;
using ::kvcache::worker::testing::MakePrompt;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::kvcache::worker::testing::TinyModel;

// ---------------------------------------------------------------------------------------------
// Every build, every machine.
// ---------------------------------------------------------------------------------------------

TEST(CudaQwen3MoeModelTest, BuiltWithCudaMatchesTheBuild) {
#if KVCACHE_WITH_CUDA
  EXPECT_TRUE(BuiltWithCuda());
#else
  EXPECT_FALSE(BuiltWithCuda());
#endif
}

// Never skips: each build and machine has its one right answer.
TEST(CudaQwen3MoeModelTest, CreateAnswersForTheBuildAndTheMachine) {
  absl::StatusOr<CudaQwen3MoeModel> model = CudaQwen3MoeModel::Create(TinyModel(), 0);
  if (!BuiltWithCuda()) {
    EXPECT_THAT(model, StatusIs(absl::StatusCode::kFailedPrecondition, "built without CUDA"));
  } else if (!CudaDeviceAvailable()) {
    EXPECT_THAT(model,
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no CUDA device")));
  } else {
    EXPECT_OK(model);
    EXPECT_THAT(CudaQwen3MoeModel::Create(TinyModel(), -1),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
    EXPECT_THAT(CudaQwen3MoeModel::Create(TinyModel(), 1 << 20),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("does not exist")));
  }
}

TEST(MoeDispatchPlanTest, GroupsTokensByExpertAndOrdersEachTokensSumByExpert) {
  // 3 tokens, top 2 of 4 experts, in router (TopK) order, not by index.
  const std::vector<uint32_t> ids = {2, 0, 1, 2, 3, 0};
  const std::vector<float> weights = {0.6f, 0.4f, 0.7f, 0.3f, 0.55f, 0.45f};
  MoeDispatchPlan plan;
  ASSERT_OK(PlanMoeDispatch(ids, weights, 3, 2, 4, plan));
  // Expert 0: tokens 0, 2; expert 1: token 1; expert 2: tokens 0, 1; expert 3: token 2.
  EXPECT_THAT(plan.expert_begin, ElementsAre(0, 2, 3, 5, 6));
  EXPECT_THAT(plan.gather_tokens, ElementsAre(0, 2, 1, 0, 1, 2));
  // Token 0: expert 0 (row 0), expert 2 (row 3); token 1: expert 1 (row 2), expert 2 (row 4);
  // token 2: expert 0 (row 1), expert 3 (row 5).
  EXPECT_THAT(plan.combine_rows, ElementsAre(0, 3, 2, 4, 1, 5));
  EXPECT_THAT(plan.combine_weights, ElementsAre(0.4f, 0.6f, 0.7f, 0.3f, 0.45f, 0.55f));
}

TEST(MoeDispatchPlanTest, ReusesThePlanAcrossCallsOfOtherSizes) {
  MoeDispatchPlan plan;
  const std::vector<uint32_t> many = {0, 1, 1, 0, 0, 1, 1, 0};
  const std::vector<float> many_weights(8, 0.5f);
  ASSERT_OK(PlanMoeDispatch(many, many_weights, 4, 2, 2, plan));
  EXPECT_THAT(plan.expert_begin, ElementsAre(0, 4, 8));
  const std::vector<uint32_t> one = {1};
  const std::vector<float> one_weight = {1.0f};
  ASSERT_OK(PlanMoeDispatch(one, one_weight, 1, 1, 3, plan));
  EXPECT_THAT(plan.expert_begin, ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(plan.gather_tokens, ElementsAre(0));
  EXPECT_THAT(plan.combine_rows, ElementsAre(0));
  ASSERT_OK(PlanMoeDispatch({}, {}, 0, 2, 3, plan));
  EXPECT_THAT(plan.expert_begin, ElementsAre(0, 0, 0, 0));
  EXPECT_TRUE(plan.gather_tokens.empty());
}

TEST(MoeDispatchPlanTest, RejectsBadRouterOutput) {
  MoeDispatchPlan plan;
  const std::vector<float> weights = {0.5f, 0.5f};
  EXPECT_THAT(PlanMoeDispatch(std::vector<uint32_t>{4, 0}, weights, 1, 2, 4, plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expert id 4 of token 0")));
  EXPECT_THAT(
      PlanMoeDispatch(std::vector<uint32_t>{1, 1}, weights, 1, 2, 4, plan),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 0 selects expert 1 twice")));
  EXPECT_THAT(PlanMoeDispatch(std::vector<uint32_t>{1, 2, 3}, weights, 1, 2, 4, plan),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("want 2 each")));
}

#if KVCACHE_WITH_CUDA
// ---------------------------------------------------------------------------------------------
// GPU against CPU.
// ---------------------------------------------------------------------------------------------

constexpr uint32_t kBlockSize = 16;

// Logits: max |gpu - cpu| <= kLogitTolerance * max |cpu|. The GPU's attention and expert sums
// run in another order (and CUDA's expf), so the logits differ in the last bits (~1e-6).
constexpr float kLogitTolerance = 1e-3f;
// KV of the layers after 0: |gpu - cpu| <= kKvTolerance * (|cpu| + max |cpu|), plus, for bf16,
// two bf16 ulps of the value (2^-6 |cpu|): a last-bit float difference may round either way.
constexpr float kKvTolerance = 1e-4f;

// A zero-filled device pool. Each copy is followed by a device sync: the model's stream is
// non-blocking, so it is not ordered after the legacy default stream these copies use.
class DevicePool {
 public:
  DevicePool(const PoolLayout& layout, uint32_t num_blocks)
      : layout_(layout),
        num_blocks_(num_blocks),
        bytes_(uint64_t{num_blocks} * layout.BlockBytes()) {
    if (cudaMalloc(&data_, bytes_) != cudaSuccess) {
      data_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << bytes_ << " bytes failed";
      return;
    }
    EXPECT_EQ(cudaMemset(data_, 0, bytes_), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~DevicePool() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  uint8_t* data() const { return data_; }
  DevicePagedKv View(const std::vector<uint32_t>& table) const {
    return DevicePagedKv{data_, layout_, table, num_blocks_};
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> host(bytes_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  void CopyBlock(uint32_t from, uint32_t to) {
    const uint64_t block = layout_.BlockBytes();
    EXPECT_EQ(cudaMemcpy(data_ + to * block, data_ + from * block, block, cudaMemcpyDeviceToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

 private:
  PoolLayout layout_;
  uint32_t num_blocks_;
  uint64_t bytes_;
  uint8_t* data_ = nullptr;
};

std::vector<uint32_t> Iota(uint32_t begin, uint32_t count) {
  std::vector<uint32_t> ids(count);
  for (uint32_t i = 0; i < count; ++i) ids[i] = begin + i;
  return ids;
}

void ExpectLogitsClose(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  ASSERT_EQ(gpu.size(), cpu.size());
  float max_diff = 0;
  float max_abs = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << "logit " << i;
    max_diff = std::max(max_diff, std::fabs(gpu[i] - cpu[i]));
    max_abs = std::max(max_abs, std::fabs(cpu[i]));
  }
  EXPECT_LE(max_diff, kLogitTolerance * max_abs) << "max |logit| " << max_abs;
  EXPECT_EQ(Argmax(gpu), Argmax(cpu));
  std::cout << "max |gpu - cpu logit| = " << max_diff << " (max |logit| " << max_abs << ")\n";
}

// Decoded K (kv = 0) or V (kv = 1) of `layer` for positions [0, end) of both pools, compared.
void ExpectKvClose(PagedKv& gpu, PagedKv& cpu, uint32_t layer, uint32_t kv, uint32_t end,
                   DType dtype) {
  std::vector<float> got(size_t{end} * cpu.token_elements());
  std::vector<float> want(got.size());
  ASSERT_OK(gpu.ReadRange(layer, kv, 0, end, got.data()));
  ASSERT_OK(cpu.ReadRange(layer, kv, 0, end, want.data()));
  float max_abs = 0;
  for (float w : want) max_abs = std::max(max_abs, std::fabs(w));
  const float rounding = dtype == DType::kBFloat16 ? 1.0f / 64 : 0.0f;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float tolerance =
        kKvTolerance * (std::fabs(want[i]) + max_abs) + rounding * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tolerance) && ++bad <= 5) {
      ADD_FAILURE() << "layer " << layer << (kv == 0 ? " K" : " V") << " [" << i << "]: got "
                    << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << "layer " << layer << (kv == 0 ? " K" : " V");
}

class CudaQwen3MoeModelGpuTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!BuiltWithCuda() || !CudaDeviceAvailable()) {
      GTEST_SKIP() << "no CUDA device";
    }
    absl::StatusOr<CudaQwen3MoeModel> created = CudaQwen3MoeModel::Create(TinyModel(), 0);
    ASSERT_OK(created);
    gpu_.emplace(std::move(*created));
  }

  PoolLayout Layout() const { return TinyModel().KvLayout(kBlockSize, GetParam()); }
  CudaQwen3MoeModel& gpu() { return *gpu_; }

  std::optional<CudaQwen3MoeModel> gpu_;
};

// The prompts of the two tests below were chosen (on the CPU model, both pool dtypes) so that the
// top two logits differ by at least 27% (prefill) and 2% (each of the 16 decode steps) of
// max |logit|: thousands of times the expected GPU/CPU difference, so equal argmaxes are not luck.
TEST_P(CudaQwen3MoeModelGpuTest, PrefillLogitsAndKvMatchCpu) {
  const std::vector<uint32_t> prompt = MakePrompt(40, 23);
  const std::vector<uint32_t> table = {6, 0, 4};
  HostPool host(Layout(), 8);
  PagedKv host_kv = host.View(table);
  absl::StatusOr<std::vector<float>> want = TinyModel().Forward(prompt, 0, host_kv);
  ASSERT_OK(want);
  DevicePool device(Layout(), 8);
  absl::StatusOr<std::vector<float>> got = gpu().Forward(prompt, 0, device.View(table));
  ASSERT_OK(got);
  ExpectLogitsClose(*got, *want);

  std::vector<uint8_t> got_bytes = device.Download();
  ASSERT_EQ(got_bytes.size(), host.bytes.size());
  // Layer 0: everything up to the KV write is bit-exact in practice (see the header).
  const PoolLayout layout = Layout();
  for (uint32_t block : table) {
    const uint64_t begin = block * layout.BlockBytes() + layout.KvOffset(0, 0);
    const uint64_t length = layout.KvOffset(1, 0) - layout.KvOffset(0, 0);
    EXPECT_EQ(std::memcmp(&got_bytes[begin], &host.bytes[begin], length), 0)
        << "layer 0 K/V bytes of block " << block;
  }
  PagedKv got_kv(got_bytes.data(), layout, table, 8);
  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      ExpectKvClose(got_kv, host_kv, layer, kv, prompt.size(), GetParam());
    }
  }
  // Blocks outside the table are untouched.
  for (uint32_t block : {1u, 2u, 3u, 5u, 7u}) {
    const uint8_t* bytes = &got_bytes[block * layout.BlockBytes()];
    EXPECT_TRUE(std::all_of(bytes, bytes + layout.BlockBytes(), [](uint8_t b) { return b == 0; }))
        << "block " << block;
  }
}

TEST_P(CudaQwen3MoeModelGpuTest, GreedyDecodeMatchesCpu) {
  const std::vector<uint32_t> prompt = MakePrompt(40, 24);
  constexpr uint32_t kNewTokens = 16;
  const std::vector<uint32_t> table = {5, 1, 7, 2};  // 64 slots >= 40 + 15
  HostPool host(Layout(), 8);
  Sampler sampler = Sampler::Greedy();
  absl::StatusOr<std::vector<uint32_t>> want =
      GenerateTokens(TinyModel(), host, table, prompt, kNewTokens, sampler);
  ASSERT_OK(want);

  DevicePool device(Layout(), 8);
  const DevicePagedKv kv = device.View(table);
  absl::StatusOr<std::vector<float>> logits = gpu().Forward(prompt, 0, kv);
  ASSERT_OK(logits);
  std::vector<uint32_t> got;
  for (uint32_t position = prompt.size();; ++position) {
    got.push_back(Argmax(*logits));
    if (got.size() == kNewTokens) break;
    logits = gpu().Forward(absl::MakeConstSpan(&got.back(), 1), position, kv);
    ASSERT_OK(logits);
  }
  EXPECT_EQ(got, *want);
}

// Runs `prompt` in calls that end at each of `ends` and then at its end; the last call's logits.
absl::StatusOr<std::vector<float>> RunInChunks(CudaQwen3MoeModel& model,
                                               const std::vector<uint32_t>& prompt,
                                               std::vector<uint32_t> ends,
                                               const DevicePagedKv& kv) {
  ends.push_back(static_cast<uint32_t>(prompt.size()));
  uint32_t begin = 0;
  absl::StatusOr<std::vector<float>> logits = absl::InternalError("no chunk");
  for (uint32_t end : ends) {
    logits = model.Forward(absl::MakeConstSpan(prompt).subspan(begin, end - begin), begin, kv);
    if (!logits.ok()) return logits;
    begin = end;
  }
  return logits;
}

// Batch invariance: how a prompt is split across calls changes neither logits nor KV bytes.
TEST_P(CudaQwen3MoeModelGpuTest, ChunkedAndTokenByTokenPrefillAreBitIdenticalToOneShot) {
  const std::vector<uint32_t> prompt = MakePrompt(40, 25);
  const std::vector<uint32_t> table = {6, 0, 4};
  DevicePool one_shot(Layout(), 8);
  absl::StatusOr<std::vector<float>> expected = gpu().Forward(prompt, 0, one_shot.View(table));
  ASSERT_OK(expected);
  const std::vector<uint8_t> expected_bytes = one_shot.Download();

  for (const std::vector<uint32_t>& ends : {std::vector<uint32_t>{17, 33}, Iota(1, 39)}) {
    const std::string what = absl::StrCat(ends.size() + 1, " chunks");
    DevicePool pool(Layout(), 8);
    absl::StatusOr<std::vector<float>> logits = RunInChunks(gpu(), prompt, ends, pool.View(table));
    ASSERT_OK(logits) << what;
    EXPECT_TRUE(BitIdentical(*logits, *expected)) << what;
    EXPECT_TRUE(pool.Download() == expected_bytes) << what;
  }
}

// A prefix computed by another sequence — its blocks shared, or byte-copied to other blocks —
// gives the cold run's logits and KV bytes, bit for bit.
TEST_P(CudaQwen3MoeModelGpuTest, PrefixReuseIsBitIdenticalToCold) {
  const std::vector<uint32_t> prompt = MakePrompt(80, 23);
  const std::vector<uint32_t> cold_table = Iota(3, 5);
  DevicePool cold_pool(Layout(), 32);
  absl::StatusOr<std::vector<float>> cold = gpu().Forward(prompt, 0, cold_pool.View(cold_table));
  ASSERT_OK(cold);
  const std::vector<uint8_t> cold_bytes = cold_pool.Download();

  DevicePool pool(Layout(), 32);
  // Sequence A: the prompt's first two blocks, then another continuation.
  std::vector<uint32_t> a_tokens(prompt.begin(), prompt.begin() + 32);
  const std::vector<uint32_t> other = MakePrompt(20, 99);
  a_tokens.insert(a_tokens.end(), other.begin(), other.end());
  const std::vector<uint32_t> a_table = {9, 3, 20, 21};
  ASSERT_OK(gpu().Forward(a_tokens, 0, pool.View(a_table)));

  const auto suffix = absl::MakeConstSpan(prompt).subspan(32);
  // Sequence B shares A's blocks 9 and 3; sequence C gets byte copies of them in 17 and 5.
  const std::vector<uint32_t> b_table = {9, 3, 11, 30, 2};
  absl::StatusOr<std::vector<float>> shared = gpu().Forward(suffix, 32, pool.View(b_table));
  ASSERT_OK(shared);
  EXPECT_TRUE(BitIdentical(*shared, *cold));
  pool.CopyBlock(9, 17);
  pool.CopyBlock(3, 5);
  const std::vector<uint32_t> c_table = {17, 5, 25, 26, 27};
  absl::StatusOr<std::vector<float>> copied = gpu().Forward(suffix, 32, pool.View(c_table));
  ASSERT_OK(copied);
  EXPECT_TRUE(BitIdentical(*copied, *cold));

  // The blocks B and C computed hold the cold run's bytes.
  const std::vector<uint8_t> bytes = pool.Download();
  const uint64_t block = Layout().BlockBytes();
  for (size_t i = 2; i < cold_table.size(); ++i) {
    for (uint32_t id : {b_table[i], c_table[i]}) {
      EXPECT_EQ(std::memcmp(&bytes[id * block], &cold_bytes[cold_table[i] * block], block), 0)
          << "block " << id << " (table entry " << i << ")";
    }
  }
}

TEST_P(CudaQwen3MoeModelGpuTest, BadRequestsGetTheCpuModelsCodesAndWriteNothing) {
  const PoolLayout layout = Layout();
  PoolLayout other_layout = layout;
  other_layout.num_layers = 2;
  struct Case {
    std::vector<uint32_t> tokens;
    uint32_t start;
    std::vector<uint32_t> table;
    PoolLayout layout;
  };
  const std::vector<uint32_t> three = {1, 2, 3};
  const std::vector<Case> cases = {
      {{}, 0, {0, 1}, layout},              // no tokens
      {{1, 2, 256, 3}, 0, {0, 1}, layout},  // token outside the vocabulary
      {three, 4094, {0, 1}, layout},        // past max_position_embeddings
      {three, 0xfffffffe, {0, 1}, layout},  // position overflow
      {three, 30, {0, 1}, layout},          // past the block table
      {three, 0, {0, 4}, layout},           // block outside the 4-block pool
      {three, 0, {0, 1}, other_layout},     // a pool for another model
  };
  HostPool host(layout, 4);
  DevicePool device(layout, 4);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    PagedKv host_kv(host.bytes.data(), c.layout, c.table, 4);
    const absl::Status want = TinyModel().Forward(c.tokens, c.start, host_kv).status();
    const absl::Status got =
        gpu()
            .Forward(c.tokens, c.start, DevicePagedKv{device.data(), c.layout, c.table, 4})
            .status();
    EXPECT_FALSE(want.ok()) << "case " << i;
    EXPECT_EQ(got.code(), want.code()) << "case " << i << ": " << got;
    EXPECT_EQ(got.message(), want.message()) << "case " << i;
  }

  // Checks only a device pool needs.
  const std::vector<uint32_t> table = {0, 1};
  EXPECT_THAT(
      gpu().Forward(three, 0,
                    DevicePagedKv{device.data(), layout, table, PagedKv::kUnknownPoolBlocks}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_pool_blocks")));
  EXPECT_THAT(gpu().Forward(three, 0, DevicePagedKv{host.bytes.data(), layout, table, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not device memory")));
  const std::vector<uint32_t> repeated = {1, 1};
  EXPECT_THAT(gpu().Forward(MakePrompt(20, 1), 0, device.View(repeated)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("both write slot")));
  const std::vector<uint8_t> bytes = device.Download();
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; }));

  // The model still works after the rejections; a moved-from one answers FAILED_PRECONDITION.
  EXPECT_OK(gpu().Forward(three, 0, device.View(table)));
  CudaQwen3MoeModel moved = std::move(gpu());
  EXPECT_THAT(gpu().Forward(three, 0, device.View(table)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("moved-from")));
  EXPECT_OK(moved.Forward(three, 3, device.View(table)));
}

INSTANTIATE_TEST_SUITE_P(PoolDtypes, CudaQwen3MoeModelGpuTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });
#endif  // KVCACHE_WITH_CUDA

}  // namespace
}  // namespace kvcache::worker
