// Qwen3NextConfig parsing: Hugging Face's fields and defaults, layer types from layer_types or
// full_attention_interval, and a precise INVALID_ARGUMENT for every unsupported or inconsistent
// config.
#include "model/qwen3_next_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/testing/status_matchers.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr LayerType kLinear = LayerType::kLinearAttention;
constexpr LayerType kFull = LayerType::kFullAttention;

nlohmann::json ValidConfig() {
  return nlohmann::json::parse(R"({
    "model_type": "qwen3_next", "hidden_act": "silu", "hidden_size": 64,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
    "num_hidden_layers": 8, "full_attention_interval": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.25,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "vocab_size": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "num_experts": 8, "num_experts_per_tok": 2,
    "max_position_embeddings": 4096
  })");
}

absl::StatusOr<Qwen3NextConfig> Parse(const nlohmann::json& json) {
  return ParseQwen3NextConfig(json.dump());
}

TEST(Qwen3NextConfigTest, ParsesHuggingFaceFields) {
  absl::StatusOr<Qwen3NextConfig> config = Parse(ValidConfig());
  ASSERT_OK(config);
  EXPECT_EQ(config->base.hidden_size, 64u);
  EXPECT_EQ(config->shared_expert_intermediate_size, 48u);
  EXPECT_EQ(config->rotary_dim(), 4u);
  EXPECT_EQ(config->linear.conv_kernel, 4u);
  EXPECT_EQ(config->linear.key_dim(), 32u);
  EXPECT_EQ(config->linear.value_dim(), 32u);
  EXPECT_EQ(config->linear.conv_dim(), 96u);
  EXPECT_EQ(config->linear.value_heads_per_key_head(), 2u);
  EXPECT_TRUE(config->base.norm_topk_prob);  // Qwen3NextConfig's default
  EXPECT_EQ(config->layer_types, (std::vector<LayerType>{kLinear, kLinear, kLinear, kFull, kLinear,
                                                         kLinear, kLinear, kFull}));
  EXPECT_EQ(config->num_full_attention_layers(), 2u);
  EXPECT_EQ(config->num_linear_attention_layers(), 6u);
  EXPECT_EQ(config->IndexWithinType(3), 0u);
  EXPECT_EQ(config->IndexWithinType(7), 1u);
  EXPECT_EQ(config->IndexWithinType(4), 3u);
}

TEST(Qwen3NextConfigTest, DefaultsFollowHuggingFace) {
  nlohmann::json json = ValidConfig();
  json.erase("full_attention_interval");
  json.erase("partial_rotary_factor");
  json.erase("linear_conv_kernel_dim");
  json.erase("head_dim");
  absl::StatusOr<Qwen3NextConfig> config = Parse(json);
  ASSERT_OK(config);
  EXPECT_EQ(config->base.head_dim, 256u);    // not hidden_size / num_attention_heads
  EXPECT_EQ(config->layer_types[3], kFull);  // interval 4
  EXPECT_EQ(config->layer_types[2], kLinear);
  EXPECT_EQ(config->partial_rotary_factor, 0.25);
  EXPECT_EQ(config->linear.conv_kernel, 4u);
}

TEST(Qwen3NextConfigTest, ExplicitLayerTypesWin) {
  nlohmann::json json = ValidConfig();
  json.erase("full_attention_interval");
  json["num_hidden_layers"] = 3;
  json["layer_types"] = {"full_attention", "linear_attention", "full_attention"};
  absl::StatusOr<Qwen3NextConfig> config = Parse(json);
  ASSERT_OK(config);
  EXPECT_EQ(config->layer_types, (std::vector<LayerType>{kFull, kLinear, kFull}));
  EXPECT_EQ(config->IndexWithinType(2), 1u);
}

TEST(Qwen3NextConfigTest, RejectsBadConfigsPrecisely) {
  struct Case {
    const char* what;
    void (*edit)(nlohmann::json&);
    const char* message;
  };
  const Case cases[] = {
      {"model type", [](nlohmann::json& j) { j["model_type"] = "qwen3_moe"; },
       "only \"qwen3_next\" is supported"},
      {"missing linear field", [](nlohmann::json& j) { j.erase("linear_key_head_dim"); },
       "config is missing \"linear_key_head_dim\""},
      {"missing shared expert",
       [](nlohmann::json& j) { j.erase("shared_expert_intermediate_size"); },
       "config is missing \"shared_expert_intermediate_size\""},
      {"value heads", [](nlohmann::json& j) { j["linear_num_value_heads"] = 3; },
       "linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2"},
      {"zero kernel", [](nlohmann::json& j) { j["linear_conv_kernel_dim"] = 0; },
       "config \"linear_conv_kernel_dim\" is 0"},
      {"zero interval", [](nlohmann::json& j) { j["full_attention_interval"] = 0; },
       "config \"full_attention_interval\" is 0"},
      {"no full attention", [](nlohmann::json& j) { j["full_attention_interval"] = 9; },
       "no full_attention layer"},
      {"layer count",
       [](nlohmann::json& j) {
         j["layer_types"] = {"linear_attention", "full_attention"};
       },
       "\"layer_types\" has 2 entries for num_hidden_layers 8"},
      {"layer name",
       [](nlohmann::json& j) {
         j["num_hidden_layers"] = 2;
         j.erase("full_attention_interval");
         j["layer_types"] = {"full_attention", "mamba"};
       },
       "\"layer_types\"[1] is \"mamba\""},
      {"layer disagreement",
       [](nlohmann::json& j) {
         j["num_hidden_layers"] = 2;
         j["layer_types"] = {"full_attention", "full_attention"};
       },
       "disagrees with \"full_attention_interval\" 4"},
      {"rotary factor", [](nlohmann::json& j) { j["partial_rotary_factor"] = 1.5; },
       "partial_rotary_factor 1.5 is not in (0, 1]"},
      {"odd rotary", [](nlohmann::json& j) { j["partial_rotary_factor"] = 0.1875; },
       "rotary dimension 3"},
      {"rope scaling",
       [](nlohmann::json& j) {
         j["rope_scaling"] = {{"type", "yarn"}};
       },
       "\"rope_scaling\""},
      {"dense layers", [](nlohmann::json& j) { j["mlp_only_layers"] = {1}; },
       "\"mlp_only_layers\" [1] is not supported"},
      {"base field", [](nlohmann::json& j) { j["num_experts_per_tok"] = 9; },
       "num_experts_per_tok 9 exceeds num_experts 8"},
  };
  for (const Case& c : cases) {
    nlohmann::json json = ValidConfig();
    c.edit(json);
    EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.what;
  }
  EXPECT_THAT(ParseQwen3NextConfig("{"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Qwen3NextConfigTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadQwen3NextConfig("/nonexistent/config.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/config.json")));
}

}  // namespace
}  // namespace kvcache::worker
