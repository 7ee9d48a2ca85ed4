#include "model/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvcache::worker {

float Dot(const float* a, const float* b, size_t n) {
  constexpr size_t kLanes = 8;
  float lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] += a[i + j] * b[i + j];
  }
  for (size_t j = 0; i < n; ++i, ++j) lane[j] += a[i] * b[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

void MatVec(const float* w, const float* x, size_t rows, size_t cols, float* out) {
  for (size_t r = 0; r < rows; ++r) out[r] = Dot(w + r * cols, x, cols);
}

void RmsNorm(const float* x, const float* weight, size_t n, float eps, float* out) {
  double sum_squares = 0;
  for (size_t i = 0; i < n; ++i) sum_squares += static_cast<double>(x[i]) * x[i];
  const float inv_rms =
      static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(n) + eps));
  for (size_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv_rms);
}

std::vector<double> RopeInverseFrequencies(uint32_t head_dim, double theta) {
  std::vector<double> inv_freq(head_dim / 2);
  for (uint32_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / head_dim);
  }
  return inv_freq;
}

void RopeCosSin(uint32_t position, const std::vector<double>& inv_freq, float* cos, float* sin) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
  }
}

void ApplyRope(float* x, uint32_t head_dim, const float* cos, const float* sin) {
  const uint32_t half = head_dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    const float lo = x[i];
    const float hi = x[i + half];
    x[i] = lo * cos[i] - hi * sin[i];
    x[i + half] = hi * cos[i] + lo * sin[i];
  }
}

void NormAndRotateHeads(float* x, size_t num_heads, uint32_t head_dim, const float* norm, float eps,
                        uint32_t rotary_dim, const float* cos, const float* sin) {
  for (size_t h = 0; h < num_heads; ++h) {
    float* head = x + h * head_dim;
    RmsNorm(head, norm, head_dim, eps, head);
    ApplyRope(head, rotary_dim, cos, sin);
  }
}

void Softmax(float* x, size_t n) {
  if (n == 0) return;
  float max_value = x[0];
  for (size_t i = 1; i < n; ++i) max_value = std::max(max_value, x[i]);
  float sum = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += x[i];
  }
  for (size_t i = 0; i < n; ++i) x[i] /= sum;
}

void AttendCausal(const float* q, const float* keys, const float* values, size_t visible,
                  size_t heads, size_t kv_heads, size_t head_dim, float* scores, float* out) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const size_t group = heads / kv_heads;
  const size_t kv_dim = kv_heads * head_dim;
  for (size_t h = 0; h < heads; ++h) {
    const float* q_head = q + h * head_dim;
    const size_t kv_offset = (h / group) * head_dim;
    for (size_t p = 0; p < visible; ++p) {
      scores[p] = Dot(q_head, &keys[p * kv_dim + kv_offset], head_dim) * scale;
    }
    Softmax(scores, visible);
    float* out_head = out + h * head_dim;
    std::fill(out_head, out_head + head_dim, 0.0f);
    for (size_t p = 0; p < visible; ++p) {
      const float* value = &values[p * kv_dim + kv_offset];
      for (size_t d = 0; d < head_dim; ++d) out_head[d] += scores[p] * value[d];
    }
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

void SwiGlu(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

std::vector<uint32_t> TopK(const float* x, size_t n, size_t k) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  const auto before = [x](uint32_t a, uint32_t b) {
    const bool a_nan = std::isnan(x[a]);
    const bool b_nan = std::isnan(x[b]);
    if (a_nan != b_nan) return b_nan;
    if (!a_nan && x[a] != x[b]) return x[a] > x[b];
    return a < b;
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    before);
  order.resize(k);
  return order;
}

}  // namespace kvcache::worker
