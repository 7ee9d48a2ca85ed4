// Qwen3MoeModel: a CPU reference of a Qwen3-MoE decoder in float32 whose attention runs over a
// paged KV pool it does not own (model/paged_kv.h).
//
// Per layer: input RMSNorm → Q/K/V projections → per-head q_norm / k_norm (RMSNorm over head_dim)
// → rotate-half RoPE → K/V written to the pool → causal GQA attention over K/V READ BACK from the
// pool (softmax in fp32, scale 1/sqrt(head_dim)) → o_proj → residual; post-attention RMSNorm →
// router softmax over all experts → top-k (renormalized when norm_topk_prob) → SwiGLU experts,
// summed in expert-index order → residual. Then the final norm and lm_head (tied or not).
//
// Determinism: every reduction has a fixed order and attention reads only pool contents, so a
// token's logits depend only on its token, its position and the pool bytes of positions <= its
// own. Computing a prompt in one Forward, in several chunks, or over prefix blocks copied in from
// another sequence gives bit-identical logits (for any pool dtype).
//
// Weights are float32 copies (bf16 / fp16 checkpoints are widened exactly on load).
// Thread-safety: immutable after Load(); concurrent Forward() calls are safe as long as they
// write different pool blocks.
#ifndef KVCACHE_MODEL_QWEN3_MOE_H_
#define KVCACHE_MODEL_QWEN3_MOE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "model/model_config.h"
#include "model/moe_block.h"
#include "model/paged_kv.h"
#include "model/safetensors.h"

namespace kvcache::worker {

// The argument checks of Qwen3MoeModel::Forward, in one place so that every backend of the model
// (model/cuda/qwen3_moe_cuda.h) answers a bad request with the same code and message; see Forward
// for the codes. Reads only kv's layout, block table and pool size, never the pool memory, so `kv`
// may view a device pool.
absl::Status CheckForwardRequest(const ModelConfig& config, absl::Span<const uint32_t> tokens,
                                 uint32_t start_position, const PagedKv& kv);

class Qwen3MoeModel {
 public:
  // The weights, float32, each a row-major Linear weight [out, in] or a norm vector.
  using Expert = SwiGluExpert;  // [moe_intermediate, hidden] / [hidden, moe_intermediate]
  struct Layer {
    std::vector<float> input_norm;  // [hidden]
    std::vector<float> q_proj;      // [heads * head_dim, hidden]
    std::vector<float> k_proj;      // [kv_heads * head_dim, hidden]
    std::vector<float> v_proj;      // [kv_heads * head_dim, hidden]
    std::vector<float> o_proj;      // [hidden, heads * head_dim]
    std::vector<float> q_norm;      // [head_dim]
    std::vector<float> k_norm;      // [head_dim]
    std::vector<float> post_norm;   // [hidden]
    std::vector<float> router;      // [experts, hidden]
    std::vector<Expert> experts;
  };

  // Reads `checkpoint_dir`/config.json and `checkpoint_dir`/model.safetensors (one file; sharded
  // checkpoints are not supported). NOT_FOUND for a missing file or tensor, INVALID_ARGUMENT for a
  // malformed config or file or a mis-shaped tensor; messages name the file and the tensor.
  static absl::StatusOr<Qwen3MoeModel> Load(const std::string& checkpoint_dir);
  // Same, from an already parsed config and an open file. REQUIRES: config.Validate() is OK.
  static absl::StatusOr<Qwen3MoeModel> FromSafetensors(const ModelConfig& config,
                                                       const SafetensorsFile& file);

  Qwen3MoeModel(Qwen3MoeModel&&) = default;
  Qwen3MoeModel& operator=(Qwen3MoeModel&&) = default;

  const ModelConfig& config() const { return config_; }

  // Read-only views of the weights, for other backends of the same model (the CUDA model uploads
  // them once).
  const std::vector<float>& embed_tokens() const { return embed_tokens_; }  // [vocab, hidden]
  const std::vector<Layer>& layers() const { return layers_; }
  const std::vector<float>& final_norm() const { return final_norm_; }  // [hidden]
  // [vocab, hidden]: lm_head, or embed_tokens when tie_word_embeddings.
  const std::vector<float>& lm_head() const {
    return config_.tie_word_embeddings ? embed_tokens_ : lm_head_;
  }

  // The pool layout this model's KV needs, for a pool of `block_size`-token blocks of `dtype`.
  PoolLayout KvLayout(uint32_t block_size, DType dtype) const;

  // Runs `tokens` at positions start_position, start_position + 1, ...; writes their K/V into
  // `kv` and returns the logits (vocab_size floats) of the last token. K/V of positions below
  // start_position must already be in the pool.
  // Errors: INVALID_ARGUMENT for no tokens or a token >= vocab_size; OUT_OF_RANGE when a position
  // reaches max_position_embeddings or the block table's capacity; FAILED_PRECONDITION when the
  // pool layout is not this model's; OUT_OF_RANGE / INVALID_ARGUMENT from kv.Validate(). Nothing
  // is written to the pool when an error is returned.
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const uint32_t> tokens,
                                             uint32_t start_position, PagedKv& kv) const;

 private:
  // Scratch buffers of one Forward call.
  struct Scratch;

  explicit Qwen3MoeModel(const ModelConfig& config);

  // Attention sub-block of `layer` for x ([n, hidden]), residual included.
  absl::Status Attention(uint32_t layer_index, uint32_t start_position, PagedKv& kv,
                         Scratch& scratch) const;
  // MoE sub-block of `layer` for one token's hidden state, residual included.
  void Moe(const Layer& layer, float* x, Scratch& scratch) const;

  ModelConfig config_;
  std::vector<double> rope_inv_freq_;
  std::vector<float> embed_tokens_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;  // [hidden]
  std::vector<float> lm_head_;     // [vocab, hidden]; empty when tied to embed_tokens_
};

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_QWEN3_MOE_H_
