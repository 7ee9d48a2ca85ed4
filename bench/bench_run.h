// What every benchmark shares so that it cannot rot unseen: it stops at its first error with
// exit status 1 and says why (a figure computed over failed calls is no figure), it exits with
// kSkipped where it cannot run (no GPU), and it has a smoke mode, KVCACHE_BENCH_SMOKE=1, in
// which it runs at small sizes for a fraction of a second. CI runs every bench that way (CTest
// label bench_smoke, bench/CMakeLists.txt), its figures ignored. Bench-only code.
#ifndef KVCACHE_BENCH_BENCH_RUN_H_
#define KVCACHE_BENCH_BENCH_RUN_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache::bench {

// The exit status of a bench that cannot run on this machine: CTest's SKIP_RETURN_CODE, so a
// skip is reported as skipped, never as passed.
inline constexpr int kSkipped = 77;

// True when KVCACHE_BENCH_SMOKE is set (and not "0"): CI's smoke run.
inline bool SmokeRun() {
  const char* smoke = std::getenv("KVCACHE_BENCH_SMOKE");
  return smoke != nullptr && *smoke != '\0' && std::strcmp(smoke, "0") != 0;
}

// `full` in a measuring run, `smoke` in a smoke run.
template <typename T>
T FullOrSmoke(T full, T smoke) {
  return SmokeRun() ? smoke : full;
}

// Prints "ERROR: <what>[: <status>]" and exits 1 at once. _Exit: other threads (gRPC's, a
// daemon's) may still run; child processes die with this one (SpawnTiedProcess).
[[noreturn]] inline void Fail(absl::string_view what, const absl::Status& status = {}) {
  std::fflush(stdout);
  std::fprintf(stderr, "ERROR: %.*s%s%s\n", static_cast<int>(what.size()), what.data(),
               status.ok() ? "" : ": ", status.ok() ? "" : status.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

inline void CheckOk(const absl::Status& status, absl::string_view what) {
  if (!status.ok()) Fail(what, status);
}

template <typename T>
T ValueOrFail(absl::StatusOr<T> value, absl::string_view what) {
  if (!value.ok()) Fail(what, value.status());
  return *std::move(value);
}

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_BENCH_RUN_H_
