// FUZZ_CHECK: the fuzz targets' assertion. A broken invariant must stop libFuzzer with a crash it
// records (abort), and say what broke; GoogleTest's macros would only log and go on. And the
// check of a pool that every target makes.
//
// Thread safety: stateless; CheckPool is as thread-safe as Pool.
#ifndef KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_
#define KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "cache/pool.h"

#define FUZZ_CHECK(condition, ...)                                                            \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #condition); \
      std::fprintf(stderr, __VA_ARGS__);                                                      \
      std::fprintf(stderr, "\n");                                                             \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

#define FUZZ_CHECK_OK(expression)                                                   \
  do {                                                                              \
    const absl::Status fuzz_check_status = (expression);                            \
    FUZZ_CHECK(fuzz_check_status.ok(), "%s", fuzz_check_status.ToString().c_str()); \
  } while (0)

namespace kvcache {

// The pool's own invariants (Pool::CheckInvariants), its blocks all counted once (free +
// evictable + referenced = size), and its tenants' shares adding up to its figures. Each figure
// is read under its own lock: call it only when nothing else changes the pool.
inline void CheckPool(const Pool& pool) {
  FUZZ_CHECK_OK(pool.CheckInvariants());
  const PoolStatsSnapshot stats = pool.Stats();
  const char* const name = pool.options().name.c_str();
  FUZZ_CHECK(stats.free + stats.evictable + stats.referenced == pool.options().num_blocks,
             "%s: free %u + evictable %u + referenced %u != %u blocks", name, stats.free,
             stats.evictable, stats.referenced, pool.options().num_blocks);
  uint32_t referenced = 0, open = 0;
  for (const std::string& tenant : pool.Tenants()) {
    const PoolStatsSnapshot share = pool.Stats(tenant);
    referenced += share.referenced;
    open += share.open_sequences;
  }
  FUZZ_CHECK(referenced == stats.referenced && open == stats.open_sequences,
             "%s: tenants hold %u blocks and %u sequences, the pool %u and %u", name, referenced,
             open, stats.referenced, stats.open_sequences);
}

}  // namespace kvcache

#endif  // KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_
