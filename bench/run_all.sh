#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# run_all.sh - loom's main job: every collective benchmark on N local ranks
# (default 4) from 8 B to 64 MiB, nccl-tests tables on stdout.
# Usage: bench/run_all.sh [BUILD_DIR] [NRANKS] [extra *_perf flags...]
set -e
build=${1:-build}
n=${2:-4}
[ $# -ge 2 ] && shift 2 || shift $#
status=0
for b in all_reduce all_gather all_gatherv reduce_scatter reduce_scatterv alltoall alltoallv \
    broadcast reduce sendrecv; do
    "$build/tools/loomrun" -n "$n" "$build/bench/${b}_perf" -b 8 -e 64M -f 2 "$@" || status=1
done
exit $status
