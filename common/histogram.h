// Histogram: a fixed-bucket distribution recorded from many threads without a lock, read by a
// metrics scrape (server/metrics.h) as Prometheus reads it: cumulative counts per upper bound,
// the count and the sum. The core records into it without knowing about Prometheus.
//
// Thread safety: thread-safe. Observe is a few relaxed atomic adds; a Snapshot taken while
// others observe may show a sample in `count` but not yet in its bucket (or the reverse), which
// a scrape tolerates; it never loses one.
#ifndef KVCACHE_COMMON_HISTOGRAM_H_
#define KVCACHE_COMMON_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvcache {

struct HistogramSnapshot {
  std::vector<double> upper_bounds;         // ascending; +Inf is implied after the last
  std::vector<uint64_t> cumulative_counts;  // per bound, samples <= it
  uint64_t count = 0;                       // every sample, the +Inf bucket
  double sum = 0;
};

class Histogram {
 public:
  // REQUIRES: `upper_bounds` ascending and not empty.
  explicit Histogram(std::vector<double> upper_bounds);

  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);
  HistogramSnapshot Snapshot() const;

 private:
  const std::vector<double> upper_bounds_;
  // One per bound plus the +Inf overflow, not cumulative.
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// A histogram of whole milliseconds for a caller that already holds a lock: Observe is a short
// scan of integer bounds and two adds, no atomics and no floating point, so the core can take a
// sample per block (Pool's residency histograms) at no measurable cost. Snapshot reports seconds,
// as Histogram does.
//
// Thread safety: none; the owner serializes Observe and Snapshot.
class MillisecondHistogram {
 public:
  // REQUIRES: `upper_bounds_seconds` ascending, not empty, each a whole number of milliseconds.
  explicit MillisecondHistogram(const std::vector<double>& upper_bounds_seconds);

  void Observe(uint32_t milliseconds) {
    size_t bucket = 0;
    while (bucket < upper_bounds_ms_.size() && milliseconds > upper_bounds_ms_[bucket]) ++bucket;
    ++buckets_[bucket];
    sum_ms_ += milliseconds;
  }
  HistogramSnapshot Snapshot() const;

 private:
  std::vector<uint32_t> upper_bounds_ms_;
  std::vector<uint64_t> buckets_;  // one per bound plus the +Inf overflow, not cumulative
  uint64_t sum_ms_ = 0;
};

// vLLM's buckets for its KV-block residency histograms (vllm:kv_block_lifetime_seconds and
// friends), 1 ms to 30 min, so dashboards compare the two directly.
const std::vector<double>& ResidencyBucketsSeconds();
// RPC latency, 25 us to 10 s.
const std::vector<double>& LatencyBucketsSeconds();

}  // namespace kvcache

#endif  // KVCACHE_COMMON_HISTOGRAM_H_
