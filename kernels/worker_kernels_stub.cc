// The CUDA entry points of worker_kernels.h for a build without CUDA: they exist so that callers
// link either way, and answer FAILED_PRECONDITION("built without CUDA").
#include "common/cuda/not_built.h"
#include "kernels/worker_kernels.h"

namespace kvcache::kernels {
namespace {

absl::Status NoCuda() { return NotBuiltWith("CUDA"); }

}  // namespace

absl::Status RmsNormCuda(const float*, const float*, float, uint32_t, uint32_t, float*, void*) {
  return NoCuda();
}

absl::Status RopeCuda(float*, const uint32_t*, uint32_t, uint32_t, uint32_t, double, void*) {
  return NoCuda();
}

absl::Status WriteKvCuda(const float*, const float*, const int64_t*, uint32_t, uint32_t,
                         const PoolLayout&, uint64_t, uint8_t*, void*) {
  return NoCuda();
}

absl::Status PagedAttentionCuda(const float*, const uint32_t*, const uint32_t*, const uint32_t*,
                                uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, const PoolLayout&,
                                uint64_t, const uint8_t*, float*, void*) {
  return NoCuda();
}

absl::Status MoeRouteCuda(const float*, uint32_t, uint32_t, uint32_t, bool, uint32_t*, float*,
                          void*) {
  return NoCuda();
}

absl::Status ExpertSwiGluCuda(const float*, const float*, const float*, const float*, uint32_t,
                              uint32_t, uint32_t, float*, float*, void*) {
  return NoCuda();
}

absl::Status LinearCuda(const float*, const float*, uint32_t, uint32_t, uint32_t, bool, float*,
                        void*) {
  return NoCuda();
}

absl::Status GatherRowsCuda(const float*, uint64_t, uint32_t, const uint32_t*, uint32_t, float*,
                            void*) {
  return NoCuda();
}

absl::Status MoeCombineCuda(const float*, uint64_t, uint32_t, const uint32_t*, const float*,
                            uint32_t, uint32_t, float*, void*) {
  return NoCuda();
}

}  // namespace kvcache::kernels
