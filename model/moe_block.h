// The sparse MoE feed-forward shared by the worker's CPU models (Qwen3-MoE, Qwen3-Next): router
// softmax over all experts, top-k (renormalized when norm_topk_prob), SwiGLU experts summed in
// expert-index order (as Hugging Face's index_add_ loop does), in float32 with a fixed order.
// Thread-safety: pure functions over caller-owned buffers.
#ifndef KVCACHE_MODEL_MOE_BLOCK_H_
#define KVCACHE_MODEL_MOE_BLOCK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace kvcache::worker {

// One SwiGLU MLP, row-major Linear weights [out, in].
struct SwiGluExpert {
  std::vector<float> gate_proj;  // [intermediate, hidden]
  std::vector<float> up_proj;    // [intermediate, hidden]
  std::vector<float> down_proj;  // [hidden, intermediate]
};

// `prefix`gate_proj.weight, up_proj.weight and down_proj.weight of `file` (Hugging Face's names
// for an MLP). Errors as LoadFloats.
absl::StatusOr<SwiGluExpert> LoadSwiGluExpert(const SafetensorsFile& file,
                                              const std::string& prefix, uint32_t hidden,
                                              uint32_t intermediate);

// Buffers of one MoE evaluation, sized for the widest MLP it runs.
struct MoeScratch {
  MoeScratch(const ModelConfig& config, uint32_t max_intermediate)
      : router_probs(config.num_experts),
        gate(max_intermediate),
        up(max_intermediate),
        projected(config.hidden_size) {}

  std::vector<float> router_probs;  // [experts]
  std::vector<float> gate;          // [intermediate]
  std::vector<float> up;            // [intermediate]
  std::vector<float> projected;     // [hidden]
};

// out = down_proj(Silu(gate_proj x) * up_proj x). `out` must not alias `x`.
void SwiGluMlp(const SwiGluExpert& mlp, const float* x, uint32_t hidden, uint32_t intermediate,
               MoeScratch& scratch, float* out);

// out (hidden floats, overwritten) = sum over the top-k experts of `normed` under `router`
// ([experts, hidden]), in expert-index order, of weight * expert(normed).
void RoutedExperts(const ModelConfig& config, const std::vector<float>& router,
                   const std::vector<SwiGluExpert>& experts, const float* normed,
                   MoeScratch& scratch, float* out);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_MOE_BLOCK_H_
