// Deterministic random floats for numeric tests (the same on every machine for a seed).
// Thread-safety: pure function.
#ifndef KVCACHE_TESTS_TESTING_RANDOM_FLOATS_H_
#define KVCACHE_TESTS_TESTING_RANDOM_FLOATS_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kvcache::testing {

// `count` draws of N(0, scale^2) from std::mt19937(seed).
inline std::vector<float> RandomNormals(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_RANDOM_FLOATS_H_
