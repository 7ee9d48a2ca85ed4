// Qwen3NextConfig: the hyper-parameters of a Qwen3-Next-style hybrid MoE decoder, parsed from a
// Hugging Face `config.json` (model_type "qwen3_next"), following
// transformers/models/qwen3_next/configuration_qwen3_next.py: layers are "linear_attention"
// (Gated DeltaNet) or "full_attention" (gated attention), given by `layer_types` or, without it,
// by `full_attention_interval` (layer i is full attention when (i + 1) % interval == 0; default
// 4); every layer's feed-forward is a sparse MoE with a shared expert.
//
// Only what the CPU decoder implements is accepted, as for Qwen3-MoE (model/model_config.h):
// every layer MoE, no attention bias, SiLU, no RoPE scaling. Anything else is INVALID_ARGUMENT.
// Thread-safety: value type; thread-compatible.
#ifndef KVCACHE_MODEL_QWEN3_NEXT_CONFIG_H_
#define KVCACHE_MODEL_QWEN3_NEXT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/model_config.h"

namespace kvcache::worker {

enum class LayerType : uint8_t { kLinearAttention, kFullAttention };

// The shape of one Gated DeltaNet layer.
struct LinearAttentionDims {
  uint32_t num_key_heads = 0;    // linear_num_key_heads
  uint32_t num_value_heads = 0;  // linear_num_value_heads, a multiple of num_key_heads
  uint32_t key_head_dim = 0;     // linear_key_head_dim
  uint32_t value_head_dim = 0;   // linear_value_head_dim
  uint32_t conv_kernel = 0;      // linear_conv_kernel_dim

  uint32_t key_dim() const { return num_key_heads * key_head_dim; }
  uint32_t value_dim() const { return num_value_heads * value_head_dim; }
  // Channels of the short convolution: q, k and v side by side.
  uint32_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // Value heads per key head (q and k are shared by that many value heads).
  uint32_t value_heads_per_key_head() const { return num_value_heads / num_key_heads; }
  // Floats of one layer's recurrent state, [num_value_heads][key_head_dim][value_head_dim].
  uint64_t recurrent_floats() const {
    return uint64_t{num_value_heads} * key_head_dim * value_head_dim;
  }
  // Floats of one layer's convolution state, [conv_dim][conv_kernel - 1].
  uint64_t conv_floats() const { return uint64_t{conv_dim()} * (conv_kernel - 1); }
};

struct Qwen3NextConfig {
  // Embeddings, full attention (heads, kv heads, head_dim, rope_theta), routed experts, norms.
  // base.num_hidden_layers counts every layer, linear and full.
  ModelConfig base;
  uint32_t shared_expert_intermediate_size = 0;
  double partial_rotary_factor = 0.25;  // RoPE on the first head_dim * factor dims of q and k
  LinearAttentionDims linear;
  std::vector<LayerType> layer_types;  // num_hidden_layers entries

  // head_dim * partial_rotary_factor, truncated as Hugging Face's int() does.
  uint32_t rotary_dim() const;
  uint32_t num_full_attention_layers() const;
  uint32_t num_linear_attention_layers() const;
  // For layer i: its index among the layers of its own type (the pool layer of a full-attention
  // layer, the state slot of a linear one).
  uint32_t IndexWithinType(uint32_t layer) const;

  // INVALID_ARGUMENT naming the first field out of range or inconsistent.
  absl::Status Validate() const;
};

// Parses and validates the text of a config.json. INVALID_ARGUMENT for malformed JSON, a missing
// required field, a field of the wrong type, layer_types that disagree with num_hidden_layers or
// full_attention_interval, or an unsupported architecture option.
absl::StatusOr<Qwen3NextConfig> ParseQwen3NextConfig(absl::string_view json_text);

// Reads and parses `path`; NOT_FOUND if it does not exist.
absl::StatusOr<Qwen3NextConfig> LoadQwen3NextConfig(const std::string& path);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_QWEN3_NEXT_CONFIG_H_
