// CUDA kernels for the worker's hot ops and their launches. See worker_kernels.h for the
// contracts and worker_kernels_args.cc for the launchers' argument checks; the CPU references are
// model/ops.h and model/paged_kv.h, and tests/kernels/worker_kernels_gpu_test.cc compares the two.
//
// Precision notes. nvcc contracts a * b + c into an FMA by default; where the CPU result is meant
// to be reproduced (RMSNorm's scaling, RoPE's rotation, LinearCuda's lanes, the MoE combine) the
// kernels use __fmul_rn / __fadd_rn / __fsub_rn, which are never contracted. The pool dtype
// conversions are the CPU's own (common/float_convert.h, integer bit manipulation), so the KV
// write is byte-exact. The expert matvecs and the attention sums run in a different order from
// the CPU (warp trees, online softmax) and are not bit-exact with it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/float_convert.h"
#include "kernels/cuda_launch.h"
#include "kernels/worker_kernels.h"
#include "kernels/worker_kernels_internal.h"

namespace kvcache::kernels {
namespace {

constexpr uint32_t kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// gridDim.x limit; larger work counts are covered by the kernels' grid-stride loops.
constexpr uint64_t kMaxGridX = 0x7fffffffu;

dim3 GridFor(uint64_t count) { return dim3(static_cast<unsigned>(std::min(count, kMaxGridX))); }

// --- Warp reductions. The xor butterfly leaves the same value in every lane (a + b == b + a). ---

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ double WarpSum(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Element `i` of a pool row of `kDtype` elements. `row` is aligned to the element size (the
// launchers check the pool base; every offset inside a pool is a multiple of the element size).
template <DType kDtype>
struct PoolCodec;

template <>
struct PoolCodec<DType::kFloat32> {
  __device__ static float Load(const uint8_t* row, uint32_t i) {
    return reinterpret_cast<const float*>(row)[i];
  }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) {
    reinterpret_cast<float*>(row)[i] = v;
  }
};

template <>
struct PoolCodec<DType::kBFloat16> {
  __device__ static float Load(const uint8_t* row, uint32_t i) {
    return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
  }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) {
    reinterpret_cast<uint16_t*>(row)[i] = FloatToBFloat16(v);
  }
};

template <>
struct PoolCodec<DType::kFloat16> {
  __device__ static float Load(const uint8_t* row, uint32_t i) {
    return Float16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
  }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) {
    reinterpret_cast<uint16_t*>(row)[i] = FloatToFloat16(v);
  }
};

template <>
struct PoolCodec<DType::kFp8E4M3> {
  __device__ static float Load(const uint8_t* row, uint32_t i) { return Fp8E4M3ToFloat(row[i]); }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) { row[i] = FloatToFp8E4M3(v); }
};

// =============================================================================================
// RMSNorm
// =============================================================================================

constexpr uint32_t kNormMaxThreads = 256;

// Grid: (min(rows, 2^31 - 1)), Block: (min(256, dim rounded up to 32)). One CUDA block per row
// (grid-stride over rows): a double sum of squares (warp trees, then the warps in order), then
// every element scaled. `x` and `out` are not __restrict__: they may be the same buffer (each
// element is read and then written by the same thread, after the reduction).
__global__ void __launch_bounds__(kNormMaxThreads)
    RmsNormKernel(float* out,                        // [rows, dim]
                  const float* x,                    // [rows, dim]
                  const float* __restrict__ weight,  // [dim]
                  float eps, uint32_t rows, uint32_t dim) {
  __shared__ double warp_sums[kNormMaxThreads / kWarp];
  __shared__ float inv_rms_shared;
  const uint32_t lane = threadIdx.x % kWarp;
  const uint32_t warp = threadIdx.x / kWarp;
  const uint32_t num_warps = blockDim.x / kWarp;
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* x_row = x + row * dim;
    float* out_row = out + row * dim;
    double sum = 0;  // x * x is exact in double, as on the CPU
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const double value = x_row[i];
      sum += value * value;
    }
    sum = WarpSum(sum);
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0;
      for (uint32_t w = 0; w < num_warps; ++w) total += warp_sums[w];
      // worker::RmsNorm: float(1.0 / sqrt(sum / n + eps)) in double (IEEE sqrt and division).
      inv_rms_shared = static_cast<float>(1.0 / sqrt(total / static_cast<double>(dim) + eps));
    }
    __syncthreads();
    const float inv_rms = inv_rms_shared;
    for (uint32_t i = threadIdx.x; i < dim; i += blockDim.x) {
      out_row[i] = __fmul_rn(weight[i], __fmul_rn(x_row[i], inv_rms));
    }
    __syncthreads();  // warp_sums / inv_rms_shared are reused by the next row
  }
}

// =============================================================================================
// RoPE
// =============================================================================================

constexpr uint32_t kRopeThreads = 128;

// Grid: (min(num_tokens, 2^31 - 1)), Block: (128), dynamic shared memory: head_dim floats.
// One CUDA block per token (grid-stride over tokens): the block builds the token's cos / sin
// table (double, rounded to float, as worker::RopeCosSin), then rotates every (head, pair).
__global__ void __launch_bounds__(kRopeThreads)
    RopeKernel(float* __restrict__ x,                   // [num_tokens, num_heads, head_dim]
               const uint32_t* __restrict__ positions,  // [num_tokens]
               uint32_t num_tokens, uint32_t num_heads, uint32_t head_dim, double theta) {
  extern __shared__ float cos_sin[];  // [2, head_dim / 2]: cos then sin
  const uint32_t half = head_dim / 2;
  float* cos_table = cos_sin;
  float* sin_table = cos_sin + half;
  for (uint64_t token = blockIdx.x; token < num_tokens; token += gridDim.x) {
    const double position = static_cast<double>(positions[token]);
    for (uint32_t i = threadIdx.x; i < half; i += blockDim.x) {
      // worker::RopeInverseFrequencies and RopeCosSin, same expressions.
      const double inv_freq = 1.0 / pow(theta, static_cast<double>(2 * i) / head_dim);
      const double angle = position * inv_freq;
      cos_table[i] = static_cast<float>(cos(angle));
      sin_table[i] = static_cast<float>(sin(angle));
    }
    __syncthreads();
    float* x_token = x + token * num_heads * head_dim;
    const uint64_t pairs = uint64_t{num_heads} * half;
    for (uint64_t e = threadIdx.x; e < pairs; e += blockDim.x) {
      const uint64_t head = e / half;
      const uint32_t i = static_cast<uint32_t>(e % half);
      float* x_head = x_token + head * head_dim;
      const float lo = x_head[i];
      const float hi = x_head[i + half];
      const float c = cos_table[i];
      const float s = sin_table[i];
      // worker::ApplyRope without FMA contraction.
      x_head[i] = __fsub_rn(__fmul_rn(lo, c), __fmul_rn(hi, s));
      x_head[i + half] = __fadd_rn(__fmul_rn(hi, c), __fmul_rn(lo, s));
    }
    __syncthreads();  // the table is rebuilt for the next token
  }
}

// =============================================================================================
// KV write
// =============================================================================================

constexpr uint32_t kWriteKvThreads = 256;

using internal::KvGeometry;

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

using internal::AttnParams;

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

// =============================================================================================
// MoE routing
// =============================================================================================

constexpr uint32_t kNoExpert = 0xffffffffu;

// worker::TopK's order: NaN last, larger first, equal values by lower index. A strict total order.
__device__ __forceinline__ bool RanksBefore(float va, uint32_t a, float vb, uint32_t b) {
  const bool a_nan = isnan(va);
  const bool b_nan = isnan(vb);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && va != vb) return va > vb;
  return a < b;
}

// exp in double rounded to float: correctly rounded in all but vanishingly rare cases, as glibc's
// expf (used by worker::Softmax) is, so the probabilities agree with the CPU to the last bit in
// practice.
__device__ __forceinline__ float ExpLikeCpu(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

// Grid: (min(num_tokens, 2^31 - 1)), Block: (32), dynamic shared memory: num_experts floats rounded
// up to a multiple of 4.
// One warp per token (grid-stride over tokens). Softmax as worker::Softmax: lane 0 takes the max
// and the sum serially in index order (the CPU's order), the lanes compute the exponentials and
// the divisions; then top_k rounds of a warp arg-best over the experts that rank after the
// previous pick (no "taken" flags needed: the order is total).
__global__ void __launch_bounds__(kWarp)
    MoeRouteKernel(uint32_t* __restrict__ topk_ids,   // [num_tokens, top_k]
                   float* __restrict__ topk_weights,  // [num_tokens, top_k]
                   const float* __restrict__ logits,  // [num_tokens, num_experts]
                   uint32_t num_tokens, uint32_t num_experts, uint32_t top_k, bool norm_topk_prob) {
  extern __shared__ float probs[];  // [num_experts]
  const uint32_t lane = threadIdx.x;
  for (uint64_t token = blockIdx.x; token < num_tokens; token += gridDim.x) {
    const float* row = logits + token * num_experts;
    float max_value = 0.0f;
    if (lane == 0) {
      max_value = row[0];
      for (uint32_t e = 1; e < num_experts; ++e) {
        max_value = max_value < row[e] ? row[e] : max_value;  // std::max's NaN behavior
      }
    }
    max_value = __shfl_sync(kFullMask, max_value, 0);
    for (uint32_t e = lane; e < num_experts; e += kWarp) probs[e] = ExpLikeCpu(row[e] - max_value);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0) {
      for (uint32_t e = 0; e < num_experts; ++e) sum += probs[e];
    }
    sum = __shfl_sync(kFullMask, sum, 0);
    __syncwarp();
    for (uint32_t e = lane; e < num_experts; e += kWarp) probs[e] = probs[e] / sum;
    __syncwarp();

    uint32_t* ids = topk_ids + token * top_k;
    float* weights = topk_weights + token * top_k;
    // Each candidate travels with its probability through the shuffles, so the reduction reads
    // no shared memory and never needs probs[kNoExpert] guarded.
    uint32_t previous = kNoExpert;
    float previous_prob = 0.0f;
    float weight_sum = 0.0f;  // lane 0's, in pick order as Qwen3MoeModel::Moe
    for (uint32_t pick = 0; pick < top_k; ++pick) {
      uint32_t best = kNoExpert;
      float best_prob = 0.0f;
      for (uint32_t e = lane; e < num_experts; e += kWarp) {
        const float prob = probs[e];
        if (previous != kNoExpert && !RanksBefore(previous_prob, previous, prob, e)) continue;
        if (best == kNoExpert || RanksBefore(prob, e, best_prob, best)) {
          best = e;
          best_prob = prob;
        }
      }
#pragma unroll
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        const uint32_t other = __shfl_xor_sync(kFullMask, best, offset);
        const float other_prob = __shfl_xor_sync(kFullMask, best_prob, offset);
        if (other != kNoExpert &&
            (best == kNoExpert || RanksBefore(other_prob, other, best_prob, best))) {
          best = other;
          best_prob = other_prob;
        }
      }
      // pick < top_k <= num_experts, so some expert ranks after `previous`: best is valid.
      if (lane == 0) {
        ids[pick] = best;
        weights[pick] = best_prob;
        weight_sum += best_prob;
      }
      previous = best;
      previous_prob = best_prob;
    }
    if (norm_topk_prob && lane == 0) {
      for (uint32_t pick = 0; pick < top_k; ++pick) weights[pick] = probs[ids[pick]] / weight_sum;
    }
    __syncwarp();  // probs is rebuilt for the next token
  }
}

// =============================================================================================
// SwiGLU expert
// =============================================================================================

constexpr uint32_t kMatVecWarps = 8;
constexpr uint32_t kMatVecThreads = kMatVecWarps * kWarp;

// Grid: (min(ceil(rows * intermediate / 8), 2^31 - 1)), Block: (256). One warp per output
// (row, i) (grid-stride over them; i fastest, so neighbouring warps share x[row]); lanes stride
// over hidden, warp tree sum. act = Silu(gate . x) * (up . x), Silu(g) = g / (1 + exp(-g)).
__global__ void __launch_bounds__(kMatVecThreads)
    GateUpSiluKernel(float* __restrict__ act,              // [rows, intermediate]
                     const float* __restrict__ x,          // [rows, hidden]
                     const float* __restrict__ gate_proj,  // [intermediate, hidden]
                     const float* __restrict__ up_proj,    // [intermediate, hidden]
                     uint32_t rows, uint32_t hidden, uint32_t intermediate) {
  const uint32_t lane = threadIdx.x % kWarp;
  const uint64_t outputs = uint64_t{rows} * intermediate;
  const uint64_t stride = uint64_t{gridDim.x} * kMatVecWarps;
  for (uint64_t item = uint64_t{blockIdx.x} * kMatVecWarps + threadIdx.x / kWarp; item < outputs;
       item += stride) {
    const uint64_t row = item / intermediate;
    const uint64_t i = item % intermediate;
    const float* x_row = x + row * hidden;
    const float* gate_row = gate_proj + i * hidden;
    const float* up_row = up_proj + i * hidden;
    float gate = 0.0f;
    float up = 0.0f;
    for (uint32_t h = lane; h < hidden; h += kWarp) {
      const float xv = x_row[h];
      gate += gate_row[h] * xv;
      up += up_row[h] * xv;
    }
    gate = WarpSum(gate);
    up = WarpSum(up);
    if (lane == 0) act[item] = gate / (1.0f + expf(-gate)) * up;
  }
}

// Grid: (min(ceil(rows * hidden / 8), 2^31 - 1)), Block: (256). One warp per output (row, h)
// (grid-stride; h fastest); lanes stride over intermediate, warp tree sum.
__global__ void __launch_bounds__(kMatVecThreads)
    DownProjKernel(float* __restrict__ out,              // [rows, hidden]
                   const float* __restrict__ act,        // [rows, intermediate]
                   const float* __restrict__ down_proj,  // [hidden, intermediate]
                   uint32_t rows, uint32_t hidden, uint32_t intermediate) {
  const uint32_t lane = threadIdx.x % kWarp;
  const uint64_t outputs = uint64_t{rows} * hidden;
  const uint64_t stride = uint64_t{gridDim.x} * kMatVecWarps;
  for (uint64_t item = uint64_t{blockIdx.x} * kMatVecWarps + threadIdx.x / kWarp; item < outputs;
       item += stride) {
    const uint64_t row = item / hidden;
    const uint64_t h = item % hidden;
    const float* act_row = act + row * intermediate;
    const float* down_row = down_proj + h * intermediate;
    float sum = 0.0f;
    for (uint32_t i = lane; i < intermediate; i += kWarp) sum += down_row[i] * act_row[i];
    sum = WarpSum(sum);
    if (lane == 0) out[item] = sum;
  }
}

// =============================================================================================
// Linear (x W^T), in worker::Dot's order
// =============================================================================================

constexpr uint32_t kLinearOuts = 32;   // outputs per CUDA block: threadIdx.x
constexpr uint32_t kLinearRows = 8;    // rows per CUDA block: threadIdx.y
constexpr uint32_t kLinearDepth = 32;  // input features per shared-memory tile
constexpr uint32_t kDotLanes = 8;      // worker::Dot's lanes
constexpr uint32_t kMaxGridY = 65535;
static_assert(kLinearDepth % kDotLanes == 0, "a tile must start at lane 0");

// Grid: (ceil(out_features / 32), min(ceil(rows / 8), 65535)), Block: (32, 8). Thread (o, r) owns
// output (row_base + r, blockIdx.x * 32 + o) (grid-stride over row groups). Each 32-deep tile of
// x rows and weight rows goes through shared memory (padded rows: conflict-free column reads);
// every thread then adds the tile into worker::Dot's eight lanes. Because a tile starts at a
// multiple of 8, input k always lands in lane k % 8, and the zero padding past in_features adds
// exact +0 (a lane is never -0: it starts at +0), so every output follows worker::Dot's order
// whatever rows or tile it belongs to.
__global__ void __launch_bounds__(kLinearOuts* kLinearRows)
    LinearKernel(float* __restrict__ out,           // [rows, out_features]
                 const float* __restrict__ x,       // [rows, in_features]
                 const float* __restrict__ weight,  // [out_features, in_features]
                 uint32_t rows, uint32_t in_features, uint32_t out_features, bool accumulate) {
  __shared__ float w_tile[kLinearOuts][kLinearDepth + 1];
  __shared__ float x_tile[kLinearRows][kLinearDepth + 1];
  const uint32_t tx = threadIdx.x;
  const uint32_t ty = threadIdx.y;
  const uint64_t out_base = uint64_t{blockIdx.x} * kLinearOuts;
  const uint64_t o = out_base + tx;
  for (uint64_t row_base = uint64_t{blockIdx.y} * kLinearRows; row_base < rows;
       row_base += uint64_t{gridDim.y} * kLinearRows) {  // uniform across the block
    const uint64_t r = row_base + ty;
    float lane[kDotLanes];
#pragma unroll
    for (uint32_t j = 0; j < kDotLanes; ++j) lane[j] = 0.0f;
    for (uint32_t k0 = 0; k0 < in_features; k0 += kLinearDepth) {
      const bool k_in = k0 + tx < in_features;  // tx doubles as the k index of the loads
      for (uint32_t i = ty; i < kLinearOuts; i += kLinearRows) {
        const uint64_t wo = out_base + i;
        w_tile[i][tx] = (k_in && wo < out_features) ? weight[wo * in_features + k0 + tx] : 0.0f;
      }
      x_tile[ty][tx] = (k_in && r < rows) ? x[r * in_features + k0 + tx] : 0.0f;
      __syncthreads();
#pragma unroll
      for (uint32_t kk = 0; kk < kLinearDepth; kk += kDotLanes) {
#pragma unroll
        for (uint32_t j = 0; j < kDotLanes; ++j) {
          lane[j] = __fadd_rn(lane[j], __fmul_rn(x_tile[ty][kk + j], w_tile[tx][kk + j]));
        }
      }
      __syncthreads();  // the next tile overwrites w_tile / x_tile
    }
    if (r < rows && o < out_features) {
      const float low = __fadd_rn(__fadd_rn(lane[0], lane[1]), __fadd_rn(lane[2], lane[3]));
      const float high = __fadd_rn(__fadd_rn(lane[4], lane[5]), __fadd_rn(lane[6], lane[7]));
      const float dot = __fadd_rn(low, high);
      float* dst = out + r * out_features + o;
      *dst = accumulate ? __fadd_rn(*dst, dot) : dot;
    }
  }
}

// =============================================================================================
// Row gather and MoE combine
// =============================================================================================

constexpr uint32_t kRowThreads = 256;

// Grid: (min(num_rows, 2^31 - 1)), Block: (256). One CUDA block per output row (grid-stride).
__global__ void __launch_bounds__(kRowThreads)
    GatherRowsKernel(float* __restrict__ out,               // [num_rows, cols]
                     const float* __restrict__ src,         // [num_src_rows, cols]
                     const uint32_t* __restrict__ row_ids,  // [num_rows]
                     uint64_t num_src_rows, uint32_t cols, uint32_t num_rows) {
  for (uint64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const uint32_t id = row_ids[r];
    float* dst = out + r * cols;
    if (id >= num_src_rows) {  // uniform across the block
      for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = nanf("");
      continue;
    }
    const float* row = src + uint64_t{id} * cols;
    for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = row[i];
  }
}

// Grid: (min(num_tokens, 2^31 - 1)), Block: (256). One CUDA block per token (grid-stride); each
// thread owns hidden elements i, i + 256, ... and sums the token's top_k contributions in order.
__global__ void __launch_bounds__(kRowThreads)
    MoeCombineKernel(float* __restrict__ x,                 // [num_tokens, hidden]
                     const float* __restrict__ expert_out,  // [num_expert_rows, hidden]
                     const uint32_t* __restrict__ rows,     // [num_tokens, top_k]
                     const float* __restrict__ weights,     // [num_tokens, top_k]
                     uint64_t num_expert_rows, uint32_t hidden, uint32_t num_tokens,
                     uint32_t top_k) {
  for (uint64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const uint32_t* token_rows = rows + t * top_k;
    const float* token_weights = weights + t * top_k;
    float* x_row = x + t * hidden;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      float acc = 0.0f;
      for (uint32_t j = 0; j < top_k; ++j) {
        const uint32_t row = token_rows[j];
        const float value =
            row < num_expert_rows ? expert_out[row * uint64_t{hidden} + i] : nanf("");
        acc = __fadd_rn(acc, __fmul_rn(value, token_weights[j]));
      }
      x_row[i] = __fadd_rn(x_row[i], acc);
    }
  }
}

}  // namespace

namespace internal {

absl::Status LaunchRmsNorm(const float* x, const float* weight, float eps, uint32_t rows,
                           uint32_t dim, float* out, void* stream) {
  const uint32_t threads =
      std::min(kNormMaxThreads, std::max(kWarp, (dim + kWarp - 1) / kWarp * kWarp));
  RmsNormKernel<<<GridFor(rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(out, x, weight,
                                                                                  eps, rows, dim);
  return CheckLaunch("RmsNormCuda");
}

absl::Status LaunchRope(float* x, const uint32_t* positions, uint32_t num_tokens,
                        uint32_t num_heads, uint32_t head_dim, double theta, void* stream) {
  RopeKernel<<<GridFor(num_tokens), kRopeThreads, head_dim * sizeof(float),
               static_cast<cudaStream_t>(stream)>>>(x, positions, num_tokens, num_heads, head_dim,
                                                    theta);
  return CheckLaunch("RopeCuda");
}

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

absl::Status LaunchMoeRoute(const float* logits, uint32_t num_tokens, uint32_t num_experts,
                            uint32_t top_k, bool norm_topk_prob, uint32_t* topk_ids,
                            float* topk_weights, void* stream) {
  // Whole 16-byte groups: ptxas merges the serial sum's tail loads into one wider shared load
  // (compute-sanitizer flagged a 12-byte read at the array's start, on the sum's line).
  const uint32_t padded_experts = (num_experts + 3) / 4 * 4;
  MoeRouteKernel<<<GridFor(num_tokens), kWarp, padded_experts * sizeof(float),
                   static_cast<cudaStream_t>(stream)>>>(topk_ids, topk_weights, logits, num_tokens,
                                                        num_experts, top_k, norm_topk_prob);
  return CheckLaunch("MoeRouteCuda");
}

absl::Status LaunchExpertSwiGlu(const float* x, const float* gate_proj, const float* up_proj,
                                const float* down_proj, uint32_t rows, uint32_t hidden,
                                uint32_t intermediate, float* workspace, float* out, void* stream) {
  constexpr char kOp[] = "ExpertSwiGluCuda";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint64_t act_outputs = uint64_t{rows} * intermediate;
  GateUpSiluKernel<<<GridFor((act_outputs + kMatVecWarps - 1) / kMatVecWarps), kMatVecThreads, 0,
                     s>>>(workspace, x, gate_proj, up_proj, rows, hidden, intermediate);
  if (absl::Status launched = CheckLaunch(kOp); !launched.ok()) return launched;
  const uint64_t outputs = uint64_t{rows} * hidden;
  DownProjKernel<<<GridFor((outputs + kMatVecWarps - 1) / kMatVecWarps), kMatVecThreads, 0, s>>>(
      out, workspace, down_proj, rows, hidden, intermediate);
  return CheckLaunch(kOp);
}

absl::Status LaunchLinear(const float* x, const float* weight, uint32_t rows, uint32_t in_features,
                          uint32_t out_features, bool accumulate, float* out, void* stream) {
  const uint32_t out_groups = (out_features + kLinearOuts - 1) / kLinearOuts;
  const uint32_t row_groups = std::min((rows + kLinearRows - 1) / kLinearRows, kMaxGridY);
  LinearKernel<<<dim3(out_groups, row_groups), dim3(kLinearOuts, kLinearRows), 0,
                 static_cast<cudaStream_t>(stream)>>>(out, x, weight, rows, in_features,
                                                      out_features, accumulate);
  return CheckLaunch("LinearCuda");
}

absl::Status LaunchGatherRows(const float* src, uint64_t num_src_rows, uint32_t cols,
                              const uint32_t* row_ids, uint32_t num_rows, float* out,
                              void* stream) {
  GatherRowsKernel<<<GridFor(num_rows), kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      out, src, row_ids, num_src_rows, cols, num_rows);
  return CheckLaunch("GatherRowsCuda");
}

absl::Status LaunchMoeCombine(const float* expert_out, uint64_t num_expert_rows, uint32_t hidden,
                              const uint32_t* rows, const float* weights, uint32_t num_tokens,
                              uint32_t top_k, float* x, void* stream) {
  MoeCombineKernel<<<GridFor(num_tokens), kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, expert_out, rows, weights, num_expert_rows, hidden, num_tokens, top_k);
  return CheckLaunch("MoeCombineCuda");
}

}  // namespace internal
}  // namespace kvcache::kernels
