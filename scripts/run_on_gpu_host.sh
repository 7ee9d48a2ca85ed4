#!/usr/bin/env bash
# Runs on the CUDA host, from the repository root where scripts/bundle_for_gpu_host.sh's bundle was
# unpacked (at the build's own path): the GPU tests, then the benchmarks that want a GPU or a
# bigger machine than CI's. Each part's output also lands in RESULTS_DIR/<part>.log.
#
# Usage: [MODES="tests kernels pages transport data_plane tiers sealed worker"] [RESULTS_DIR=dir] \
#          [PART_TIMEOUT=300] [DATA_PLANE_SECONDS=3] [DISK_BENCH_DIR=dir] \
#          scripts/run_on_gpu_host.sh [BUILD_DIR]
# DISK_BENCH_DIR (default BUILD_DIR/bench-disk) holds the disk benches' files: on a disk, not tmpfs.
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
results=${RESULTS_DIR:-$PWD/gpu-results}
mkdir -p "$results"

library_dir() { dirname "$(find /usr /opt -name "$1" 2>/dev/null | head -1)"; }
libraries="$PWD/$build_dir/bundled-libs:$(library_dir libnccl.so.2):$(library_dir libcudart.so.13)"
export LD_LIBRARY_PATH="$libraries${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVCACHE_BIN_DIR="$PWD/$build_dir/bin"
if [[ ! -x /usr/bin/redis-server && -x $build_dir/bundled-tools/redis-server ]]; then
  export KVCACHE_REDIS_SERVER="$PWD/$build_dir/bundled-tools/redis-server"
  export KVCACHE_REDIS_CLI="$PWD/$build_dir/bundled-tools/redis-cli"
fi

cd "$build_dir"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "$(nproc) cores"
status=0
run() {
  local part=$1
  shift
  echo "=== $part: $*"
  timeout "${PART_TIMEOUT:-300}" "$@" 2>&1 | tee "$results/$part.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
}
for mode in ${MODES:-tests kernels pages transport data_plane tiers sealed worker}; do
  case $mode in
    tests) run gpu_tests ctest -L gpu -j4 --timeout 200 --output-on-failure ;;
    kernels) run kernels_bench bin/kernels_bench ;;
    # The page calls through a device mapping (CUDA IPC) vs a device memcpy.
    pages) run device_pages_bench bin/device_pages_bench 2 ;;
    transport) run transport_bench bin/transport_bench 1 ;;
    data_plane) run data_plane_bench bin/data_plane_bench "${DATA_PLANE_SECONDS:-3}" ;;
    # Tier 2 loads into a CUDA pool vs cudaMemcpyAsync from the same page-locked memory.
    tiers) run tier_bench bin/tier_bench 1 device ;;
    # Sealed tiers vs unsealed (--tier_key_file), on the host's cores: the seal workers' share.
    sealed)
      disk_dir=${DISK_BENCH_DIR:-$PWD/bench-disk}
      mkdir -p "$disk_dir"
      run record_seal_bench bin/record_seal_bench
      run redis_cluster_bench_256k bin/redis_cluster_bench 262144 400 9
      run redis_cluster_bench_32k bin/redis_cluster_bench 32768 400 9
      run disk_tier_bench bin/disk_tier_bench "$disk_dir"
      run tier_bench_disk bin/tier_bench 1 disk "$disk_dir"
      rm -rf "$disk_dir" ;;
    # The Qwen3-MoE worker on a wider tiny checkpoint, then the hybrid (Qwen3-Next) over state pages.
    worker)
      python3 ../scripts/make_tiny_checkpoint.py wide --hidden 512 --moe_intermediate 512 \
        >/dev/null && run worker_cuda_bench bin/worker_cuda_bench wide 3 tiny_qwen3_next ;;
    *) echo "unknown part '$mode'" >&2; status=2 ;;
  esac
done
exit $status
