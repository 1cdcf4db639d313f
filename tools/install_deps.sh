#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# install_deps.sh - installs what building and testing loom needs on Debian 12
# (as root, or with sudo available), valgrind included (.ci/run's memcheck
# step), iproute2 (ip and tc for bench/hosts), OpenBLAS (loom-train's matrix
# products) and PyTorch (python3-torch: the trainer's reference check). Optional dependencies (UCX, hwloc, libibverbs) are not needed by
# this build and are not installed.
set -e
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=""
for p in meson ninja-build pkg-config gcc g++ libgtest-dev python3 clang-format valgrind iproute2 libopenblas-dev python3-torch; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi
