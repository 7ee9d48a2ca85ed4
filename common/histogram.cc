#include "common/histogram.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace kvcache {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      buckets_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  assert(!upper_bounds_.empty() && std::is_sorted(upper_bounds_.begin(), upper_bounds_.end()));
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  // Prometheus buckets are "less than or equal": the first bound >= value.
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot snapshot;
  snapshot.upper_bounds = upper_bounds_;
  snapshot.cumulative_counts.reserve(upper_bounds_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts.push_back(running);
  }
  // The +Inf bucket is the count; keep it no smaller than the finite buckets it contains.
  snapshot.count =
      std::max(running + buckets_[upper_bounds_.size()].load(std::memory_order_relaxed),
               count_.load(std::memory_order_relaxed));
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

MillisecondHistogram::MillisecondHistogram(const std::vector<double>& upper_bounds_seconds)
    : buckets_(upper_bounds_seconds.size() + 1, 0) {
  assert(!upper_bounds_seconds.empty() &&
         std::is_sorted(upper_bounds_seconds.begin(), upper_bounds_seconds.end()));
  upper_bounds_ms_.reserve(upper_bounds_seconds.size());
  for (double bound : upper_bounds_seconds) {
    upper_bounds_ms_.push_back(static_cast<uint32_t>(std::llround(bound * 1000)));
  }
}

HistogramSnapshot MillisecondHistogram::Snapshot() const {
  HistogramSnapshot snapshot;
  snapshot.upper_bounds.reserve(upper_bounds_ms_.size());
  snapshot.cumulative_counts.reserve(upper_bounds_ms_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < upper_bounds_ms_.size(); ++i) {
    snapshot.upper_bounds.push_back(upper_bounds_ms_[i] / 1000.0);
    running += buckets_[i];
    snapshot.cumulative_counts.push_back(running);
  }
  snapshot.count = running + buckets_.back();
  snapshot.sum = sum_ms_ / 1000.0;
  return snapshot;
}

const std::vector<double>& ResidencyBucketsSeconds() {
  static const std::vector<double> buckets = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
                                              0.2,   0.5,   1,     2,    5,    10,   20,
                                              30,    60,    120,   300,  600,  1200, 1800};
  return buckets;
}

const std::vector<double>& LatencyBucketsSeconds() {
  static const std::vector<double> buckets = {0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                              0.0025,   0.005,   0.01,   0.025,   0.05,   0.1,
                                              0.25,     0.5,     1,      2.5,     5,      10};
  return buckets;
}

}  // namespace kvcache
