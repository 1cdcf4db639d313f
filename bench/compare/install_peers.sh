#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# install_peers.sh - installs what bench/compare runs next to loom: from
# Debian 12's packages Open MPI and MPICH (with their mpicc), torch (for Gloo),
# matplotlib (for the plot) and the tools that build loom; from PyPI Intel MPI
# (impi-rt, impi-devel: mpiexec, mpicc, libmpi, libfabric) with pip into a
# prefix of its own, $LOOM_IMPI_PREFIX (default ~/.cache/loom/impi), never
# into a system Python. Idempotent: it asks apt and pip only for what is
# missing, and runs 'apt-get update' only then. As root, or through sudo
# (apt only). Exits non-zero when something could not be installed;
# bench/compare/run then goes on with what is there.
set -u
PKGS="openmpi-bin libopenmpi-dev mpich libmpich-dev python3-torch python3-matplotlib
      python3 python3-pip meson ninja-build pkg-config gcc"
# 2021.19 needs a libfabric wheel that PyPI does not have; pip would fall back
# to 2021.18.1 after downloading 2021.19 first.
IMPI_VERSION=${LOOM_IMPI_VERSION:-2021.18.1}
IMPI_PREFIX=${LOOM_IMPI_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/impi}

# Intel MPI from PyPI into IMPI_PREFIX; returns non-zero when pip failed.
install_impi() {
    if [ -x "$IMPI_PREFIX/bin/mpicc" ] && [ -x "$IMPI_PREFIX/bin/mpiexec" ]; then
        echo "install_peers: Intel MPI is installed in $IMPI_PREFIX"
        return 0
    fi
    py=""
    for p in python3 /usr/bin/python3; do
        if "$p" -m pip --version >/dev/null 2>&1; then
            py=$p
            break
        fi
    done
    if [ -z "$py" ]; then
        echo "install_peers: no python3 with pip; Intel MPI not installed" >&2
        return 1
    fi
    echo "install_peers: pip-installing impi-rt and impi-devel $IMPI_VERSION into $IMPI_PREFIX"
    # --prefix keeps pip away from the interpreter's own site-packages.
    if ! "$py" -m pip install -q --disable-pip-version-check --no-warn-script-location \
            --root-user-action=ignore \
            --prefix "$IMPI_PREFIX" "impi-rt==$IMPI_VERSION" "impi-devel==$IMPI_VERSION"; then
        echo "install_peers: pip install of Intel MPI $IMPI_VERSION failed" >&2
        return 1
    fi
}

apt_install() {
    # Debian's packages that are missing; returns non-zero when apt failed.
    missing=""
    for p in $PKGS; do
        status=$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null || true)
        [ "$status" = "install ok installed" ] || missing="$missing $p"
    done
    if [ -z "$missing" ]; then
        echo "install_peers: every Debian package is installed"
        return 0
    fi
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "install_peers: missing:$missing; run as root, or install them" >&2
            return 1
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
        return 1
    fi
    echo "install_peers: done in $(( $(date +%s) - start )) s"
}

rc=0
apt_install || rc=1
install_impi || rc=1
exit $rc
