// Argument checks shared by the CPU reference and the CUDA launchers. Not part of the public API.
#ifndef KVCACHE_KERNELS_BLOCK_COPY_INTERNAL_H_
#define KVCACHE_KERNELS_BLOCK_COPY_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvcache::kernels::internal {

// Checks block_bytes > 0 and that both the pool ([num_blocks, block_bytes]) and the staging
// buffer ([num_slots, block_bytes]) have a byte size that fits in uint64 (INVALID_ARGUMENT).
// `op` names the caller in messages, e.g. "GatherBlocksCpu".
absl::Status CheckGeometry(const char* op, uint64_t block_bytes, uint32_t num_blocks,
                           uint64_t num_slots);

// INVALID_ARGUMENT "<op>: <what> is null" when `ptr` is null.
absl::Status CheckNotNull(const char* op, const char* what, const void* ptr);

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_BLOCK_COPY_INTERNAL_H_
