#!/usr/bin/env bash
# Soak with kills for as long as asked: 32 kvcache-soak-client processes of two tenants against
# a real kvcache-manager, SIGKILLed, SIGSTOPped and restarted at random for SECONDS (default 60),
# then the leak and checksum checks of tests/integration/soak_process_test.cc. Prints ops/s,
# p50/p99 per call, the signal counts, leaked blocks and checksum failures; exits non-zero when a
# check fails. KVCACHE_SOAK_SEED picks another random run (default 1).
#   scripts/soak.sh 600
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
BUILD_TARGETS="kvcache-manager kvcache-soak-client soak_process_test" ./scripts/setup.sh
KVCACHE_SOAK_SECONDS=$seconds KVCACHE_BIN_DIR=$PWD/build/bin \
  ./build/tests/integration/soak_process_test
