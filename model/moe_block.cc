#include "model/moe_block.h"

#include <algorithm>

#include "common/status_macros.h"
#include "model/ops.h"

namespace kvcache::worker {

absl::StatusOr<SwiGluExpert> LoadSwiGluExpert(const SafetensorsFile& file,
                                              const std::string& prefix, uint32_t hidden,
                                              uint32_t intermediate) {
  const int64_t in = hidden;
  const int64_t mid = intermediate;
  SwiGluExpert expert;
  ASSIGN_OR_RETURN(expert.gate_proj, LoadFloats(file, prefix + "gate_proj.weight", {mid, in}));
  ASSIGN_OR_RETURN(expert.up_proj, LoadFloats(file, prefix + "up_proj.weight", {mid, in}));
  ASSIGN_OR_RETURN(expert.down_proj, LoadFloats(file, prefix + "down_proj.weight", {in, mid}));
  return expert;
}

void SwiGluMlp(const SwiGluExpert& mlp, const float* x, uint32_t hidden, uint32_t intermediate,
               MoeScratch& scratch, float* out) {
  MatVec(mlp.gate_proj.data(), x, intermediate, hidden, scratch.gate.data());
  MatVec(mlp.up_proj.data(), x, intermediate, hidden, scratch.up.data());
  SwiGlu(scratch.gate.data(), scratch.up.data(), intermediate, scratch.gate.data());
  MatVec(mlp.down_proj.data(), scratch.gate.data(), hidden, intermediate, out);
}

void RoutedExperts(const ModelConfig& config, const std::vector<float>& router,
                   const std::vector<SwiGluExpert>& experts, const float* normed,
                   MoeScratch& scratch, float* out) {
  const size_t hidden = config.hidden_size;
  float* probs = scratch.router_probs.data();
  MatVec(router.data(), normed, config.num_experts, hidden, probs);
  Softmax(probs, config.num_experts);
  std::vector<uint32_t> selected = TopK(probs, config.num_experts, config.num_experts_per_tok);
  float weight_sum = 0;
  for (uint32_t e : selected) weight_sum += probs[e];
  // Accumulate in expert-index order, as Hugging Face's index_add_ loop does.
  std::sort(selected.begin(), selected.end());
  std::fill(out, out + hidden, 0.0f);
  for (uint32_t e : selected) {
    const float weight = config.norm_topk_prob ? probs[e] / weight_sum : probs[e];
    SwiGluMlp(experts[e], normed, config.hidden_size, config.moe_intermediate_size, scratch,
              scratch.projected.data());
    for (size_t i = 0; i < hidden; ++i) out[i] += scratch.projected[i] * weight;
  }
}

}  // namespace kvcache::worker
