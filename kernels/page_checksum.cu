// Pages copied and checksummed in one pass (kernels/page_checksum.h; the arithmetic is
// xxh3_blocks.h's, which page_checksum.cc's CPU reference shares).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_launch.h"
#include "kernels/page_checksum.h"
#include "kernels/page_checksum_internal.h"
#include "kernels/xxh3_blocks.h"

namespace kvcache::kernels {
namespace {

namespace xb = xxh3_blocks;

constexpr int kWarpThreads = 32;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpThreads;
// 1 KiB blocks whose sums are held in shared memory before the chain folds them in: 64 blocks of
// eight lanes are 4 KiB.
constexpr uint64_t kChunkBlocks = 64;
constexpr uint32_t kMaxGridX = 0x7fffffffu;
constexpr unsigned kFullMask = 0xffffffffu;
// A warp covers one 1 KiB block: thread t holds 32 bytes, lanes 4h..4h+3 (h = t % 2) of stripe
// t / 2.
static_assert(xb::kBlockBytes == kWarpThreads * 2 * sizeof(uint4), "a warp covers one block");

// Reads the 32 bytes this thread covers at `offset`, copies them, and returns them as four words.
__device__ __forceinline__ void LoadAndCopy(const uint8_t* __restrict__ source,
                                            uint8_t* __restrict__ destination, uint64_t offset,
                                            uint64_t (&words)[4]) {
  const uint4* from = reinterpret_cast<const uint4*>(source + offset);
  const uint4 a = from[0];
  const uint4 b = from[1];
  if (destination != nullptr) {
    uint4* to = reinterpret_cast<uint4*>(destination + offset);
    to[0] = a;
    to[1] = b;
  }
  words[0] = a.x | (uint64_t{a.y} << 32);
  words[1] = a.z | (uint64_t{a.w} << 32);
  words[2] = b.x | (uint64_t{b.y} << 32);
  words[3] = b.z | (uint64_t{b.w} << 32);
}

// Sums each thread's four lanes over the warp's threads of the same half (offsets 2..16 keep a
// thread's parity): thread 0 then holds lanes 0..3 of the whole block, thread 1 lanes 4..7.
__device__ __forceinline__ void SumOverWarp(uint64_t (&sums)[4]) {
#pragma unroll
  for (int offset = 2; offset < kWarpThreads; offset <<= 1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) sums[j] += __shfl_xor_sync(kFullMask, sums[j], offset);
  }
}

// Grid: (min(num_pages, 2^31 - 1)), block: kThreads. A CUDA block per page (grid-stride): its
// warps copy the page's 1 KiB blocks and sum their lanes a chunk at a time; threads 0..7 of warp
// 0 then run the chain for lanes 0..7 over the chunk; warp 0 ends with the tail and the merge.
__global__ void __launch_bounds__(kThreads)
    CopyPagesChecksummedKernel(const PageCopy* __restrict__ copies, uint32_t num_pages,
                               uint64_t page_bytes, uint64_t* __restrict__ checksums,
                               const xb::Keys keys) {
  __shared__ uint64_t block_sums[kChunkBlocks][xb::kLanes];
  const int warp = threadIdx.x / kWarpThreads;
  const int thread = threadIdx.x % kWarpThreads;
  const uint64_t stripe = thread / 2;
  const int half = thread % 2;
  const uint64_t blocks = xb::ChainedBlocks(page_bytes);
  uint64_t block_keys[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) block_keys[j] = xb::BlockKey(keys, stripe, half, j);

  for (uint64_t page = blockIdx.x; page < num_pages; page += gridDim.x) {
    const PageCopy copy = copies[page];
    // Lane threadIdx.x's accumulator, in threads 0..7.
    uint64_t lane = threadIdx.x < xb::kLanes ? xb::InitialLane(threadIdx.x) : 0;
    for (uint64_t chunk = 0; chunk < blocks; chunk += kChunkBlocks) {
      const uint64_t chunk_blocks = blocks - chunk < kChunkBlocks ? blocks - chunk : kChunkBlocks;
      for (uint64_t b = warp; b < chunk_blocks; b += kWarps) {
        uint64_t words[4];
        LoadAndCopy(copy.source, copy.destination,
                    (chunk + b) * xb::kBlockBytes + thread * 2 * sizeof(uint4), words);
        uint64_t sums[4] = {0, 0, 0, 0};
        xb::AddStripeHalf(words, block_keys, sums);
        SumOverWarp(sums);
        if (thread < 2) {
#pragma unroll
          for (int j = 0; j < 4; ++j) block_sums[b][4 * thread + j] = sums[j];
        }
      }
      __syncthreads();
      if (threadIdx.x < xb::kLanes) {
        for (uint64_t b = 0; b < chunk_blocks; ++b) {
          lane = xb::Scramble(lane + block_sums[b][threadIdx.x], keys.words[16 + threadIdx.x]);
        }
      }
      __syncthreads();  // the sums are read before the next chunk writes them
    }
    if (warp != 0) continue;
    // The tail: 1 to 16 stripes after the chained blocks, summed into the lanes unscrambled.
    const uint64_t tail_stripes = xb::TailStripes(page_bytes);
    uint64_t sums[4] = {0, 0, 0, 0};
    if (stripe < tail_stripes) {
      uint64_t words[4];
      LoadAndCopy(copy.source, copy.destination,
                  blocks * xb::kBlockBytes + thread * 2 * sizeof(uint4), words);
      uint64_t tail_keys[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) tail_keys[j] = xb::TailKey(keys, stripe, tail_stripes, half, j);
      xb::AddStripeHalf(words, tail_keys, sums);
    }
    SumOverWarp(sums);
    // Lane l's tail sum is in thread l / 4 at index l % 4.
    const int holder = (threadIdx.x % xb::kLanes) / 4;
    const int index = threadIdx.x % 4;
    uint64_t tail = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t held = __shfl_sync(kFullMask, sums[j], holder);
      if (j == index) tail = held;
    }
    lane += tail;
    uint64_t lanes[xb::kLanes];
#pragma unroll
    for (int i = 0; i < xb::kLanes; ++i) lanes[i] = __shfl_sync(kFullMask, lane, i);
    if (thread == 0) checksums[page] = xb::Merge(lanes, page_bytes, keys);
  }
}

}  // namespace

namespace internal {

absl::Status LaunchCopyPagesChecksummed(const PageCopy* copies, uint32_t num_pages,
                                        uint64_t page_bytes, uint64_t* checksums,
                                        const xxh3_blocks::Keys& keys, void* stream) {
  const dim3 grid(std::min(num_pages, kMaxGridX));
  CopyPagesChecksummedKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      copies, num_pages, page_bytes, checksums, keys);
  return CheckLaunch("CopyPagesChecksummedCuda");
}

}  // namespace internal
}  // namespace kvcache::kernels
