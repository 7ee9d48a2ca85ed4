// FUZZ_CHECK: the fuzz targets' assertion. A broken invariant must stop libFuzzer with a crash it
// records (abort), and say what broke; GoogleTest's macros would only log and go on.
//
// Thread safety: stateless.
#ifndef KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_
#define KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

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

#endif  // KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_
