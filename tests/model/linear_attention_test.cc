// The Gated DeltaNet numerics (model/linear_attention.h) on hand-computed cases, their split
// invariance, and LinearAttentionState's byte layout and the hybrid pool's part spec.
#include "model/linear_attention.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/page_parts.h"
#include "model/linear_attention_state.h"
#include "model/ops.h"
#include "tests/testing/random_floats.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::RandomNormals;
using ::kvcache::testing::StatusIs;

const Qwen3NextConfig& TinyHybridConfig() {
  static const Qwen3NextConfig* config = [] {
    absl::StatusOr<Qwen3NextConfig> loaded =
        LoadQwen3NextConfig(std::string(KVCACHE_TINY_HYBRID_CHECKPOINT_F32_DIR) + "/config.json");
    EXPECT_OK(loaded);
    return new Qwen3NextConfig(loaded.value_or(Qwen3NextConfig{}));
  }();
  return *config;
}

TEST(CausalConv1dTest, HandComputedWindowAndState) {
  // One channel, kernel 3: out_t = SiLU(0.5 x_{t-2} - x_{t-1} + 2 x_t), zeros before t = 0.
  const std::vector<float> weight = {0.5f, -1.0f, 2.0f};
  const std::vector<float> input = {1.0f, 2.0f, 3.0f};
  std::vector<float> state = {0.0f, 0.0f};
  std::vector<float> out(3);
  CausalConv1dSilu(input.data(), weight.data(), 3, 1, 3, state.data(), out.data());
  EXPECT_FLOAT_EQ(out[0], Silu(2.0f));  // 2 * 1
  EXPECT_FLOAT_EQ(out[1], Silu(3.0f));  // -1 * 1 + 2 * 2
  EXPECT_FLOAT_EQ(out[2], Silu(4.5f));  // 0.5 * 1 - 1 * 2 + 2 * 3
  EXPECT_EQ(state, (std::vector<float>{2.0f, 3.0f}));
}

TEST(GatedDeltaRuleTest, HandComputedTwoSteps) {
  // key_head_dim 2, value_head_dim 1, one head. q = (3, 4) normalizes to (0.6, 0.8) and is scaled
  // by 1/sqrt(2); k = (1, 0); v = 2; b = 0 so beta = 1/2; A_log = 0 and a + dt_bias = 0 so
  // g = -softplus(0) = -ln 2, a decay of 1/2.
  //   step 1: S = 0;        kv = 0;   delta = (2 - 0) / 2 = 1;      S = (1, 0);    o = 0.6/sqrt2
  //   step 2: S = (0.5, 0); kv = 0.5; delta = (2 - 0.5) / 2 = 0.75; S = (1.25, 0); o = 0.75/sqrt2
  const LinearAttentionDims dims{.num_key_heads = 1,
                                 .num_value_heads = 1,
                                 .key_head_dim = 2,
                                 .value_head_dim = 1,
                                 .conv_kernel = 4};
  const std::vector<float> qkv = {3, 4, 1, 0, 2, 3, 4, 1, 0, 2};  // [2 tokens][q q k k v]
  const std::vector<float> a = {0.5f, 0.5f}, b = {0, 0};
  const std::vector<float> a_log = {0}, dt_bias = {-0.5f};
  std::vector<float> state(2, 0.0f), out(2);
  GatedDeltaRule(dims, qkv.data(), a.data(), b.data(), a_log.data(), dt_bias.data(), 2,
                 state.data(), out.data());
  const double root2 = std::sqrt(2.0);
  EXPECT_NEAR(out[0], 0.6 / root2, 1e-6);
  EXPECT_NEAR(out[1], 1.25 * 0.6 / root2, 1e-6);
  EXPECT_NEAR(state[0], 1.25, 1e-6);
  EXPECT_EQ(state[1], 0.0f);
}

TEST(GatedDeltaRuleTest, ValueHeadsShareTheirKeyHead) {
  // Two value heads on one key head: identical q, k and gates, so head h's output is exactly the
  // one-head rule applied to its own v.
  const LinearAttentionDims two{.num_key_heads = 1,
                                .num_value_heads = 2,
                                .key_head_dim = 4,
                                .value_head_dim = 3,
                                .conv_kernel = 4};
  LinearAttentionDims one = two;
  one.num_value_heads = 1;
  const uint32_t n = 5;
  const std::vector<float> qkv = RandomNormals(n * two.conv_dim(), 1);
  std::vector<float> a(n * 2, 0.3f), b(n * 2, -0.2f);
  const std::vector<float> a_log = {-1.0f, -1.0f}, dt_bias = {0.1f, 0.1f};
  std::vector<float> state(two.recurrent_floats(), 0.0f), out(n * two.value_dim());
  GatedDeltaRule(two, qkv.data(), a.data(), b.data(), a_log.data(), dt_bias.data(), n, state.data(),
                 out.data());
  for (uint32_t h = 0; h < 2; ++h) {
    std::vector<float> qkv_one;
    for (uint32_t t = 0; t < n; ++t) {
      const float* token = &qkv[t * two.conv_dim()];
      qkv_one.insert(qkv_one.end(), token, token + 8);  // q, k
      qkv_one.insert(qkv_one.end(), token + 8 + h * 3, token + 8 + h * 3 + 3);
    }
    std::vector<float> state_one(one.recurrent_floats(), 0.0f), out_one(n * 3);
    GatedDeltaRule(one, qkv_one.data(), a.data(), b.data(), a_log.data(), dt_bias.data(), n,
                   state_one.data(), out_one.data());
    for (uint32_t t = 0; t < n; ++t) {
      EXPECT_EQ(std::memcmp(&out[t * 6 + h * 3], &out_one[t * 3], 3 * sizeof(float)), 0)
          << "head " << h << " token " << t;
    }
  }
}

// Running n tokens at once, or as two calls carrying the state, is bit-identical.
TEST(LinearAttentionTest, SplitRunsAreBitIdentical) {
  const LinearAttentionDims dims{.num_key_heads = 2,
                                 .num_value_heads = 4,
                                 .key_head_dim = 8,
                                 .value_head_dim = 6,
                                 .conv_kernel = 4};
  const uint32_t n = 37;
  const std::vector<float> input = RandomNormals(n * dims.conv_dim(), 2);
  const std::vector<float> weight = RandomNormals(dims.conv_dim() * dims.conv_kernel, 3, 0.5f);
  const std::vector<float> a = RandomNormals(n * dims.num_value_heads, 4);
  const std::vector<float> b = RandomNormals(n * dims.num_value_heads, 5);
  const std::vector<float> a_log = RandomNormals(dims.num_value_heads, 6, 0.3f);
  const std::vector<float> dt_bias = RandomNormals(dims.num_value_heads, 7, 0.3f);
  const auto run = [&](uint32_t begin, uint32_t end, std::vector<float>& conv_state,
                       std::vector<float>& state, std::vector<float>& out) {
    const uint32_t count = end - begin;
    std::vector<float> conv_out(count * dims.conv_dim());
    CausalConv1dSilu(&input[begin * dims.conv_dim()], weight.data(), count, dims.conv_dim(),
                     dims.conv_kernel, conv_state.data(), conv_out.data());
    GatedDeltaRule(dims, conv_out.data(), &a[begin * dims.num_value_heads],
                   &b[begin * dims.num_value_heads], a_log.data(), dt_bias.data(), count,
                   state.data(), &out[begin * dims.value_dim()]);
  };
  std::vector<float> conv_once(dims.conv_floats(), 0.0f), state_once(dims.recurrent_floats(), 0);
  std::vector<float> out_once(n * dims.value_dim());
  run(0, n, conv_once, state_once, out_once);
  for (uint32_t split : {1u, 13u, 16u, 36u}) {
    std::vector<float> conv(dims.conv_floats(), 0.0f), state(dims.recurrent_floats(), 0.0f);
    std::vector<float> out(n * dims.value_dim());
    run(0, split, conv, state, out);
    run(split, n, conv, state, out);
    EXPECT_EQ(std::memcmp(out.data(), out_once.data(), out.size() * sizeof(float)), 0) << split;
    EXPECT_EQ(conv, conv_once) << split;
    EXPECT_EQ(std::memcmp(state.data(), state_once.data(), state.size() * sizeof(float)), 0)
        << split;
  }
}

TEST(LinearAttentionStateTest, ByteLayoutIsDocumented) {
  const Qwen3NextConfig& config = TinyHybridConfig();
  const LinearAttentionDims& d = config.linear;
  const uint64_t per_layer =
      uint64_t{d.num_value_heads} * d.key_head_dim * d.value_head_dim +
      uint64_t{2 * d.num_key_heads * d.key_head_dim + d.num_value_heads * d.value_head_dim} *
          (d.conv_kernel - 1);
  ASSERT_EQ(config.num_linear_attention_layers(), 3u);
  EXPECT_EQ(LinearAttentionState::StateBytes(config), 3 * per_layer * sizeof(float));
  EXPECT_EQ(LinearAttentionState::RecurrentOffset(config, 2), 2 * per_layer);
  EXPECT_EQ(LinearAttentionState::ConvOffset(config, 1), per_layer + d.recurrent_floats());

  LinearAttentionState state(config);
  state.recurrent(1)[5] = 1.5f;
  state.conv(2)[7] = -2.25f;
  std::vector<uint8_t> bytes(state.StateBytes());
  ASSERT_OK(state.SaveTo(absl::MakeSpan(bytes)));
  float value = 0;
  std::memcpy(&value, &bytes[(LinearAttentionState::RecurrentOffset(config, 1) + 5) * 4], 4);
  EXPECT_EQ(value, 1.5f);
  std::memcpy(&value, &bytes[(LinearAttentionState::ConvOffset(config, 2) + 7) * 4], 4);
  EXPECT_EQ(value, -2.25f);

  LinearAttentionState restored(config);
  ASSERT_OK(restored.RestoreFrom(bytes, 32));
  EXPECT_EQ(restored.position(), 32u);
  state.set_position(32);
  EXPECT_TRUE(restored == state);
}

TEST(LinearAttentionStateTest, WrongSizesAreRejectedWithoutChange) {
  const Qwen3NextConfig& config = TinyHybridConfig();
  LinearAttentionState state(config);
  state.recurrent(0)[0] = 3.0f;
  std::vector<uint8_t> short_bytes(state.StateBytes() - 4);
  EXPECT_THAT(state.SaveTo(absl::MakeSpan(short_bytes)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(state.RestoreFrom(short_bytes, 16), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(state.recurrent(0)[0], 3.0f);
  EXPECT_EQ(state.position(), 0u);
}

TEST(HybridPagePartsTest, SpecParsesAsKvPlusTrailingState) {
  const Qwen3NextConfig& config = TinyHybridConfig();
  const uint64_t kv_bytes = HybridKvBytesPerPage(config, 16, DType::kBFloat16);
  // One full-attention layer: K and V of 16 tokens x 2 kv heads x 16 dims in bf16.
  EXPECT_EQ(kv_bytes, 1u * 2 * 16 * 2 * 16 * 2);
  const uint64_t state_bytes = LinearAttentionState::StateBytes(config);
  const std::string spec = HybridPagePartsSpec(config, 16, DType::kBFloat16);
  EXPECT_EQ(spec, absl::StrCat("kv/", kv_bytes, "+state/", state_bytes, "/trailing1"));
  absl::StatusOr<std::vector<PagePartLayout>> parts = ParsePageParts(spec, kv_bytes + state_bytes);
  ASSERT_OK(parts);
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "kv");
  EXPECT_EQ((*parts)[0].policy, PartHitPolicy::kAllPages);
  EXPECT_EQ((*parts)[1].name, "state");
  EXPECT_EQ((*parts)[1].offset, kv_bytes);
  EXPECT_EQ((*parts)[1].policy, PartHitPolicy::kTrailingPages);
  EXPECT_EQ((*parts)[1].trailing_pages, 1u);
}

}  // namespace
}  // namespace kvcache::worker
