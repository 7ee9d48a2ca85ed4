// Loading of Qwen3MoeModel weights from a Hugging Face checkpoint directory.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/ops.h"
#include "model/qwen3_moe.h"

namespace kvcache::worker {

Qwen3MoeModel::Qwen3MoeModel(const ModelConfig& config)
    : config_(config), rope_inv_freq_(RopeInverseFrequencies(config.head_dim, config.rope_theta)) {}

absl::StatusOr<Qwen3MoeModel> Qwen3MoeModel::Load(const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(checkpoint_dir + "/config.json"));
  ASSIGN_OR_RETURN(const SafetensorsFile file,
                   SafetensorsFile::Open(checkpoint_dir + "/model.safetensors"));
  return FromSafetensors(config, file);
}

absl::StatusOr<Qwen3MoeModel> Qwen3MoeModel::FromSafetensors(const ModelConfig& config,
                                                             const SafetensorsFile& file) {
  RETURN_IF_ERROR(config.Validate());
  Qwen3MoeModel model(config);
  const int64_t hidden = config.hidden_size;
  const int64_t q_dim = config.q_dim();
  const int64_t kv_dim = config.kv_dim();
  const int64_t head_dim = config.head_dim;
  const int64_t vocab = config.vocab_size;

  ASSIGN_OR_RETURN(model.embed_tokens_,
                   LoadFloats(file, "model.embed_tokens.weight", {vocab, hidden}));
  ASSIGN_OR_RETURN(model.final_norm_, LoadFloats(file, "model.norm.weight", {hidden}));
  if (!config.tie_word_embeddings) {
    ASSIGN_OR_RETURN(model.lm_head_, LoadFloats(file, "lm_head.weight", {vocab, hidden}));
  }
  model.layers_.resize(config.num_hidden_layers);
  for (uint32_t i = 0; i < config.num_hidden_layers; ++i) {
    Layer& layer = model.layers_[i];
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    const std::string attn = prefix + "self_attn.";
    ASSIGN_OR_RETURN(layer.input_norm,
                     LoadFloats(file, prefix + "input_layernorm.weight", {hidden}));
    ASSIGN_OR_RETURN(layer.q_proj, LoadFloats(file, attn + "q_proj.weight", {q_dim, hidden}));
    ASSIGN_OR_RETURN(layer.k_proj, LoadFloats(file, attn + "k_proj.weight", {kv_dim, hidden}));
    ASSIGN_OR_RETURN(layer.v_proj, LoadFloats(file, attn + "v_proj.weight", {kv_dim, hidden}));
    ASSIGN_OR_RETURN(layer.o_proj, LoadFloats(file, attn + "o_proj.weight", {hidden, q_dim}));
    ASSIGN_OR_RETURN(layer.q_norm, LoadFloats(file, attn + "q_norm.weight", {head_dim}));
    ASSIGN_OR_RETURN(layer.k_norm, LoadFloats(file, attn + "k_norm.weight", {head_dim}));
    ASSIGN_OR_RETURN(layer.post_norm,
                     LoadFloats(file, prefix + "post_attention_layernorm.weight", {hidden}));
    ASSIGN_OR_RETURN(layer.router,
                     LoadFloats(file, prefix + "mlp.gate.weight", {config.num_experts, hidden}));
    layer.experts.resize(config.num_experts);
    for (uint32_t e = 0; e < config.num_experts; ++e) {
      ASSIGN_OR_RETURN(layer.experts[e],
                       LoadSwiGluExpert(file, absl::StrCat(prefix, "mlp.experts.", e, "."),
                                        config.hidden_size, config.moe_intermediate_size));
    }
  }
  return model;
}

PoolLayout Qwen3MoeModel::KvLayout(uint32_t block_size, DType dtype) const {
  return PoolLayout{.num_layers = config_.num_hidden_layers,
                    .num_kv_heads = config_.num_key_value_heads,
                    .head_dim = config_.head_dim,
                    .block_size = block_size,
                    .dtype = dtype};
}

}  // namespace kvcache::worker
