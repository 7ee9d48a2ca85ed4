// The numerics of one Gated DeltaNet layer on the CPU (Qwen3-Next's linear attention), in float32
// with a fixed evaluation order, following Qwen3NextGatedDeltaNet in Hugging Face transformers,
// src/transformers/models/qwen3_next/modeling_qwen3_next.py (torch_causal_conv1d_update, l2norm,
// torch_recurrent_gated_delta_rule):
//
//   conv:   y_t[c] = SiLU(sum_{j < K} w[c, j] * x_{t - K + 1 + j}[c]), a causal depthwise conv of
//           kernel K over the q, k, v channels, inputs before position 0 being zeros;
//   gates:  beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), per value head;
//   rule:   q, k l2-normalized (x / sqrt(sum x^2 + 1e-6)), q scaled by 1 / sqrt(key_head_dim);
//           S = S * exp(g);  kv = S^T k;  delta = (v - kv) * beta;  S = S + k delta^T;
//           o = S^T q,  S: [key_head_dim, value_head_dim] per value head, value head h reading
//           q and k of key head h / (num_value_heads / num_key_heads).
//
// The recurrence runs token by token in this order (never the chunked parallel form, whose
// summation order depends on where the chunks fall), and the carried state (S, and the last K - 1
// conv inputs per channel) is float32: running tokens [0, n) at once or as [0, m) then [m, n)
// from the state after m gives bit-identical outputs and states. These functions are also the
// test oracle of the CUDA kernels (kernels/linear_attention_kernels.h).
// Thread-safety: pure functions over caller-owned buffers; sizes are the caller's to guarantee.
#ifndef KVCACHE_MODEL_LINEAR_ATTENTION_H_
#define KVCACHE_MODEL_LINEAR_ATTENTION_H_

#include <cstdint>

#include "model/qwen3_next_config.h"

namespace kvcache::worker {

// The l2norm epsilon of the reference (fla's l2norm, use_qk_l2norm_in_kernel).
inline constexpr float kL2NormEps = 1e-6f;

// input, out: [n, channels]; weight: [channels, kernel] (conv1d.weight without its middle dim);
// conv_state: [channels, kernel - 1], the inputs of the kernel - 1 positions before this call,
// oldest first, updated to the last kernel - 1 inputs. For each channel c and token t:
//   acc = 0; acc += w[c, j] * window[j] for j = 0 .. kernel - 1 (window = state then x_t);
//   out[t, c] = Silu(acc)
// each product and sum rounded in that order.
void CausalConv1dSilu(const float* input, const float* weight, uint32_t n, uint32_t channels,
                      uint32_t kernel, float* conv_state, float* out);

// softplus(x) as torch (beta 1, threshold 20): x above 20, else log1p(exp(x)).
float Softplus(float x);
// 1 / (1 + exp(-x)).
float Sigmoid(float x);

// qkv: [n, conv_dim], the conv's output: per token q [num_key_heads, key_head_dim], then k (same
// shape), then v [num_value_heads, value_head_dim]; a, b: [n, num_value_heads] (in_proj_ba's
// halves); a_log, dt_bias: [num_value_heads]; state: [num_value_heads, key_head_dim,
// value_head_dim], updated; out: [n, num_value_heads, value_head_dim]. The gated delta rule of the
// header, token by token; sums over the key dim run in ascending index, each product and sum
// rounded.
void GatedDeltaRule(const LinearAttentionDims& dims, const float* qkv, const float* a,
                    const float* b, const float* a_log, const float* dt_bias, uint32_t n,
                    float* state, float* out);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_LINEAR_ATTENTION_H_
