#include "model/config_json.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvcache::worker::config_json {
namespace {

constexpr uint64_t kMaxDimension = 1ull << 31;

}  // namespace

absl::Status ReadUint(const Json& root, const char* key, bool required, uint32_t& out) {
  const auto it = root.find(key);
  if (it == root.end() || it->is_null()) {
    if (required)
      return absl::InvalidArgumentError(absl::StrCat("config is missing \"", key, "\""));
    return absl::OkStatus();
  }
  if (!it->is_number_unsigned() || it->get<uint64_t>() > kMaxDimension) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config \"", key, "\" must be an integer in [0, ", kMaxDimension, "], got ", it->dump()));
  }
  out = static_cast<uint32_t>(it->get<uint64_t>());
  return absl::OkStatus();
}

absl::Status ReadDouble(const Json& root, const char* key, bool required, double& out) {
  const auto it = root.find(key);
  if (it == root.end() || it->is_null()) {
    if (required)
      return absl::InvalidArgumentError(absl::StrCat("config is missing \"", key, "\""));
    return absl::OkStatus();
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config \"", key, "\" must be a number, got ", it->dump()));
  }
  out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& root, const char* key, bool& out) {
  const auto it = root.find(key);
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config \"", key, "\" must be true or false, got ", it->dump()));
  }
  out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status CheckModelType(const Json& root, const char* model_type) {
  if (const auto it = root.find("model_type");
      it != root.end() && !(it->is_string() && it->get<std::string>() == model_type)) {
    return absl::InvalidArgumentError(absl::StrCat("config \"model_type\" is ", it->dump(),
                                                   "; only \"", model_type, "\" is supported"));
  }
  return absl::OkStatus();
}

absl::Status CheckCommonSupported(const Json& root) {
  if (const auto it = root.find("hidden_act");
      it != root.end() && !(it->is_string() && it->get<std::string>() == "silu")) {
    return absl::InvalidArgumentError(
        absl::StrCat("config \"hidden_act\" is ", it->dump(), "; only \"silu\" is supported"));
  }
  bool flag = false;
  RETURN_IF_ERROR(ReadBool(root, "attention_bias", flag));
  if (flag) return absl::InvalidArgumentError("config \"attention_bias\": true is not supported");
  RETURN_IF_ERROR(ReadBool(root, "use_sliding_window", flag));
  if (flag)
    return absl::InvalidArgumentError("config \"use_sliding_window\": true is not supported");
  if (const auto it = root.find("rope_scaling"); it != root.end() && !it->is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("config \"rope_scaling\" ", it->dump(),
                                                   " is not supported (only plain RoPE)"));
  }
  uint32_t sparse_step = 1;
  RETURN_IF_ERROR(ReadUint(root, "decoder_sparse_step", false, sparse_step));
  if (sparse_step != 1) {
    return absl::InvalidArgumentError(absl::StrCat("config \"decoder_sparse_step\" is ",
                                                   sparse_step,
                                                   "; only 1 (every layer MoE) is supported"));
  }
  if (const auto it = root.find("mlp_only_layers");
      it != root.end() && !it->is_null() && !(it->is_array() && it->empty())) {
    return absl::InvalidArgumentError(absl::StrCat("config \"mlp_only_layers\" ", it->dump(),
                                                   " is not supported (dense layers)"));
  }
  return absl::OkStatus();
}

absl::Status ReadDecoderFields(const Json& root, ModelConfig& config) {
  RETURN_IF_ERROR(ReadUint(root, "hidden_size", true, config.hidden_size));
  RETURN_IF_ERROR(ReadUint(root, "intermediate_size", false, config.intermediate_size));
  RETURN_IF_ERROR(ReadUint(root, "moe_intermediate_size", true, config.moe_intermediate_size));
  RETURN_IF_ERROR(ReadUint(root, "num_hidden_layers", true, config.num_hidden_layers));
  RETURN_IF_ERROR(ReadUint(root, "num_attention_heads", true, config.num_attention_heads));
  RETURN_IF_ERROR(ReadUint(root, "num_key_value_heads", true, config.num_key_value_heads));
  RETURN_IF_ERROR(ReadUint(root, "head_dim", false, config.head_dim));
  RETURN_IF_ERROR(ReadUint(root, "vocab_size", true, config.vocab_size));
  RETURN_IF_ERROR(ReadUint(root, "num_experts", true, config.num_experts));
  RETURN_IF_ERROR(ReadUint(root, "num_experts_per_tok", true, config.num_experts_per_tok));
  RETURN_IF_ERROR(ReadUint(root, "max_position_embeddings", true, config.max_position_embeddings));
  double eps = config.rms_norm_eps;
  RETURN_IF_ERROR(ReadDouble(root, "rms_norm_eps", true, eps));
  config.rms_norm_eps = static_cast<float>(eps);
  // Newer Hugging Face configs nest the base under "rope_parameters".
  const auto rope_parameters = root.find("rope_parameters");
  const bool nested_rope =
      !root.contains("rope_theta") && rope_parameters != root.end() && rope_parameters->is_object();
  if (nested_rope) {
    if (const auto type = rope_parameters->find("rope_type");
        type != rope_parameters->end() && !(type->is_string() && *type == "default")) {
      return absl::InvalidArgumentError(absl::StrCat("config \"rope_parameters\" ",
                                                     rope_parameters->dump(),
                                                     " is not supported (only plain RoPE)"));
    }
  }
  RETURN_IF_ERROR(
      ReadDouble(nested_rope ? *rope_parameters : root, "rope_theta", true, config.rope_theta));
  RETURN_IF_ERROR(ReadBool(root, "norm_topk_prob", config.norm_topk_prob));
  RETURN_IF_ERROR(ReadBool(root, "tie_word_embeddings", config.tie_word_embeddings));
  if (config.head_dim == 0) {
    if (config.num_attention_heads == 0 || config.hidden_size % config.num_attention_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config has no \"head_dim\" and hidden_size ", config.hidden_size,
                       " is not divisible by num_attention_heads ", config.num_attention_heads));
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadConfigText(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat("model config ", path, " does not exist"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot read model config ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace kvcache::worker::config_json
