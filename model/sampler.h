// Sampler: picks the next token from a logits vector. Greedy (temperature 0) is argmax with the
// lowest index winning ties. Otherwise logits are divided by the temperature, restricted to the
// top_k largest (0 = all; ties by lowest index), soft-maxed in double, and one token is drawn with
// std::mt19937_64 seeded with `seed`; the uniform draw is (rng() >> 11) * 2^-53, so the same seed
// and logits give the same tokens on every platform.
// Thread-safety: thread-compatible (the random state advances on every Sample()).
#ifndef KVCACHE_MODEL_SAMPLER_H_
#define KVCACHE_MODEL_SAMPLER_H_

#include <cstdint>
#include <random>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvcache::worker {

struct SamplerOptions {
  float temperature = 0.0f;  // 0 = greedy
  uint32_t top_k = 0;        // 0 = no limit
  uint64_t seed = 0;
};

class Sampler {
 public:
  // INVALID_ARGUMENT for a negative or non-finite temperature.
  static absl::StatusOr<Sampler> Create(const SamplerOptions& options);
  static Sampler Greedy() { return Sampler(SamplerOptions{}); }

  // INVALID_ARGUMENT for empty logits, or when no logit is a number (all NaN).
  absl::StatusOr<uint32_t> Sample(absl::Span<const float> logits);

  const SamplerOptions& options() const { return options_; }

 private:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

  SamplerOptions options_;
  std::mt19937_64 rng_;
};

// Index of the largest logit, lowest index on ties; NaN never wins. REQUIRES: non-empty.
uint32_t Argmax(absl::Span<const float> logits);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_SAMPLER_H_
