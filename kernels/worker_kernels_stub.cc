// The launches behind worker_kernels.h's *Cuda functions in a build without CUDA: the functions
// still check their arguments (worker_kernels_args.cc), then answer FAILED_PRECONDITION("built
// without CUDA").
#include "common/cuda/not_built.h"
#include "kernels/worker_kernels_internal.h"

namespace kvcache::kernels::internal {

absl::Status LaunchRmsNorm(const float*, const float*, float, uint32_t, uint32_t, float*, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchRope(float*, const uint32_t*, uint32_t, uint32_t, uint32_t, uint32_t, double,
                        void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchWriteKv(const float*, const float*, const int64_t*, uint32_t, const KvGeometry&,
                           uint8_t*, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchPagedAttention(const float*, const uint32_t*, const uint32_t*, const uint32_t*,
                                  const AttnParams&, const uint8_t*, float*, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchMoeRoute(const float*, uint32_t, uint32_t, uint32_t, bool, uint32_t*, float*,
                            void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchExpertSwiGlu(const float*, const float*, const float*, const float*, uint32_t,
                                uint32_t, uint32_t, float*, float*, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchLinear(const float*, const float*, uint32_t, uint32_t, uint32_t, bool, float*,
                          void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchGatherRows(const float*, uint64_t, uint32_t, const uint32_t*, uint32_t, float*,
                              void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchMoeCombine(const float*, uint64_t, uint32_t, const uint32_t*, const float*,
                              uint32_t, uint32_t, float*, void*) {
  return NotBuiltWith("CUDA");
}

}  // namespace kvcache::kernels::internal
