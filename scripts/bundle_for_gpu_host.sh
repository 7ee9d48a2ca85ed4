#!/usr/bin/env bash
# Packs a built tree so its GPU tests and benchmarks run on a CUDA host that lacks this project's
# build dependencies (gRPC, protobuf, abseil): the executables with debug info stripped, the ctest
# files, the test checkpoints, and every shared library they load except the C runtime and CUDA's
# own (the host brings libcudart and NCCL). Paths inside stay absolute to the build folder, so on
# the host unpack it where the build lived (or link that path to the unpacked tree).
#
# When redis-server is installed here it comes along too, with its libraries apart from the
# project's (bundled-tools/), so data_plane_bench can compare with Redis on a host without it.
#
# Usage: scripts/bundle_for_gpu_host.sh [BUILD_DIR] [OUT_TAR]
# On the host: tar -xf OUT_TAR -C REPO_ROOT; scripts/run_on_gpu_host.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
out=${2:-.gpurun/bundle.tar.xz}
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT

mapfile -t executables < <(find "$build_dir" -type f -executable -not -path '*/CMakeFiles/*' \
  -not -name '*.so*' -not -name '*.sh')
for exe in "${executables[@]}"; do
  mkdir -p "$staging/$(dirname "$exe")"
  objcopy --strip-debug "$exe" "$staging/$exe"
done
find "$build_dir" -name CTestTestfile.cmake -not -path '*/CMakeFiles/*' | while read -r f; do
  mkdir -p "$staging/$(dirname "$f")" && cp "$f" "$staging/$f"
done
for dir in "$build_dir"/tiny_qwen3_moe* "$build_dir"/demo-checkpoint; do
  [[ -d $dir ]] && cp -r "$dir" "$staging/$build_dir/"
done

libs="$staging/$build_dir/bundled-libs"
mkdir -p "$libs"
ldd "${executables[@]}" 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libz|libcuda|libcudart|libnccl)\.so' |
  xargs -r cp -L -t "$libs"

redis=/usr/bin/redis-server
if [[ -x $redis ]]; then
  tools="$staging/$build_dir/bundled-tools"
  mkdir -p "$tools/redis"
  cp -L "$redis" "$tools/redis/redis-server"
  ldd "$redis" | awk '/=> \// {print $3}' |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so' |
    xargs -r cp -L -t "$tools/redis"
  cat > "$tools/redis-server" <<'WRAPPER'
#!/bin/sh
# redis-server with the libraries it was built against, kept off everyone else's library path.
here=$(dirname "$0")/redis
LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/redis-server" "$@"
WRAPPER
  chmod +x "$tools/redis-server"
fi

mkdir -p "$(dirname "$out")"
tar -C "$staging" -cJf "$out" .
ls -la "$out"
