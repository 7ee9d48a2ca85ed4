// Time source injected into everything that expires (session leases), so tests run on simulated
// time. Thread-safe.
#ifndef KVCACHE_COMMON_CLOCK_H_
#define KVCACHE_COMMON_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvcache {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  static Clock* Get() {
    static RealClock clock;
    return &clock;
  }
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_CLOCK_H_
