// FakeClock: simulated time for lease expiry tests. Thread-safe.
#ifndef KVCACHE_TESTS_TESTING_FAKE_CLOCK_H_
#define KVCACHE_TESTS_TESTING_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace kvcache::testing {

class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration by) {
    absl::MutexLock lock(&mu_);
    now_ += by;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'000'000);
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_FAKE_CLOCK_H_
