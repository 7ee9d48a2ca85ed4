// CUDA kernels of the Gated DeltaNet (Qwen3-Next linear attention) layer's sequential part: the
// causal depthwise conv with its carried window, and the gated delta rule with its carried
// recurrent state. Their CPU references, and the test oracle, are in model/linear_attention.h:
//
//   CausalConv1dSiluCuda  worker::CausalConv1dSilu
//   GatedDeltaRuleCuda    worker::GatedDeltaRule
//   GateMultiplyCuda      the output gates of Qwen3NextModel (x * sigmoid(gate), x * SiLU(z))
//
// Both run the tokens of one sequence in order, each token's arithmetic in the CPU reference's
// order with every product and sum rounded (no FMA contraction): the window and state they carry
// are float32 in the byte layout of model/linear_attention_state.h, so a state copied off the
// device after m tokens and back on resumes bit-identically. Splitting a run into calls (prefill
// in chunks, then decode one token at a time) gives bit-identical outputs and states on the GPU.
// Against the CPU they agree to the last bits of exp / log1p (CUDA's expf and log1pf are within
// 2 ulp, glibc's within 1), not bit for bit; the sums, square roots and divisions are IEEE on both.
//
// Conventions as kernels/worker_kernels.h: device pointers, `stream` a cudaStream_t as void*, no
// hidden synchronization or allocation; INVALID_ARGUMENT for bad sizes or null pointers before
// anything is enqueued; OK without launching for n == 0; FAILED_PRECONDITION ("built without
// CUDA") in a build without CUDA, after the same checks. Outputs must not alias inputs.
#ifndef KVCACHE_KERNELS_LINEAR_ATTENTION_KERNELS_H_
#define KVCACHE_KERNELS_LINEAR_ATTENTION_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvcache::kernels {

inline constexpr uint32_t kMaxCudaConvKernel = 16;       // the window lives in registers
inline constexpr uint32_t kMaxCudaLinearHeadDim = 1024;  // one thread per value column

// input, out: [n, channels]; weight: [channels, kernel]; conv_state: [channels, kernel - 1], the
// inputs before this call, oldest first; updated to the last kernel - 1 inputs.
// out[t, c] = Silu(sum_j weight[c, j] * window_t[c, j]), as worker::CausalConv1dSilu.
// INVALID_ARGUMENT unless channels > 0 and 1 <= kernel <= kMaxCudaConvKernel.
absl::Status CausalConv1dSiluCuda(const float* input, const float* weight, uint32_t n,
                                  uint32_t channels, uint32_t kernel, float* conv_state, float* out,
                                  void* stream);

struct GatedDeltaRuleShape {
  uint32_t num_key_heads = 0;
  uint32_t num_value_heads = 0;  // a multiple of num_key_heads
  uint32_t key_head_dim = 0;
  uint32_t value_head_dim = 0;  // at most kMaxCudaLinearHeadDim
};

// qkv: [n, 2 * num_key_heads * key_head_dim + num_value_heads * value_head_dim] (the conv's
// output: q, k, v); a, b: [n, num_value_heads]; a_log, dt_bias: [num_value_heads]; state:
// [num_value_heads, key_head_dim, value_head_dim], updated; out: [n, num_value_heads,
// value_head_dim]. The gated delta rule of worker::GatedDeltaRule, token by token.
// INVALID_ARGUMENT for a zero dimension, value heads not a multiple of key heads, or a value head
// dim above kMaxCudaLinearHeadDim.
absl::Status GatedDeltaRuleCuda(const GatedDeltaRuleShape& shape, const float* qkv, const float* a,
                                const float* b, const float* a_log, const float* dt_bias,
                                uint32_t n, float* state, float* out, void* stream);

// How GateMultiplyCuda turns a gate into a factor.
enum class GateActivation : uint8_t {
  kSigmoid,  // 1 / (1 + exp(-g)): gated attention's output gate (worker::Sigmoid)
  kSilu,     // g / (1 + exp(-g)): RMSNormGated's SiLU(z) (worker::Silu)
};

// x, gate: [count] floats; x[i] = x[i] * act(gate[i]), one rounded product, as the CPU model's
// `x[i] *= Sigmoid(gate[i])` and `x[i] = x[i] * Silu(z[i])`. OK without launching for count 0.
absl::Status GateMultiplyCuda(float* x, const float* gate, uint64_t count,
                              GateActivation activation, void* stream);

namespace internal {
// The launches behind the functions above (linear_attention_kernels.cu, or the stub without
// CUDA). REQUIRES: the public function's checks passed.
absl::Status LaunchCausalConv1dSilu(const float* input, const float* weight, uint32_t n,
                                    uint32_t channels, uint32_t kernel, float* conv_state,
                                    float* out, void* stream);
absl::Status LaunchGatedDeltaRule(const GatedDeltaRuleShape& shape, float q_scale, const float* qkv,
                                  const float* a, const float* b, const float* a_log,
                                  const float* dt_bias, uint32_t n, float* state, float* out,
                                  void* stream);
absl::Status LaunchGateMultiply(float* x, const float* gate, uint64_t count,
                                GateActivation activation, void* stream);
}  // namespace internal

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_LINEAR_ATTENTION_KERNELS_H_
