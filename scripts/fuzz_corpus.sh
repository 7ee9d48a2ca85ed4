#!/usr/bin/env bash
# Regenerates the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): runs each target for
# FUZZ_SECONDS (default 300) from its committed corpus, then keeps the smallest set of inputs that
# covers what all of them cover (libFuzzer's -merge=1), each input at most the -max_len its CTest
# run uses (tests/fuzz/CMakeLists.txt). Needs
# the clang fuzz build (scripts/test.sh makes it: build-clang with -DKVCACHE_FUZZ=ON).
#   scripts/fuzz_corpus.sh [target...]    # default: every target under tests/fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-clang}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-300}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for source in tests/fuzz/*_fuzzer.cc; do targets+=("$(basename "$source" .cc)"); done
fi
export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp
for target in "${targets[@]}"; do
  binary=$BUILD_DIR/tests/fuzz/$target
  case $target in
    cache_manager_fuzzer) MAX_LEN=64 ;;
    *) MAX_LEN=1024 ;;
  esac
  corpus=tests/fuzz/corpus/$target
  scratch=$(mktemp -d)
  mkdir -p "$corpus"
  cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target "$target"
  echo "== $target: fuzzing ${SECONDS_PER_TARGET}s"
  "$binary" -max_len="$MAX_LEN" -max_total_time="$SECONDS_PER_TARGET" -detect_leaks=0 \
    "$scratch" "$corpus" 2>&1 | tail -3
  merged=$(mktemp -d)
  "$binary" -merge=1 -max_len="$MAX_LEN" -detect_leaks=0 "$merged" "$corpus" "$scratch" 2>&1 | tail -1
  rm -rf "$corpus" && mv "$merged" "$corpus" && chmod 755 "$corpus"
  rm -rf "$scratch"
  echo "$target: $(ls "$corpus" | wc -l) inputs, $(du -sb "$corpus" | cut -f1) bytes"
done
