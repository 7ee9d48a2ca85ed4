// Numeric building blocks of the CPU decoder, all in float32 with a fixed evaluation order so
// that the same inputs always give bit-identical outputs (no threads, no data-dependent order).
// Callers guarantee the sizes; the functions do not check them.
// Thread-safety: pure functions over caller-owned buffers.
#ifndef KVCACHE_MODEL_OPS_H_
#define KVCACHE_MODEL_OPS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache::worker {

// sum_i a[i] * b[i], accumulated in eight fixed lanes then combined pairwise, in that order.
float Dot(const float* a, const float* b, size_t n);

// out[r] = Dot(w[r, :], x) for a row-major w of shape [rows, cols] (a Linear weight [out, in]).
// `out` must not alias `x`.
void MatVec(const float* w, const float* x, size_t rows, size_t cols, float* out);

// out = weight * (x / sqrt(mean(x^2) + eps)), the Hugging Face RMSNorm. `out` may alias `x`.
void RmsNorm(const float* x, const float* weight, size_t n, float eps, float* out);

// inv_freq[i] = theta^(-2i / head_dim) for i in [0, head_dim / 2), in double.
std::vector<double> RopeInverseFrequencies(uint32_t head_dim, double theta);

// cos[i], sin[i] of position * inv_freq[i], for the inv_freq.size() rotary pairs.
void RopeCosSin(uint32_t position, const std::vector<double>& inv_freq, float* cos, float* sin);

// Rotate-half RoPE (Hugging Face convention) of one head in place, half = head_dim / 2:
//   x'[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   x'[i + half] = x[i + half] * cos[i] + x[i] * sin[i]
void ApplyRope(float* x, uint32_t head_dim, const float* cos, const float* sin);

// Per head of x ([num_heads, head_dim], in place): RmsNorm with `norm` (the q_norm / k_norm of
// Qwen attention), then ApplyRope over the head's first rotary_dim dims (the rest pass through).
void NormAndRotateHeads(float* x, size_t num_heads, uint32_t head_dim, const float* norm, float eps,
                        uint32_t rotary_dim, const float* cos, const float* sin);

// In-place softmax: x[i] = exp(x[i] - max) / sum_j exp(x[j] - max), summed in index order.
void Softmax(float* x, size_t n);

// Causal GQA attention of one token over `visible` positions, per q head h:
//   out[h] = sum_p softmax_p(Dot(q[h], keys[p][h / group]) * scale) * values[p][h / group]
// with group = heads / kv_heads, scale = float(1 / sqrt(double(head_dim))), the weighted sum in
// position order. q, out: [heads, head_dim]; keys, values: [visible, kv_heads, head_dim];
// scores: `visible` floats of scratch.
void AttendCausal(const float* q, const float* keys, const float* values, size_t visible,
                  size_t heads, size_t kv_heads, size_t head_dim, float* scores, float* out);

// x * sigmoid(x).
float Silu(float x);

// out[i] = Silu(gate[i]) * up[i]. `out` may alias either input.
void SwiGlu(const float* gate, const float* up, size_t n, float* out);

// Indices of the k largest values, largest first; equal values by lowest index. NaN sorts last.
// REQUIRES: k <= n.
std::vector<uint32_t> TopK(const float* x, size_t n, size_t k);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_OPS_H_
