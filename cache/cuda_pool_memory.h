// CudaPoolMemory: a pool in device memory (cudaMalloc), exported as a CUDA IPC handle so workers on
// the node map it once with cudaIpcOpenMemHandle and then work with block offsets. A block copy
// (fork) is a device-to-device copy on the pool's own stream; reads, writes and one block's
// checksum stage through the host and synchronize (they serve the data RPCs, not the workers'
// hot path); a batch's checksums (ChecksumBlocks: a commit of pages written without theirs) are
// computed on the device in one launch.
//
// Built without CUDA, CreateCudaPoolMemory returns FAILED_PRECONDITION.
// Thread safety: as PoolMemory.
#ifndef KVCACHE_CACHE_CUDA_POOL_MEMORY_H_
#define KVCACHE_CACHE_CUDA_POOL_MEMORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cache/pool_memory.h"

namespace kvcache {

// CUDA errors as common/cuda/cuda_status.h maps them: RESOURCE_EXHAUSTED when the device lacks
// memory; FAILED_PRECONDITION with no device or driver, and in a build without CUDA ("built
// without CUDA"); INTERNAL otherwise. INVALID_ARGUMENT for a pool of 0 bytes.
absl::StatusOr<std::unique_ptr<PoolMemory>> CreateCudaPoolMemory(int device, uint64_t block_bytes,
                                                                 uint32_t num_blocks);

}  // namespace kvcache

#endif  // KVCACHE_CACHE_CUDA_POOL_MEMORY_H_
