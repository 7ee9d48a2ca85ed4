#include "model/linear_attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "model/ops.h"

namespace kvcache::worker {
namespace {

// 1 / sqrt(sum_i x[i]^2 + eps), the sum in float in ascending index.
float InverseL2Norm(const float* x, uint32_t n) {
  float sum = 0;
  for (uint32_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return 1.0f / std::sqrt(sum + kL2NormEps);
}

// One token of one value head: the delta rule on state [key_dim, value_dim].
void DeltaRuleStep(const float* q, const float* k, const float* v, float decay, float beta,
                   uint32_t key_dim, uint32_t value_dim, float* state, float* out) {
  for (uint32_t j = 0; j < value_dim; ++j) {
    float kv_memory = 0;
    for (uint32_t i = 0; i < key_dim; ++i) {
      float& s = state[i * value_dim + j];
      s = s * decay;
      kv_memory += s * k[i];
    }
    const float delta = (v[j] - kv_memory) * beta;
    float o = 0;
    for (uint32_t i = 0; i < key_dim; ++i) {
      float& s = state[i * value_dim + j];
      s = s + k[i] * delta;
      o += s * q[i];
    }
    out[j] = o;
  }
}

}  // namespace

void CausalConv1dSilu(const float* input, const float* weight, uint32_t n, uint32_t channels,
                      uint32_t kernel, float* conv_state, float* out) {
  const uint32_t history = kernel - 1;
  for (uint32_t c = 0; c < channels; ++c) {
    const float* w = weight + size_t{c} * kernel;
    float* window = conv_state + size_t{c} * history;
    for (uint32_t t = 0; t < n; ++t) {
      const float x = input[size_t{t} * channels + c];
      float acc = 0;
      for (uint32_t j = 0; j < history; ++j) acc += w[j] * window[j];
      acc += w[history] * x;
      out[size_t{t} * channels + c] = Silu(acc);
      if (history > 0) {
        std::memmove(window, window + 1, (history - 1) * sizeof(float));
        window[history - 1] = x;
      }
    }
  }
}

float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void GatedDeltaRule(const LinearAttentionDims& dims, const float* qkv, const float* a,
                    const float* b, const float* a_log, const float* dt_bias, uint32_t n,
                    float* state, float* out) {
  const uint32_t hk = dims.key_head_dim;
  const uint32_t hv = dims.value_head_dim;
  const uint32_t group = dims.value_heads_per_key_head();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hk)));
  std::vector<float> q_normed(hk), k_normed(hk);
  for (uint32_t t = 0; t < n; ++t) {
    const float* q = qkv + size_t{t} * dims.conv_dim();
    const float* k = q + dims.key_dim();
    const float* v = k + dims.key_dim();
    for (uint32_t h = 0; h < dims.num_value_heads; ++h) {
      const size_t key_offset = size_t{h / group} * hk;
      const float q_inv = InverseL2Norm(q + key_offset, hk);
      const float k_inv = InverseL2Norm(k + key_offset, hk);
      for (uint32_t i = 0; i < hk; ++i) {
        q_normed[i] = (q[key_offset + i] * q_inv) * scale;
        k_normed[i] = k[key_offset + i] * k_inv;
      }
      const size_t gate = size_t{t} * dims.num_value_heads + h;
      const float beta = Sigmoid(b[gate]);
      const float g = -std::exp(a_log[h]) * Softplus(a[gate] + dt_bias[h]);
      DeltaRuleStep(q_normed.data(), k_normed.data(), v + size_t{h} * hv, std::exp(g), beta, hk, hv,
                    state + size_t{h} * hk * hv, out + gate * hv);
    }
  }
}

}  // namespace kvcache::worker
