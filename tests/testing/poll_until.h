// Waiting for a condition that a daemon reaches asynchronously.
#ifndef KVCACHE_TESTS_TESTING_POLL_UNTIL_H_
#define KVCACHE_TESTS_TESTING_POLL_UNTIL_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvcache::testing {

// Polls `done` until it holds; false after `within` (10 s unless told). For conditions the daemon
// reaches asynchronously (lease expiry, a stream's pins ending after its last message, a cancelled
// stream's cleanup after the client already has its status).
template <typename Predicate>
bool PollUntil(Predicate done, absl::Duration within = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + within;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_POLL_UNTIL_H_
