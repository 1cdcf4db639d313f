#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# install_deps.sh - installs what building and testing loom needs on Debian 12
# (as root, or with sudo available), valgrind included (.ci/run's memcheck
# step), iproute2 (ip and tc for bench/hosts), OpenBLAS (libopenblas-dev: the shard
# kernels' Newton-Schulz and loom-train's matrix products), PyTorch (python3-torch: the trainer's reference check; with libtorch-dev,
# pybind11-dev and python3-dev also loom_torch, python/; python3-pytest its tests), hwloc and libibverbs
# (topology detection; optional, loom reads sysfs without them), and UCX (libucx-dev: the
# optional ucx transport, LOOM_NET=ucx; without it loom builds and tests without that transport).
set -e
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=""
for p in meson ninja-build pkg-config gcc g++ libgtest-dev python3 clang-format valgrind iproute2 libopenblas-dev python3-torch libtorch-dev pybind11-dev python3-dev python3-pytest libhwloc-dev libibverbs-dev libucx-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
fi
