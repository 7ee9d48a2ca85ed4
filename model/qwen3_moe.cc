// Qwen3MoeModel::Forward: the decoder over a paged KV pool. See qwen3_moe.h for the contract.
#include "model/qwen3_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/moe_block.h"
#include "model/ops.h"

namespace kvcache::worker {

struct Qwen3MoeModel::Scratch {
  explicit Scratch(const ModelConfig& config, size_t num_tokens, size_t total_positions)
      : x(num_tokens * config.hidden_size),
        normed(config.hidden_size),
        q(num_tokens * config.q_dim()),
        k(config.kv_dim()),
        v(config.kv_dim()),
        keys(total_positions * config.kv_dim()),
        values(total_positions * config.kv_dim()),
        scores(total_positions),
        attn_out(config.q_dim()),
        projected(config.hidden_size),
        cos(config.head_dim / 2),
        sin(config.head_dim / 2),
        moe(config, config.moe_intermediate_size),
        moe_out(config.hidden_size) {}

  std::vector<float> x;          // [n, hidden] residual stream of the tokens being computed
  std::vector<float> normed;     // [hidden]
  std::vector<float> q;          // [n, heads * head_dim], after q_norm and RoPE
  std::vector<float> k;          // [kv_heads * head_dim]
  std::vector<float> v;          // [kv_heads * head_dim]
  std::vector<float> keys;       // [positions, kv_heads * head_dim], read back from the pool
  std::vector<float> values;     // [positions, kv_heads * head_dim], read back from the pool
  std::vector<float> scores;     // [positions]
  std::vector<float> attn_out;   // [heads * head_dim]
  std::vector<float> projected;  // [hidden]
  std::vector<float> cos;        // [head_dim / 2]
  std::vector<float> sin;        // [head_dim / 2]
  MoeScratch moe;
  std::vector<float> moe_out;  // [hidden]
};

absl::Status CheckForwardRequest(const ModelConfig& config, absl::Span<const uint32_t> tokens,
                                 uint32_t start_position, const PagedKv& kv) {
  if (tokens.empty()) return absl::InvalidArgumentError("Forward needs at least one token");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", tokens[i], " at index ", i,
                                                     " is outside the vocabulary of ",
                                                     config.vocab_size));
    }
  }
  const uint64_t end = uint64_t{start_position} + tokens.size();
  if (end > config.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("positions [", start_position, ", ", end,
                                              ") reach past max_position_embeddings ",
                                              config.max_position_embeddings));
  }
  RETURN_IF_ERROR(kv.Validate());
  RETURN_IF_ERROR(
      kv.CheckModelShape(config.num_hidden_layers, config.num_key_value_heads, config.head_dim));
  if (end > kv.capacity_tokens()) {
    return absl::OutOfRangeError(absl::StrCat("positions [", start_position, ", ", end,
                                              ") need more than the block table's ",
                                              kv.capacity_tokens(), " token slots"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Qwen3MoeModel::Forward(absl::Span<const uint32_t> tokens,
                                                          uint32_t start_position,
                                                          PagedKv& kv) const {
  RETURN_IF_ERROR(CheckForwardRequest(config_, tokens, start_position, kv));
  const size_t hidden = config_.hidden_size;
  const size_t n = tokens.size();
  Scratch scratch(config_, n, start_position + n);
  for (size_t t = 0; t < n; ++t) {
    std::memcpy(&scratch.x[t * hidden], &embed_tokens_[size_t{tokens[t]} * hidden],
                hidden * sizeof(float));
  }
  for (uint32_t l = 0; l < config_.num_hidden_layers; ++l) {
    RETURN_IF_ERROR(Attention(l, start_position, kv, scratch));
    for (size_t t = 0; t < n; ++t) Moe(layers_[l], &scratch.x[t * hidden], scratch);
  }
  // Only the last token's logits are needed.
  const float* last = &scratch.x[(n - 1) * hidden];
  RmsNorm(last, final_norm_.data(), hidden, config_.rms_norm_eps, scratch.normed.data());
  std::vector<float> logits(config_.vocab_size);
  const std::vector<float>& head = config_.tie_word_embeddings ? embed_tokens_ : lm_head_;
  MatVec(head.data(), scratch.normed.data(), config_.vocab_size, hidden, logits.data());
  return logits;
}

absl::Status Qwen3MoeModel::Attention(uint32_t layer_index, uint32_t start_position, PagedKv& kv,
                                      Scratch& scratch) const {
  const Layer& layer = layers_[layer_index];
  const size_t hidden = config_.hidden_size;
  const size_t head_dim = config_.head_dim;
  const size_t heads = config_.num_attention_heads;
  const size_t kv_heads = config_.num_key_value_heads;
  const size_t q_dim = config_.q_dim();
  const size_t kv_dim = config_.kv_dim();
  const size_t n = scratch.x.size() / hidden;
  const float eps = config_.rms_norm_eps;

  // Projections, q_norm / k_norm, RoPE; K and V go to the pool.
  for (size_t t = 0; t < n; ++t) {
    const uint32_t position = start_position + static_cast<uint32_t>(t);
    float* q = &scratch.q[t * q_dim];
    RmsNorm(&scratch.x[t * hidden], layer.input_norm.data(), hidden, eps, scratch.normed.data());
    MatVec(layer.q_proj.data(), scratch.normed.data(), q_dim, hidden, q);
    MatVec(layer.k_proj.data(), scratch.normed.data(), kv_dim, hidden, scratch.k.data());
    MatVec(layer.v_proj.data(), scratch.normed.data(), kv_dim, hidden, scratch.v.data());
    RopeCosSin(position, rope_inv_freq_, scratch.cos.data(), scratch.sin.data());
    NormAndRotateHeads(q, heads, config_.head_dim, layer.q_norm.data(), eps, config_.head_dim,
                       scratch.cos.data(), scratch.sin.data());
    NormAndRotateHeads(scratch.k.data(), kv_heads, config_.head_dim, layer.k_norm.data(), eps,
                       config_.head_dim, scratch.cos.data(), scratch.sin.data());
    RETURN_IF_ERROR(kv.WriteK(layer_index, position, scratch.k.data()));
    RETURN_IF_ERROR(kv.WriteV(layer_index, position, scratch.v.data()));
  }

  // Every position's K/V, the new ones included, as stored in the pool.
  const uint64_t total = uint64_t{start_position} + n;
  RETURN_IF_ERROR(kv.ReadRange(layer_index, 0, 0, total, scratch.keys.data()));
  RETURN_IF_ERROR(kv.ReadRange(layer_index, 1, 0, total, scratch.values.data()));

  for (size_t t = 0; t < n; ++t) {
    const size_t visible = start_position + t + 1;  // causal: positions [0, own position]
    AttendCausal(&scratch.q[t * q_dim], scratch.keys.data(), scratch.values.data(), visible, heads,
                 kv_heads, head_dim, scratch.scores.data(), scratch.attn_out.data());
    MatVec(layer.o_proj.data(), scratch.attn_out.data(), hidden, q_dim, scratch.projected.data());
    float* x = &scratch.x[t * hidden];
    for (size_t i = 0; i < hidden; ++i) x[i] += scratch.projected[i];
  }
  return absl::OkStatus();
}

void Qwen3MoeModel::Moe(const Layer& layer, float* x, Scratch& scratch) const {
  const size_t hidden = config_.hidden_size;
  RmsNorm(x, layer.post_norm.data(), hidden, config_.rms_norm_eps, scratch.normed.data());
  RoutedExperts(config_, layer.router, layer.experts, scratch.normed.data(), scratch.moe,
                scratch.moe_out.data());
  for (size_t i = 0; i < hidden; ++i) x[i] += scratch.moe_out[i];
}

}  // namespace kvcache::worker
