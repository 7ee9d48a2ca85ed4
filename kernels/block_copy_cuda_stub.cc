// The CUDA entry points of block_copy.h for a build without CUDA: they exist so that callers link
// either way, and answer FAILED_PRECONDITION("built without CUDA").
#include "common/cuda/not_built.h"
#include "kernels/block_copy.h"

namespace kvcache::kernels {
namespace {

absl::Status NoCuda() { return NotBuiltWith("CUDA"); }

}  // namespace

absl::Status CopyBlocksCuda(uint8_t*, uint64_t, uint32_t, const int64_t*, const int64_t*, uint32_t,
                            void*) {
  return NoCuda();
}

absl::Status GatherBlocksCuda(const uint8_t*, uint64_t, uint32_t, const int64_t*, uint32_t,
                              uint8_t*, void*) {
  return NoCuda();
}

absl::Status ScatterBlocksCuda(const uint8_t*, uint64_t, uint32_t, const int64_t*, uint32_t,
                               uint8_t*, void*) {
  return NoCuda();
}

}  // namespace kvcache::kernels
