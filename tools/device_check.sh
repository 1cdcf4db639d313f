#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# device_check.sh - the checks of loom's GPU path (docs/gpu.md) and of its drop-in NCCL library
# (libloom-nccl.so) that need a GPU, in one short run on a machine with one NVIDIA GPU and no
# network (docs/nccl-plugins.md, "GPU check"):
#
#   tools/device_check.sh BUILDDIR OUTDIR
#
# Every stage runs under its own timeout, 9 minutes in all, and prints one line
#   STAGE <name> PASS|FAIL|SKIP <detail>
# also written to OUTDIR/log.txt; what the stage ran and printed goes to OUTDIR/<name>.log. A
# failed stage is recorded and the next one runs. OUTDIR/summary.json (rewritten after every
# stage, so a run cut short still leaves one) holds each stage, what S0_env found and the
# result. Exit status: 0 no stage failed, 1 one did, 2 bad usage.
#
# A stage is a function stage_<name> that ends with `finish STATUS DETAIL`; adding one is that
# function, a line in STAGES and its seconds in BUDGET. Stages read what S0_env found from
# OUTDIR/state.env. The GPU path's stages (S1_kernels, S2_ranks, S3_timings) are in
# device_check/gpu_path.sh; S3_timings writes OUTDIR/timings.csv.
#
# Environment (all optional): LOOM_NCCL_LIBRARY the real libnccl.so.2 (else the one of torch's
# nvidia-nccl wheel, else /usr/local/cuda/lib64's); LOOM_DEVICE_CHECK_PYTHON (else the active
# virtual environment's python or python3, whichever has torch); LOOM_DEVICE_CHECK_NVIDIA_SMI
# (else nvidia-smi); LOOM_DEVICE_CHECK_SHIM (else BUILDDIR/src/plugin/nccl_shim/libloom-nccl.so);
# LOOM_DEVICE_CHECK_LIBTORCH_CUDA (else torch/lib/libtorch_cuda.so in that python's packages);
# LOOM_DEVICE_CHECK_CUOBJDUMP (else cuobjdump); LOOM_DEVICE_CHECK_STAGE_TIMEOUT caps every
# stage's seconds (tests, quick reruns).
set -u
set -o pipefail

STAGES=(S0_env S1_kernels S2_ranks S3_timings S4_shim_c S5_torch_symbols S5_torch_forward
    S5_shim_trace)
declare -A BUDGET=([S0_env]=140 [S1_kernels]=40 [S2_ranks]=70 [S3_timings]=75 [S4_shim_c]=45
    [S5_torch_symbols]=15 [S5_torch_forward]=95 [S5_shim_trace]=50)
# the budgets' sum: with each stage's 5 s kill grace and the driver's own steps, the run ends
# within 540 s
TOTAL_SECONDS=530
REBUILD_SECONDS=120

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
SRC=$(cd "$(dirname "$SELF")/.." && pwd)
TORCH_FORWARD=$SRC/tools/device_check/torch_forward.py
# shellcheck disable=SC1091  # checked on its own
. "$SRC/tools/device_check/gpu_path.sh"

usage() {
    echo "usage: $0 BUILDDIR OUTDIR    (or --list-stages)"
}

abspath() {
    case $1 in
    /*) printf '%s\n' "$1" ;;
    *) printf '%s\n' "$PWD/$1" ;;
    esac
}

now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

# One line of at most 300 characters: newlines and tabs become spaces.
one_line() {
    local s=${1//$'\n'/ }
    s=${s//$'\t'/ }
    s=${s//$'\r'/ }
    printf '%s' "${s:0:300}"
}

# The first line starting with FAIL, else the last non-empty line.
gist() {
    local line
    line=$(grep -m1 '^FAIL' <<<"$1")
    [ -n "$line" ] || line=$(grep -v '^[[:space:]]*$' <<<"$1" | tail -n1)
    one_line "$line"
}

# A JSON string of printable ASCII.
json_str() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    s=$(printf '%s' "$s" | LC_ALL=C tr -cd '\040-\176')
    printf '"%s"' "$s"
}

# Inner time limits stay in the stage's process group (--foreground), so that the stage's own
# timeout, which signals the group, ends them too.
limit() {
    local seconds=$1
    shift
    timeout --foreground -k 3 "$seconds" "$@"
}

# ---- Inside a stage (bash device_check.sh --stage NAME BUILDDIR OUTDIR) --------------------------

# Ends the stage with its result.
finish() {
    local status=$1
    shift
    printf '%s\n%s\n' "$status" "$(one_line "$*")" >"$OUT/.result.$STAGE"
    echo "result: $status $*"
    exit 0
}

# Records what S0_env found: for later stages (state.env) and for summary.json (env.tsv).
remember() {
    printf '%s=%q\n' "$1" "$2" >>"$OUT/state.env"
    printf '%s\t%s\n' "$1" "$(one_line "$2")" >>"$OUT/env.tsv"
}

need_env() {
    [ "${S0_DONE:-}" = 1 ] || finish SKIP "S0_env did not finish: nothing is known of this machine"
}

need_gpu() {
    need_env
    [ "$GPU" = yes ] || finish SKIP "$GPU_WHY"
}

need_torch_run() {
    need_gpu
    [ -n "$TORCH_VERSION" ] || finish SKIP "torch is not installed for $PYTHON"
    [ -n "$REAL_NCCL" ] || finish SKIP "$REAL_NCCL_WHY"
    [ -f "$SHIM" ] || finish SKIP "the shim is not built ($SHIM)"
}

# Runs a program of the build; prints why it cannot run here and fails, or succeeds.
probe_build() {
    local dir=$1 out rc
    local -a exe
    [ -d "$dir" ] || {
        echo "$dir does not exist"
        return 1
    }
    if [ -x "$dir/tools/device_check/nccl_device_smoke" ]; then
        exe=("$dir/tools/device_check/nccl_device_smoke" --probe)
    elif [ -x "$dir/tools/loomrun" ]; then
        exe=("$dir/tools/loomrun" --help)
    else
        echo "$dir holds no program of loom's build"
        return 1
    fi
    out=$(limit 20 "${exe[@]}" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
        echo "${exe[0]##*/} does not run here (status $rc): $(gist "$out")"
        return 1
    fi
    local shim=${LOOM_DEVICE_CHECK_SHIM:-$dir/src/plugin/nccl_shim/libloom-nccl.so}
    if [ -f "$shim" ]; then
        if ! out=$(limit 20 ldd "$shim" 2>&1) || grep -q 'not found' <<<"$out"; then
            echo "the shim's libraries do not resolve: $(one_line "$(grep -m1 'not found' <<<"$out")")"
            return 1
        fi
    fi
    return 0
}

# Builds the device check's programs afresh from this tree; prints the new build folder.
rebuild() {
    local dir targets=() t start
    start=$(date +%s)
    if ! command -v meson >/dev/null || ! command -v ninja >/dev/null; then
        echo "meson or ninja is not installed" >&2
        return 1
    fi
    dir=$(mktemp -d "${TMPDIR:-/tmp}/loom-device-build.XXXXXX") || return 1
    # the kernel tests need GoogleTest; without it the other programs still build
    if ! limit "$REBUILD_SECONDS" meson setup "$dir" "$SRC" -Dtests=true -Dwerror=false \
        -Dtorch=disabled >&2; then
        rm -rf "$dir" && mkdir -p "$dir" || return 1
        limit "$REBUILD_SECONDS" meson setup "$dir" "$SRC" -Dtests=false -Dwerror=false \
            -Dtorch=disabled >&2 || return 1
    fi
    for t in tools/device_check/nccl_device_smoke src/plugin/nccl_shim/libloom-nccl.so \
        tools/loomrun tests/device/test_dev_kernels_gpu tools/device_check/device_ranks \
        tools/device_check/copy_bw bench/gpu_kernels_perf bench/all_reduce_perf; do
        if ninja -C "$dir" -t query "$t" >/dev/null 2>&1; then
            targets+=("$t")
        fi
    done
    local left=$((REBUILD_SECONDS - ($(date +%s) - start)))
    [ $left -gt 0 ] || return 1
    limit "$left" ninja -C "$dir" "${targets[@]}" >&2 || return 1
    echo "$dir"
}

stage_S0_env() {
    local failed=() out rc
    rm -f "$OUT/state.env" "$OUT/env.tsv"

    # The GPU.
    local smi=${LOOM_DEVICE_CHECK_NVIDIA_SMI:-nvidia-smi} gpu=no why="" name="" driver=""
    if ! command -v "$smi" >/dev/null 2>&1; then
        why="no GPU: nvidia-smi not found"
    else
        out=$(limit 20 "$smi" -L 2>&1)
        rc=$?
        printf '$ %s -L\n%s\n' "$smi" "$out"
        if [ $rc -eq 0 ] && grep -q '^GPU [0-9]' <<<"$out"; then
            gpu=yes
            name=$(grep -m1 '^GPU [0-9]' <<<"$out")
            driver=$(limit 20 "$smi" --query-gpu=driver_version --format=csv,noheader 2>&1 |
                head -n1)
        else
            why="no usable GPU: nvidia-smi -L ended with status $rc: $(gist "$out")"
            failed+=("$why")
        fi
    fi
    remember GPU "$gpu"
    remember GPU_WHY "$why"
    remember GPU_NAME "$name"
    remember DRIVER "$driver"

    # The CUDA compiler.
    local nvcc nvcc_version=""
    nvcc=$(command -v nvcc || true)
    [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
    if [ -n "$nvcc" ]; then
        nvcc_version=$(limit 20 "$nvcc" --version 2>&1 | grep -o 'release [0-9.]*, V[0-9.]*')
    fi
    remember NVCC "${nvcc_version:-not found}"

    # Python, torch and the site-packages folders, without importing torch (slow).
    # Unless named, the first of the active virtual environment's python and python3 on the
    # PATH that has torch installed, else the first that exists.
    local py=${LOOM_DEVICE_CHECK_PYTHON:-} cand
    if [ -z "$py" ]; then
        for cand in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} "$(command -v python3 || true)"; do
            if [ -z "$cand" ] || [ ! -x "$cand" ]; then continue; fi
            [ -n "$py" ] || py=$cand
            if limit 30 "$cand" -c 'import importlib.metadata as m; m.version("torch")' \
                >/dev/null 2>&1; then
                py=$cand
                break
            fi
        done
    fi
    local sites="" torch_version=""
    if [ -n "$py" ]; then
        sites=$(limit 30 "$py" -c 'import site, sysconfig
dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
print("\n".join(dict.fromkeys(dirs)))' 2>/dev/null)
        torch_version=$(limit 30 "$py" -c 'import importlib.metadata as m
print(m.version("torch"))' 2>/dev/null)
    fi
    remember PYTHON "${py:-none}"
    remember TORCH_VERSION "$torch_version"

    # The real libnccl.so.2 and its ncclGetVersion.
    local real="" real_why="" real_version="" d f
    if [ -n "${LOOM_NCCL_LIBRARY:-}" ]; then
        [ -f "$LOOM_NCCL_LIBRARY" ] && real=$LOOM_NCCL_LIBRARY ||
            real_why="LOOM_NCCL_LIBRARY=$LOOM_NCCL_LIBRARY is not a file"
    else
        while IFS= read -r d; do
            if [ -z "$d" ] || [ -n "$real" ]; then
                continue
            fi
            for f in "$d"/nvidia/nccl/lib/libnccl.so.2 "$d"/nvidia/nccl/lib/libnccl.so*; do
                if [ -f "$f" ]; then
                    real=$f
                    break
                fi
            done
        done <<<"$sites"
        [ -n "$real" ] || [ ! -f /usr/local/cuda/lib64/libnccl.so.2 ] ||
            real=/usr/local/cuda/lib64/libnccl.so.2
        [ -n "$real" ] || real_why="no real libnccl.so.2: none in site-packages/nvidia/nccl/lib or /usr/local/cuda/lib64"
    fi
    if [ -n "$real" ] && [ -n "$py" ]; then
        real_version=$(limit 30 "$py" -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int(0)
r = lib.ncclGetVersion(ctypes.byref(v))
print(v.value if r == 0 else "ncclGetVersion failed with %d" % r)' "$real" 2>&1 | tail -n1)
    fi
    remember REAL_NCCL "$real"
    remember REAL_NCCL_WHY "$real_why"
    remember REAL_NCCL_VERSION "$real_version"

    # torch's CUDA library, whose NCCL references S5 checks.
    local torch_cuda=${LOOM_DEVICE_CHECK_LIBTORCH_CUDA:-}
    while IFS= read -r d; do
        if [ -n "$d" ] && [ -z "$torch_cuda" ] && [ -f "$d/torch/lib/libtorch_cuda.so" ]; then
            torch_cuda=$d/torch/lib/libtorch_cuda.so
        fi
    done <<<"$sites"
    remember TORCH_CUDA "$torch_cuda"

    # The build: does it run here (same glibc)? If not, a fresh one from this tree.
    local build=$BUILD built="carried" rebuilt carried_why rebuilt_why
    if ! carried_why=$(probe_build "$BUILD"); then
        echo "the build cannot be used: $carried_why; rebuilding"
        if rebuilt=$(rebuild) && rebuilt_why=$(probe_build "$rebuilt"); then
            build=$rebuilt
            built="rebuilt here, as the carried one could not run ($carried_why)"
        else
            failed+=("the build cannot run here ($carried_why) and rebuilding failed${rebuilt_why:+: $rebuilt_why}")
            built="unusable"
        fi
    fi
    local shim=${LOOM_DEVICE_CHECK_SHIM:-$build/src/plugin/nccl_shim/libloom-nccl.so}
    remember BUILD_USED "$build"
    remember BUILD_STATE "$built"
    remember SHIM "$shim"
    remember S0_DONE 1

    local shim_state="not built"
    [ ! -f "$shim" ] || shim_state="built"
    local summary
    summary="${name:-$why}${driver:+, driver $driver}; nvcc: ${nvcc_version:-none}"
    summary+="; torch: ${torch_version:-none} (${py:-no python})"
    summary+="; real NCCL: ${real:-none}${real_version:+ ($real_version)}; shim: $shim_state"
    summary+="; build: $built"
    if [ ${#failed[@]} -gt 0 ]; then
        finish FAIL "${failed[*]}; $summary"
    fi
    finish PASS "$summary"
}

# S4: a C program written against nccl.h, on the real NCCL alone and then through the shim in
# forward mode: collectives on device buffers and an AllReduce replayed from a CUDA graph.
stage_S4_shim_c() {
    need_gpu
    local smoke=$BUILD_USED/tools/device_check/nccl_device_smoke out rc
    [ -x "$smoke" ] || finish SKIP "nccl_device_smoke is not built (no CUDA toolkit with nccl.h at build time)"
    [ -n "$REAL_NCCL" ] || finish SKIP "$REAL_NCCL_WHY"
    export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
    echo "== the real NCCL alone: $REAL_NCCL"
    out=$(limit 22 "$smoke" "$REAL_NCCL" 2>&1)
    rc=$?
    echo "$out"
    local real_result="passes on the real NCCL alone"
    case $rc in
    0) ;;
    77) finish FAIL "CUDA sees no device although nvidia-smi does: $(gist "$out")" ;;
    *) real_result="fails on the real NCCL alone (status $rc): $(gist "$out")" ;;
    esac
    if [ ! -f "$SHIM" ]; then
        [ $rc -ne 0 ] && finish FAIL "nccl_device_smoke $real_result; the shim is not built"
        finish SKIP "the shim is not built ($SHIM); nccl_device_smoke $real_result"
    fi
    echo "== the shim in forward mode: $SHIM"
    out=$(LOOM_NCCL_MODE=forward LOOM_NCCL_LIBRARY=$REAL_NCCL limit 22 "$smoke" "$SHIM" 2>&1)
    local shim_rc=$?
    echo "$out"
    [ $shim_rc -eq 0 ] || finish FAIL "through the shim (forward): status $shim_rc: $(gist "$out"); nccl_device_smoke $real_result"
    [ $rc -eq 0 ] || finish FAIL "nccl_device_smoke $real_result (through the shim it passes)"
    finish PASS "forward to $REAL_NCCL: AllReduce, Broadcast, AllGather, ReduceScatter on device buffers and a graph-captured AllReduce replayed 10 times correct, as on the real NCCL alone"
}

# S5: every nccl* function libtorch_cuda.so leaves undefined must be one the shim exports.
stage_S5_torch_symbols() {
    need_env
    [ -n "$TORCH_CUDA" ] || finish SKIP "libtorch_cuda.so not found (python: $PYTHON)"
    command -v nm >/dev/null || finish FAIL "nm is not installed"
    local list=$OUT/torch_nccl_undefined.txt n missing
    limit 15 nm -D --undefined-only "$TORCH_CUDA" | awk '{print $NF}' | sed 's/@.*//' |
        grep '^nccl' | sort -u >"$list"
    n=$(wc -l <"$list")
    echo "$n nccl functions undefined in $TORCH_CUDA (list: $list)"
    [ "$n" -gt 0 ] || finish SKIP "libtorch_cuda.so references no nccl function (NCCL linked into torch statically?)"
    [ -f "$SHIM" ] || finish SKIP "$n nccl functions listed in torch_nccl_undefined.txt; the shim is not built ($SHIM)"
    missing=$(limit 15 nm -D --defined-only "$SHIM" | awk '{print $NF}' | sed 's/@.*//' |
        sort -u | comm -23 "$list" -)
    if [ -n "$missing" ]; then
        echo "missing from the shim:"
        echo "$missing"
        finish FAIL "$(wc -l <<<"$missing") of $n missing from the shim: $(one_line "$missing" | cut -c1-200)"
    fi
    finish PASS "the shim exports all $n nccl functions libtorch_cuda.so references"
}

# S5: torch world 1 on cuda:0, without and with the shim preloaded (forward): equal values.
stage_S5_torch_forward() {
    need_torch_run
    export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} PYTHONDONTWRITEBYTECODE=1
    local rc
    rm -f "$OUT/torch_base.json" "$OUT/torch_shim.json"
    echo "== without the shim"
    (
        unset LD_PRELOAD
        limit 45 "$PYTHON" "$TORCH_FORWARD" run "$OUT/torch_base.json"
    )
    rc=$?
    [ $rc -eq 0 ] || finish FAIL "torch without the shim failed (status $rc; see S5_torch_forward.log)"
    echo "== with the shim preloaded, forward mode"
    LD_PRELOAD=$SHIM LOOM_NCCL_MODE=forward LOOM_NCCL_LIBRARY=$REAL_NCCL \
        limit 45 "$PYTHON" "$TORCH_FORWARD" run "$OUT/torch_shim.json"
    rc=$?
    [ $rc -eq 0 ] || finish FAIL "torch with the shim preloaded failed (status $rc; see S5_torch_forward.log)"
    local out
    out=$(limit 20 "$PYTHON" "$TORCH_FORWARD" compare "$OUT/torch_base.json" \
        "$OUT/torch_shim.json" --mapped libloom-nccl 2>&1)
    rc=$?
    echo "$out"
    [ $rc -eq 0 ] || finish FAIL "with the shim: $(one_line "$out")"
    finish PASS "all_reduce, broadcast, all_gather, reduce_scatter, barrier, new_group, destroy_process_group on cuda:0: $(one_line "$out") with the shim preloaded (forward to $REAL_NCCL)"
}

# S5: the same run with the shim's call trace (LOOM_DEBUG_SUBSYS=SHIM): the calls went through
# the shim.
stage_S5_shim_trace() {
    need_torch_run
    export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} PYTHONDONTWRITEBYTECODE=1
    local trace=$OUT/shim_trace.txt rc name lines counts="" lacking=""
    rm -f "$trace" "$OUT/torch_trace.json"
    LD_PRELOAD=$SHIM LOOM_NCCL_MODE=forward LOOM_NCCL_LIBRARY=$REAL_NCCL LOOM_DEBUG=TRACE \
        LOOM_DEBUG_SUBSYS=SHIM LOOM_DEBUG_FILE=$trace \
        limit 45 "$PYTHON" "$TORCH_FORWARD" run "$OUT/torch_trace.json"
    rc=$?
    [ $rc -eq 0 ] || finish FAIL "torch with the shim and its trace failed (status $rc; see S5_shim_trace.log)"
    [ -s "$trace" ] || finish FAIL "no trace in shim_trace.txt: LOOM_DEBUG_SUBSYS=SHIM wrote nothing, so the calls did not reach the shim"
    if [ "$(wc -c <"$trace")" -gt 4194304 ]; then
        truncate -s 4194304 "$trace"
        echo "shim_trace.txt cut to 4 MiB"
    fi
    lines=$(wc -l <"$trace")
    # torch broadcasts with ncclBcast or ncclBroadcast; how it retires a communicator (Destroy,
    # Finalize, Abort) depends on its version, so those are counted but not required
    for name in CommInitRank AllReduce 'Broadcast|Bcast' AllGather ReduceScatter CommSplit \
        'CommDestroy|CommFinalize|CommAbort'; do
        local c
        c=$(grep -c -E "$name" "$trace")
        counts+="$name $c, "
        case $name in
        CommSplit | CommDestroy*) ;;
        *) [ "$c" -gt 0 ] || lacking+="$name " ;;
        esac
    done
    echo "$lines lines; $counts"
    [ -z "$lacking" ] || finish FAIL "the trace names no ${lacking% } call ($lines lines in shim_trace.txt)"
    local out="no run without the shim (S5_torch_forward) to compare with"
    if [ -f "$OUT/torch_base.json" ]; then
        out=$(limit 20 "$PYTHON" "$TORCH_FORWARD" compare "$OUT/torch_base.json" \
            "$OUT/torch_trace.json" --mapped libloom-nccl 2>&1)
        rc=$?
        echo "$out"
        [ $rc -eq 0 ] || finish FAIL "traced run: $(one_line "$out")"
    fi
    finish PASS "$lines trace lines in shim_trace.txt: ${counts%, }; values: $(one_line "$out")"
}

run_one_stage() {
    # set by state.env, which S0_env writes
    GPU="" GPU_WHY="" PYTHON="" TORCH_VERSION="" REAL_NCCL="" REAL_NCCL_WHY="" TORCH_CUDA=""
    BUILD_USED="" SHIM="" S0_DONE=""
    [ $# -eq 3 ] || exit 2
    STAGE=$1
    BUILD=$2
    OUT=$3
    # shellcheck disable=SC1091
    [ "$STAGE" = S0_env ] || [ ! -f "$OUT/state.env" ] || . "$OUT/state.env"
    "stage_$STAGE"
    finish FAIL "stage_$STAGE ended without a result"
}

# ---- The driver ---------------------------------------------------------------------------------

NAMES=()
STATUSES=()
DETAILS=()
TIMES=()

record() {
    local line="STAGE $1 $2 $3"
    echo "$line"
    echo "$line" >>"$OUT/log.txt"
    NAMES+=("$1")
    STATUSES+=("$2")
    DETAILS+=("$3")
    TIMES+=("$4")
}

seconds_since() {
    local ms=$(($(now_ms) - $1))
    printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

count() {
    local n=0 s
    for s in "${STATUSES[@]}"; do
        [ "$s" != "$1" ] || n=$((n + 1))
    done
    echo $n
}

write_summary() {
    local tmp=$OUT/.summary.json i sep="" key value result=PASS complete=false
    [ "$(count FAIL)" -eq 0 ] || result=FAIL
    [ ${#NAMES[@]} -lt ${#STAGES[@]} ] || complete=true
    {
        printf '{\n  "tool": "device_check",\n'
        printf '  "started": %s,\n' "$(json_str "$STARTED")"
        printf '  "seconds": %s,\n' "$(seconds_since "$T0")"
        printf '  "build_dir": %s,\n' "$(json_str "$BUILD")"
        printf '  "result": "%s",\n  "complete": %s,\n' "$result" "$complete"
        printf '  "counts": {"PASS": %d, "FAIL": %d, "SKIP": %d},\n' "$(count PASS)" \
            "$(count FAIL)" "$(count SKIP)"
        printf '  "env": {'
        if [ -f "$OUT/env.tsv" ]; then
            while IFS=$'\t' read -r key value; do
                printf '%s\n    %s: %s' "$sep" "$(json_str "$key")" "$(json_str "$value")"
                sep=","
            done <"$OUT/env.tsv"
        fi
        printf '\n  },\n  "stages": ['
        sep=""
        for i in "${!NAMES[@]}"; do
            printf '%s\n    {"name": %s, "status": "%s", "detail": %s, "seconds": %s}' "$sep" \
                "$(json_str "${NAMES[$i]}")" "${STATUSES[$i]}" "$(json_str "${DETAILS[$i]}")" \
                "${TIMES[$i]}"
            sep=","
        done
        printf '\n  ]\n}\n'
    } >"$tmp" && mv "$tmp" "$OUT/summary.json"
}

run_stage() {
    local name=$1 budget=${BUDGET[$1]} start rc status detail
    local left=$((DEADLINE - $(date +%s)))
    if [ "$left" -lt 5 ]; then
        record "$name" SKIP "no time left of the run's ${TOTAL_SECONDS} s" 0.000
        return
    fi
    [ "$budget" -le "$left" ] || budget=$left
    [ -z "$STAGE_CAP" ] || [ "$budget" -le "$STAGE_CAP" ] || budget=$STAGE_CAP
    rm -f "$OUT/.result.$name"
    start=$(now_ms)
    timeout -k 5 "$budget" bash "$SELF" --stage "$name" "$BUILD" "$OUT" \
        >"$OUT/$name.log" 2>&1 </dev/null
    rc=$?
    if [ -f "$OUT/.result.$name" ]; then
        { read -r status && read -r detail; } <"$OUT/.result.$name"
        rm -f "$OUT/.result.$name"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        status=FAIL
        detail="timed out after $budget s (see $name.log)"
    else
        status=FAIL
        detail="ended with status $rc and no result (see $name.log)"
    fi
    record "$name" "$status" "$detail" "$(seconds_since "$start")"
}

main() {
    case ${1:-} in
    --stage)
        shift
        run_one_stage "$@"
        ;;
    --list-stages)
        printf '%s\n' "${STAGES[@]}"
        exit 0
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    esac
    if [ $# -ne 2 ]; then
        usage >&2
        exit 2
    fi
    STAGE_CAP=${LOOM_DEVICE_CHECK_STAGE_TIMEOUT:-}
    if [ -n "$STAGE_CAP" ] && ! [[ $STAGE_CAP =~ ^[1-9][0-9]*$ ]]; then
        echo "$0: LOOM_DEVICE_CHECK_STAGE_TIMEOUT must be a number of seconds, not '$STAGE_CAP'" >&2
        exit 2
    fi
    BUILD=$(abspath "$1")
    OUT=$(abspath "$2")
    if ! mkdir -p "$OUT" || [ ! -w "$OUT" ]; then
        echo "$0: cannot write to $OUT" >&2
        exit 2
    fi
    rm -f "$OUT"/.result.* "$OUT/state.env" "$OUT/env.tsv" "$OUT/summary.json"
    : >"$OUT/log.txt"
    STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    T0=$(now_ms)
    DEADLINE=$(($(date +%s) + TOTAL_SECONDS))
    local s
    for s in "${STAGES[@]}"; do
        run_stage "$s"
        write_summary
    done
    echo "device_check: $(count PASS) PASS, $(count FAIL) FAIL, $(count SKIP) SKIP in" \
        "$(seconds_since "$T0") s; $OUT/summary.json"
    [ "$(count FAIL)" -eq 0 ]
}

main "$@"
