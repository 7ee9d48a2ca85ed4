// The launches behind linear_attention_kernels.h in a build without CUDA: the public functions
// still check their arguments, then answer FAILED_PRECONDITION("built without CUDA").
#include "common/cuda/not_built.h"
#include "kernels/linear_attention_kernels.h"

namespace kvcache::kernels::internal {

absl::Status LaunchCausalConv1dSilu(const float*, const float*, uint32_t, uint32_t, uint32_t,
                                    float*, float*, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchGatedDeltaRule(const GatedDeltaRuleShape&, float, const float*, const float*,
                                  const float*, const float*, const float*, uint32_t, float*,
                                  float*, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchGateMultiply(float*, const float*, uint64_t, GateActivation, void*) {
  return NotBuiltWith("CUDA");
}

}  // namespace kvcache::kernels::internal
