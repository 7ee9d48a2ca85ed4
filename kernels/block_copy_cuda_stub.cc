// The launches behind block_copy.h's *Cuda functions in a build without CUDA: the functions
// still check their arguments (block_copy.cc), then answer FAILED_PRECONDITION("built without
// CUDA").
#include "common/cuda/not_built.h"
#include "kernels/block_copy_internal.h"

namespace kvcache::kernels::internal {

absl::Status LaunchCopyBlocks(uint8_t*, uint64_t, uint32_t, const int64_t*, const int64_t*,
                              uint32_t, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchGatherBlocks(const uint8_t*, uint64_t, uint32_t, const int64_t*, uint32_t,
                                uint8_t*, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status LaunchScatterBlocks(const uint8_t*, uint64_t, uint32_t, const int64_t*, uint32_t,
                                 uint8_t*, void*) {
  return NotBuiltWith("CUDA");
}

}  // namespace kvcache::kernels::internal
