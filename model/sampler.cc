#include "model/sampler.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/ops.h"

namespace kvcache::worker {

uint32_t Argmax(absl::Span<const float> logits) {
  uint32_t best = 0;
  bool found = false;
  for (uint32_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > logits[best]) {
      best = i;
      found = true;
    }
  }
  return best;
}

absl::StatusOr<Sampler> Sampler::Create(const SamplerOptions& options) {
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be finite and >= 0, got ", options.temperature));
  }
  return Sampler(options);
}

absl::StatusOr<uint32_t> Sampler::Sample(absl::Span<const float> logits) {
  if (logits.empty()) return absl::InvalidArgumentError("cannot sample from empty logits");
  bool any_number = false;
  for (float value : logits) any_number |= !std::isnan(value);
  if (!any_number) return absl::InvalidArgumentError("every logit is NaN");
  if (options_.temperature == 0.0f) return Argmax(logits);

  const size_t k =
      options_.top_k == 0 ? logits.size() : std::min<size_t>(options_.top_k, logits.size());
  const std::vector<uint32_t> candidates = TopK(logits.data(), logits.size(), k);
  if (std::isinf(logits[candidates[0]])) return candidates[0];  // +inf: certain
  // candidates[0] is the largest logit and a number; NaN candidates get probability 0.
  const double max_scaled = static_cast<double>(logits[candidates[0]]) / options_.temperature;
  std::vector<double> weights(candidates.size());
  double total = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const float logit = logits[candidates[i]];
    weights[i] = std::isnan(logit)
                     ? 0.0
                     : std::exp(static_cast<double>(logit) / options_.temperature - max_scaled);
    total += weights[i];
  }
  const double uniform = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double threshold = uniform * total;
  size_t last_possible = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (weights[i] <= 0) continue;
    if (threshold < weights[i]) return candidates[i];
    threshold -= weights[i];
    last_possible = i;
  }
  return candidates[last_possible];  // rounding carried the draw past the end
}

}  // namespace kvcache::worker
