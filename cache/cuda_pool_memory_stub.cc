// Built without CUDA: device pools are refused with a clear error.
#include "absl/strings/str_cat.h"
#include "cache/cuda_pool_memory.h"
#include "common/cuda/not_built.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<PoolMemory>> CreateCudaPoolMemory(int device, uint64_t block_bytes,
                                                                 uint32_t num_blocks) {
  return NotBuiltWith(
      "CUDA", absl::StrCat("a pool on cuda:", device, " (this kvcache-manager serves host pools)"));
}

}  // namespace kvcache
