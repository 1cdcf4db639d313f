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
SMOKE = os.path.join(BUILD, "tools", "device_check", "nccl_device_smoke")
STAGE_LINE = re.compile(r"^STAGE (\S+) (PASS|FAIL|SKIP) (.*)$")


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

    def run_check(self, **env):
        full = dict(os.environ)
        for key in ("LOOM_NCCL_LIBRARY", "LOOM_DEVICE_CHECK_SHIM", "LOOM_DEVICE_CHECK_PYTHON",
                    "LOOM_DEVICE_CHECK_LIBTORCH_CUDA", "LOOM_DEVICE_CHECK_STAGE_TIMEOUT"):
            full.pop(key, None)
        # never the machine's GPU: the stages that need one must skip, or meet stand-ins
        full["LOOM_DEVICE_CHECK_NVIDIA_SMI"] = os.path.join(self.tmp, "no", "nvidia-smi")
        full["CUDA_VISIBLE_DEVICES"] = ""
        full.update(env)
        start = time.monotonic()
        proc = subprocess.run(["bash", SCRIPT, BUILD, self.out], capture_output=True, text=True,
                              env=full, timeout=240)
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
        for name in ("S4_shim_c", "S5_torch_forward", "S5_shim_trace"):
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
        for name in ("S4_shim_c", "S5_torch_forward", "S5_shim_trace"):
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
        for name in ("S4_shim_c", "S5_torch_symbols", "S5_torch_forward", "S5_shim_trace"):
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

    def test_script_syntax_and_usage(self):
        subprocess.run(["bash", "-n", SCRIPT], check=True)
        if shutil.which("shellcheck"):
            proc = subprocess.run(["shellcheck", SCRIPT], capture_output=True, text=True)
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
