// Block copy, gather and scatter over a block-major KV pool, with a naive CPU reference for each
// CUDA kernel. Pool memory is one base pointer; block i is the contiguous byte range
// [i * block_bytes, (i + 1) * block_bytes). Free functions; thread-compatible (callers own the
// memory and any concurrency on it).
//
// Sentinel: a block id of -1 (kSkipBlock) in any id array means "skip this slot": no byte is read
// or written for it. Any other negative id, or an id >= num_blocks, is an error on the CPU path.
//
// CUDA path: pointers are device pointers, the id arrays are device arrays of int64, and `stream`
// is a `cudaStream_t` passed as `void*` (nullptr = the legacy default stream) so that code built
// without the CUDA headers can include this file. The launchers check their host-visible
// arguments (sizes, null pointers, overflow), enqueue one kernel on `stream` and return at once:
// no hidden synchronization. Id values live on the device and cannot be checked without a sync, so
// the kernels treat every id outside [0, num_blocks) as a skip (never an out-of-bounds access);
// callers that want the CPU path's strict checks run ValidateCopyIds / ValidateBlockIds on the host
// copy of the ids before uploading them. A kernel fault surfaces on the next synchronizing call.
// Built without CUDA, the *Cuda functions make the same checks and, where they would launch,
// return FAILED_PRECONDITION("built without CUDA"), as every stub does (common/cuda/not_built.h);
// common/cuda/cuda_device.h says which build this is.
#ifndef KVCACHE_KERNELS_BLOCK_COPY_H_
#define KVCACHE_KERNELS_BLOCK_COPY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvcache::kernels {

// The documented "skip this slot" id.
inline constexpr int64_t kSkipBlock = -1;

// --- Argument checks shared by the CPU and CUDA paths (host memory). ---

// Checks a copy's id pairs: equal lengths (INVALID_ARGUMENT); every id is kSkipBlock or in
// [0, num_blocks) (OUT_OF_RANGE); among the pairs with neither side skipped, no dst block is
// written twice and no dst block is also a src block, itself included (INVALID_ARGUMENT).
absl::Status ValidateCopyIds(uint32_t num_blocks, absl::Span<const int64_t> src,
                             absl::Span<const int64_t> dst);

// Checks that every id is kSkipBlock or in [0, num_blocks) (OUT_OF_RANGE). With
// `unique_targets`, also that no non-skipped id repeats (INVALID_ARGUMENT): a scatter must not
// write one block twice. A gather may read a block more than once.
absl::Status ValidateBlockIds(uint32_t num_blocks, absl::Span<const int64_t> block_ids,
                              bool unique_targets);

// --- CPU reference (always built). ---

// pool: [num_blocks, block_bytes]. For each i with src[i] != -1 and dst[i] != -1, copies block
// src[i] to block dst[i]. All checks run before any byte moves: on error nothing is written.
absl::Status CopyBlocksCpu(uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                           absl::Span<const int64_t> src, absl::Span<const int64_t> dst);

// pool: [num_blocks, block_bytes]; out: [block_ids.size(), block_bytes].
// out[i] = block block_ids[i]; a -1 slot leaves out[i] untouched.
absl::Status GatherBlocksCpu(const uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                             absl::Span<const int64_t> block_ids, uint8_t* out);

// in: [block_ids.size(), block_bytes]; pool: [num_blocks, block_bytes].
// Block block_ids[i] = in[i]; a -1 slot is skipped. Ids must not repeat (except -1).
absl::Status ScatterBlocksCpu(const uint8_t* in, uint64_t block_bytes, uint32_t num_blocks,
                              absl::Span<const int64_t> block_ids, uint8_t* pool);

// --- CUDA (device pointers, device id arrays, explicit stream). ---

// pool: device [num_blocks, block_bytes]; src_ids, dst_ids: device [num_pairs] int64.
// Same contract as CopyBlocksCpu; the pairs must satisfy ValidateCopyIds (not checked here; a
// violation races but stays in bounds).
absl::Status CopyBlocksCuda(uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                            const int64_t* src_ids, const int64_t* dst_ids, uint32_t num_pairs,
                            void* stream);

// pool: device [num_blocks, block_bytes]; block_ids: device [num_ids] int64;
// out: device [num_ids, block_bytes]. Same contract as GatherBlocksCpu.
absl::Status GatherBlocksCuda(const uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                              const int64_t* block_ids, uint32_t num_ids, uint8_t* out,
                              void* stream);

// in: device [num_ids, block_bytes]; block_ids: device [num_ids] int64;
// pool: device [num_blocks, block_bytes]. Same contract as ScatterBlocksCpu.
absl::Status ScatterBlocksCuda(const uint8_t* in, uint64_t block_bytes, uint32_t num_blocks,
                               const int64_t* block_ids, uint32_t num_ids, uint8_t* pool,
                               void* stream);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_BLOCK_COPY_H_
