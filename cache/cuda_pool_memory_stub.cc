// Built without CUDA: device pools are refused with a clear error.
#include "cache/cuda_pool_memory.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<PoolMemory>> CreateCudaPoolMemory(int device, uint64_t block_bytes,
                                                                 uint32_t num_blocks) {
  return absl::FailedPreconditionError(
      "this kvcache-manager was built without CUDA; it can only serve host pools");
}

}  // namespace kvcache
