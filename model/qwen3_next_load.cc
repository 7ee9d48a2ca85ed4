// Loading of Qwen3NextModel weights from a Hugging Face checkpoint directory, with the tensor
// names of Qwen3NextForCausalLM (transformers/models/qwen3_next/modeling_qwen3_next.py).
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/ops.h"
#include "model/qwen3_next.h"

namespace kvcache::worker {
namespace {

// A zero-centred RMSNorm weight (Qwen3NextRMSNorm) as the scale it applies: 1 + weight.
absl::StatusOr<std::vector<float>> LoadCenteredNorm(const SafetensorsFile& file,
                                                    const std::string& name, int64_t size) {
  ASSIGN_OR_RETURN(std::vector<float> weight, LoadFloats(file, name, {size}));
  for (float& w : weight) w = 1.0f + w;
  return weight;
}

absl::StatusOr<Qwen3NextModel::LinearAttentionWeights> LoadLinearAttention(
    const Qwen3NextConfig& config, const SafetensorsFile& file, const std::string& prefix) {
  const LinearAttentionDims& dims = config.linear;
  const int64_t hidden = config.base.hidden_size;
  const int64_t qkvz =
      int64_t{dims.num_key_heads} *
      (2 * dims.key_head_dim + 2 * dims.value_heads_per_key_head() * dims.value_head_dim);
  const int64_t nv = dims.num_value_heads;
  Qwen3NextModel::LinearAttentionWeights weights;
  ASSIGN_OR_RETURN(weights.in_proj_qkvz,
                   LoadFloats(file, prefix + "in_proj_qkvz.weight", {qkvz, hidden}));
  ASSIGN_OR_RETURN(weights.in_proj_ba,
                   LoadFloats(file, prefix + "in_proj_ba.weight", {2 * nv, hidden}));
  ASSIGN_OR_RETURN(weights.conv, LoadFloats(file, prefix + "conv1d.weight",
                                            {dims.conv_dim(), 1, dims.conv_kernel}));
  ASSIGN_OR_RETURN(weights.dt_bias, LoadFloats(file, prefix + "dt_bias", {nv}));
  ASSIGN_OR_RETURN(weights.a_log, LoadFloats(file, prefix + "A_log", {nv}));
  ASSIGN_OR_RETURN(weights.norm, LoadFloats(file, prefix + "norm.weight", {dims.value_head_dim}));
  ASSIGN_OR_RETURN(weights.out_proj,
                   LoadFloats(file, prefix + "out_proj.weight", {hidden, dims.value_dim()}));
  return weights;
}

absl::StatusOr<Qwen3NextModel::FullAttentionWeights> LoadFullAttention(
    const Qwen3NextConfig& config, const SafetensorsFile& file, const std::string& prefix) {
  const int64_t hidden = config.base.hidden_size;
  const int64_t q_dim = config.base.q_dim();
  const int64_t kv_dim = config.base.kv_dim();
  Qwen3NextModel::FullAttentionWeights weights;
  ASSIGN_OR_RETURN(weights.q_proj, LoadFloats(file, prefix + "q_proj.weight", {2 * q_dim, hidden}));
  ASSIGN_OR_RETURN(weights.k_proj, LoadFloats(file, prefix + "k_proj.weight", {kv_dim, hidden}));
  ASSIGN_OR_RETURN(weights.v_proj, LoadFloats(file, prefix + "v_proj.weight", {kv_dim, hidden}));
  ASSIGN_OR_RETURN(weights.o_proj, LoadFloats(file, prefix + "o_proj.weight", {hidden, q_dim}));
  ASSIGN_OR_RETURN(weights.q_norm,
                   LoadCenteredNorm(file, prefix + "q_norm.weight", config.base.head_dim));
  ASSIGN_OR_RETURN(weights.k_norm,
                   LoadCenteredNorm(file, prefix + "k_norm.weight", config.base.head_dim));
  return weights;
}

}  // namespace

Qwen3NextModel::Qwen3NextModel(const Qwen3NextConfig& config)
    : config_(config),
      kv_config_(config.base),
      rope_inv_freq_(RopeInverseFrequencies(config.rotary_dim(), config.base.rope_theta)) {
  kv_config_.num_hidden_layers = config.num_full_attention_layers();
}

absl::StatusOr<Qwen3NextModel> Qwen3NextModel::Load(const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(const Qwen3NextConfig config,
                   LoadQwen3NextConfig(checkpoint_dir + "/config.json"));
  ASSIGN_OR_RETURN(const SafetensorsFile file,
                   SafetensorsFile::Open(checkpoint_dir + "/model.safetensors"));
  return FromSafetensors(config, file);
}

absl::StatusOr<Qwen3NextModel> Qwen3NextModel::FromSafetensors(const Qwen3NextConfig& config,
                                                               const SafetensorsFile& file) {
  RETURN_IF_ERROR(config.Validate());
  Qwen3NextModel model(config);
  const ModelConfig& base = config.base;
  const int64_t hidden = base.hidden_size;
  const int64_t vocab = base.vocab_size;
  ASSIGN_OR_RETURN(model.embed_tokens_,
                   LoadFloats(file, "model.embed_tokens.weight", {vocab, hidden}));
  ASSIGN_OR_RETURN(model.final_norm_, LoadCenteredNorm(file, "model.norm.weight", hidden));
  if (!base.tie_word_embeddings) {
    ASSIGN_OR_RETURN(model.lm_head_, LoadFloats(file, "lm_head.weight", {vocab, hidden}));
  }
  model.layers_.resize(base.num_hidden_layers);
  for (uint32_t i = 0; i < base.num_hidden_layers; ++i) {
    Layer& layer = model.layers_[i];
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    layer.type = config.layer_types[i];
    ASSIGN_OR_RETURN(layer.input_norm,
                     LoadCenteredNorm(file, prefix + "input_layernorm.weight", hidden));
    ASSIGN_OR_RETURN(layer.post_norm,
                     LoadCenteredNorm(file, prefix + "post_attention_layernorm.weight", hidden));
    if (layer.type == LayerType::kLinearAttention) {
      ASSIGN_OR_RETURN(layer.linear, LoadLinearAttention(config, file, prefix + "linear_attn."));
    } else {
      ASSIGN_OR_RETURN(layer.full, LoadFullAttention(config, file, prefix + "self_attn."));
    }
    const std::string mlp = prefix + "mlp.";
    ASSIGN_OR_RETURN(layer.router,
                     LoadFloats(file, mlp + "gate.weight", {base.num_experts, hidden}));
    layer.experts.resize(base.num_experts);
    for (uint32_t e = 0; e < base.num_experts; ++e) {
      ASSIGN_OR_RETURN(layer.experts[e],
                       LoadSwiGluExpert(file, absl::StrCat(mlp, "experts.", e, "."),
                                        base.hidden_size, base.moe_intermediate_size));
    }
    ASSIGN_OR_RETURN(layer.shared_expert,
                     LoadSwiGluExpert(file, mlp + "shared_expert.", base.hidden_size,
                                      config.shared_expert_intermediate_size));
    ASSIGN_OR_RETURN(layer.shared_expert_gate,
                     LoadFloats(file, mlp + "shared_expert_gate.weight", {1, hidden}));
  }
  return model;
}

PoolLayout Qwen3NextModel::KvLayout(uint32_t block_size, DType dtype) const {
  return HybridKvLayout(config_, block_size, dtype);
}

}  // namespace kvcache::worker
