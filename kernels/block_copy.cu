// CUDA block copy, gather and scatter over a block-major KV pool. See block_copy.h for the
// contract; block_copy.cc holds the CPU reference each kernel is tested against and the
// launchers' argument checks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/block_copy.h"
#include "kernels/block_copy_internal.h"
#include "kernels/cuda_launch.h"

namespace kvcache::kernels {
namespace {

constexpr int kThreadsPerBlock = 256;
// gridDim.x limit; larger id counts are covered by the kernels' grid-stride loop over slots.
constexpr uint32_t kMaxGridX = 0x7fffffffu;
constexpr uint32_t kMaxGridY = 65535;
constexpr uint64_t kVecBytes = sizeof(uint4);  // 16
// Each CUDA block copies one slice of a KV block, so a few large KV blocks still spread over every
// SM: with one CUDA block per 2 MiB KV block, 128 blocks left the H100's 132 SMs one resident CUDA
// block each, too few loads in flight, and ran at 0.79x of a device memcpy.
constexpr uint64_t kSliceBytes = 64 << 10;
// Loads each thread issues before its stores, for more bytes in flight per thread.
constexpr int kUnroll = 4;

// Copies this CUDA block's slices (blockIdx.y, striding by gridDim.y) of one KV block. With
// kVec16, both pointers are 16-byte aligned and `bytes` is a multiple of 16.
template <bool kVec16>
__device__ __forceinline__ void CopyOneBlock(uint8_t* __restrict__ dst,        // [bytes]
                                             const uint8_t* __restrict__ src,  // [bytes]
                                             uint64_t bytes) {
  for (uint64_t begin = blockIdx.y * kSliceBytes; begin < bytes;
       begin += uint64_t{gridDim.y} * kSliceBytes) {
    const uint64_t end = begin + kSliceBytes < bytes ? begin + kSliceBytes : bytes;
    if constexpr (kVec16) {
      uint4* __restrict__ dst16 = reinterpret_cast<uint4*>(dst);
      const uint4* __restrict__ src16 = reinterpret_cast<const uint4*>(src);
      const uint64_t last = end / kVecBytes;
      uint64_t i = begin / kVecBytes + threadIdx.x;
      for (; i + (kUnroll - 1) * blockDim.x < last; i += kUnroll * blockDim.x) {
        uint4 words[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) words[u] = src16[i + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) dst16[i + u * blockDim.x] = words[u];
      }
      for (; i < last; i += blockDim.x) dst16[i] = src16[i];
    } else {
      for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
    }
  }
}

__device__ __forceinline__ bool ActiveId(int64_t id, uint32_t num_blocks) {
  // -1 is the documented skip; any other out-of-range id is also skipped so that a bad id can
  // never read or write outside the pool (the host path rejects them instead).
  return id >= 0 && id < static_cast<int64_t>(num_blocks);
}

// Grid: (min(num_pairs, 2^31 - 1), slices), Block: (kThreadsPerBlock). blockIdx.x picks the copied
// KV block (grid-stride over pairs when there are more pairs than CUDA blocks), blockIdx.y its
// slice.
template <bool kVec16>
__global__ void CopyBlocksKernel(uint8_t* __restrict__ pool,           // [num_blocks, block_bytes]
                                 const int64_t* __restrict__ src_ids,  // [num_pairs]
                                 const int64_t* __restrict__ dst_ids,  // [num_pairs]
                                 uint32_t num_pairs, uint64_t block_bytes, uint32_t num_blocks) {
  for (uint64_t pair = blockIdx.x; pair < num_pairs; pair += gridDim.x) {
    const int64_t src = src_ids[pair];
    const int64_t dst = dst_ids[pair];
    if (!ActiveId(src, num_blocks) || !ActiveId(dst, num_blocks)) continue;
    CopyOneBlock<kVec16>(pool + static_cast<uint64_t>(dst) * block_bytes,
                         pool + static_cast<uint64_t>(src) * block_bytes, block_bytes);
  }
}

// Grid: (min(num_ids, 2^31 - 1), slices), Block: (kThreadsPerBlock). blockIdx.x picks the gathered
// KV block (grid-stride over slots), blockIdx.y its slice.
template <bool kVec16>
__global__ void GatherBlocksKernel(const uint8_t* __restrict__ pool,  // [num_blocks, block_bytes]
                                   const int64_t* __restrict__ block_ids,  // [num_ids]
                                   uint8_t* __restrict__ out,              // [num_ids, block_bytes]
                                   uint32_t num_ids, uint64_t block_bytes, uint32_t num_blocks) {
  for (uint64_t slot = blockIdx.x; slot < num_ids; slot += gridDim.x) {
    const int64_t id = block_ids[slot];
    if (!ActiveId(id, num_blocks)) continue;
    CopyOneBlock<kVec16>(out + slot * block_bytes, pool + static_cast<uint64_t>(id) * block_bytes,
                         block_bytes);
  }
}

// Grid: (min(num_ids, 2^31 - 1), slices), Block: (kThreadsPerBlock). blockIdx.x picks the
// scattered KV block (grid-stride over slots), blockIdx.y its slice.
template <bool kVec16>
__global__ void ScatterBlocksKernel(const uint8_t* __restrict__ in,  // [num_ids, block_bytes]
                                    const int64_t* __restrict__ block_ids,  // [num_ids]
                                    uint8_t* __restrict__ pool,  // [num_blocks, block_bytes]
                                    uint32_t num_ids, uint64_t block_bytes, uint32_t num_blocks) {
  for (uint64_t slot = blockIdx.x; slot < num_ids; slot += gridDim.x) {
    const int64_t id = block_ids[slot];
    if (!ActiveId(id, num_blocks)) continue;
    CopyOneBlock<kVec16>(pool + static_cast<uint64_t>(id) * block_bytes, in + slot * block_bytes,
                         block_bytes);
  }
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kVecBytes == 0; }

// True when every block start in both buffers is 16-byte aligned.
bool CanVectorize(uint64_t block_bytes, const void* a, const void* b) {
  return block_bytes % kVecBytes == 0 && Aligned16(a) && Aligned16(b);
}

dim3 GridFor(uint32_t count, uint64_t block_bytes) {
  const uint64_t slices = (block_bytes + kSliceBytes - 1) / kSliceBytes;
  return dim3(std::min(count, kMaxGridX),
              static_cast<uint32_t>(std::min<uint64_t>(slices, kMaxGridY)));
}

}  // namespace

namespace internal {

absl::Status LaunchCopyBlocks(uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                              const int64_t* src_ids, const int64_t* dst_ids, uint32_t num_pairs,
                              void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (CanVectorize(block_bytes, pool, pool)) {
    CopyBlocksKernel<true><<<GridFor(num_pairs, block_bytes), kThreadsPerBlock, 0, s>>>(
        pool, src_ids, dst_ids, num_pairs, block_bytes, num_blocks);
  } else {
    CopyBlocksKernel<false><<<GridFor(num_pairs, block_bytes), kThreadsPerBlock, 0, s>>>(
        pool, src_ids, dst_ids, num_pairs, block_bytes, num_blocks);
  }
  return CheckLaunch("CopyBlocksCuda");
}

absl::Status LaunchGatherBlocks(const uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                                const int64_t* block_ids, uint32_t num_ids, uint8_t* out,
                                void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (CanVectorize(block_bytes, pool, out)) {
    GatherBlocksKernel<true><<<GridFor(num_ids, block_bytes), kThreadsPerBlock, 0, s>>>(
        pool, block_ids, out, num_ids, block_bytes, num_blocks);
  } else {
    GatherBlocksKernel<false><<<GridFor(num_ids, block_bytes), kThreadsPerBlock, 0, s>>>(
        pool, block_ids, out, num_ids, block_bytes, num_blocks);
  }
  return CheckLaunch("GatherBlocksCuda");
}

absl::Status LaunchScatterBlocks(const uint8_t* in, uint64_t block_bytes, uint32_t num_blocks,
                                 const int64_t* block_ids, uint32_t num_ids, uint8_t* pool,
                                 void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (CanVectorize(block_bytes, in, pool)) {
    ScatterBlocksKernel<true><<<GridFor(num_ids, block_bytes), kThreadsPerBlock, 0, s>>>(
        in, block_ids, pool, num_ids, block_bytes, num_blocks);
  } else {
    ScatterBlocksKernel<false><<<GridFor(num_ids, block_bytes), kThreadsPerBlock, 0, s>>>(
        in, block_ids, pool, num_ids, block_bytes, num_blocks);
  }
  return CheckLaunch("ScatterBlocksCuda");
}

}  // namespace internal
}  // namespace kvcache::kernels
