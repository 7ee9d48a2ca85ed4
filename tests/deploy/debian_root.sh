#!/usr/bin/env bash
# debian_root.sh DIR [PACKAGE...]: a minimal Debian 12 root filesystem in DIR (debootstrap
# minbase from Debian's default mirror), with PACKAGEs. Reused when DIR/.complete names the same
# packages, so a test's second run skips the download. For the image and rootfs tests: no
# container registry is needed.
set -euo pipefail
dir=$1
shift
want="$*"
if [ -f "$dir/.complete" ] && [ "$(cat "$dir/.complete")" = "$want" ]; then exit 0; fi
rm -rf "$dir"
include=()
[ $# -eq 0 ] || include=(--include="$(IFS=,; echo "$*")")
debootstrap --variant=minbase "${include[@]}" bookworm "$dir" >"$dir.log" 2>&1 ||
  { tail -20 "$dir.log"; exit 1; }
echo "$want" >"$dir/.complete"
