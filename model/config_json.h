// Readers of Hugging Face config.json fields, shared by the configs of the worker's models
// (model/model_config.h, model/qwen3_next_config.h) so that every model answers a bad field with
// the same INVALID_ARGUMENT message: `config is missing "KEY"`, or `config "KEY" must be ...`.
// A field that is absent or null leaves `out` unchanged unless it is required.
// Thread-safety: pure functions.
#ifndef KVCACHE_MODEL_CONFIG_JSON_H_
#define KVCACHE_MODEL_CONFIG_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/model_config.h"

namespace kvcache::worker::config_json {

using Json = nlohmann::json;

// An integer in [0, 2^31].
absl::Status ReadUint(const Json& root, const char* key, bool required, uint32_t& out);
absl::Status ReadDouble(const Json& root, const char* key, bool required, double& out);
absl::Status ReadBool(const Json& root, const char* key, bool& out);

// INVALID_ARGUMENT unless "model_type" is absent or equals `model_type`.
absl::Status CheckModelType(const Json& root, const char* model_type);

// Rejects the attention and MLP options no worker model implements: a hidden_act other than
// silu, attention_bias, use_sliding_window, rope_scaling, decoder_sparse_step other than 1 and
// dense mlp_only_layers.
absl::Status CheckCommonSupported(const Json& root);

// The decoder fields every worker model shares (hidden size, heads, experts, norms, RoPE base,
// vocabulary, embeddings), with head_dim defaulting to hidden_size / num_attention_heads. Does
// not call Validate.
absl::Status ReadDecoderFields(const Json& root, ModelConfig& config);

// The text of the file at `path`: NOT_FOUND if it does not exist, PERMISSION_DENIED if it cannot
// be read.
absl::StatusOr<std::string> ReadConfigText(const std::string& path);

// Parses `json_text` and hands the root to `parse_root`; INVALID_ARGUMENT for malformed JSON or a
// JSON library error.
template <typename Config, typename ParseRoot>
absl::StatusOr<Config> ParseWith(absl::string_view json_text, ParseRoot parse_root) {
  const Json root = Json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config is not valid JSON");
  try {
    return parse_root(root);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed config: ", e.what()));
  }
}

// Reads `path` and parses it with `parse_text`; errors are prefixed with the path.
template <typename Config, typename ParseText>
absl::StatusOr<Config> LoadWith(const std::string& path, ParseText parse_text) {
  absl::StatusOr<std::string> text = ReadConfigText(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Config> config = parse_text(*text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace kvcache::worker::config_json

#endif  // KVCACHE_MODEL_CONFIG_JSON_H_
