// Qwen3NextModel::Forward: the hybrid decoder. See qwen3_next.h for the contract.
#include "model/qwen3_next.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/linear_attention.h"
#include "model/ops.h"
#include "model/qwen3_moe.h"

namespace kvcache::worker {

struct Qwen3NextModel::Scratch {
  Scratch(const Qwen3NextConfig& config, size_t n, size_t total_positions)
      : x(n * config.base.hidden_size),
        normed(config.base.hidden_size),
        projected(config.base.hidden_size),
        qkvz(config.linear.num_key_heads *
             (2 * config.linear.key_head_dim +
              2 * config.linear.value_heads_per_key_head() * config.linear.value_head_dim)),
        ba(2 * config.linear.num_value_heads),
        mixed(n * config.linear.conv_dim()),
        conv_out(n * config.linear.conv_dim()),
        z(n * config.linear.value_dim()),
        a(n * config.linear.num_value_heads),
        b(n * config.linear.num_value_heads),
        core(n * config.linear.value_dim()),
        q(n * config.base.q_dim()),
        gate(n * config.base.q_dim()),
        q_and_gate(2 * config.base.q_dim()),
        k(config.base.kv_dim()),
        v(config.base.kv_dim()),
        keys(total_positions * config.base.kv_dim()),
        values(total_positions * config.base.kv_dim()),
        scores(total_positions),
        attn_out(config.base.q_dim()),
        cos(config.rotary_dim() / 2),
        sin(config.rotary_dim() / 2),
        moe(config.base,
            std::max(config.base.moe_intermediate_size, config.shared_expert_intermediate_size)),
        moe_out(config.base.hidden_size),
        shared_out(config.base.hidden_size) {}

  std::vector<float> x;          // [n, hidden] residual stream
  std::vector<float> normed;     // [hidden]
  std::vector<float> projected;  // [hidden]
  // Linear attention.
  std::vector<float> qkvz;      // [key_heads * (2 hk + 2 r hv)] one token's projection
  std::vector<float> ba;        // [2 value_heads]
  std::vector<float> mixed;     // [n, conv_dim] q, k, v before the conv
  std::vector<float> conv_out;  // [n, conv_dim] after conv + SiLU
  std::vector<float> z;         // [n, value_dim]
  std::vector<float> a;         // [n, value_heads]
  std::vector<float> b;         // [n, value_heads]
  std::vector<float> core;      // [n, value_dim] the delta rule's output
  // Full attention.
  std::vector<float> q;           // [n, heads * head_dim] after q_norm and RoPE
  std::vector<float> gate;        // [n, heads * head_dim]
  std::vector<float> q_and_gate;  // [heads * 2 * head_dim] one token's q_proj
  std::vector<float> k;           // [kv_heads * head_dim]
  std::vector<float> v;           // [kv_heads * head_dim]
  std::vector<float> keys;        // [positions, kv_dim] read back from the pool
  std::vector<float> values;      // [positions, kv_dim]
  std::vector<float> scores;      // [positions]
  std::vector<float> attn_out;    // [heads * head_dim]
  std::vector<float> cos;         // [rotary_dim / 2]
  std::vector<float> sin;         // [rotary_dim / 2]
  // MoE.
  MoeScratch moe;
  std::vector<float> moe_out;     // [hidden]
  std::vector<float> shared_out;  // [hidden]
};

absl::Status CheckStateRequest(const Qwen3NextConfig& config, uint64_t state_bytes,
                               uint64_t state_position, uint32_t start_position) {
  if (state_bytes != LinearAttentionState::StateBytes(config)) {
    return absl::FailedPreconditionError(
        absl::StrCat("linear-attention state of ", state_bytes, " bytes is not this model's (",
                     LinearAttentionState::StateBytes(config), " bytes)"));
  }
  if (state_position != start_position) {
    return absl::FailedPreconditionError(absl::StrCat("linear-attention state is at position ",
                                                      state_position, ", not at start position ",
                                                      start_position));
  }
  return absl::OkStatus();
}

absl::Status Qwen3NextModel::CheckRequest(absl::Span<const uint32_t> tokens,
                                          uint32_t start_position, const PagedKv& kv,
                                          const LinearAttentionState& state) const {
  RETURN_IF_ERROR(CheckForwardRequest(kv_config_, tokens, start_position, kv));
  RETURN_IF_ERROR(CheckStateRequest(config_, state.StateBytes(), state.position(), start_position));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Qwen3NextModel::Forward(absl::Span<const uint32_t> tokens,
                                                           uint32_t start_position, PagedKv& kv,
                                                           LinearAttentionState& state) const {
  RETURN_IF_ERROR(CheckRequest(tokens, start_position, kv, state));
  const size_t hidden = config_.base.hidden_size;
  const size_t n = tokens.size();
  Scratch scratch(config_, n, start_position + n);
  for (size_t t = 0; t < n; ++t) {
    std::memcpy(&scratch.x[t * hidden], &embed_tokens_[size_t{tokens[t]} * hidden],
                hidden * sizeof(float));
  }
  for (uint32_t l = 0; l < config_.base.num_hidden_layers; ++l) {
    if (layers_[l].type == LayerType::kLinearAttention) {
      LinearAttention(l, state, scratch);
    } else {
      RETURN_IF_ERROR(FullAttention(l, start_position, kv, scratch));
    }
    for (size_t t = 0; t < n; ++t) Moe(layers_[l], &scratch.x[t * hidden], scratch);
  }
  state.set_position(start_position + n);
  const float* last = &scratch.x[(n - 1) * hidden];
  RmsNorm(last, final_norm_.data(), hidden, config_.base.rms_norm_eps, scratch.normed.data());
  std::vector<float> logits(config_.base.vocab_size);
  MatVec(lm_head().data(), scratch.normed.data(), config_.base.vocab_size, hidden, logits.data());
  return logits;
}

absl::StatusOr<std::vector<float>> Qwen3NextModel::ForwardWithCheckpoints(
    absl::Span<const uint32_t> tokens, uint32_t start_position, PagedKv& kv,
    LinearAttentionState& state, uint32_t checkpoint_interval,
    absl::FunctionRef<absl::Status(const LinearAttentionState&)> on_checkpoint) const {
  if (checkpoint_interval == 0) {
    return absl::InvalidArgumentError("checkpoint interval must be at least one token");
  }
  // Check the whole request first so that a bad one writes nothing.
  RETURN_IF_ERROR(CheckRequest(tokens, start_position, kv, state));
  std::vector<float> logits;
  size_t done = 0;
  while (done < tokens.size()) {
    const uint64_t position = start_position + done;
    const uint64_t boundary = (position / checkpoint_interval + 1) * checkpoint_interval;
    const size_t count = std::min<uint64_t>(boundary - position, tokens.size() - done);
    ASSIGN_OR_RETURN(
        logits, Forward(tokens.subspan(done, count), static_cast<uint32_t>(position), kv, state));
    done += count;
    if (state.position() % checkpoint_interval == 0) RETURN_IF_ERROR(on_checkpoint(state));
  }
  return logits;
}

void Qwen3NextModel::LinearAttention(uint32_t layer_index, LinearAttentionState& state,
                                     Scratch& scratch) const {
  const LinearAttentionWeights& weights = layers_[layer_index].linear;
  const LinearAttentionDims& dims = config_.linear;
  const size_t hidden = config_.base.hidden_size;
  const size_t n = scratch.x.size() / hidden;
  const uint32_t hk = dims.key_head_dim;
  const uint32_t hv = dims.value_head_dim;
  const uint32_t r = dims.value_heads_per_key_head();
  const uint32_t group_width = 2 * hk + 2 * r * hv;  // one key head's [q | k | v | z]
  const uint32_t conv_dim = dims.conv_dim();
  const uint32_t key_dim = dims.key_dim();
  const uint32_t value_dim = dims.value_dim();
  const uint32_t nv = dims.num_value_heads;

  // Projections, regrouped from per-key-head [q | k | v | z] and [b | a] into q, k, v side by
  // side (the conv's channel order), z, a and b (Qwen3NextGatedDeltaNet's
  // fix_query_key_value_ordering).
  for (size_t t = 0; t < n; ++t) {
    RmsNorm(&scratch.x[t * hidden], layers_[layer_index].input_norm.data(), hidden,
            config_.base.rms_norm_eps, scratch.normed.data());
    MatVec(weights.in_proj_qkvz.data(), scratch.normed.data(), scratch.qkvz.size(), hidden,
           scratch.qkvz.data());
    MatVec(weights.in_proj_ba.data(), scratch.normed.data(), 2 * nv, hidden, scratch.ba.data());
    float* mixed = &scratch.mixed[t * conv_dim];
    for (uint32_t kh = 0; kh < dims.num_key_heads; ++kh) {
      const float* group = &scratch.qkvz[size_t{kh} * group_width];
      std::copy_n(group, hk, mixed + kh * hk);
      std::copy_n(group + hk, hk, mixed + key_dim + kh * hk);
      std::copy_n(group + 2 * hk, r * hv, mixed + 2 * key_dim + kh * r * hv);
      std::copy_n(group + 2 * hk + r * hv, r * hv, &scratch.z[t * value_dim + kh * r * hv]);
      const float* ba = &scratch.ba[size_t{kh} * 2 * r];
      std::copy_n(ba, r, &scratch.b[t * nv + kh * r]);
      std::copy_n(ba + r, r, &scratch.a[t * nv + kh * r]);
    }
  }
  const uint32_t linear_index = config_.IndexWithinType(layer_index);
  CausalConv1dSilu(scratch.mixed.data(), weights.conv.data(), n, conv_dim, dims.conv_kernel,
                   state.conv(linear_index), scratch.conv_out.data());
  GatedDeltaRule(dims, scratch.conv_out.data(), scratch.a.data(), scratch.b.data(),
                 weights.a_log.data(), weights.dt_bias.data(), n, state.recurrent(linear_index),
                 scratch.core.data());
  for (size_t t = 0; t < n; ++t) {
    float* core = &scratch.core[t * value_dim];
    const float* z = &scratch.z[t * value_dim];
    for (uint32_t h = 0; h < nv; ++h) {
      float* head = core + h * hv;
      RmsNorm(head, weights.norm.data(), hv, config_.base.rms_norm_eps, head);
      for (uint32_t d = 0; d < hv; ++d) head[d] = head[d] * Silu(z[h * hv + d]);
    }
    MatVec(weights.out_proj.data(), core, hidden, value_dim, scratch.projected.data());
    float* x = &scratch.x[t * hidden];
    for (size_t i = 0; i < hidden; ++i) x[i] += scratch.projected[i];
  }
}

absl::Status Qwen3NextModel::FullAttention(uint32_t layer_index, uint32_t start_position,
                                           PagedKv& kv, Scratch& scratch) const {
  const Layer& layer = layers_[layer_index];
  const FullAttentionWeights& weights = layer.full;
  const ModelConfig& base = config_.base;
  const size_t hidden = base.hidden_size;
  const size_t head_dim = base.head_dim;
  const size_t heads = base.num_attention_heads;
  const size_t kv_heads = base.num_key_value_heads;
  const size_t q_dim = base.q_dim();
  const size_t kv_dim = base.kv_dim();
  const size_t n = scratch.x.size() / hidden;
  const float eps = base.rms_norm_eps;
  const uint32_t pool_layer = config_.IndexWithinType(layer_index);
  const uint32_t rotary_dim = config_.rotary_dim();

  for (size_t t = 0; t < n; ++t) {
    const uint32_t position = start_position + static_cast<uint32_t>(t);
    RmsNorm(&scratch.x[t * hidden], layer.input_norm.data(), hidden, eps, scratch.normed.data());
    MatVec(weights.q_proj.data(), scratch.normed.data(), 2 * q_dim, hidden,
           scratch.q_and_gate.data());
    MatVec(weights.k_proj.data(), scratch.normed.data(), kv_dim, hidden, scratch.k.data());
    MatVec(weights.v_proj.data(), scratch.normed.data(), kv_dim, hidden, scratch.v.data());
    RopeCosSin(position, rope_inv_freq_, scratch.cos.data(), scratch.sin.data());
    for (size_t h = 0; h < heads; ++h) {
      const float* q_and_gate = &scratch.q_and_gate[h * 2 * head_dim];
      std::copy_n(q_and_gate, head_dim, &scratch.q[t * q_dim + h * head_dim]);
      std::copy_n(q_and_gate + head_dim, head_dim, &scratch.gate[t * q_dim + h * head_dim]);
    }
    NormAndRotateHeads(&scratch.q[t * q_dim], heads, head_dim, weights.q_norm.data(), eps,
                       rotary_dim, scratch.cos.data(), scratch.sin.data());
    NormAndRotateHeads(scratch.k.data(), kv_heads, head_dim, weights.k_norm.data(), eps, rotary_dim,
                       scratch.cos.data(), scratch.sin.data());
    RETURN_IF_ERROR(kv.WriteK(pool_layer, position, scratch.k.data()));
    RETURN_IF_ERROR(kv.WriteV(pool_layer, position, scratch.v.data()));
  }

  const uint64_t total = uint64_t{start_position} + n;
  RETURN_IF_ERROR(kv.ReadRange(pool_layer, 0, 0, total, scratch.keys.data()));
  RETURN_IF_ERROR(kv.ReadRange(pool_layer, 1, 0, total, scratch.values.data()));
  for (size_t t = 0; t < n; ++t) {
    const size_t visible = start_position + t + 1;
    AttendCausal(&scratch.q[t * q_dim], scratch.keys.data(), scratch.values.data(), visible, heads,
                 kv_heads, head_dim, scratch.scores.data(), scratch.attn_out.data());
    const float* gate = &scratch.gate[t * q_dim];
    for (size_t i = 0; i < q_dim; ++i) scratch.attn_out[i] *= Sigmoid(gate[i]);
    MatVec(weights.o_proj.data(), scratch.attn_out.data(), hidden, q_dim, scratch.projected.data());
    float* x = &scratch.x[t * hidden];
    for (size_t i = 0; i < hidden; ++i) x[i] += scratch.projected[i];
  }
  return absl::OkStatus();
}

void Qwen3NextModel::Moe(const Layer& layer, float* x, Scratch& scratch) const {
  const ModelConfig& base = config_.base;
  const size_t hidden = base.hidden_size;
  RmsNorm(x, layer.post_norm.data(), hidden, base.rms_norm_eps, scratch.normed.data());
  RoutedExperts(base, layer.router, layer.experts, scratch.normed.data(), scratch.moe,
                scratch.moe_out.data());
  SwiGluMlp(layer.shared_expert, scratch.normed.data(), base.hidden_size,
            config_.shared_expert_intermediate_size, scratch.moe, scratch.shared_out.data());
  const float shared_gate =
      Sigmoid(Dot(layer.shared_expert_gate.data(), scratch.normed.data(), hidden));
  for (size_t i = 0; i < hidden; ++i) {
    x[i] += scratch.moe_out[i] + shared_gate * scratch.shared_out[i];
  }
}

}  // namespace kvcache::worker
