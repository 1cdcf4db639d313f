# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
#
# gpu_path.sh - the stages of tools/device_check.sh that check loom's own GPU path (docs/gpu.md),
# sourced by it: S1_kernels (the device kernels bitwise against the CPU reference, and 128-bit
# loads in their SASS), S2_ranks (2 and 4 ranks sharing GPU 0, as threads and as processes over
# CUDA IPC, every collective and Echo) and S3_timings (kernel bandwidth against the copy ceiling,
# AllReduce on device buffers over the staged and ipc transports next to the cost model). Each is
# a function stage_<name> ending with `finish`, like the script's own stages, and reads what
# S0_env found (BUILD_USED, GPU, ...).

# Counts of a GoogleTest program's output: G_PASSED, G_FAILED, G_SKIPPED, G_FAILED_NAMES (the
# failing tests, space separated) and G_SKIP_WHY (the first skip's reason).
gtest_tally() {
    local out=$1
    G_PASSED=$(sed -n 's/^\[  PASSED  \] \([0-9][0-9]*\) tests\{0,1\}\..*/\1/p' <<<"$out" | tail -n1)
    G_SKIPPED=$(sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) tests\{0,1\}, listed below:.*/\1/p' \
        <<<"$out" | tail -n1)
    G_FAILED=$(sed -n 's/^\[  FAILED  \] \([0-9][0-9]*\) tests\{0,1\}, listed below:.*/\1/p' \
        <<<"$out" | tail -n1)
    G_PASSED=${G_PASSED:-0} G_SKIPPED=${G_SKIPPED:-0} G_FAILED=${G_FAILED:-0}
    G_FAILED_NAMES=$(grep '^\[  FAILED  \] [A-Za-z_]' <<<"$out" | awk '{print $4}' | sed 's/,$//' |
        sort -u | tr '\n' ' ')
    G_FAILED_NAMES=${G_FAILED_NAMES% }
    G_SKIP_WHY=$(grep -A1 -m1 ': Skipped$' <<<"$out" | tail -n1)
}

# The cuobjdump to read SASS with, or nothing.
find_cuobjdump() {
    if [ -n "${LOOM_DEVICE_CHECK_CUOBJDUMP:-}" ]; then
        printf '%s\n' "$LOOM_DEVICE_CHECK_CUOBJDUMP"
    elif command -v cuobjdump >/dev/null 2>&1; then
        command -v cuobjdump
    elif [ -x /usr/local/cuda/bin/cuobjdump ]; then
        echo /usr/local/cuda/bin/cuobjdump
    fi
}

# SASS of the kernels in FILE: the reduce and the codec (q4) kernels, each family with at least
# one function using 128-bit global loads (LDG.E.128, with any modifiers). Prints the counts;
# fails when a family has no function or none with such loads.
sass_check() {
    local tool=$1 file=$2 dump
    if ! dump=$(limit 25 "$tool" -sass "$file" 2>&1); then
        echo "cuobjdump -sass $file failed: $(gist "$dump")"
        return 1
    fi
    awk '
        /Function : / { fn = $NF; fam = "";
                        if (tolower(fn) ~ /q4|codec|encode|decode/) fam = "codec";
                        else if (tolower(fn) ~ /reduce/) fam = "reduce";
                        if (fam != "") { all[fam]++; name[fn] = fam } }
        /LDG\.E(\.[A-Z0-9_]+)*\.128/ { if (fn in name && !(fn in wide)) { wide[fn] = 1; w[name[fn]]++ } }
        END {
            bad = 0
            for (i = 1; i <= 2; i++) {
                f = i == 1 ? "reduce" : "codec"
                printf("%s%s kernels: %d of %d with LDG.E.128", (i > 1 ? ", " : ""), f, w[f] + 0,
                       all[f] + 0)
                if (all[f] == 0 || w[f] == 0) bad = 1
            }
            printf "\n"
            exit bad
        }' <<<"$dump"
}

# S1: the device suite's kernel tests (tests/device/test_dev_kernels_gpu): every kernel against
# dev_kernels_host.c's reference, bitwise, modules loaded eagerly; then the SASS's loads.
stage_S1_kernels() {
    need_gpu
    local exe=$BUILD_USED/tests/device/test_dev_kernels_gpu out rc sass="" tool lib
    [ -x "$exe" ] || finish SKIP "test_dev_kernels_gpu is not built (a build without the cuda feature or without tests)"
    out=$(CUDA_MODULE_LOADING=EAGER limit "${S1_TEST_SECONDS:-30}" "$exe" 2>&1)
    rc=$?
    echo "$out"
    gtest_tally "$out"
    [ $rc -ne 124 ] || finish FAIL "test_dev_kernels_gpu timed out after ${S1_TEST_SECONDS:-30} s ($G_PASSED passed before)"
    [ $rc -eq 0 ] || finish FAIL "test_dev_kernels_gpu: $G_FAILED failed${G_FAILED_NAMES:+ ($G_FAILED_NAMES)}, $G_PASSED passed (status $rc): $(gist "$out")"
    # Where nvidia-smi shows a GPU every kernel test must run.
    if [ "$G_SKIPPED" -gt 0 ]; then
        case $G_SKIP_WHY in
        *CUDA*device* | *cudaGetDeviceCount*)
            finish FAIL "CUDA sees no device although nvidia-smi does: $G_SKIPPED of $((G_PASSED + G_SKIPPED)) kernel tests skipped (${G_SKIP_WHY:-no reason given})"
            ;;
        esac
        finish FAIL "$G_SKIPPED kernel tests skipped on a machine with a GPU: ${G_SKIP_WHY:-no reason given}"
    fi
    [ "$G_PASSED" -gt 0 ] || finish FAIL "test_dev_kernels_gpu ran no test: $(gist "$out")"
    local tests="$G_PASSED kernel tests bitwise equal to the CPU reference"
    tool=$(find_cuobjdump)
    if [ -z "$tool" ]; then
        finish PASS "$tests; cuobjdump not found, SASS not read"
    fi
    lib=$BUILD_USED/src/libloom.so
    [ -e "$lib" ] || lib=$exe
    lib=$(readlink -f "$lib")
    echo "== $tool -sass ${lib##*/}"
    if ! sass=$(sass_check "$tool" "$lib"); then
        finish FAIL "$tests; SASS of ${lib##*/}: $sass"
    fi
    finish PASS "$tests; SASS of ${lib##*/}: $sass"
}

# One run of device_ranks with the environment of S2 (LOOM_DEVICE=auto, eager module loading, the
# device path's INFO lines): "threads N" or "processes N" (loomrun -n N). Prints its output; sets
# R_RESULT (PASS, or why not), R_CASES and R_IPC (how the ipc transport opened on rank 0).
ranks_run() {
    local mode=$1 n=$2 out rc line
    local -a cmd=("$BUILD_USED/tools/device_check/device_ranks" --threads "$n")
    [ "$mode" = threads ] || cmd=("$BUILD_USED/tools/loomrun" -n "$n" "$BUILD_USED/tools/device_check/device_ranks")
    echo "== $n ranks as $mode: ${cmd[*]##*/}"
    out=$(LOOM_DEVICE=auto CUDA_MODULE_LOADING=EAGER LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=DEVICE \
        limit "${S2_RUN_SECONDS:-15}" "${cmd[@]}" 2>&1)
    rc=$?
    echo "$out"
    line=$(grep -m1 'transports: ipc ' <<<"$out")
    R_IPC=${line#*transports: ipc }
    R_IPC=${R_IPC%%, nccl *}
    [ -n "$line" ] || R_IPC="unknown (no transports line)"
    R_CASES=$(sed -n 's/^PASS .*: \([0-9][0-9]*\) cases .*/\1/p' <<<"$out" | tail -n1)
    case $rc in
    0) R_RESULT=PASS ;;
    77) R_RESULT="no device runtime: $(gist "$(sed -n 's/^device_ranks: no device runtime: //p' <<<"$out")")" ;;
    124 | 137) R_RESULT="timed out after ${S2_RUN_SECONDS:-15} s" ;;
    *) R_RESULT="status $rc: $(gist "$out")" ;;
    esac
    [ "$R_RESULT" = PASS ]
}

# S2: every collective and Echo on device buffers with 2 and 4 ranks sharing GPU 0, as threads
# (the same pointers) and as processes (CUDA IPC), through tools/device_check/device_ranks: each
# result bitwise equal to the host buffers' and identical on every rank. A failure of the
# processes (CUDA IPC) is recorded without hiding the threads' results.
stage_S2_ranks() {
    need_gpu
    [ -x "$BUILD_USED/tools/device_check/device_ranks" ] || finish SKIP "device_ranks is not built"
    [ -x "$BUILD_USED/tools/loomrun" ] || finish SKIP "loomrun is not built"
    local mode n parts=() bad=0 nodev=0 runs=0
    for mode in threads processes; do
        for n in 2 4; do
            runs=$((runs + 1))
            if ranks_run "$mode" "$n"; then
                parts+=("$n $mode: $R_CASES cases, ipc $R_IPC")
                # processes must share memory over CUDA IPC, not fall back to host staging
                [ "$mode" = threads ] || [ "$R_IPC" = open ] || bad=$((bad + 1))
            else
                parts+=("$n $mode: $R_RESULT")
                bad=$((bad + 1))
                case $R_RESULT in no\ device\ runtime*) nodev=$((nodev + 1)) ;; esac
            fi
        done
    done
    local detail
    detail=$(printf '%s; ' "${parts[@]}")
    detail=${detail%; }
    [ "$nodev" -lt "$runs" ] || finish FAIL "CUDA sees no device although nvidia-smi does: $detail"
    [ "$bad" -eq 0 ] || finish FAIL "$detail"
    finish PASS "bitwise equal to host buffers and across ranks: $detail"
}

# Appends the kernel rows of gpu_kernels_perf's table (stdin) to the CSV file $1, judging the
# rows at >= 64 MiB against the copy ceiling of the same size: reduce >= 80 %, codec (q4_*)
# >= 70 %. Prints "judged J failed F ceiling64 C worst W".
kernel_rows() {
    awk -v csv="$1" '
        $1 ~ /^[a-z_+0-9]+$/ && $4 ~ /^[0-9]+$/ && NF >= 7 {
            n++; name[n] = $1; type[n] = $2; nsrc[n] = $3; bytes[n] = $4; gbps[n] = $6
            if ($1 == "memcpy_d2d" || $1 == "copy_kernel")
                if ($6 > ceil[$4]) ceil[$4] = $6
        }
        END {
            judged = 0; failed = 0; worst = ""; c64 = ceil[67108864] + 0
            for (i = 1; i <= n; i++) {
                c = ceil[bytes[i]] + 0; ratio = c > 0 ? gbps[i] / c : 0; target = ""; verdict = "-"
                if (name[i] ~ /^reduce/) target = 0.80
                else if (name[i] ~ /^q4_/) target = 0.70
                if (target != "" && bytes[i] >= 67108864) {
                    judged++; verdict = ratio >= target ? "PASS" : "FAIL"
                    if (verdict == "FAIL") {
                        failed++
                        worst = worst sprintf("%s%s %s x%d %d MiB %.0f%%", worst == "" ? "" : ", ",
                                              name[i], type[i], nsrc[i], bytes[i] / 1048576, 100 * ratio)
                    }
                } else target = ""
                printf("kernel,%s %s x%d,%d,%.1f,GB/s,copy ceiling,%.1f,%.3f,%s,%s\n", name[i], type[i],
                       nsrc[i], bytes[i], gbps[i], c, ratio, target, verdict) >> csv
            }
            printf "judged %d failed %d ceiling64 %.1f worst %s\n", judged, failed, c64, worst
        }'
}

# Appends the rows of an all_reduce_perf -G 1 table (stdin) to the CSV file $1 for transport $2,
# next to the cost model of docs/gpu.md: staged = N / B_d2h + host(N) + N / B_h2d, with host(N)
# the same call on host buffers (rows "host" already in $1) and B measured by copy_bw; ipc =
# (ranks + 1) N / B_copy, B_copy the copy ceiling. $3 B_h2d, $4 B_d2h, $5 B_copy (GB/s, or
# empty), $6 ranks. Prints the number of rows with wrong results.
allreduce_rows() {
    awk -v csv="$1" -v tp="$2" -v h2d="$3" -v d2h="$4" -v copy="$5" -v nr="$6" '
        BEGIN {
            while ((getline l < csv) > 0) {
                split(l, f, ",")
                if (f[1] == "allreduce" && f[2] == "host out-of-place") host[f[3]] = f[4]
            }
            close(csv)
        }
        $1 ~ /^[0-9]+$/ && NF >= 13 {
            N = $1; t = $6; wrongs = ($9 != "0" && $9 != "N/A") + ($13 != "0" && $13 != "N/A"); bad += wrongs > 0
            model = ""; how = ""
            if (tp == "host") { how = "-" }
            else if (tp == "staged" && h2d > 0 && d2h > 0 && (N in host)) {
                model = N / (d2h * 1e3) + host[N] + N / (h2d * 1e3); how = "model N/B_d2h+host+N/B_h2d"
            } else if (tp == "ipc" && copy > 0) {
                model = (nr + 1) * N / (copy * 1e3); how = "model (n+1)N/B_copy"
            } else how = "model unavailable"
            mtext = model == "" ? "" : sprintf("%.2f", model)
            rtext = model > 0 ? sprintf("%.3f", t / model) : ""
            verdict = wrongs ? "WRONG" : "-"
            printf("allreduce,%s out-of-place,%d,%.2f,us,%s,%s,%s,,%s\n", tp, N, t, how, mtext, rtext,
                   verdict) >> csv
        }
        END { print bad + 0 }'
}

# One all_reduce_perf run on 2 ranks of GPU 0: host buffers (transport "host") or -G 1 with the
# device transport forced to $1; 1, 4, 16 and 64 MiB of float32, checked. Prints its output.
allreduce_run() {
    local tp=$1 dev=(-G 1)
    local -a env=(LOOM_DEVICE=auto CUDA_MODULE_LOADING=EAGER "LOOM_DEVICE_TRANSPORTS=$tp")
    if [ "$tp" = host ]; then
        dev=(-G 0)
        env=(LOOM_DEVICE=auto)
    fi
    echo "== all_reduce_perf ${dev[*]} on 2 ranks, ${env[*]}" >&2
    (
        export "${env[@]}"
        limit "${S3_AR_SECONDS:-15}" "$BUILD_USED/tools/loomrun" -n 2 \
            "$BUILD_USED/bench/all_reduce_perf" "${dev[@]}" -b 1M -e 64M -f 4 -d float -o sum \
            -n 20 -w 3 -c 1 2>&1
    )
}

# S3: the kernels' bandwidth against the copy ceiling of the same run (gpu_kernels_perf at 64 and
# 256 MiB: reduce >= 80 %, codec >= 70 %), the pinned copy bandwidth (copy_bw), and AllReduce on
# device buffers over host staging and over ipc at 1, 16 and 64 MiB on 2 ranks next to the cost
# model; every number into OUTDIR/timings.csv.
stage_S3_timings() {
    need_gpu
    local csv=$OUT/timings.csv out rc notes=() fail=() kern="" h2d="" d2h="" copy="" tp
    echo "kind,name,bytes,measured,unit,reference,reference_value,ratio,target,verdict" >"$csv"
    local gkp=$BUILD_USED/bench/gpu_kernels_perf
    if [ -x "$gkp" ]; then
        echo "== gpu_kernels_perf -s 64M,256M"
        out=$(CUDA_MODULE_LOADING=EAGER limit "${S3_KERNELS_SECONDS:-25}" "$gkp" -s 64M,256M -n 20 -w 3 2>&1)
        rc=$?
        echo "$out"
        kern=$(kernel_rows "$csv" <<<"$out")
        local judged failed
        read -r _ judged _ failed _ copy _ <<<"$kern"
        if [ $rc -ne 0 ] || [ "$judged" -eq 0 ]; then
            fail+=("gpu_kernels_perf (status $rc) judged no kernel: $(gist "$out")")
            copy=""
        elif [ "$failed" -gt 0 ]; then
            fail+=("$failed of $judged kernel rows below target: ${kern#* worst }")
        else
            notes+=("$judged kernel rows at >= 64 MiB on target (reduce >= 80 %, codec >= 70 % of the copy ceiling, $copy GB/s at 64 MiB)")
        fi
    else
        fail+=("gpu_kernels_perf is not built")
    fi
    local cbw=$BUILD_USED/tools/device_check/copy_bw
    if [ -x "$cbw" ]; then
        out=$(limit 10 "$cbw" -s 64M 2>&1)
        echo "$out"
        h2d=$(sed -n 's/^h2d_gbps //p' <<<"$out")
        d2h=$(sed -n 's/^d2h_gbps //p' <<<"$out")
        if [ -n "$h2d" ] && [ -n "$d2h" ]; then
            printf 'copy,pinned host to device,67108864,%s,GB/s,,,,,-\ncopy,device to pinned host,67108864,%s,GB/s,,,,,-\n' \
                "$h2d" "$d2h" >>"$csv"
            notes+=("pinned copies $h2d GB/s to and $d2h GB/s from the GPU")
        else
            fail+=("copy_bw: $(gist "$out")")
        fi
    else
        fail+=("copy_bw is not built")
    fi
    for tp in host staged ipc; do
        out=$(allreduce_run "$tp")
        rc=$?
        echo "$out"
        local wrong
        wrong=$(allreduce_rows "$csv" "$tp" "$h2d" "$d2h" "$copy" 2 <<<"$out")
        if [ $rc -ne 0 ]; then
            fail+=("all_reduce_perf ${tp}: status $rc: $(gist "$out")")
        elif [ "$wrong" -gt 0 ]; then
            fail+=("all_reduce_perf ${tp}: $wrong rows with wrong results")
        fi
    done
    local sizes
    sizes=$(awk -F, '$1 == "allreduce" && $2 != "host out-of-place" && ($3 == 1048576 || $3 == 16777216 || $3 == 67108864) {
                split($2, w, " "); printf "%s%s %d MiB %.0f us (model %s)", n++ ? ", " : "", w[1], $3 / 1048576, $4, $7 == "" ? "-" : sprintf("%.0f", $7) }' "$csv")
    [ -z "$sizes" ] || notes+=("AllReduce: $sizes")
    local all=("${fail[@]}" "${notes[@]}") detail
    detail=$(printf '%s; ' "${all[@]}")
    detail="${detail%; } (timings.csv)"
    [ ${#fail[@]} -eq 0 ] || finish FAIL "$detail"
    finish PASS "$detail"
}
