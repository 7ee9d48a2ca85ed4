#!/usr/bin/env bash
# Builds everything and runs every test: unit, integration (daemon and clients as processes), the
# Python hash vectors and every bench's smoke run (label bench_smoke: figures ignored, errors not;
# only here, the other builds have no benches). Then the checks that keep the code honest:
# - every C++/CUDA file is formatted as .clang-format says;
# - clang builds every CPU target but the benchmarks with -Werror=thread-safety (the
#   ABSL_GUARDED_BY annotations),
#   with AddressSanitizer and UBSan, and every test runs again under them, the libFuzzer targets
#   (tests/fuzz, KVCACHE_FUZZ=ON) among them for a bounded number of inputs each.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA_PACKAGES="clang clang-format libclang-rt-14-dev" ./scripts/setup.sh

echo "== format: clang-format --dry-run -Werror"
git ls-files -z '*.cc' '*.h' '*.cu' | xargs -0 clang-format --dry-run -Werror

# More tests at once than cores: most of them wait on the processes they start (daemons, Redis,
# Python), and at -j2 the two cores were 29% busy (gcc's tests: 280 s at -j2, 147 s at -j4).
ctest --test-dir build --output-on-failure -j4 --timeout 300

echo "== clang: every CPU target with -Werror=thread-safety, every test under ASan + UBSan, fuzzing"
# libclang-rt-14-dev (above) holds libFuzzer and FuzzedDataProvider.h. Line tables are all the
# debug info sanitizer reports need (-g1). No benchmarks: nothing here runs them, and they hold no
# guarded fields for the thread-safety analysis (gcc's build above compiles them).
CLANG_ARGS="-DKVCACHE_SANITIZE=ON -DKVCACHE_FUZZ=ON -DKVCACHE_WITH_CUDA=OFF -DKVCACHE_BUILD_BENCH=OFF"
CLANG_ARGS+=" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1"
BUILD_DIR=build-clang CC=clang CXX=clang++ CMAKE_ARGS="$CLANG_ARGS" ./scripts/setup.sh
# malloc_tuning_test checks glibc's allocator, which ASan replaces (TuneMallocForBlockStreams then
# says false, as documented). A UBSan report fails its test instead of scrolling by. LeakSanitizer
# ignores only third-party leaks (scripts/lsan.supp).
# -j5: the three fuzz runs (started first, tests/fuzz/CMakeLists.txt) and two more beside them.
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp \
  ctest --test-dir build-clang --output-on-failure -j5 --timeout 300 -E '^malloc_tuning_test$'

echo "== clang: the core's concurrency tests under ThreadSanitizer (label tsan)"
# Only the gRPC-free core tests (Debian's gRPC is not TSan-built): BUILD_TARGETS builds just their
# binaries and -L tsan runs just them. Debian's absl::Mutex is made visible to TSan by
# tests/testing/tsan_absl_mutex.cc; scripts/tsan.supp says what little it cannot cover.
TSAN_TARGETS="concurrency_test cache_manager_test kv_event_log_test session_registry_test"
TSAN_TARGETS+=" disk_tier_test pool_tier_test disk_tier_sealed_test task_workers_test"
BUILD_DIR=build-tsan CC=clang CXX=clang++ \
  CMAKE_ARGS="-DKVCACHE_TSAN=ON -DKVCACHE_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo" \
  BUILD_TARGETS="$TSAN_TARGETS" ./scripts/setup.sh
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp" \
  ctest --test-dir build-tsan --output-on-failure -j2 --timeout 300 -L tsan
