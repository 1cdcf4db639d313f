#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_device_check.py - tools/device_check.sh on a machine without a GPU, as the tools suite runs
it: every stage reports exactly once, in order, with a valid summary.json; GPU stages skip with
their reason; a failure (a broken nvidia-smi, a stage past its time) is recorded and the run goes
on; and, with stand-ins for nvidia-smi, python, torch's library and the drop-in library, every
stage's own logic passes or fails as it should. Also the script's syntax (bash -n, shellcheck
where installed) and torch_forward.py's comparison. The script's path comes in DEVICE_CHECK, the
build folder in BUILD_DIR, the C compiler in CC.
"""
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import unittest

SCRIPT = os.environ.get("DEVICE_CHECK", "tools/device_check.sh")
BUILD = os.environ.get("BUILD_DIR", "build")
TORCH_FORWARD = os.path.join(os.path.dirname(SCRIPT), "device_check", "torch_forward.py")
GPU_PATH = os.path.join(os.path.dirname(SCRIPT), "device_check", "gpu_path.sh")
SMOKE = os.path.join(BUILD, "tools", "device_check", "nccl_device_smoke")
STAGE_LINE = re.compile(r"^STAGE (\S+) (PASS|FAIL|SKIP) (.*)$")
GPU_STAGES = ("S1_kernels", "S2_ranks", "S3_timings")  # loom's own GPU path


def stages():
    out = subprocess.run(["bash", SCRIPT, "--list-stages"], capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def write_exe(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


class DeviceCheck(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="loom-device-check-test-")
        self.out = os.path.join(self.tmp, "out")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_check(self, build=None, **env):
        full = dict(os.environ)
        for key in ("LOOM_NCCL_LIBRARY", "LOOM_DEVICE_CHECK_SHIM", "LOOM_DEVICE_CHECK_PYTHON",
                    "LOOM_DEVICE_CHECK_LIBTORCH_CUDA", "LOOM_DEVICE_CHECK_STAGE_TIMEOUT"):
            full.pop(key, None)
        # never the machine's GPU: the stages that need one must skip, or meet stand-ins
        full["LOOM_DEVICE_CHECK_NVIDIA_SMI"] = os.path.join(self.tmp, "no", "nvidia-smi")
        full["CUDA_VISIBLE_DEVICES"] = ""
        full.update(env)
        start = time.monotonic()
        proc = subprocess.run(["bash", SCRIPT, build or BUILD, self.out], capture_output=True,
                              text=True, env=full, timeout=240)
        elapsed = time.monotonic() - start
        lines = proc.stdout.splitlines()
        results = {}
        for line in lines:
            m = STAGE_LINE.match(line)
            if m:
                self.assertNotIn(m.group(1), results, f"stage reported twice:\n{proc.stdout}")
                results[m.group(1)] = (m.group(2), m.group(3))
        # one line per stage, in order, and the same in log.txt and summary.json
        names = [STAGE_LINE.match(l).group(1) for l in lines if STAGE_LINE.match(l)]
        self.assertEqual(names, stages(), proc.stdout + proc.stderr)
        with open(os.path.join(self.out, "log.txt"), encoding="utf-8") as f:
            self.assertEqual(f.read().splitlines(), [l for l in lines if STAGE_LINE.match(l)])
        with open(os.path.join(self.out, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        self.assertEqual([s["name"] for s in summary["stages"]], names)
        for s in summary["stages"]:
            self.assertEqual((s["status"], s["detail"]), results[s["name"]])
        fails = sum(1 for s, _ in results.values() if s == "FAIL")
        self.assertEqual(summary["counts"]["FAIL"], fails)
        self.assertEqual(summary["result"], "FAIL" if fails else "PASS")
        self.assertTrue(summary["complete"])
        self.assertEqual(proc.returncode, 1 if fails else 0, proc.stdout + proc.stderr)
        return results, summary, elapsed, proc

    def compile_lib(self, name, source):
        cc = shlex.split(os.environ.get("CC", "cc"))
        if not shutil.which(cc[0]):
            self.skipTest(f"no C compiler ({cc[0]})")
        src = os.path.join(self.tmp, name + ".c")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        lib = os.path.join(self.tmp, name + ".so")
        subprocess.run(cc + ["-shared", "-fPIC", "-o", lib, src], check=True)
        return lib

    def test_runs_to_the_end_without_a_gpu(self):
        results, summary, elapsed, _ = self.run_check()
        self.assertLess(elapsed, 60)
        self.assertEqual(results["S0_env"][0], "PASS", results)
        self.assertIn("no GPU: nvidia-smi not found", results["S0_env"][1])
        for name in GPU_STAGES + ("S4_shim_c", "S5_torch_forward", "S5_shim_trace"):
            self.assertEqual(results[name], ("SKIP", "no GPU: nvidia-smi not found"))
        self.assertNotEqual(results["S5_torch_symbols"][0], "FAIL")
        self.assertEqual(summary["env"]["GPU"], "no")
        self.assertEqual(summary["env"]["BUILD_STATE"], "carried")

    def test_a_broken_nvidia_smi_fails_s0_and_the_rest_still_run(self):
        smi = write_exe(os.path.join(self.tmp, "nvidia-smi"),
                        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't "
                        "communicate with the NVIDIA driver.\"\nexit 9\n")
        results, _, _, _ = self.run_check(LOOM_DEVICE_CHECK_NVIDIA_SMI=smi)
        self.assertEqual(results["S0_env"][0], "FAIL")
        self.assertIn("nvidia-smi -L ended with status 9: NVIDIA-SMI has failed",
                      results["S0_env"][1])
        for name in GPU_STAGES + ("S4_shim_c", "S5_torch_forward", "S5_shim_trace"):
            self.assertEqual(results[name][0], "SKIP")
            self.assertTrue(results[name][1].startswith("no usable GPU"), results[name])

    def test_a_stage_past_its_time_is_ended_with_its_processes(self):
        pidfile = os.path.join(self.tmp, "smi.pid")
        smi = write_exe(os.path.join(self.tmp, "nvidia-smi"),
                        f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
        results, _, elapsed, _ = self.run_check(LOOM_DEVICE_CHECK_NVIDIA_SMI=smi,
                                                LOOM_DEVICE_CHECK_STAGE_TIMEOUT="3")
        self.assertLess(elapsed, 40)
        self.assertEqual(results["S0_env"], ("FAIL", "timed out after 3 s (see S0_env.log)"))
        for name in GPU_STAGES + ("S4_shim_c", "S5_torch_symbols", "S5_torch_forward",
                                  "S5_shim_trace"):
            self.assertEqual(results[name],
                             ("SKIP", "S0_env did not finish: nothing is known of this machine"))
        with open(pidfile, encoding="utf-8") as f:
            pid = int(f.read())
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            self.fail(f"the stand-in nvidia-smi (pid {pid}) outlived its stage")

    def test_every_stage_with_stand_ins(self):
        """A GPU nvidia-smi reports, a python that answers as torch's would, torch's library
        and the drop-in library: the stages' own logic, end to end."""
        shim = self.compile_lib("libloom-nccl", """
int ncclGetVersion(int *v) { *v = 22809; return 0; }
int ncclAllReduce(void) { return 0; }
int ncclBcast(void) { return 0; }
int ncclCommInitRankConfig(void) { return 0; }
""")
        torch_ok = self.compile_lib("libfake_torch_cuda", """
int ncclAllReduce(void); int ncclBcast(void); int ncclCommInitRankConfig(void);
int use(void) { return ncclAllReduce() + ncclBcast() + ncclCommInitRankConfig(); }
""")
        torch_more = self.compile_lib("libfake_torch_cuda_more", """
int ncclAllReduce(void); int ncclCommShrink(void); int ncclCommRevoke(void);
int use(void) { return ncclAllReduce() + ncclCommShrink() + ncclCommRevoke(); }
""")
        smi = write_exe(os.path.join(self.tmp, "nvidia-smi"), """#!/bin/sh
case "$1" in
-L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
*) echo "580.95.05" ;;
esac
""")
        python = write_exe(os.path.join(self.tmp, "python"), f"""#!/bin/bash
if [ "$1" = -c ]; then
    case "$2" in
    *getsitepackages*) echo {self.tmp}/site-packages ;;
    *importlib.metadata*) echo 2.11.0+cu130 ;;
    *ncclGetVersion*) echo 22809 ;;
    esac
    exit 0
fi
case "$2" in
run)
    mapped='"/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2"'
    [ -z "${{LD_PRELOAD:-}}" ] || mapped="\\"$LD_PRELOAD\\", $mapped"
    echo "{{\\"results\\": {{\\"all_reduce\\": [1.5, -2.0]}}, \\"mapped\\": [$mapped]}}" > "$3"
    if [ -n "${{LOOM_DEBUG_FILE:-}}" ]; then
        for f in ncclCommInitRankConfig ncclAllReduce ncclBcast ncclAllGather \\
            ncclReduceScatter ncclCommSplit ncclCommDestroy; do
            echo "host:1:1 LOOM TRACE SHIM $f" >> "$LOOM_DEBUG_FILE"
        done
    fi
    ;;
compare) exec {sys.executable} "$@" ;;
esac
""")
        env = dict(LOOM_DEVICE_CHECK_NVIDIA_SMI=smi, LOOM_DEVICE_CHECK_PYTHON=python,
                   LOOM_DEVICE_CHECK_SHIM=shim, LOOM_DEVICE_CHECK_LIBTORCH_CUDA=torch_ok,
                   LOOM_NCCL_LIBRARY=shim)
        results, summary, _, _ = self.run_check(**env)
        self.assertEqual(results["S0_env"][0], "PASS", results)
        self.assertIn("GPU 0: NVIDIA H100 80GB HBM3", results["S0_env"][1])
        self.assertIn("driver 580.95.05", results["S0_env"][1])
        self.assertIn("torch: 2.11.0+cu130", results["S0_env"][1])
        self.assertIn(f"real NCCL: {shim} (22809); shim: built", results["S0_env"][1])
        self.assertEqual(summary["env"]["REAL_NCCL_VERSION"], "22809")
        # loom's own GPU path: CUDA sees no device here, while the stand-in nvidia-smi shows one
        if os.access(os.path.join(BUILD, "tests", "device", "test_dev_kernels_gpu"), os.X_OK):
            self.assertEqual(results["S1_kernels"][0], "FAIL")
            self.assertIn("CUDA sees no device although nvidia-smi does", results["S1_kernels"][1])
        else:
            self.assertEqual(results["S1_kernels"][0], "SKIP")
        self.assertEqual(results["S2_ranks"][0], "FAIL")
        self.assertIn("CUDA sees no device although nvidia-smi does: 2 threads: no device "
                      "runtime", results["S2_ranks"][1])
        self.assertEqual(results["S3_timings"][0], "FAIL")
        self.assertTrue(os.path.exists(os.path.join(self.out, "timings.csv")))
        if os.access(SMOKE, os.X_OK):
            # CUDA sees no device here, while the stand-in nvidia-smi shows one
            self.assertEqual(results["S4_shim_c"][0], "FAIL")
            self.assertIn("CUDA sees no device although nvidia-smi does",
                          results["S4_shim_c"][1])
        else:
            self.assertEqual(results["S4_shim_c"][0], "SKIP")
        self.assertEqual(results["S5_torch_symbols"],
                         ("PASS", "the shim exports all 3 nccl functions libtorch_cuda.so "
                                  "references"))
        with open(os.path.join(self.out, "torch_nccl_undefined.txt"), encoding="utf-8") as f:
            self.assertEqual(f.read().split(),
                             ["ncclAllReduce", "ncclBcast", "ncclCommInitRankConfig"])
        self.assertEqual(results["S5_torch_forward"][0], "PASS", results)
        self.assertIn("1 results equal", results["S5_torch_forward"][1])
        self.assertEqual(results["S5_shim_trace"][0], "PASS", results)
        self.assertIn("7 trace lines", results["S5_shim_trace"][1])
        self.assertIn("AllReduce 1", results["S5_shim_trace"][1])

        # what fails: names torch needs and the shim lacks; a run with the shim that is not
        # the shim's (nothing of it mapped); a trace without the collectives
        python_bad = write_exe(os.path.join(self.tmp, "python_bad"),
                               open(python, encoding="utf-8").read()
                               .replace('[ -z "${LD_PRELOAD:-}" ]', "true")
                               .replace("ncclAllGather", "ncclSomethingElse"))
        env.update(LOOM_DEVICE_CHECK_LIBTORCH_CUDA=torch_more,
                   LOOM_DEVICE_CHECK_PYTHON=python_bad)
        results, _, _, _ = self.run_check(**env)
        self.assertEqual(results["S5_torch_symbols"],
                         ("FAIL", "2 of 3 missing from the shim: ncclCommRevoke ncclCommShrink"))
        self.assertEqual(results["S5_torch_forward"][0], "FAIL")
        self.assertIn("no library named *libloom-nccl* mapped", results["S5_torch_forward"][1])
        self.assertEqual(results["S5_shim_trace"][0], "FAIL")
        self.assertIn("the trace names no AllGather call", results["S5_shim_trace"][1])

    def fake_build(self, kernels_out, kernels_rc=0):
        """A build folder of stand-ins: loomrun (for S0's probe), the kernel tests printing
        kernels_out and ending with kernels_rc, libloom.so."""
        build = os.path.join(self.tmp, "fake-build")
        for d in ("tools", "tests/device", "src", "bench"):
            os.makedirs(os.path.join(build, d), exist_ok=True)
        write_exe(os.path.join(build, "tools", "loomrun"), "#!/bin/sh\nexit 0\n")
        out = os.path.join(self.tmp, "kernels.out")
        with open(out, "w", encoding="utf-8") as f:
            f.write(kernels_out)
        write_exe(os.path.join(build, "tests", "device", "test_dev_kernels_gpu"),
                  f"#!/bin/sh\n[ \"$CUDA_MODULE_LOADING\" = EAGER ] || exit 3\ncat {out}\n"
                  f"exit {kernels_rc}\n")
        with open(os.path.join(build, "src", "libloom.so"), "w", encoding="utf-8") as f:
            f.write("not really a library\n")
        return build

    def test_kernels_stage_with_stand_ins(self):
        """S1_kernels' logic: the kernel tests' verdict, all of them skipped while nvidia-smi
        sees a GPU, and the 128-bit loads of each kernel family in cuobjdump's SASS."""
        smi = write_exe(os.path.join(self.tmp, "nvidia-smi"),
                        "#!/bin/sh\n[ \"$1\" = -L ] && echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'"
                        " || echo 580.95.05\n")
        sass = os.path.join(self.tmp, "sass.txt")
        cuobjdump = write_exe(os.path.join(self.tmp, "cuobjdump"),
                              f"#!/bin/sh\n[ \"$1\" = -sass ] || exit 2\ncat {sass}\n")

        def sass_text(codec_wide):
            return ("\t\tFunction : _Z16loom_reduce_vec4ILi2EEvPv\n"
                    "        /*0100*/   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;\n"
                    "\t\tFunction : _Z18loom_reduce_scalarPv\n"
                    "        /*0100*/   LDG.E.U16 R4, desc[UR4][R2.64] ;\n"
                    "\t\tFunction : _Z14loom_q4_encodePKv\n"
                    f"        /*0100*/   LDG.E{'.128' if codec_wide else '.64'} R4, [R2.64] ;\n"
                    "\t\tFunction : _Z9loom_castPv\n"
                    "        /*0100*/   LDG.E.128 R4, [R2.64] ;\n")

        passing = ("[==========] Running 5 tests from 2 test suites.\n"
                   "[  PASSED  ] 5 tests.\n")
        env = dict(LOOM_DEVICE_CHECK_NVIDIA_SMI=smi, LOOM_DEVICE_CHECK_CUOBJDUMP=cuobjdump)
        with open(sass, "w", encoding="utf-8") as f:
            f.write(sass_text(True))
        build = self.fake_build(passing)
        results, _, _, _ = self.run_check(build, **env)
        self.assertEqual(results["S1_kernels"],
                         ("PASS", "5 kernel tests bitwise equal to the CPU reference; SASS "
                                  "of libloom.so: reduce kernels: 1 of 2 with LDG.E.128, "
                                  "codec kernels: 1 of 1 with LDG.E.128"))
        with open(sass, "w", encoding="utf-8") as f:
            f.write(sass_text(False))
        results, _, _, _ = self.run_check(build, **env)
        self.assertEqual(results["S1_kernels"][0], "FAIL")
        self.assertIn("codec kernels: 0 of 1 with LDG.E.128", results["S1_kernels"][1])
        results, _, _, _ = self.run_check(build, **dict(env, LOOM_DEVICE_CHECK_CUOBJDUMP=""))
        if not shutil.which("cuobjdump") and not os.path.exists("/usr/local/cuda/bin/cuobjdump"):
            self.assertEqual(results["S1_kernels"][1], "5 kernel tests bitwise equal to the "
                             "CPU reference; cuobjdump not found, SASS not read")
        build = self.fake_build(
            "[ RUN      ] Kernels.Reduce\ntest_dev_kernels_gpu.cc:40: Skipped\n"
            "no CUDA device: cudaGetDeviceCount: no CUDA-capable device is detected\n"
            "[  SKIPPED ] Kernels.Reduce (0 ms)\n[  PASSED  ] 0 tests.\n"
            "[  SKIPPED ] 3 tests, listed below:\n[  SKIPPED ] Kernels.Reduce\n")
        results, _, _, _ = self.run_check(build, **env)
        self.assertEqual(results["S1_kernels"],
                         ("FAIL", "CUDA sees no device although nvidia-smi does: 3 of 3 kernel "
                                  "tests skipped (no CUDA device: cudaGetDeviceCount: no "
                                  "CUDA-capable device is detected)"))
        build = self.fake_build(
            "[  FAILED  ] Kernels.Codec/bf16 (3 ms)\n[  PASSED  ] 4 tests.\n"
            "[  FAILED  ] 1 test, listed below:\n[  FAILED  ] Kernels.Codec/bf16\n", 1)
        results, _, _, _ = self.run_check(build, **env)
        self.assertEqual(results["S1_kernels"][0], "FAIL")
        self.assertTrue(results["S1_kernels"][1].startswith(
            "test_dev_kernels_gpu: 1 failed (Kernels.Codec/bf16), 4 passed (status 1)"),
            results["S1_kernels"])

    def test_ranks_and_timings_stages_with_stand_ins(self):
        """S2_ranks' and S3_timings' logic with stand-ins for device_ranks, loomrun,
        gpu_kernels_perf, copy_bw and all_reduce_perf: each run's verdict, the ipc transport
        required between processes, the kernels judged against the copy ceiling, and
        timings.csv with the cost model next to every AllReduce."""
        smi = write_exe(os.path.join(self.tmp, "nvidia-smi"),
                        "#!/bin/sh\n[ \"$1\" = -L ] && echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'"
                        " || echo 580.95.05\n")
        build = self.fake_build("[  PASSED  ] 5 tests.\n")
        for d in ("tools/device_check", "bench"):
            os.makedirs(os.path.join(build, d), exist_ok=True)
        write_exe(os.path.join(build, "tools", "loomrun"),
                  "#!/bin/sh\n[ \"$1\" = --help ] && exit 0\n[ \"$1\" = -n ] || exit 2\n"
                  "export FAKE_NRANKS=$2\nshift 2\nexec \"$@\"\n")
        write_exe(os.path.join(build, "tools", "device_check", "device_ranks"), """#!/bin/bash
[ "$LOOM_DEVICE" = auto ] && [ "$CUDA_MODULE_LOADING" = EAGER ] || exit 3
if [ "$1" = --threads ]; then mode=threads n=$2 ipc=open; else mode=processes n=$FAKE_NRANKS ipc=$FAKE_IPC; fi
echo "host:1:1 [0] LOOM INFO comm 0x1 rank 0: device runtime cuda, device 0; transports: ipc $ipc, nccl not available (rank 0: one GPU per rank), staged open"
if [ "$mode" = processes ] && [ -n "${FAKE_PROC_FAIL:-}" ]; then
    echo "FAIL $n ranks as processes on GPU 0: 1 case(s) failed; first: $FAKE_PROC_FAIL"; exit 1
fi
echo "PASS $n ranks as $mode on GPU 0: $((36 * n)) cases on device buffers equal to host buffers and across ranks"
""")
        write_exe(os.path.join(build, "bench", "gpu_kernels_perf"), f"#!/bin/sh\ncat {os.path.join(self.tmp, 'gkp.txt')}\n")
        write_exe(os.path.join(build, "tools", "device_check", "copy_bw"),
                  "#!/bin/sh\necho h2d_gbps 50.00\necho d2h_gbps 40.00\n")
        write_exe(os.path.join(build, "bench", "all_reduce_perf"), """#!/bin/bash
[ "$LOOM_DEVICE" = auto ] || exit 3
case " $* " in *" -G 1 "*) t=${LOOM_DEVICE_TRANSPORTS:?} ;; *) t=host ;; esac
echo "# Collective test starting: all_reduce_perf"
for s in 1048576 4194304 16777216 67108864; do
    case $t in host) us=$((s / 1000)) ;; staged) us=$((s / 100)) ;; *) us=$((s / 10000)) ;; esac
    w=0; [ "$t" = ipc ] && [ -n "${FAKE_WRONG:-}" ] && w=3
    printf '%12d %12d %8s %6s %6d %8d.00 1.00 1.00 %6d %8d.00 1.00 1.00 %6d\n' $s $((s / 4)) float sum -1 $us $w $us 0
done
echo "# Out of bounds values : 0 OK"
""")
        gkp = ["# kernel type nsrc bytes time_us GB/s %ceiling"]
        for size in (67108864, 268435456):
            gkp += [f"  memcpy_d2d float32 1 {size} 35.0 3800.0 100.0%",
                    f"  copy_kernel float32 1 {size} 34.0 4000.0 100.0%",
                    f"  reduce bfloat16 8 {size} 40.0 3400.0 85.0%",
                    f"  q4_decode_acc float32 1 {size} 40.0 {2900.0 if size > 67108864 else 2700.0} 70.0%",
                    f"  cast float32>bfloat16 1 {size} 40.0 1000.0 25.0%"]
        with open(os.path.join(self.tmp, "gkp.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(gkp) + "\n")
        env = dict(LOOM_DEVICE_CHECK_NVIDIA_SMI=smi, LOOM_DEVICE_CHECK_CUOBJDUMP="", FAKE_IPC="open")

        results, _, _, _ = self.run_check(build, **env)
        self.assertEqual(results["S2_ranks"],
                         ("PASS", "bitwise equal to host buffers and across ranks: 2 threads: 72 "
                                  "cases, ipc open; 4 threads: 144 cases, ipc open; 2 processes: "
                                  "72 cases, ipc open; 4 processes: 144 cases, ipc open"))
        status, detail = results["S3_timings"]
        # q4_decode_acc at 64 MiB is 2700 / 4000 = 67.5 % of the copy ceiling: below 70 %
        self.assertEqual(status, "FAIL", detail)
        self.assertTrue(detail.startswith("1 of 4 kernel rows below target: q4_decode_acc float32 "
                                          "x1 64 MiB 68%; pinned copies 50.00 GB/s to and 40.00 "
                                          "GB/s from the GPU; AllReduce: staged 1 MiB 10485 us"),
                        detail)
        with open(os.path.join(self.out, "timings.csv"), encoding="utf-8") as f:
            rows = [line.split(",") for line in f.read().splitlines()]
        self.assertEqual(rows[0], ["kind", "name", "bytes", "measured", "unit", "reference",
                                   "reference_value", "ratio", "target", "verdict"])
        kernels = {(r[1], r[2]): r for r in rows if r[0] == "kernel"}
        self.assertEqual(kernels[("reduce bfloat16 x8", "67108864")][6:],
                         ["4000.0", "0.850", "0.8", "PASS"])
        self.assertEqual(kernels[("q4_decode_acc float32 x1", "67108864")][9], "FAIL")
        self.assertEqual(kernels[("cast float32>bfloat16 x1", "67108864")][8:], ["", "-"])
        ar = {(r[1], r[2]): r for r in rows if r[0] == "allreduce"}
        self.assertEqual(len(ar), 12)
        # staged: N / 40 GB/s + the host call's 16777 us + N / 50 GB/s
        staged = ar[("staged out-of-place", "16777216")]
        self.assertEqual(staged[3:8], ["167772.00", "us", "model N/B_d2h+host+N/B_h2d",
                                       f"{16777216 / 40e3 + 16777 + 16777216 / 50e3:.2f}",
                                       f"{167772 / (16777216 / 40e3 + 16777 + 16777216 / 50e3):.3f}"])
        # ipc: (2 + 1) N / the 4000 GB/s ceiling
        self.assertEqual(ar[("ipc out-of-place", "67108864")][6], f"{3 * 67108864 / 4e6:.2f}")

        # Processes whose ipc transport did not open ran staged: recorded as a failure, with the
        # threads' results kept; a failing case and wrong results are failures too.
        results, _, _, _ = self.run_check(build, **dict(
            env, FAKE_IPC="not available (rank 1: cudaIpcOpenMemHandle: invalid argument)",
            FAKE_WRONG="1"))
        self.assertEqual(results["S2_ranks"][0], "FAIL")
        self.assertIn("4 threads: 144 cases, ipc open; 2 processes: 72 cases, ipc not available "
                      "(rank 1: cudaIpcOpenMemHandle: invalid argument)", results["S2_ranks"][1])
        self.assertIn("all_reduce_perf ipc: 4 rows with wrong results", results["S3_timings"][1])
        results, _, _, _ = self.run_check(build, **dict(env, FAKE_PROC_FAIL="AllGather float32"))
        self.assertEqual(results["S2_ranks"][0], "FAIL")
        self.assertIn("2 processes: status 1: FAIL 2 ranks as processes on GPU 0: 1 case(s) "
                      "failed; first: AllGather float32", results["S2_ranks"][1])

    def test_script_syntax_and_usage(self):
        for path in (SCRIPT, GPU_PATH):
            subprocess.run(["bash", "-n", path], check=True)
            if shutil.which("shellcheck"):
                proc = subprocess.run(["shellcheck", path], capture_output=True, text=True)
                self.assertEqual(proc.returncode, 0, proc.stdout)
        for args in ([], [BUILD], [BUILD, self.out, "extra"]):
            proc = subprocess.run(["bash", SCRIPT] + args, capture_output=True, text=True)
            self.assertEqual(proc.returncode, 2)
            self.assertIn("usage:", proc.stderr)
        proc = subprocess.run(["bash", SCRIPT, BUILD, self.out],
                              env=dict(os.environ, LOOM_DEVICE_CHECK_STAGE_TIMEOUT="soon"),
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("LOOM_DEVICE_CHECK_STAGE_TIMEOUT", proc.stderr)

    def test_torch_forward_compare(self):
        def doc(name, results, mapped):
            path = os.path.join(self.tmp, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"results": results, "mapped": mapped}, f)
            return path

        real = ["/x/nvidia/nccl/lib/libnccl.so.2"]
        base = doc("base.json", {"a": [1.0, 2.5], "b": [3]}, real)
        same = doc("same.json", {"a": [1.0, 2.5], "b": [3]}, ["/b/libloom-nccl.so"] + real)
        off = doc("off.json", {"a": [1.0, 2.25], "b": [3]}, ["/b/libloom-nccl.so"] + real)
        short = doc("short.json", {"a": [1.0, 2.5]}, ["/b/libloom-nccl.so"] + real)

        def compare(other, *extra):
            return subprocess.run([sys.executable, TORCH_FORWARD, "compare", base, other]
                                  + list(extra), capture_output=True, text=True)

        proc = compare(same, "--mapped", "libloom-nccl")
        self.assertEqual((proc.returncode, proc.stdout.strip()), (0, "2 results equal"))
        proc = compare(off)
        self.assertEqual((proc.returncode, proc.stdout.strip()), (1, "a: differs at element 1"))
        proc = compare(short)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("b: missing in", proc.stdout)
        proc = compare(base, "--mapped", "libloom-nccl")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("no library named *libloom-nccl* mapped", proc.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
