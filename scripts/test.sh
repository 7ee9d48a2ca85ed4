#!/usr/bin/env bash
# Builds everything and runs every test: unit, integration (daemon and clients as processes) and
# the Python hash vectors; then the core's unit tests again under AddressSanitizer and UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

ctest --test-dir build --output-on-failure -j2 --timeout 300

echo "== sanitizers: core, kernel and data-plane unit tests under ASan + UBSan"
SANITIZED_TESTS="grpc_tuning_test streaming_copy_test bytes_field_split_test block_checksum_test block_pool_test prefix_cache_test cache_manager_test pool_spec_test block_hash_test pool_layout_test block_copy_test block_streams_test mapped_pool_test client_block_transfer_test unix_listener_test spawn_process_test"
BUILD_DIR=build-asan BUILD_TARGETS="$SANITIZED_TESTS" \
  CMAKE_ARGS="-DKVCACHE_SANITIZE=ON -DKVCACHE_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug" \
  ./scripts/setup.sh
ctest --test-dir build-asan --output-on-failure -j2 \
  -R "^($(echo "$SANITIZED_TESTS" | tr ' ' '|'))\$"
