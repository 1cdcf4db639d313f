#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# fuzz/run.sh - builds the libFuzzer harnesses in fuzz/ with clang, ASan and UBSan, straight
# from the library sources they exercise (no build directory needed), replays every input kept
# in fuzz/regress/<name>/, then fuzzes each harness for SECONDS (default 60; the harnesses run
# side by side) on a copy of the corpus kept in fuzz/corpus/<name>/ (minimised, so each run
# starts where the earlier ones got to; the tree's copy is only read). Prints one line per
# harness and exits 1 if any input crashes, leaks, hangs or trips a sanitizer (the crashing
# input is kept, with the command that turns it into a regression input), 2 if it cannot build.
# With --update-corpus the corpus each harness ends with is minimised into fuzz/corpus/<name>/, to
# be committed: libFuzzer's -merge=1 on edge coverage alone (-use_counters=0), inputs up to the
# harness's size limit, which keeps each a few KiB.
# Installs clang with apt-get when it is missing and the script runs as root.
# Usage: fuzz/run.sh [--update-corpus] [SECONDS]
# Called by .ci/run (fuzz/run.sh 60); environment: CLANG (default clang).
set -u

UPDATE_CORPUS=0
if [ "${1:-}" = --update-corpus ]; then
    UPDATE_CORPUS=1
    shift
fi
SECONDS_EACH=${1:-60}
case $SECONDS_EACH in
'' | *[!0-9]*)
    echo "usage: fuzz/run.sh [--update-corpus] [SECONDS]" >&2
    exit 2
    ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
CLANG=${CLANG:-clang}

# name and the library sources it links, relative to the repository root
HARNESSES=(bootstrap_wire frame env_parsers topo_json topo_file cost_env q4 moe_trace)
KERNELS="src/collectives/kernels.c src/collectives/kernels_scalar.c src/collectives/kernels_avx2.c
    src/collectives/kernels_avx512.c src/core/dtype.c src/core/debug.c src/core/log_line.c src/core/param.c"
declare -A SOURCES=(
    [bootstrap_wire]="src/core/bootstrap_wire.c"
    [frame]="src/transport/wire.c src/core/debug.c src/core/log_line.c src/core/param.c"
    [env_parsers]="src/core/param.c src/core/debug.c src/core/log_line.c src/core/socket.c src/core/bootstrap_wire.c"
    [topo_json]="src/topology/json.c"
    [topo_file]="src/topology/topo_file.c src/topology/json.c"
    [cost_env]="src/collectives/cost_model.c src/core/debug.c src/core/log_line.c src/core/param.c"
    [q4]="src/quant/q4.c src/quant/q4_avx2.c src/quant/q4_avx512.c $KERNELS"
    [moe_trace]="src/moe/moe_trace.c src/core/debug.c src/core/log_line.c src/core/param.c"
)
# The longest input each harness is given (libFuzzer's -max_len), which keeps the corpus small;
# q4 needs room for two tiles (1152 bytes of codes and scales per 2048 values).
declare -A MAX_LEN=([bootstrap_wire]=256 [frame]=256 [env_parsers]=128 [topo_json]=512
    [topo_file]=512 [cost_env]=96 [q4]=2400 [moe_trace]=512)

# True if $CLANG links a libFuzzer program with both sanitizers.
clang_works() {
    command -v "$CLANG" >/dev/null 2>&1 || return 1
    local probe
    probe=$(mktemp -d "${TMPDIR:-/tmp}/loom-fuzz-probe.XXXXXX") || return 1
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)\n{ (void)d; (void)n; return 0; }\n' >"$probe/p.c"
    "$CLANG" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1
    local rc=$?
    rm -rf "$probe"
    return $rc
}

if ! clang_works; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "fuzz: installing clang and the libFuzzer runtime with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null && apt-get install -y -qq clang >/dev/null
        major=$("$CLANG" --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
        if [ -n "$major" ] && ! clang_works; then
            apt-get install -y -qq "libclang-rt-$major-dev" >/dev/null 2>&1 || true
        fi
    fi
    if ! clang_works; then
        echo "fuzz: $CLANG cannot build libFuzzer programs with ASan and UBSan (install clang and" \
            "libclang-rt-<version>-dev)" >&2
        exit 2
    fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/loom-fuzz.XXXXXX")
CFLAGS=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer -D_GNU_SOURCE -Wall -Wextra -Werror
    -I"$ROOT/include" -I"$ROOT/src/core" -I"$ROOT/src/transport" -I"$ROOT/src/collectives"
    -I"$ROOT/src/quant")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Builds, replays the regression inputs, fuzzes; writes one result line to $WORK/<name>.result.
run_one() {
    local name=$1 bin="$WORK/$1" log="$WORK/$1.log" srcs=()
    for s in ${SOURCES[$name]}; do
        srcs+=("$ROOT/$s")
    done
    if ! "$CLANG" "${CFLAGS[@]}" "$HERE/fuzz_$name.c" "${srcs[@]}" -o "$bin" >"$WORK/$name.build" 2>&1; then
        echo "fuzz $name: BUILD FAILED (see $WORK/$name.build)" >"$WORK/$name.result"
        return 2
    fi
    local regress=() f
    if [ -d "$HERE/regress/$name" ]; then
        for f in "$HERE/regress/$name"/*; do
            [ -f "$f" ] && regress+=("$f")
        done
    fi
    if [ ${#regress[@]} -gt 0 ] && ! "$bin" -timeout=10 "${regress[@]}" >"$WORK/$name.regress" 2>&1; then
        echo "fuzz $name: REGRESSION INPUT FAILS (see $WORK/$name.regress)" >"$WORK/$name.result"
        return 1
    fi
    # A copy of the kept corpus: libFuzzer adds what it finds to the first directory.
    mkdir -p "$WORK/corpus-$name"
    [ -d "$HERE/corpus/$name" ] && cp -p "$HERE/corpus/$name"/* "$WORK/corpus-$name"/ 2>/dev/null
    "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -max_len="${MAX_LEN[$name]}" -artifact_prefix="$WORK/$name-" "$WORK/corpus-$name" \
        >"$log" 2>&1
    local rc=$?
    local execs cov ft corpus
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2)
    corpus=$(grep -o 'corp: [0-9]*' "$log" | tail -n1 | cut -d' ' -f2)
    if [ $rc -ne 0 ]; then
        local crash
        crash=$(ls "$WORK/$name-"* 2>/dev/null | head -n1)
        echo "fuzz $name: FAILED after ${execs:-?} execs (log $log; input ${crash:-none};" \
            "keep it with: cp ${crash:-<input>} $HERE/regress/$name/)" >"$WORK/$name.result"
        return 1
    fi
    local kept=""
    if [ "$UPDATE_CORPUS" = 1 ]; then
        mkdir -p "$WORK/merged-$name"
        if ! "$bin" -merge=1 -use_counters=0 -max_len="${MAX_LEN[$name]}" "$WORK/merged-$name" \
            "$WORK/corpus-$name" >"$WORK/$name.merge" 2>&1; then
            echo "fuzz $name: CORPUS MERGE FAILED (see $WORK/$name.merge)" >"$WORK/$name.result"
            return 1
        fi
        rm -rf "${HERE:?}/corpus/$name"
        mkdir -p "$HERE/corpus/$name"
        cp -p "$WORK/merged-$name"/* "$HERE/corpus/$name"/ 2>/dev/null
        kept=", kept $(find "$HERE/corpus/$name" -type f | wc -l) inputs ($(du -sk "$HERE/corpus/$name" |
            cut -f1) KiB) in fuzz/corpus/$name"
    fi
    echo "fuzz $name: ok, ${execs:-?} execs in ${SECONDS_EACH} s, ${#regress[@]} regression" \
        "inputs, coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corpus:-?}$kept" \
        >"$WORK/$name.result"
    return 0
}

pids=()
for name in "${HARNESSES[@]}"; do
    run_one "$name" &
    pids+=($!)
done
status=0
for i in "${!HARNESSES[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    [ $rc -gt $status ] && status=$rc
done
for name in "${HARNESSES[@]}"; do
    cat "$WORK/$name.result"
done
if [ $status -eq 0 ]; then
    rm -rf "$WORK"
else
    echo "fuzz: work directory kept in $WORK" >&2
fi
exit $status
