#!/usr/bin/env bash
# image_test.sh WORK_DIR: builds deploy/docker/Dockerfile as deploy/README.md says, runs the
# daemon from the image as its non-root user and probes it as kubelet would, and checks the
# workers, kvcachectl and the Python client are in it.
#
# No registry is reachable here, so the base image is a debootstrap'd Debian 12 imported into
# podman's storage (kept under WORK_DIR, vfs driver), and the build runs with chroot isolation
# and the host's network (apt-get inside the build). `podman run` cannot start containers on
# machines without CAP_SYS_RESOURCE (crun: "setrlimit RLIMIT_NPROC: Operation not permitted"),
# so the daemon runs in a buildah working container of the image, chroot isolation.
# Slow (the build stage compiles the project): label "image", not in the default CI run.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mkdir -p "$1" && cd "$1" && pwd)
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
export CONTAINERS_STORAGE_CONF=$work/storage.conf
printf '[storage]\ndriver = "vfs"\ngraphroot = "%s/storage"\nrunroot = "%s/runroot"\n' \
  "$work" "$work" >"$CONTAINERS_STORAGE_CONF"

start=$SECONDS
"$src/tests/deploy/debian_root.sh" "$work/debian-12"
tar -C "$work/debian-12" --exclude=./.complete -c . | podman import -q - localhost/debian:12 >/dev/null
echo "image_test: base image from debootstrap in $((SECONDS - start)) s"

cd "$src"
start=$SECONDS
# deploy/README.md's build command, with the imported base.
podman build --pull=never --network host --build-arg BASE_IMAGE=localhost/debian:12 \
  -f deploy/docker/Dockerfile -t kvcache:0.1.0 . >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; exit 1; }
echo "image_test: podman build in $((SECONDS - start)) s"
podman image inspect kvcache:0.1.0 --format 'user={{.Config.User}} cmd={{.Config.Cmd}}'
[ "$(podman image inspect kvcache:0.1.0 --format '{{.Config.User}}')" = 65532:65532 ]

container=$(buildah from --pull-never kvcache:0.1.0)
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; buildah rm "$container" >/dev/null' EXIT
in_image() { buildah run --network host "$container" -- "$@"; }
# --help exits 1 (Abseil's flags); a binary runs when it prints its usage line.
in_image sh -c 'for b in kvcache-manager kvcache-worker kvcache-pd kvcachectl; do
                  case "$($b --help 2>&1)" in "$b: "*) ;; *) echo "$b does not run"; exit 1;; esac; done'
in_image python3 -c 'import kvcache_client.hashing'
if in_image sh -c 'command -v cmake || command -v g++ || command -v protoc' 2>/dev/null; then
  echo "image_test: build tools in the runtime image"; exit 1
fi
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The image's own command (the sidecar's socket) plus the health port, as its non-root user.
buildah run --network host --user 65532:65532 "$container" -- kvcache-manager \
  --listen=unix:///run/kvcache/kv.sock --health_listen=127.0.0.1:$port >"$work/daemon.log" 2>&1 &
daemon=$!
/usr/bin/python3 "$src/tests/deploy/health_probe.py" 127.0.0.1:$port "" 30 ||
  { cat "$work/daemon.log"; exit 1; }
/usr/bin/python3 "$src/tests/deploy/health_probe.py" 127.0.0.1:$port kvcache.v1.KvCache 5
grep -q "listening on unix:///run/kvcache/kv.sock" "$work/daemon.log"
echo "image_test: OK"
