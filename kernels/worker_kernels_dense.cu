// CUDA kernels for the worker's dense ops: RMSNorm, RoPE and the linear layer (x W^T), and their
// launches. See worker_kernels.h for the contracts, worker_kernels_args.cc for the launchers'
// argument checks and worker_kernels_device.h for the shared helpers and precision notes; the CPU
// references are in model/ops.h.
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
using internal::kWarp;
using internal::WarpSum;

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

// Grid: (min(num_tokens, 2^31 - 1)), Block: (128), dynamic shared memory: rotary_dim floats.
// One CUDA block per token (grid-stride over tokens): the block builds the token's cos / sin
// table (double, rounded to float, as worker::RopeCosSin), then rotates every (head, pair).
__global__ void __launch_bounds__(kRopeThreads)
    RopeKernel(float* __restrict__ x,                   // [num_tokens, num_heads, head_dim]
               const uint32_t* __restrict__ positions,  // [num_tokens]
               uint32_t num_tokens, uint32_t num_heads, uint32_t head_dim, uint32_t rotary_dim,
               double theta) {
  extern __shared__ float cos_sin[];  // [2, rotary_dim / 2]: cos then sin
  const uint32_t half = rotary_dim / 2;
  float* cos_table = cos_sin;
  float* sin_table = cos_sin + half;
  for (uint64_t token = blockIdx.x; token < num_tokens; token += gridDim.x) {
    const double position = static_cast<double>(positions[token]);
    for (uint32_t i = threadIdx.x; i < half; i += blockDim.x) {
      // worker::RopeInverseFrequencies and RopeCosSin, same expressions.
      const double inv_freq = 1.0 / pow(theta, static_cast<double>(2 * i) / rotary_dim);
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
                        uint32_t num_heads, uint32_t head_dim, uint32_t rotary_dim, double theta,
                        void* stream) {
  RopeKernel<<<GridFor(num_tokens), kRopeThreads, rotary_dim * sizeof(float),
               static_cast<cudaStream_t>(stream)>>>(x, positions, num_tokens, num_heads, head_dim,
                                                    rotary_dim, theta);
  return CheckLaunch("RopeCuda");
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

}  // namespace internal
}  // namespace kvcache::kernels
