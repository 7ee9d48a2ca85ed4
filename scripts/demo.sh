#!/usr/bin/env bash
# The main job: builds, starts kvcache-manager with its embedded default (one host-memory pool on
# a Unix socket in a fresh temp dir), runs the demo client that shows a prefix hit, and stops the
# daemon with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

run_dir=$(mktemp -d /tmp/kvcache-demo-XXXXXX)
socket="unix://$run_dir/kv.sock"
./build/bin/kvcache-manager --listen "$socket" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$run_dir"' EXIT

./build/bin/kvcache-demo --target "$socket"
