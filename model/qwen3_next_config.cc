#include "model/qwen3_next_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/config_json.h"

namespace kvcache::worker {
namespace {

using config_json::Json;

// Hugging Face's default when neither layer_types nor full_attention_interval is given.
constexpr uint32_t kDefaultFullAttentionInterval = 4;
constexpr uint32_t kDefaultHeadDim = 256;

std::vector<LayerType> LayersFromInterval(uint32_t num_layers, uint32_t interval) {
  std::vector<LayerType> types(num_layers);
  for (uint32_t i = 0; i < num_layers; ++i) {
    types[i] = (i + 1) % interval == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention;
  }
  return types;
}

absl::Status ReadLayerTypes(const Json& root, Qwen3NextConfig& config) {
  uint32_t interval = 0;
  RETURN_IF_ERROR(config_json::ReadUint(root, "full_attention_interval", false, interval));
  if (root.contains("full_attention_interval") && interval == 0) {
    return absl::InvalidArgumentError("config \"full_attention_interval\" is 0");
  }
  const uint32_t num_layers = config.base.num_hidden_layers;
  const auto it = root.find("layer_types");
  if (it == root.end() || it->is_null()) {
    config.layer_types =
        LayersFromInterval(num_layers, interval == 0 ? kDefaultFullAttentionInterval : interval);
    return absl::OkStatus();
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config \"layer_types\" must be a list, got ", it->dump()));
  }
  if (it->size() != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("config \"layer_types\" has ", it->size(),
                                                   " entries for num_hidden_layers ", num_layers));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& entry = (*it)[i];
    if (entry.is_string() && entry.get<std::string>() == "linear_attention") {
      config.layer_types.push_back(LayerType::kLinearAttention);
    } else if (entry.is_string() && entry.get<std::string>() == "full_attention") {
      config.layer_types.push_back(LayerType::kFullAttention);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("config \"layer_types\"[", i, "] is ", entry.dump(),
                       "; want \"linear_attention\" or \"full_attention\""));
    }
  }
  if (interval != 0 && config.layer_types != LayersFromInterval(num_layers, interval)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config \"layer_types\" disagrees with \"full_attention_interval\" ", interval));
  }
  return absl::OkStatus();
}

absl::StatusOr<Qwen3NextConfig> ParseRoot(const Json& root) {
  if (!root.is_object()) return absl::InvalidArgumentError("config is not a JSON object");
  RETURN_IF_ERROR(config_json::CheckModelType(root, "qwen3_next"));
  RETURN_IF_ERROR(config_json::CheckCommonSupported(root));
  Qwen3NextConfig config;
  // Qwen3NextConfig's default head_dim, where Qwen3MoeConfig derives hidden / heads.
  config.base.head_dim = kDefaultHeadDim;
  RETURN_IF_ERROR(config_json::ReadDecoderFields(root, config.base));
  // Qwen3NextConfig's default, unlike Qwen3MoeConfig's.
  config.base.norm_topk_prob = true;
  RETURN_IF_ERROR(config_json::ReadBool(root, "norm_topk_prob", config.base.norm_topk_prob));
  RETURN_IF_ERROR(config_json::ReadUint(root, "shared_expert_intermediate_size", true,
                                        config.shared_expert_intermediate_size));
  RETURN_IF_ERROR(
      config_json::ReadDouble(root, "partial_rotary_factor", false, config.partial_rotary_factor));
  LinearAttentionDims& linear = config.linear;
  linear.conv_kernel = 4;
  RETURN_IF_ERROR(config_json::ReadUint(root, "linear_conv_kernel_dim", false, linear.conv_kernel));
  RETURN_IF_ERROR(config_json::ReadUint(root, "linear_key_head_dim", true, linear.key_head_dim));
  RETURN_IF_ERROR(
      config_json::ReadUint(root, "linear_value_head_dim", true, linear.value_head_dim));
  RETURN_IF_ERROR(config_json::ReadUint(root, "linear_num_key_heads", true, linear.num_key_heads));
  RETURN_IF_ERROR(
      config_json::ReadUint(root, "linear_num_value_heads", true, linear.num_value_heads));
  RETURN_IF_ERROR(ReadLayerTypes(root, config));
  RETURN_IF_ERROR(config.Validate());
  return config;
}

}  // namespace

uint32_t Qwen3NextConfig::rotary_dim() const {
  return static_cast<uint32_t>(base.head_dim * partial_rotary_factor);
}

uint32_t Qwen3NextConfig::num_full_attention_layers() const {
  uint32_t count = 0;
  for (LayerType type : layer_types) count += type == LayerType::kFullAttention ? 1 : 0;
  return count;
}

uint32_t Qwen3NextConfig::num_linear_attention_layers() const {
  return static_cast<uint32_t>(layer_types.size()) - num_full_attention_layers();
}

uint32_t Qwen3NextConfig::IndexWithinType(uint32_t layer) const {
  uint32_t index = 0;
  for (uint32_t i = 0; i < layer; ++i) index += layer_types[i] == layer_types[layer] ? 1 : 0;
  return index;
}

absl::Status Qwen3NextConfig::Validate() const {
  RETURN_IF_ERROR(base.Validate());
  const std::pair<const char*, uint32_t> positive[] = {
      {"shared_expert_intermediate_size", shared_expert_intermediate_size},
      {"linear_conv_kernel_dim", linear.conv_kernel},
      {"linear_key_head_dim", linear.key_head_dim},
      {"linear_value_head_dim", linear.value_head_dim},
      {"linear_num_key_heads", linear.num_key_heads},
      {"linear_num_value_heads", linear.num_value_heads},
  };
  for (const auto& [name, value] : positive) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat("config \"", name, "\" is 0"));
  }
  if (linear.num_value_heads % linear.num_key_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear_num_value_heads ", linear.num_value_heads,
                     " is not a multiple of linear_num_key_heads ", linear.num_key_heads));
  }
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial_rotary_factor ", partial_rotary_factor, " is not in (0, 1]"));
  }
  const uint32_t rotary = rotary_dim();
  if (rotary < 2 || rotary % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rotary dimension ", rotary, " (head_dim ", base.head_dim, " * partial_rotary_factor ",
        partial_rotary_factor, ") must be even and at least 2"));
  }
  if (layer_types.size() != base.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(layer_types.size(), " layer types for ", base.num_hidden_layers, " layers"));
  }
  if (num_full_attention_layers() == 0) {
    return absl::InvalidArgumentError(
        "config has no full_attention layer; the KV pool needs at least one");
  }
  return absl::OkStatus();
}

absl::StatusOr<Qwen3NextConfig> ParseQwen3NextConfig(absl::string_view json_text) {
  return config_json::ParseWith<Qwen3NextConfig>(json_text, ParseRoot);
}

absl::StatusOr<Qwen3NextConfig> LoadQwen3NextConfig(const std::string& path) {
  return config_json::LoadWith<Qwen3NextConfig>(path, ParseQwen3NextConfig);
}

}  // namespace kvcache::worker
