#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# run_foreign_kernels.sh - the trainer and echo suites with OpenBLAS and loom's reduction kernels
# forced to another instruction set than the one this CPU would pick, so that a test whose
# verdict depends on the CPU's kernels fails on every machine, not only on the next one. On
# x86-64 with AVX2, FMA and F16C: OpenBLAS's Haswell kernels (Sandybridge's where Haswell's are
# the native ones) and loom's AVX2 kernels (scalar where AVX2 is the best the CPU has). Prints the
# combination, a PASS or FAIL line per test program and "N passed, N failed"; the meson log
# (meson-logs/foreign-kernels.*) is counted by tools/test_summary.py with the others. Exits 77,
# saying why, where the CPU lacks those instructions or OpenBLAS cannot switch kernels (a build
# without DYNAMIC_ARCH). Run by .ci/run.
# Usage: tests/trainer/run_foreign_kernels.sh [--build DIR]
set -u
cd "$(dirname "$0")/../.."
build=build
if [ "${1:-}" = "--build" ] && [ -n "${2:-}" ]; then
    build=$2
elif [ $# -ne 0 ]; then
    echo "usage: $0 [--build DIR]" >&2
    exit 2
fi
train=$build/trainer/loom-train
if [ ! -x "$train" ]; then
    echo "SKIP: $train is not built (no OpenBLAS): no trainer suite to run"
    exit 77
fi

if [ "$(uname -m)" != x86_64 ]; then
    echo "SKIP: not x86-64: there is no other kernel family to force"
    exit 77
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
for f in avx2 fma f16c; do
    if [[ $flags != *" $f "* ]]; then
        echo "SKIP: this CPU lacks $f: OpenBLAS's Haswell and loom's AVX2 kernels cannot run"
        exit 77
    fi
done

# The core OpenBLAS reports at load (OPENBLAS_VERBOSE=2), with or without a forced one.
blas_core() { OPENBLAS_VERBOSE=2 "$@" "$train" --help 2>&1 | sed -n 's/.*Core: \([A-Za-z0-9]*\).*/\1/p' | tail -1; }
native=$(blas_core env)
blas=Haswell
[ "$native" = Haswell ] && blas=Sandybridge
got=$(blas_core env OPENBLAS_CORETYPE=$blas)
if [ "$got" != "$blas" ]; then
    echo "SKIP: OPENBLAS_CORETYPE=$blas gives core '${got:-none reported}' (native '${native:-none reported}'): this OpenBLAS cannot switch kernels"
    exit 77
fi
kernels=scalar
avx512=1
for f in avx512f avx512bw avx512vl avx512dq; do
    [[ $flags == *" $f "* ]] || avx512=0
done
[ "$avx512" = 1 ] && kernels=avx2

echo "trainer and echo suites with OPENBLAS_CORETYPE=$blas (native: ${native:-unknown}) and LOOM_KERNELS=$kernels"
log=$build/meson-logs/foreign-kernels.txt
OPENBLAS_CORETYPE=$blas LOOM_KERNELS=$kernels \
    meson test -C "$build" --suite trainer --suite echo --num-processes 1 --print-errorlogs \
    --logbase foreign-kernels >/dev/null 2>&1
rc=$?
json=$build/meson-logs/foreign-kernels.json
if [ ! -s "$json" ]; then
    echo "FAIL: meson test wrote no log (exit $rc); see $log"
    exit 1
fi
python3 - "$json" <<'EOF'
import json, sys
bad = 0
tests = [json.loads(line) for line in open(sys.argv[1])]
for t in tests:
    ok = t["result"] in ("OK", "SKIP")
    bad += not ok
    print(f"{'PASS' if ok else 'FAIL'} {t['name']} ({t['result']}, {t['duration']:.0f} s)")
print(f"{len(tests) - bad} passed, {bad} failed")
EOF
if [ $rc -ne 0 ]; then
    echo "the failing tests' output: $log"
    exit 1
fi
exit 0
