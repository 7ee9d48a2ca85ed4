// What a kvcache-soak-client process measured, as it prints it at exit and as the soak driver
// (soak_process_test.cc) reads and merges it: per call, how often it succeeded, how often it
// ended with each expected kind of error, and a latency histogram of its successes; and counters
// of the data checks. A SIGKILLed client prints nothing; the driver merges what the others print.
//
// The histogram has log-scale buckets (8 per power of two of microseconds, so a percentile is
// within 9% of the true value): fixed-size, mergeable across processes, and a line of text.
//
// Thread safety: thread-compatible (one client thread records; the driver merges on one thread).
#ifndef KVCACHE_TESTS_INTEGRATION_SOAK_STATS_H_
#define KVCACHE_TESTS_INTEGRATION_SOAK_STATS_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvcache::testing {

class LatencyHistogram {
 public:
  static constexpr int kBucketsPerOctave = 8;
  static constexpr int kNumBuckets = kBucketsPerOctave * 34;  // up to 2^34 us (~4.8 h)

  void Record(absl::Duration latency);
  void Merge(const LatencyHistogram& other);
  uint64_t count() const { return count_; }
  // The upper bound, in microseconds, of the bucket holding the q-quantile (0 < q <= 1) of the
  // samples; 0 with no samples.
  double PercentileMicros(double q) const;

  // "index:count,index:count" over the non-empty buckets ("" when empty).
  std::string ToString() const;
  static std::optional<LatencyHistogram> Parse(absl::string_view text);

 private:
  std::array<uint64_t, kNumBuckets> buckets_{};
  uint64_t count_ = 0;
};

// One call's figures.
struct CallStats {
  uint64_t ok = 0;
  uint64_t exhausted = 0;    // RESOURCE_EXHAUSTED: the pool or a tenant quota is full
  uint64_t lost = 0;         // ABORTED / FAILED_PRECONDITION: the lease ended under the call
  uint64_t timeout = 0;      // DEADLINE_EXCEEDED / UNAVAILABLE: the daemon did not answer in time
  uint64_t unexpected = 0;   // anything else: a defect
  LatencyHistogram latency;  // of the successes

  // Files `status` under its kind; `latency` counts only for OK.
  void Count(const absl::Status& status, absl::Duration latency);
  void Merge(const CallStats& other);
};

struct SoakStats {
  std::map<std::string, CallStats> calls;  // by call name
  uint64_t verified_blocks = 0;            // blocks read back and compared with their pattern
  uint64_t checksum_failures = 0;          // of those, mismatches the client's lease cannot excuse
  uint64_t stale_reads = 0;  // mismatches read through the mapping after the lease ended
  uint64_t sessions = 0;     // sessions opened (the first and every reopen)

  void Merge(const SoakStats& other);
  uint64_t TotalOk() const;
  uint64_t TotalUnexpected() const;

  // The lines a client prints: "soak-call NAME ok=.. exhausted=.. lost=.. timeout=..
  // unexpected=.. hist=..", one per call, then "soak-counters verified_blocks=.. ...".
  std::string ToLines() const;
  // Adds one printed line to these stats; false for a line it cannot read.
  bool ParseLine(absl::string_view line);
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_SOAK_STATS_H_
