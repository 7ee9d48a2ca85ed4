// The hybrid worker's reuse scenarios, written once and run on each backend: on the CPU over a
// host pool (hybrid_worker_process_test.cc) and on the GPU over a device pool
// (hybrid_worker_gpu_process_test.cc). Each step is a new kvcache-worker process on a fresh
// daemon's hybrid pool of 16-token pages; `expect_cold(prompt, cached, extra_flags)` runs one with
// `extra_flags` and expects `cached` prompt tokens from the cache and the tokens and logits of its
// backend's cold run.
//
// Thread safety: thread-compatible.
#ifndef KVCACHE_TESTS_INTEGRATION_HYBRID_WORKER_CASES_H_
#define KVCACHE_TESTS_INTEGRATION_HYBRID_WORKER_CASES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"

namespace kvcache::testing {

using ExpectColdRun = absl::FunctionRef<void(const std::vector<uint32_t>& prompt, uint32_t cached,
                                             const std::vector<std::string>& extra_flags)>;

// A deterministic prompt of `length` byte-sized tokens.
inline std::vector<uint32_t> HybridPrompt(uint32_t seed, size_t length) {
  std::vector<uint32_t> tokens(length);
  for (size_t i = 0; i < length; ++i) tokens[i] = (seed * 131 + i * 7 + (i * i) % 13) % 256;
  return tokens;
}

// 0, 50 and 90% cached, each run a new worker process reusing what the ones before committed.
inline void ReuseAtZeroFiftyAndNinetyPercent(ExpectColdRun expect_cold) {
  const std::vector<uint32_t> prompt = HybridPrompt(1, 160);  // 10 pages
  expect_cold(std::vector<uint32_t>(prompt.begin(), prompt.begin() + 80), 0, {});
  expect_cold(prompt, 80, {});
  std::vector<uint32_t> other(prompt.begin(), prompt.begin() + 144);
  other.resize(160, 9);
  expect_cold(other, 144, {});
}

// A worker saving the state every 4th page leaves pages without it: the next process's hit ends
// at the last page that holds one.
inline void AnEndpointWithoutItsStateIsNotAHit(ExpectColdRun expect_cold) {
  const std::vector<uint32_t> prompt = HybridPrompt(2, 98);  // 6 full pages
  expect_cold(prompt, 0, {"--state_every_pages=4"});
  expect_cold(prompt, 64, {});  // page 3 holds a state, pages 4 and 5 do not
  expect_cold(prompt, 96, {});  // the every-page worker saved them
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_HYBRID_WORKER_CASES_H_
