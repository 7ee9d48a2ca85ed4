#!/bin/sh
# Adds Debian's contrib and non-free components (nvidia-cuda-toolkit, libcudart) to the image's
# apt sources, in whichever format the base image keeps them: deb822 (debian:12 images) or
# sources.list (debootstrap).
set -eu
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  sed -i 's/^Components: main$/Components: main contrib non-free/' \
    /etc/apt/sources.list.d/debian.sources
fi
if [ -f /etc/apt/sources.list ]; then
  sed -i 's/^\(deb .*\) main$/\1 main contrib non-free/' /etc/apt/sources.list
fi
