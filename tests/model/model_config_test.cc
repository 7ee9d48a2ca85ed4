#include "model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

nlohmann::json ValidConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 256, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null,
    "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 4096,
    "tie_word_embeddings": false, "attention_bias": false, "torch_dtype": "bfloat16"})");
}

absl::StatusOr<ModelConfig> Parse(const nlohmann::json& json) {
  return ParseModelConfig(json.dump());
}

TEST(ModelConfigTest, ParsesEveryField) {
  absl::StatusOr<ModelConfig> config = Parse(ValidConfig());
  ASSERT_OK(config);
  EXPECT_EQ(config->hidden_size, 64u);
  EXPECT_EQ(config->intermediate_size, 128u);
  EXPECT_EQ(config->moe_intermediate_size, 32u);
  EXPECT_EQ(config->num_hidden_layers, 3u);
  EXPECT_EQ(config->num_attention_heads, 4u);
  EXPECT_EQ(config->num_key_value_heads, 2u);
  EXPECT_EQ(config->head_dim, 16u);
  EXPECT_EQ(config->vocab_size, 256u);
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-6f);
  EXPECT_EQ(config->rope_theta, 1e6);
  EXPECT_EQ(config->num_experts, 8u);
  EXPECT_EQ(config->num_experts_per_tok, 2u);
  EXPECT_TRUE(config->norm_topk_prob);
  EXPECT_EQ(config->max_position_embeddings, 4096u);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->q_dim(), 64u);
  EXPECT_EQ(config->kv_dim(), 32u);
}

TEST(ModelConfigTest, OptionalFieldsTakeHuggingFaceDefaults) {
  nlohmann::json json = ValidConfig();
  for (const char* key : {"head_dim", "norm_topk_prob", "tie_word_embeddings", "intermediate_size",
                          "model_type", "hidden_act", "rope_scaling", "mlp_only_layers"}) {
    json.erase(key);
  }
  json["hidden_size"] = 96;  // head_dim becomes 96 / 4 = 24
  absl::StatusOr<ModelConfig> config = Parse(json);
  ASSERT_OK(config);
  EXPECT_EQ(config->head_dim, 24u);
  EXPECT_FALSE(config->norm_topk_prob);
  EXPECT_FALSE(config->tie_word_embeddings);
}

TEST(ModelConfigTest, NestedRopeParametersAreRead) {
  nlohmann::json json = ValidConfig();
  json.erase("rope_theta");
  json["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  absl::StatusOr<ModelConfig> config = Parse(json);
  ASSERT_OK(config);
  EXPECT_EQ(config->rope_theta, 5000.0);
  json["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_THAT(Parse(json),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_parameters")));
}

TEST(ModelConfigTest, MalformedJsonIsInvalid) {
  EXPECT_THAT(ParseModelConfig("{\"hidden_size\": 64,"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
  EXPECT_THAT(ParseModelConfig("[1]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
}

TEST(ModelConfigTest, MissingRequiredFieldIsNamed) {
  for (const char* key :
       {"hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta", "num_experts",
        "num_experts_per_tok", "max_position_embeddings"}) {
    nlohmann::json json = ValidConfig();
    json.erase(key);
    EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key))) << key;
  }
}

TEST(ModelConfigTest, WrongTypesAreInvalid) {
  nlohmann::json json = ValidConfig();
  json["hidden_size"] = "64";
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hidden_size")));
  json = ValidConfig();
  json["num_experts"] = -8;
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_experts")));
  json = ValidConfig();
  json["head_dim"] = 16.5;
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
  json = ValidConfig();
  json["norm_topk_prob"] = 1;
  EXPECT_THAT(Parse(json),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("norm_topk_prob")));
  json = ValidConfig();
  json["rope_theta"] = "big";
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_theta")));
}

TEST(ModelConfigTest, InconsistentShapesAreInvalid) {
  nlohmann::json json = ValidConfig();
  json["num_key_value_heads"] = 3;
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("not a multiple of num_key_value_heads 3")));
  json = ValidConfig();
  json["num_experts_per_tok"] = 9;
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("num_experts_per_tok 9 exceeds num_experts 8")));
  json = ValidConfig();
  json["head_dim"] = 15;
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd")));
  json = ValidConfig();
  json["num_hidden_layers"] = 0;
  EXPECT_THAT(Parse(json),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_hidden_layers")));
  json = ValidConfig();
  json["rms_norm_eps"] = 0;
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rms_norm_eps")));
  json = ValidConfig();
  json.erase("head_dim");
  json["hidden_size"] = 66;
  EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("not divisible by num_attention_heads")));
}

TEST(ModelConfigTest, UnsupportedArchitectureOptionsAreRefused) {
  const std::pair<const char*, nlohmann::json> cases[] = {
      {"model_type", "llama"},
      {"hidden_act", "gelu"},
      {"attention_bias", true},
      {"use_sliding_window", true},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}},
      {"decoder_sparse_step", 2},
      {"mlp_only_layers", {0}},
  };
  for (const auto& [key, value] : cases) {
    nlohmann::json json = ValidConfig();
    json[key] = value;
    EXPECT_THAT(Parse(json), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(key))) << key;
  }
}

TEST(ModelConfigTest, LoadFromFile) {
  ::kvcache::testing::ScopedTempDir dir;
  EXPECT_THAT(LoadModelConfig(dir.File("config.json")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
  testing::WriteFile(dir.File("config.json"), ValidConfig().dump(2));
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir.File("config.json"));
  ASSERT_OK(config);
  EXPECT_EQ(config->vocab_size, 256u);
  testing::WriteFile(dir.File("config.json"), "{}");
  EXPECT_THAT(LoadModelConfig(dir.File("config.json")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("config.json")));
}

}  // namespace
}  // namespace kvcache::worker
