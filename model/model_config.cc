#include "model/model_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/config_json.h"

namespace kvcache::worker {
namespace {

using Json = nlohmann::json;

absl::StatusOr<ModelConfig> ParseRoot(const Json& root) {
  if (!root.is_object()) return absl::InvalidArgumentError("config is not a JSON object");
  RETURN_IF_ERROR(config_json::CheckModelType(root, "qwen3_moe"));
  RETURN_IF_ERROR(config_json::CheckCommonSupported(root));
  ModelConfig config;
  RETURN_IF_ERROR(config_json::ReadDecoderFields(root, config));
  RETURN_IF_ERROR(config.Validate());
  return config;
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  const std::pair<const char*, uint32_t> positive[] = {
      {"hidden_size", hidden_size},
      {"moe_intermediate_size", moe_intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"num_experts", num_experts},
      {"num_experts_per_tok", num_experts_per_tok},
      {"max_position_embeddings", max_position_embeddings},
  };
  for (const auto& [name, value] : positive) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat("config \"", name, "\" is 0"));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", num_attention_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   num_key_value_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", head_dim, " is odd; RoPE needs pairs"));
  }
  if (num_experts_per_tok > num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("num_experts_per_tok ", num_experts_per_tok,
                                                   " exceeds num_experts ", num_experts));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return absl::InvalidArgumentError(absl::StrCat("rms_norm_eps ", rms_norm_eps, " is not > 0"));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(absl::StrCat("rope_theta ", rope_theta, " is not > 0"));
  }
  return absl::OkStatus();
}

std::string ModelConfig::DebugString() const {
  return absl::StrCat("hidden=", hidden_size, " layers=", num_hidden_layers,
                      " heads=", num_attention_heads, " kv_heads=", num_key_value_heads,
                      " head_dim=", head_dim, " vocab=", vocab_size, " experts=", num_experts,
                      " top_k=", num_experts_per_tok, " moe_intermediate=", moe_intermediate_size,
                      " max_positions=", max_position_embeddings);
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  return config_json::ParseWith<ModelConfig>(json_text, ParseRoot);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  return config_json::LoadWith<ModelConfig>(path, ParseModelConfig);
}

}  // namespace kvcache::worker
