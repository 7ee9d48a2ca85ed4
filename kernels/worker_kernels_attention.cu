// CUDA kernels for the worker's paged KV: the KV write into a block-major pool and causal GQA
// paged attention over it, and their launches. See worker_kernels.h for the contracts,
// worker_kernels_args.cc for the launchers' argument checks and worker_kernels_device.h for the
// shared helpers (PoolCodec) and precision notes; the CPU references are model/paged_kv.h and
// Qwen3MoeModel::Attention.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda_launch.h"
#include "kernels/worker_kernels.h"
#include "kernels/worker_kernels_device.h"
#include "kernels/worker_kernels_internal.h"

namespace kvcache::kernels {
namespace {

using internal::AttnParams;
using internal::GridFor;
using internal::KvGeometry;
using internal::kWarp;
using internal::PoolCodec;
using internal::WarpSum;

// =============================================================================================
// KV write
// =============================================================================================

constexpr uint32_t kWriteKvThreads = 256;

// Grid: (min(num_tokens, 2^31 - 1)), Block: (256). One CUDA block per token (grid-stride over
// tokens); threads stride over the token's num_kv_heads * head_dim elements of K and of V.
// A slot outside [0, num_blocks * block_size), kSkipSlot included, skips the token.
template <DType kDtype>
__global__ void __launch_bounds__(kWriteKvThreads)
    WriteKvKernel(uint8_t* __restrict__ pool,                // [num_blocks, block_bytes]
                  const float* __restrict__ k,               // [num_tokens, kv_heads, head_dim]
                  const float* __restrict__ v,               // [num_tokens, kv_heads, head_dim]
                  const int64_t* __restrict__ slot_mapping,  // [num_tokens]
                  uint32_t num_tokens, KvGeometry g) {
  using Codec = PoolCodec<kDtype>;
  const uint64_t num_slots = g.num_blocks * g.block_size;
  for (uint64_t token = blockIdx.x; token < num_tokens; token += gridDim.x) {
    const int64_t slot = slot_mapping[token];
    if (slot < 0 || static_cast<uint64_t>(slot) >= num_slots) continue;
    const uint64_t block = static_cast<uint64_t>(slot) / g.block_size;
    const uint64_t in_block = static_cast<uint64_t>(slot) % g.block_size;
    uint8_t* k_row = pool + block * g.block_bytes + g.k_offset + in_block * g.token_bytes;
    uint8_t* v_row = k_row + g.v_minus_k;
    const float* k_src = k + token * g.token_elems;
    const float* v_src = v + token * g.token_elems;
    for (uint32_t i = threadIdx.x; i < g.token_elems; i += blockDim.x) {
      Codec::Store(k_row, i, k_src[i]);
      Codec::Store(v_row, i, v_src[i]);
    }
  }
}

// =============================================================================================
// Paged attention
// =============================================================================================

constexpr uint32_t kAttnThreads = 128;
constexpr uint32_t kAttnWarps = kAttnThreads / kWarp;
constexpr uint32_t kAttnTile = 256;  // positions scored per pass
constexpr uint32_t kAttnDimsPerThread = kMaxCudaHeadDim / kAttnThreads;
static_assert(kMaxCudaHeadDim % kAttnThreads == 0);

// Grid: (min(num_tokens * num_q_heads, 2^31 - 1)), Block: (128). One CUDA block per (token,
// q head) (grid-stride over them). Positions 0..p are processed in tiles of kAttnTile: each warp
// scores positions (lanes over head_dim, warp tree sum), then the block folds the tile into a
// running max m, denominator l and per-thread output accumulators (thread i owns dims i, i + 128,
// ...) with the online-softmax rescaling exp(m_old - m_new); out = acc / l at the end. Max and
// tile sums are computed serially (in index order) by every thread from shared memory, so all
// threads agree without another reduction.
template <DType kDtype>
__global__ void __launch_bounds__(kAttnThreads)
    PagedAttentionKernel(float* __restrict__ out,                    // [tokens, q_heads, head_dim]
                         const float* __restrict__ q,                // [tokens, q_heads, head_dim]
                         const uint8_t* __restrict__ pool,           // [num_blocks, block_bytes]
                         const uint32_t* __restrict__ block_tables,  // [num_seqs, max_blocks]
                         const uint32_t* __restrict__ seq_ids,       // [tokens] or null
                         const uint32_t* __restrict__ positions,     // [tokens]
                         AttnParams p) {
  using Codec = PoolCodec<kDtype>;
  __shared__ float q_shared[kMaxCudaHeadDim];
  __shared__ float weights[kAttnTile];      // scores, then exp(score - m)
  __shared__ int64_t k_offsets[kAttnTile];  // byte offset of the position's K head row; -1 masked
  const uint32_t head_dim = p.kv.head_dim;
  const uint32_t lane = threadIdx.x % kWarp;
  const uint32_t warp = threadIdx.x / kWarp;
  const uint64_t items = uint64_t{p.num_tokens} * p.num_q_heads;
  const uint64_t capacity = uint64_t{p.max_blocks_per_seq} * p.kv.block_size;
  const uint64_t head_bytes = uint64_t{head_dim} * p.kv.elem_bytes;
  for (uint64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const uint64_t token = item / p.num_q_heads;
    const uint32_t kv_head = static_cast<uint32_t>(item % p.num_q_heads) / p.group;
    float* out_row = out + item * head_dim;
    const uint32_t seq = seq_ids == nullptr ? 0 : seq_ids[token];
    const uint64_t position = positions[token];
    if (seq >= p.num_seqs || position >= capacity) {  // uniform across the block
      for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) out_row[d] = nanf("");
      continue;
    }
    const uint32_t* table = block_tables + uint64_t{seq} * p.max_blocks_per_seq;
    const float* q_row = q + item * head_dim;
    for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) q_shared[d] = q_row[d];
    __syncthreads();

    const uint64_t context = position + 1;
    float running_max = -INFINITY;
    float denominator = 0.0f;
    float acc[kAttnDimsPerThread];
#pragma unroll
    for (uint32_t i = 0; i < kAttnDimsPerThread; ++i) acc[i] = 0.0f;

    for (uint64_t tile_start = 0; tile_start < context; tile_start += kAttnTile) {
      const uint32_t n = static_cast<uint32_t>(min(uint64_t{kAttnTile}, context - tile_start));
      // Scores: one warp per position.
      for (uint32_t j = warp; j < n; j += kAttnWarps) {
        const uint64_t pos = tile_start + j;
        const uint64_t block = table[pos / p.kv.block_size];
        float score = -INFINITY;
        int64_t offset = -1;
        if (block < p.kv.num_blocks) {
          offset = static_cast<int64_t>(block * p.kv.block_bytes + p.kv.k_offset +
                                        (pos % p.kv.block_size) * p.kv.token_bytes +
                                        kv_head * head_bytes);
          const uint8_t* k_row = pool + offset;
          float partial = 0.0f;
          for (uint32_t d = lane; d < head_dim; d += kWarp) {
            partial += q_shared[d] * Codec::Load(k_row, d);
          }
          score = WarpSum(partial) * p.scale;
        }
        if (lane == 0) {
          weights[j] = score;
          k_offsets[j] = offset;
        }
      }
      __syncthreads();
      float tile_max = -INFINITY;
      for (uint32_t j = 0; j < n; ++j) tile_max = fmaxf(tile_max, weights[j]);
      const float new_max = fmaxf(running_max, tile_max);
      __syncthreads();  // every thread has read the scores before they are overwritten
      if (new_max == -INFINITY) continue;  // nothing visible yet (uniform across the block)
      const float correction = expf(running_max - new_max);  // 0 while running_max is -inf
      for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
        weights[j] = expf(weights[j] - new_max);  // a masked position gives exp(-inf) = 0
      }
      __syncthreads();
      float tile_sum = 0.0f;
      for (uint32_t j = 0; j < n; ++j) tile_sum += weights[j];
      denominator = denominator * correction + tile_sum;
#pragma unroll
      for (uint32_t i = 0; i < kAttnDimsPerThread; ++i) {
        const uint32_t d = threadIdx.x + i * kAttnThreads;
        if (d < head_dim) {
          float a = acc[i] * correction;
          for (uint32_t j = 0; j < n; ++j) {
            const int64_t offset = k_offsets[j];
            if (offset >= 0) a += weights[j] * Codec::Load(pool + offset + p.kv.v_minus_k, d);
          }
          acc[i] = a;
        }
      }
      running_max = new_max;
      __syncthreads();  // the next tile overwrites weights / k_offsets
    }
#pragma unroll
    for (uint32_t i = 0; i < kAttnDimsPerThread; ++i) {
      const uint32_t d = threadIdx.x + i * kAttnThreads;
      // denominator 0 (no visible position) gives 0 / 0 = NaN, as documented.
      if (d < head_dim) out_row[d] = acc[i] / denominator;
    }
    __syncthreads();  // q_shared is reloaded for the next item
  }
}

}  // namespace

namespace internal {

absl::Status LaunchWriteKv(const float* k, const float* v, const int64_t* slot_mapping,
                           uint32_t num_tokens, const KvGeometry& g, uint8_t* pool, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 grid = GridFor(num_tokens);
  switch (g.dtype) {
    case DType::kFloat32:
      WriteKvKernel<DType::kFloat32>
          <<<grid, kWriteKvThreads, 0, s>>>(pool, k, v, slot_mapping, num_tokens, g);
      break;
    case DType::kBFloat16:
      WriteKvKernel<DType::kBFloat16>
          <<<grid, kWriteKvThreads, 0, s>>>(pool, k, v, slot_mapping, num_tokens, g);
      break;
    case DType::kFloat16:
      WriteKvKernel<DType::kFloat16>
          <<<grid, kWriteKvThreads, 0, s>>>(pool, k, v, slot_mapping, num_tokens, g);
      break;
    case DType::kFp8E4M3:
      WriteKvKernel<DType::kFp8E4M3>
          <<<grid, kWriteKvThreads, 0, s>>>(pool, k, v, slot_mapping, num_tokens, g);
      break;
  }
  return CheckLaunch("WriteKvCuda");
}

absl::Status LaunchPagedAttention(const float* q, const uint32_t* positions,
                                  const uint32_t* seq_ids, const uint32_t* block_tables,
                                  const AttnParams& p, const uint8_t* pool, float* out,
                                  void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 grid = GridFor(uint64_t{p.num_tokens} * p.num_q_heads);
  switch (p.kv.dtype) {
    case DType::kFloat32:
      PagedAttentionKernel<DType::kFloat32>
          <<<grid, kAttnThreads, 0, s>>>(out, q, pool, block_tables, seq_ids, positions, p);
      break;
    case DType::kBFloat16:
      PagedAttentionKernel<DType::kBFloat16>
          <<<grid, kAttnThreads, 0, s>>>(out, q, pool, block_tables, seq_ids, positions, p);
      break;
    case DType::kFloat16:
      PagedAttentionKernel<DType::kFloat16>
          <<<grid, kAttnThreads, 0, s>>>(out, q, pool, block_tables, seq_ids, positions, p);
      break;
    case DType::kFp8E4M3:
      PagedAttentionKernel<DType::kFp8E4M3>
          <<<grid, kAttnThreads, 0, s>>>(out, q, pool, block_tables, seq_ids, positions, p);
      break;
  }
  return CheckLaunch("PagedAttentionCuda");
}

}  // namespace internal
}  // namespace kvcache::kernels
