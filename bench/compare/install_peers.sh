#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# install_peers.sh - installs, from Debian 12's packages, what bench/compare
# runs next to loom: Open MPI and MPICH (with their mpicc), torch (for Gloo),
# matplotlib (for the plot), and the tools that build loom. Idempotent: it
# asks apt only for what is missing, and runs 'apt-get update' only then.
# As root, or through sudo. Exits non-zero when something could not be
# installed; bench/compare/run then goes on with what is there.
set -u
PKGS="openmpi-bin libopenmpi-dev mpich libmpich-dev python3-torch python3-matplotlib
      python3 meson ninja-build pkg-config gcc"
missing=""
for p in $PKGS; do
    status=$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "install_peers: everything is installed"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install_peers: missing:$missing; run as root, or install them" >&2
        exit 1
    fi
    SUDO="sudo"
fi
echo "install_peers: installing$missing"
start=$(date +%s)
# Another apt may be running (unattended upgrades): wait for its lock.
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq ||
    echo "install_peers: apt-get update failed" >&2
# force-unsafe-io skips dpkg's fsync per file: torch alone unpacks ~640 MB.
# shellcheck disable=SC2086 # the list is meant to split
if ! $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
        -o Dpkg::Options::=--force-unsafe-io install -y -qq --no-install-recommends \
        $missing >/dev/null; then
    echo "install_peers: apt-get install failed for:$missing" >&2
    exit 1
fi
echo "install_peers: done in $(( $(date +%s) - start )) s"
