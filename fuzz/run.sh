#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# fuzz/run.sh - builds the libFuzzer harnesses in fuzz/ with clang, ASan and UBSan, straight
# from the library sources they exercise (no build directory needed), replays every input kept
# in fuzz/regress/<name>/, then fuzzes each harness for SECONDS (default 60; the harnesses run
# side by side) starting from the seeds in fuzz/corpus/<name>/. Prints one line per harness
# and exits 1 if any input crashes, leaks, hangs or trips a sanitizer (the crashing input is
# kept, with the command that turns it into a regression input), 2 if it cannot build.
# Installs clang with apt-get when it is missing and the script runs as root.
# Usage: fuzz/run.sh [SECONDS]    Called by .ci/run; environment: CLANG (default clang).
set -u

SECONDS_EACH=${1:-60}
case $SECONDS_EACH in
'' | *[!0-9]*)
    echo "usage: fuzz/run.sh [SECONDS]" >&2
    exit 2
    ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
CLANG=${CLANG:-clang}

# name and the library sources it links, relative to the repository root
HARNESSES=(bootstrap_wire frame env_parsers topo_json topo_file)
declare -A SOURCES=(
    [bootstrap_wire]="src/core/bootstrap_wire.c"
    [frame]="src/transport/stream.c src/core/debug.c src/core/param.c"
    [env_parsers]="src/core/param.c src/core/debug.c src/core/socket.c src/core/bootstrap_wire.c"
    [topo_json]="src/topology/json.c"
    [topo_file]="src/topology/topo_file.c src/topology/json.c"
)

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
    -I"$ROOT/include" -I"$ROOT/src/core" -I"$ROOT/src/transport")
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
    mkdir -p "$WORK/corpus-$name"
    local seeds=()
    [ -d "$HERE/corpus/$name" ] && seeds=("$HERE/corpus/$name")
    "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$WORK/$name-" "$WORK/corpus-$name" "${seeds[@]}" >"$log" 2>&1
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
    echo "fuzz $name: ok, ${execs:-?} execs in ${SECONDS_EACH} s, ${#regress[@]} regression" \
        "inputs, coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corpus:-?}" >"$WORK/$name.result"
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
