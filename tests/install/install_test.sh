#!/usr/bin/env bash
# The installed product, as another service uses it: `cmake --install` of this build into a fresh
# prefix; a consumer project (tests/install/consumer) configured with find_package(kvcache 0.1)
# against that prefix alone and linked with kvcache::client; the installed kvcache-manager started
# on a Unix socket; the installed kvcachectl waits for it; the consumer pings it, describes its
# pool, opens, commits and looks up a sequence, and its output must match the pool the daemon was
# started with. The consumer build reuses the installed libraries: one small file compiles.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR CXX_COMPILER [COMPILER_LAUNCHER]
set -euo pipefail
build_dir=$1 source_dir=$2 work_dir=$3 cxx=$4 launcher=${5:-}

rm -rf "$work_dir"
mkdir -p "$work_dir"
prefix=$work_dir/prefix
cmake --install "$build_dir" --prefix "$prefix" >"$work_dir/install.log"
for installed in bin/kvcache-manager bin/kvcachectl bin/kvcache-worker bin/kvcache-pd \
                 lib/cmake/kvcache/kvcacheConfig.cmake lib/cmake/kvcache/kvcacheConfigVersion.cmake \
                 include/kvcache/client/kv_cache_client.h include/kvcache/kvcache/v1/kvcache.pb.h; do
  [ -e "$prefix/$installed" ] || { echo "FAIL: not installed: $installed"; exit 1; }
done

# Only the prefix: CMAKE_FIND_USE_PACKAGE_REGISTRY off and no path into the build tree, so the
# package can only come from the install.
cmake -S "$source_dir/tests/install/consumer" -B "$work_dir/consumer" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"} \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  >"$work_dir/consumer-configure.log" ||
  { cat "$work_dir/consumer-configure.log"; echo "FAIL: find_package(kvcache) against $prefix"; exit 1; }
grep -q "kvcache_DIR:PATH=$prefix/lib/cmake/kvcache" "$work_dir/consumer/CMakeCache.txt" ||
  { grep kvcache_DIR "$work_dir/consumer/CMakeCache.txt"; echo "FAIL: kvcache found elsewhere"; exit 1; }
cmake --build "$work_dir/consumer" >"$work_dir/consumer-build.log" ||
  { cat "$work_dir/consumer-build.log"; echo "FAIL: the consumer does not build"; exit 1; }

# A version the package does not offer is refused (0.x: the minor version must match).
cat >"$work_dir/wrong_version.cmake" <<CMAKE
set(CMAKE_PREFIX_PATH "$prefix")
find_package(kvcache 0.2 QUIET)
if(kvcache_FOUND)
  message(FATAL_ERROR "find_package(kvcache 0.2) accepted version \${kvcache_VERSION}")
endif()
CMAKE
cmake -P "$work_dir/wrong_version.cmake"

socket=$work_dir/kv.sock
"$prefix/bin/kvcache-manager" --listen="unix://$socket" \
  --pool=install_test:model=consumer:layers=2:kv_heads=4:head_dim=64:block_size=16:blocks=128 \
  >"$work_dir/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
# Ready once the installed kvcachectl lists its pools (bounded: 20 s).
for _ in $(seq 200); do
  "$prefix/bin/kvcachectl" --target="unix://$socket" pools >/dev/null 2>&1 && break
  kill -0 $daemon 2>/dev/null || { cat "$work_dir/daemon.log"; echo "FAIL: the daemon exited"; exit 1; }
  sleep 0.1
done

"$work_dir/consumer/kvcache_consumer" "unix://$socket" install_test | tee "$work_dir/consumer.out"
expected="ping: epoch nonzero
pool: install_test model=consumer layers=2 kv_heads=4 head_dim=64 block_size=16 blocks=128
sequence: 3 blocks
lookup: 32 cached tokens"
if [ "$(cat "$work_dir/consumer.out")" != "$expected" ]; then
  printf 'FAIL: the consumer printed\n%s\nexpected\n%s\n' "$(cat "$work_dir/consumer.out")" "$expected"
  exit 1
fi
echo "PASS"
