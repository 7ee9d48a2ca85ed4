// CUDA kernels for the worker's mixture of experts: routing (softmax + top-k), one SwiGLU expert,
// the row gather and the weighted combine, and their launches. See worker_kernels.h for the
// contracts, worker_kernels_args.cc for the launchers' argument checks and worker_kernels_device.h
// for the shared helpers and precision notes; the CPU references are model/ops.h and
// Qwen3MoeModel::Moe.
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

using internal::GridFor;
using internal::kFullMask;
using internal::kWarp;
using internal::WarpSum;

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
