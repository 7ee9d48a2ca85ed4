// ModelConfig: the hyper-parameters of a Qwen3-MoE-style decoder, parsed from a Hugging Face
// `config.json` (model_type "qwen3_moe"). Only what the CPU decoder implements is accepted: every
// layer sparse (decoder_sparse_step 1, no mlp_only_layers), no attention bias, SiLU, no RoPE
// scaling, no sliding window. Anything else is INVALID_ARGUMENT rather than a silently wrong model.
// Thread-safety: value type; thread-compatible.
#ifndef KVCACHE_MODEL_MODEL_CONFIG_H_
#define KVCACHE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache::worker {

struct ModelConfig {
  uint32_t hidden_size = 0;
  uint32_t intermediate_size = 0;  // dense MLP width; unused (every layer is MoE)
  uint32_t moe_intermediate_size = 0;
  uint32_t num_hidden_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_key_value_heads = 0;
  uint32_t head_dim = 0;  // defaults to hidden_size / num_attention_heads when absent
  uint32_t vocab_size = 0;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  uint32_t num_experts = 0;
  uint32_t num_experts_per_tok = 0;
  bool norm_topk_prob = false;  // Hugging Face's default for Qwen3MoeConfig
  uint32_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  uint32_t q_dim() const { return num_attention_heads * head_dim; }
  uint32_t kv_dim() const { return num_key_value_heads * head_dim; }

  // INVALID_ARGUMENT naming the first field out of range or inconsistent.
  absl::Status Validate() const;
  std::string DebugString() const;
};

// Parses and validates the text of a config.json. INVALID_ARGUMENT for malformed JSON, a missing
// required field, a field of the wrong type, or an unsupported architecture option.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);

// Reads and parses `path`; NOT_FOUND if it does not exist.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_MODEL_CONFIG_H_
