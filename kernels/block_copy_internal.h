// Argument checks shared by the CPU reference and the CUDA launchers (block_copy.cc, built in
// every configuration), and the launches behind the *Cuda functions (block_copy.cu, or
// block_copy_cuda_stub.cc without CUDA). Not part of the public API.
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

// The launches of CopyBlocksCuda, GatherBlocksCuda and ScatterBlocksCuda. REQUIRES: the public
// function's checks passed (geometry, a non-zero count, non-null pointers). Each enqueues on
// `stream` and returns the launch error (kernels/cuda_launch.h), or FAILED_PRECONDITION "built
// without CUDA".
absl::Status LaunchCopyBlocks(uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                              const int64_t* src_ids, const int64_t* dst_ids, uint32_t num_pairs,
                              void* stream);
absl::Status LaunchGatherBlocks(const uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                                const int64_t* block_ids, uint32_t num_ids, uint8_t* out,
                                void* stream);
absl::Status LaunchScatterBlocks(const uint8_t* in, uint64_t block_bytes, uint32_t num_blocks,
                                 const int64_t* block_ids, uint32_t num_ids, uint8_t* pool,
                                 void* stream);

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_BLOCK_COPY_INTERNAL_H_
