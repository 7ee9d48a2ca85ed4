#!/usr/bin/env bash
# Packs a built tree so its GPU tests and benchmarks run on a CUDA host that lacks this project's
# build dependencies (gRPC, protobuf, abseil): the executables with debug info stripped, the ctest
# files, the test checkpoints, and every shared library they load except the C runtime and CUDA's
# own (the host brings libcudart and NCCL). Paths inside stay absolute to the build folder, so on
# the host unpack it where the build lived (or link that path to the unpacked tree).
#
# When redis-server and redis-cli are installed here they come along too, with their libraries
# apart from the project's (bundled-tools/), so data_plane_bench can compare with Redis and the
# cluster tier's tests can start a Redis Cluster on a host without them.
#
# Usage: scripts/bundle_for_gpu_host.sh [BUILD_DIR] [OUT_TAR]
# On the host: tar -xf OUT_TAR -C REPO_ROOT; scripts/run_on_gpu_host.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
out=${2:-.gpurun/bundle.tar.xz}
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT

# ELF files only: the build folder also holds scripts and the image test's root file system.
is_elf() { [[ $(head -c4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }
executables=()
while read -r file; do
  is_elf "$file" && executables+=("$file")
done < <(find "$build_dir" -type f -executable -not -path '*/CMakeFiles/*' \
  -not -path '*/deploy-rootfs/*' -not -path '*/kubernetes-client/*' -not -path '*/install/work/*' \
  -not -name '*.so*')
for exe in "${executables[@]}"; do
  mkdir -p "$staging/$(dirname "$exe")"
  objcopy --strip-debug "$exe" "$staging/$exe"
done
find "$build_dir" -name CTestTestfile.cmake -not -path '*/CMakeFiles/*' | while read -r f; do
  mkdir -p "$staging/$(dirname "$f")" && cp "$f" "$staging/$f"
done
for dir in "$build_dir"/tiny_* "$build_dir"/demo-checkpoint; do
  [[ -d $dir ]] && cp -r "$dir" "$staging/$build_dir/"
done

libs="$staging/$build_dir/bundled-libs"
mkdir -p "$libs"
# ldd fails on a static executable; the others' libraries still count.
{ ldd "${executables[@]}" 2>/dev/null || true; } | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libz|libcuda|libcudart|libnccl)\.so' |
  xargs -r cp -L -t "$libs"

# Each runs through a wrapper that sets its own library path, kept off everyone else's.
if [[ -x /usr/bin/redis-server && -x /usr/bin/redis-cli ]]; then
  tools="$staging/$build_dir/bundled-tools"
  mkdir -p "$tools/redis"
  for tool in redis-server redis-cli; do
    cp -L "/usr/bin/$tool" "$tools/redis/$tool"
    ldd "/usr/bin/$tool" | awk '/=> \// {print $3}' |
      grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so' |
      xargs -r cp -L -t "$tools/redis"
    cat > "$tools/$tool" <<WRAPPER
#!/bin/sh
here=\$(dirname "\$0")/redis
LD_LIBRARY_PATH="\$here\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/$tool" "\$@"
WRAPPER
    chmod +x "$tools/$tool"
  done
fi

mkdir -p "$(dirname "$out")"
tar -C "$staging" -cJf "$out" .
ls -la "$out"
