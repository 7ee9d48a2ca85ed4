// CUDA kernels of linear_attention_kernels.h: the causal conv and the gated delta rule. Every
// product and sum is an explicit __fmul_rn / __fadd_rn (no FMA contraction) in the order of the
// CPU reference, model/linear_attention.cc; see the header for what matches bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_launch.h"
#include "kernels/linear_attention_kernels.h"

namespace kvcache::kernels {
namespace {

constexpr uint32_t kConvThreads = 128;
constexpr uint32_t kWarpSize = 32;

// x / (1 + exp(-x)), worker::Silu.
__device__ float SiluRn(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

// Grid: (ceil(channels / 128)), Block: (128). One thread per channel walks the tokens in order,
// its window (the last kernel - 1 inputs) in registers.
__global__ void __launch_bounds__(kConvThreads)
    CausalConv1dSiluKernel(const float* __restrict__ input,   // [n, channels]
                           const float* __restrict__ weight,  // [channels, kernel]
                           uint32_t n, uint32_t channels, uint32_t kernel,
                           float* __restrict__ conv_state,  // [channels, kernel - 1]
                           float* __restrict__ out) {       // [n, channels]
  const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const uint32_t history = kernel - 1;
  float window[kMaxCudaConvKernel];
  float w[kMaxCudaConvKernel];
  for (uint32_t j = 0; j < kernel; ++j) w[j] = weight[uint64_t{c} * kernel + j];
  for (uint32_t j = 0; j < history; ++j) window[j] = conv_state[uint64_t{c} * history + j];
  for (uint32_t t = 0; t < n; ++t) {
    const float x = input[uint64_t{t} * channels + c];
    float acc = 0.0f;
    for (uint32_t j = 0; j < history; ++j) acc = __fadd_rn(acc, __fmul_rn(w[j], window[j]));
    acc = __fadd_rn(acc, __fmul_rn(w[history], x));
    out[uint64_t{t} * channels + c] = SiluRn(acc);
    if (history > 0) {
      for (uint32_t j = 0; j + 1 < history; ++j) window[j] = window[j + 1];
      window[history - 1] = x;
    }
  }
  for (uint32_t j = 0; j < history; ++j) conv_state[uint64_t{c} * history + j] = window[j];
}

// softplus as torch (beta 1, threshold 20), worker::Softplus.
__device__ float SoftplusRn(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// 1 / sqrt(sum x^2 + 1e-6), the sum in ascending index (worker's InverseL2Norm). IEEE sqrt and
// division (nvcc's defaults without fast math).
__device__ float InverseL2Norm(const float* x, uint32_t n) {
  float sum = 0.0f;
  for (uint32_t i = 0; i < n; ++i) sum = __fadd_rn(sum, __fmul_rn(x[i], x[i]));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sum, 1e-6f)));
}

// Grid: (num_value_heads), Block: (value_head_dim rounded up to 32), dynamic shared memory:
// 2 * key_head_dim floats. One CUDA block per value head walks the tokens in order; thread j owns
// column j of the head's state [key_head_dim, value_head_dim] (in global memory, coalesced across
// the warp). Per token: thread 0 computes the l2 norms and gates; all threads normalize q and k
// into shared memory; then each thread updates its column:
//   s *= decay; kv += s * k[i]          (i ascending)
//   delta = (v[j] - kv) * beta
//   s += k[i] * delta; o += s * q[i]    (i ascending)
__global__ void GatedDeltaRuleKernel(
    const float* __restrict__ qkv,      // [n, 2 * key_heads * key_head_dim + value_dim]
    const float* __restrict__ a,        // [n, value_heads]
    const float* __restrict__ b,        // [n, value_heads]
    const float* __restrict__ a_log,    // [value_heads]
    const float* __restrict__ dt_bias,  // [value_heads]
    GatedDeltaRuleShape shape, float q_scale, uint32_t n,
    float* __restrict__ state,  // [value_heads, key_head_dim, value_head_dim]
    float* __restrict__ out) {  // [n, value_heads, value_head_dim]
  extern __shared__ float shared[];
  const uint32_t hk = shape.key_head_dim;
  const uint32_t hv = shape.value_head_dim;
  float* q_normed = shared;       // [hk]
  float* k_normed = shared + hk;  // [hk]
  __shared__ float q_inv, k_inv, beta, decay;

  const uint32_t h = blockIdx.x;
  const uint32_t key_head = h / (shape.num_value_heads / shape.num_key_heads);
  const uint64_t key_dim = uint64_t{shape.num_key_heads} * hk;
  const uint64_t conv_dim = 2 * key_dim + uint64_t{shape.num_value_heads} * hv;
  const uint32_t j = threadIdx.x;
  float* column = state + uint64_t{h} * hk * hv + j;  // element i at column[i * hv]

  for (uint32_t t = 0; t < n; ++t) {
    const float* q = qkv + t * conv_dim + uint64_t{key_head} * hk;
    const float* k = q + key_dim;
    const float* v = qkv + t * conv_dim + 2 * key_dim + uint64_t{h} * hv;
    if (threadIdx.x == 0) {
      q_inv = InverseL2Norm(q, hk);
      k_inv = InverseL2Norm(k, hk);
      const uint64_t gate = uint64_t{t} * shape.num_value_heads + h;
      beta = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b[gate])));
      const float g = __fmul_rn(-expf(a_log[h]), SoftplusRn(__fadd_rn(a[gate], dt_bias[h])));
      decay = expf(g);
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < hk; i += blockDim.x) {
      q_normed[i] = __fmul_rn(__fmul_rn(q[i], q_inv), q_scale);
      k_normed[i] = __fmul_rn(k[i], k_inv);
    }
    __syncthreads();
    if (j < hv) {
      float kv_memory = 0.0f;
      for (uint32_t i = 0; i < hk; ++i) {
        const float s = __fmul_rn(column[uint64_t{i} * hv], decay);
        column[uint64_t{i} * hv] = s;
        kv_memory = __fadd_rn(kv_memory, __fmul_rn(s, k_normed[i]));
      }
      const float delta = __fmul_rn(__fsub_rn(v[j], kv_memory), beta);
      float o = 0.0f;
      for (uint32_t i = 0; i < hk; ++i) {
        const float s = __fadd_rn(column[uint64_t{i} * hv], __fmul_rn(k_normed[i], delta));
        column[uint64_t{i} * hv] = s;
        o = __fadd_rn(o, __fmul_rn(s, q_normed[i]));
      }
      out[(uint64_t{t} * shape.num_value_heads + h) * hv + j] = o;
    }
    __syncthreads();  // q_normed / k_normed and the gates are rewritten by the next token
  }
}

constexpr uint32_t kGateThreads = 256;

// Grid: (min(ceil(count / 256), 65535)), Block: (256), grid-stride over elements.
__global__ void __launch_bounds__(kGateThreads)
    GateMultiplyKernel(float* __restrict__ x,           // [count]
                       const float* __restrict__ gate,  // [count]
                       uint64_t count, GateActivation activation) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    const float denominator = __fadd_rn(1.0f, expf(-g));
    const float factor = activation == GateActivation::kSigmoid ? __fdiv_rn(1.0f, denominator)
                                                                : __fdiv_rn(g, denominator);
    x[i] = __fmul_rn(x[i], factor);
  }
}

}  // namespace

namespace internal {

absl::Status LaunchCausalConv1dSilu(const float* input, const float* weight, uint32_t n,
                                    uint32_t channels, uint32_t kernel, float* conv_state,
                                    float* out, void* stream) {
  const uint32_t blocks = (channels + kConvThreads - 1) / kConvThreads;
  CausalConv1dSiluKernel<<<blocks, kConvThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      input, weight, n, channels, kernel, conv_state, out);
  return CheckLaunch("CausalConv1dSiluCuda");
}

absl::Status LaunchGatedDeltaRule(const GatedDeltaRuleShape& shape, float q_scale, const float* qkv,
                                  const float* a, const float* b, const float* a_log,
                                  const float* dt_bias, uint32_t n, float* state, float* out,
                                  void* stream) {
  const uint32_t threads = (shape.value_head_dim + kWarpSize - 1) / kWarpSize * kWarpSize;
  const size_t shared_bytes = 2 * size_t{shape.key_head_dim} * sizeof(float);
  GatedDeltaRuleKernel<<<shape.num_value_heads, threads, shared_bytes,
                         static_cast<cudaStream_t>(stream)>>>(qkv, a, b, a_log, dt_bias, shape,
                                                              q_scale, n, state, out);
  return CheckLaunch("GatedDeltaRuleCuda");
}

absl::Status LaunchGateMultiply(float* x, const float* gate, uint64_t count,
                                GateActivation activation, void* stream) {
  const uint64_t blocks = std::min<uint64_t>((count + kGateThreads - 1) / kGateThreads, 65535);
  GateMultiplyKernel<<<static_cast<uint32_t>(blocks), kGateThreads, 0,
                       static_cast<cudaStream_t>(stream)>>>(x, gate, count, activation);
  return CheckLaunch("GateMultiplyCuda");
}

}  // namespace internal
}  // namespace kvcache::kernels
