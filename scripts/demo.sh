#!/usr/bin/env bash
# The main job: builds, starts kvcache-manager with its embedded default pool plus a pool laid out
# for the tiny test model, on a Unix socket in a fresh temp dir; runs the demo client (a prefix
# hit at the API level), then two MoE workers as separate processes: the first holds a 3-turn
# conversation (each turn hits its own history), the second asks the first prompt again and
# gets it from the cache. Then a hybrid turn (issue 34): the tiny Qwen3-Next, whose pages hold the
# full-attention KV and the linear-attention state together, asked twice by two processes — the
# second restores KV and state from the cache. Every turn is checked against a cold in-process
# run, bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs; ./scripts/test.sh builds the rest.
BUILD_TARGETS="kvcache-manager kvcache-demo kvcache-worker" ./scripts/setup.sh

checkpoint=build/demo-checkpoint
[ -f "$checkpoint/model.safetensors" ] || /usr/bin/python3 scripts/make_tiny_checkpoint.py "$checkpoint"
hybrid_checkpoint=build/demo-hybrid-checkpoint
[ -f "$hybrid_checkpoint/model.safetensors" ] ||
  /usr/bin/python3 scripts/make_tiny_checkpoint.py "$hybrid_checkpoint" --variant hybrid
# The hybrid's pool: pages of [kv | state] (DESIGN §5): 1 full-attention layer's KV (2 KiB a page)
# and the 3 linear-attention layers' state (16896 bytes, padded to 9 more layer-blocks).
hybrid_pool=next:model=tiny-qwen3-next:layers=10:kv_heads=2:head_dim=16:block_size=16:dtype=bf16
hybrid_pool+=:parts=kv/2048+state/18432/trailing1:blocks=256

run_dir=$(mktemp -d /tmp/kvcache-demo-XXXXXX)
socket="unix://$run_dir/kv.sock"
./build/bin/kvcache-manager --listen "$socket" \
  --pool default,qwen:model=tiny-qwen3-moe:layers=3:kv_heads=2:head_dim=16:block_size=16:dtype=bf16:blocks=512,"$hybrid_pool" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$run_dir"' EXIT

./build/bin/kvcache-demo --target "$socket"

prompt="You are a helpful assistant. Explain how a paged KV cache lets two requests share a prefix."
echo
echo "== worker 1: a 3-turn conversation"
./build/bin/kvcache-worker --target "$socket" --pool qwen --checkpoint "$checkpoint" \
  --prompt "$prompt" --max_new_tokens 24 --turns 3 --check_cold | grep -v '^result'
echo "== worker 2 (another process): the first prompt again"
./build/bin/kvcache-worker --target "$socket" --pool qwen --checkpoint "$checkpoint" \
  --prompt "$prompt" --max_new_tokens 24 --check_cold | grep -v '^result'
echo "== hybrid worker (Qwen3-Next: linear-attention state + KV in each page)"
./build/bin/kvcache-worker --target "$socket" --pool next --checkpoint "$hybrid_checkpoint" \
  --prompt "$prompt" --max_new_tokens 24 --check_cold | grep -v '^result'
echo "== hybrid worker 2 (another process): KV and state restored from the cache"
./build/bin/kvcache-worker --target "$socket" --pool next --checkpoint "$hybrid_checkpoint" \
  --prompt "$prompt" --max_new_tokens 24 --check_cold | grep -v '^result'
