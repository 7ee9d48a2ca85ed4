// Qwen3NextModel: a CPU reference of a Qwen3-Next-style hybrid MoE decoder in float32. Its
// full-attention layers keep K/V in a paged pool it does not own (model/paged_kv.h, pool layer =
// the layer's index among the full-attention layers); its linear-attention layers carry a
// per-sequence recurrent state (model/linear_attention_state.h). Followed:
// Hugging Face transformers, src/transformers/models/qwen3_next/modeling_qwen3_next.py and
// configuration_qwen3_next.py.
//
// Per layer: x += mixer(RMSNorm(x)); x += MoE(RMSNorm(x)), every RMSNorm outside the linear
// attention's gated one zero-centred (scale 1 + weight; Qwen3NextRMSNorm; the loader adds the 1).
//  - linear_attention (Qwen3NextGatedDeltaNet): in_proj_qkvz and in_proj_ba, grouped per key head
//    as [q | k | v | z] and [b | a]; causal depthwise conv (kernel linear_conv_kernel_dim) + SiLU
//    over q, k, v; the gated delta rule (model/linear_attention.h); per value head
//    RMSNormGated(o, z) = weight * RMSNorm(o) * SiLU(z) (weight not zero-centred); out_proj.
//  - full_attention (Qwen3NextAttention): q_proj gives per head [query | gate]; q_norm / k_norm
//    per head; rotate-half RoPE on the first rotary_dim = head_dim * partial_rotary_factor dims;
//    K/V to the pool; causal GQA attention over the K/V read back from the pool; the output times
//    sigmoid(gate); o_proj.
//  - MoE (Qwen3NextSparseMoeBlock): softmax router, top-k (renormalized when norm_topk_prob),
//    SwiGLU experts summed in expert-index order, plus the shared expert scaled by
//    sigmoid(shared_expert_gate · x).
//
// Determinism: every reduction has a fixed order, attention reads only pool contents, and the
// recurrence runs token by token from a float32 state saved as exact bytes. So running tokens
// [0, n) at once, or [0, m) then [m, n) resuming from the state after m and the pool's KV, gives
// bit-identical logits, KV bytes and state, for any m. (Hugging Face's eager code restarts the
// recurrence for every multi-token call and only carries the state across one-token decode
// steps; here every call continues from the state it is given, which is the same math and what a
// prefix hit needs.)
// Thread-safety: immutable after Load(); concurrent Forward() calls are safe when they use
// different states and write different pool blocks.
#ifndef KVCACHE_MODEL_QWEN3_NEXT_H_
#define KVCACHE_MODEL_QWEN3_NEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "model/linear_attention_state.h"
#include "model/moe_block.h"
#include "model/paged_kv.h"
#include "model/qwen3_next_config.h"
#include "model/safetensors.h"

namespace kvcache::worker {

// The linear-attention state checks of Qwen3NextModel::Forward, in one place so that every
// backend (model/cuda/qwen3_next_cuda.h) answers with the same code and message:
// FAILED_PRECONDITION when a state of `state_bytes` bytes is not `config`'s, or its position is
// not start_position.
absl::Status CheckStateRequest(const Qwen3NextConfig& config, uint64_t state_bytes,
                               uint64_t state_position, uint32_t start_position);

class Qwen3NextModel {
 public:
  // Weights in float32, each a row-major Linear weight [out, in] or a vector. Zero-centred norm
  // weights are stored with the 1 added (the scale applied).
  struct LinearAttentionWeights {
    std::vector<float> in_proj_qkvz;  // [key_heads * (2 key_head_dim + 2 r value_head_dim), hidden]
    std::vector<float> in_proj_ba;    // [2 value_heads, hidden]
    std::vector<float> conv;          // [conv_dim, conv_kernel]
    std::vector<float> dt_bias;       // [value_heads]
    std::vector<float> a_log;         // [value_heads]
    std::vector<float> norm;          // [value_head_dim], RMSNormGated's weight as stored
    std::vector<float> out_proj;      // [hidden, value_dim]
  };
  struct FullAttentionWeights {
    std::vector<float> q_proj;  // [heads * 2 * head_dim, hidden], per head [query | gate]
    std::vector<float> k_proj;  // [kv_heads * head_dim, hidden]
    std::vector<float> v_proj;  // [kv_heads * head_dim, hidden]
    std::vector<float> o_proj;  // [hidden, heads * head_dim]
    std::vector<float> q_norm;  // [head_dim], 1 + weight
    std::vector<float> k_norm;  // [head_dim], 1 + weight
  };
  struct Layer {
    LayerType type = LayerType::kLinearAttention;
    std::vector<float> input_norm;  // [hidden], 1 + weight
    std::vector<float> post_norm;   // [hidden], 1 + weight
    LinearAttentionWeights linear;  // empty for a full-attention layer
    FullAttentionWeights full;      // empty for a linear-attention layer
    std::vector<float> router;      // [experts, hidden]
    std::vector<SwiGluExpert> experts;
    SwiGluExpert shared_expert;             // intermediate shared_expert_intermediate_size
    std::vector<float> shared_expert_gate;  // [hidden] (Linear [1, hidden])
  };

  // Reads `checkpoint_dir`/config.json and `checkpoint_dir`/model.safetensors. NOT_FOUND for a
  // missing file or tensor, INVALID_ARGUMENT for a malformed config or file or a mis-shaped
  // tensor; messages name the file and the tensor.
  static absl::StatusOr<Qwen3NextModel> Load(const std::string& checkpoint_dir);
  // Same, from a parsed config and an open file. INVALID_ARGUMENT when config.Validate() fails.
  static absl::StatusOr<Qwen3NextModel> FromSafetensors(const Qwen3NextConfig& config,
                                                        const SafetensorsFile& file);

  Qwen3NextModel(Qwen3NextModel&&) = default;
  Qwen3NextModel& operator=(Qwen3NextModel&&) = default;

  const Qwen3NextConfig& config() const { return config_; }
  const std::vector<Layer>& layers() const { return layers_; }
  const std::vector<float>& embed_tokens() const { return embed_tokens_; }  // [vocab, hidden]
  const std::vector<float>& final_norm() const { return final_norm_; }      // 1 + weight
  const std::vector<float>& lm_head() const {
    return config_.base.tie_word_embeddings ? embed_tokens_ : lm_head_;
  }

  // The pool layout of the full-attention layers' KV, `block_size`-token blocks of `dtype`.
  PoolLayout KvLayout(uint32_t block_size, DType dtype) const;
  // A zero state for a new sequence.
  LinearAttentionState NewState() const { return LinearAttentionState(config_); }

  // Runs `tokens` at positions start_position, start_position + 1, ...: writes their K/V into
  // `kv`, advances `state` past them, and returns the logits (vocab_size floats) of the last
  // token. K/V of positions below start_position must be in the pool and `state` must be the
  // state after exactly start_position tokens.
  // Errors: those of Qwen3MoeModel::Forward (CheckForwardRequest: INVALID_ARGUMENT, OUT_OF_RANGE,
  // FAILED_PRECONDITION for a pool of another shape); FAILED_PRECONDITION when state.position()
  // is not start_position or the state belongs to another model. Nothing is written to the pool
  // or the state when an error is returned.
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const uint32_t> tokens,
                                             uint32_t start_position, PagedKv& kv,
                                             LinearAttentionState& state) const;

  // Forward, split so that a chunk ends at every position that is a multiple of
  // `checkpoint_interval` tokens (a page, or every N pages); after each such chunk
  // `on_checkpoint(state)` is called with the state at that boundary (state.position() says
  // which), for the caller to save as the page's state part. Same logits, KV and final state as
  // one Forward. INVALID_ARGUMENT for an interval of 0; an error from on_checkpoint stops the run
  // and is returned (the chunks before it stay written).
  absl::StatusOr<std::vector<float>> ForwardWithCheckpoints(
      absl::Span<const uint32_t> tokens, uint32_t start_position, PagedKv& kv,
      LinearAttentionState& state, uint32_t checkpoint_interval,
      absl::FunctionRef<absl::Status(const LinearAttentionState&)> on_checkpoint) const;

 private:
  struct Scratch;

  explicit Qwen3NextModel(const Qwen3NextConfig& config);

  absl::Status CheckRequest(absl::Span<const uint32_t> tokens, uint32_t start_position,
                            const PagedKv& kv, const LinearAttentionState& state) const;
  // The token mixers of layer `layer_index` for scratch.x ([n, hidden]), residual included.
  void LinearAttention(uint32_t layer_index, LinearAttentionState& state, Scratch& scratch) const;
  absl::Status FullAttention(uint32_t layer_index, uint32_t start_position, PagedKv& kv,
                             Scratch& scratch) const;
  // The MoE sub-block of `layer` for one token's hidden state, residual included.
  void Moe(const Layer& layer, float* x, Scratch& scratch) const;

  Qwen3NextConfig config_;
  // config_.base with num_hidden_layers = the full-attention layers: the shape of the KV pool.
  ModelConfig kv_config_;
  std::vector<double> rope_inv_freq_;  // over rotary_dim
  std::vector<float> embed_tokens_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::vector<float> lm_head_;  // empty when tied
};

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_QWEN3_NEXT_H_
