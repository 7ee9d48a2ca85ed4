#!/usr/bin/env bash
# runtime_rootfs_test.sh BIN_DIR WORK_DIR: the image's runtime stage without a container build.
# A debootstrap'd Debian 12 root with only deploy/docker/runtime-packages.txt installed gets what
# the Dockerfile copies (the binaries, the Python client, the uid 65532); then every binary's
# shared libraries must resolve there (ldd in the chroot), each answers --help, the Python
# client imports, and the daemon runs in the chroot as uid 65532 and answers kubelet's health
# probe. The fast, CI-sized check of the runtime file list; tests/deploy/image_test.sh builds the
# image itself. Needs root (chroot) and Debian's mirror (debootstrap).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1
work=$(mkdir -p "$2" && cd "$2" && pwd)
root=$work/runtime-root
binaries=(kvcache-manager kvcache-worker kvcache-pd kvcachectl)

start=$SECONDS
mapfile -t packages < <(grep -v '^#' "$src/deploy/docker/runtime-packages.txt")
"$src/tests/deploy/debian_root.sh" "$root" "${packages[@]}"
echo "runtime_rootfs_test: Debian 12 root with ${#packages[@]} runtime packages in $((SECONDS - start)) s"

# What the Dockerfile's runtime stage adds.
for binary in "${binaries[@]}"; do
  strip --strip-debug -o "$root/usr/local/bin/$binary" "$bin/$binary"
done
# A build with CUDA links the toolkit's runtime (libcudart, libnccl) through its RPATH; the CUDA
# image carries a CUDA runtime, so copy those in at the same paths. Every other library must
# come from the runtime packages.
for binary in "${binaries[@]}"; do
  ldd "$bin/$binary" | awk '$3 ~ /^\/usr\/local\/cuda/ {print $3}'
done | sort -u | while read -r library; do
  echo "runtime_rootfs_test: a CUDA build: copying $library from the toolkit"
  cp --parents -L "$library" "$root"
done
rm -rf "$root/usr/lib/python3/dist-packages/kvcache_client"
cp -r "$src/client/python/kvcache_client" "$root/usr/lib/python3/dist-packages/"
chroot "$root" sh -c 'getent passwd 65532 >/dev/null ||
  { groupadd --system --gid 65532 kvcache && useradd --system --uid 65532 --gid 65532 \
      --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kvcache; }
  install -d -o 65532 -g 65532 -m 0700 /run/kvcache'

status=0
for binary in "${binaries[@]}"; do
  missing=$(chroot "$root" ldd "/usr/local/bin/$binary" | grep "not found" || true)
  if [ -n "$missing" ]; then
    echo "runtime_rootfs_test: $binary: libraries missing from the runtime packages:"
    echo "$missing"
    status=1
  # --help exits 1 (Abseil's flags); it runs when it prints the binary's usage line.
  elif [[ "$(chroot --userspec=65532:65532 "$root" "/usr/local/bin/$binary" --help 2>&1)" != \
          "$binary: "* ]]; then
    echo "runtime_rootfs_test: $binary does not run in the runtime root"
    status=1
  fi
done
[ $status -eq 0 ]
chroot --userspec=65532:65532 "$root" python3 -c 'import kvcache_client.hashing'
if chroot "$root" sh -c 'command -v cmake || command -v g++ || command -v protoc'; then
  echo "runtime_rootfs_test: build tools in the runtime root"; exit 1
fi

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev/shm" || { mkdir -p "$root/dev/shm"; mount -t tmpfs -o mode=1777 shm "$root/dev/shm"; }
chroot --userspec=65532:65532 "$root" /usr/local/bin/kvcache-manager \
  --listen=unix:///run/kvcache/kv.sock --health_listen=127.0.0.1:$port >"$work/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; umount "$root/dev/shm" "$root/proc"' EXIT
/usr/bin/python3 "$src/tests/deploy/health_probe.py" 127.0.0.1:$port "" 30 || { cat "$work/daemon.log"; exit 1; }
/usr/bin/python3 "$src/tests/deploy/health_probe.py" 127.0.0.1:$port kvcache.v1.KvCache 5
[ "$(stat -c %u "$root/run/kvcache/kv.sock")" = 65532 ]
echo "runtime_rootfs_test: OK in $((SECONDS - start)) s"
