// Rates measured side by side on a noisy machine: each op of a comparison run in interleaved
// slices, so every op sees the same noise, and ratios taken slice by slice. Shared by the benches
// that compare a path with its baseline (data_plane_bench, pages_bench). Bench-only code.
#ifndef KVCACHE_BENCH_INTERLEAVED_RATES_H_
#define KVCACHE_BENCH_INTERLEAVED_RATES_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "bench/bench_run.h"

namespace kvcache::bench {

// Runs `op` (returning the units it moved: bytes, or 1 per call; 0 on failure, which ends the
// bench) repeatedly for `seconds`; 1e9 units per second (GB/s for bytes).
inline double Bandwidth(double seconds, const std::function<uint64_t()>& op) {
  uint64_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto stop = start + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < stop) {
    const uint64_t moved = op();
    if (moved == 0) Fail("an operation failed (moved no bytes)");
    bytes += moved;
  }
  return bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         1e9;
}

// Every op in `ops` measured for `rounds` interleaved slices of `seconds / rounds` each: this
// machine is noisy, and interleaving exposes every op to the same noise.
class InterleavedRates {
 public:
  InterleavedRates(double seconds, int rounds, const std::vector<std::function<uint64_t()>>& ops)
      : samples_(ops.size()) {
    for (const auto& op : ops) op();  // warm up: connections, page tables, caches
    for (int round = 0; round < rounds; ++round) {
      for (size_t i = 0; i < ops.size(); ++i) {
        samples_[i].push_back(Bandwidth(seconds / rounds, ops[i]));
      }
    }
  }

  // Op `i`'s median rate, in Bandwidth's units.
  double Median(size_t i) const { return MedianOf(samples_[i]); }

  // The median over rounds of op `a`'s rate over op `b`'s in the same round: slices measured
  // side by side share the machine's state, so their ratio holds when the absolute rates drift
  // between rounds (Redis alone swings 2x from one second to the next here). 0 when b is 0.
  double Ratio(size_t a, size_t b) const {
    std::vector<double> ratios;
    for (size_t round = 0; round < samples_[a].size(); ++round) {
      if (samples_[b][round] == 0) return 0;
      ratios.push_back(samples_[a][round] / samples_[b][round]);
    }
    return MedianOf(std::move(ratios));
  }

 private:
  static double MedianOf(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  }

  std::vector<std::vector<double>> samples_;  // per op, per round
};

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_INTERLEAVED_RATES_H_
