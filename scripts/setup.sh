#!/usr/bin/env bash
# Installs what the build needs (Debian 12 packages), then configures and builds into build/.
# Idempotent: installs only what is missing, rebuilds incrementally.
# --packages-only: install and stop (the image's build stage, deploy/docker/Dockerfile, installs
# in a layer of its own before the sources arrive).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build ccache pkg-config
          libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
          libabsl-dev libgtest-dev libgmock-dev libxxhash-dev libssl-dev
          nlohmann-json3-dev python3 python3-xxhash
          grpc-proto python3-grpcio prometheus-cpp-dev prometheus
          libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack
          python3-protobuf python3-numpy python3-pip python3-setuptools python3-wheel python3-venv
          python3-mypy python3-torch
          python3-yaml openssl debootstrap liburing-dev libhiredis-dev redis-server
          ${EXTRA_PACKAGES:-})
# tests/deploy renders the manifests with Debian 12's kubectl (1.20, whose kustomize v2.0.3 is
# the oldest they are written for): the kubernetes-client package, or, where another package
# holds /usr/bin/kubectl (Google Cloud SDK's kubectl), that package unpacked into the build tree.
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "${1:-}" != "--packages-only" ] || exit 0

BUILD_DIR=${BUILD_DIR:-build}
if ! dpkg -s kubernetes-client >/dev/null 2>&1 && [ ! -x "$BUILD_DIR/kubernetes-client/usr/bin/kubectl" ]; then
  mkdir -p "$BUILD_DIR/kubernetes-client"
  (cd "$BUILD_DIR" && apt-get download kubernetes-client >/dev/null &&
     dpkg-deb -x kubernetes-client_*.deb kubernetes-client && rm kubernetes-client_*.deb)
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j"${JOBS:-2}" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
