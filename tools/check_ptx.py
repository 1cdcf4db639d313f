#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# check_ptx.py - the code-generation check of the device kernels (src/device/kernels/*.cu),
# run by the device suite of builds with the cuda feature; no GPU needed:
#
#   check_ptx.py ptxas PTXAS ARCH LOG PTX...   runs `PTXAS -v -arch=ARCH` on each PTX file and
#                                              writes what it printed to LOG (a build step)
#   check_ptx.py check LOG PTX...              the check (exit 1 on any failure)
#   check_ptx.py selftest LOG PTX...           the check must fail on copies of the files with the
#                                              vector accesses scalarised, a spill, a stack frame,
#                                              a kernel missing from the log, an unknown kernel
#
# Every kernel must belong to a known family (reduce, codec, cast, copy; a new kernel is added
# to FAMILIES on purpose) and every family must be present. Each kernel must contain a 16-byte
# global load through the read-only path (ld.global.nc.v4 of 32-bit or .v2 of 64-bit lanes),
# a 16-byte global store (st.global[.wb|.cg|.cs|.wt].v4 / .v2 of 64-bit lanes) and no local
# memory; ptxas must report it with 0 bytes stack frame, 0 bytes spill stores and 0 bytes
# spill loads. Prints one line per family (kernels, most registers) and the verdict.
import re
import subprocess
import sys

FAMILIES = ("reduce_kernel", "q4_encode_kernel", "q4_decode_kernel", "cast_kernel", "copy_kernel")

ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z0-9_$]+)\s*\(", re.M)
LOAD16 = re.compile(r"\bld\.global\.nc(?:\.[A-Za-z0-9_:]+)*?\.(?:v4\.[bsuf]32|v2\.[bsuf]64)\b")
STORE16 = re.compile(r"\bst\.global(?:\.(?:wb|cg|cs|wt))?(?:\.[A-Za-z0-9_:]+)*?"
                     r"\.(?:v4\.[bsuf]32|v2\.[bsuf]64)\b")
LOCAL = re.compile(r"\b(?:ld|st)\.local\b|\.local\s+\.")
PROPS = re.compile(r"Function properties for ([A-Za-z0-9_$]+)\s*\n\s*(\d+) bytes stack frame, "
                   r"(\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Compiling entry function '([A-Za-z0-9_$]+)'.*?Used (\d+) registers", re.S)


def entries(ptx):
    """(name, body) of each kernel of a PTX text."""
    marks = list(ENTRY.finditer(ptx))
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(ptx)
        out.append((m.group(1), ptx[m.start():end]))
    return out


def family(name):
    for f in FAMILIES:
        if f in name:
            return f
    return None


def check(log, ptxs):
    """Failures (strings) and per-family summary lines."""
    bad = []
    props = {m.group(1): tuple(int(x) for x in m.groups()[1:]) for m in PROPS.finditer(log)}
    regs = {}
    for chunk in log.split("Compiling entry function")[1:]:
        m = USED.search("Compiling entry function" + chunk)
        if m:
            regs[m.group(1)] = int(m.group(2))
    seen = {f: [] for f in FAMILIES}
    total = 0
    for ptx in ptxs:
        for name, body in entries(ptx):
            total += 1
            fam = family(name)
            if fam is None:
                bad.append(f"{name}: not a known kernel family (add it to FAMILIES in "
                           f"tools/check_ptx.py)")
                continue
            seen[fam].append(name)
            if not LOAD16.search(body):
                bad.append(f"{name}: no 16-byte read-only global load (ld.global.nc.v4)")
            if not STORE16.search(body):
                bad.append(f"{name}: no 16-byte global store (st.global.v4)")
            if LOCAL.search(body):
                bad.append(f"{name}: uses local memory")
            p = props.get(name)
            if p is None:
                bad.append(f"{name}: not in the ptxas -v log")
            elif p != (0, 0, 0):
                bad.append(f"{name}: ptxas reports {p[0]} bytes stack frame, {p[1]} bytes "
                           f"spill stores, {p[2]} bytes spill loads")
    lines = []
    for f in FAMILIES:
        if not seen[f]:
            bad.append(f"no {f} in the PTX")
            continue
        r = [regs[n] for n in seen[f] if n in regs]
        lines.append(f"  {f:18s} {len(seen[f]):4d} kernels, registers at most "
                     f"{max(r) if r else '?'}")
    if total == 0:
        bad.append("no kernels in the PTX")
    return bad, lines, total


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def cmd_ptxas(argv):
    ptxas, arch, log_path, ptx_paths = argv[0], argv[1], argv[2], argv[3:]
    out = []
    for p in ptx_paths:
        r = subprocess.run([ptxas, "-v", f"-arch={arch}", p, "-o", "/dev/null"],
                           capture_output=True, text=True)
        out.append(r.stdout + r.stderr)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            print(f"check_ptx: {ptxas} failed on {p} (exit {r.returncode})", file=sys.stderr)
            return 1
    with open(log_path, "w", encoding="utf-8") as f:
        f.write("".join(out))
    return 0


def cmd_check(argv):
    log, ptxs = read(argv[0]), [read(p) for p in argv[1:]]
    bad, lines, total = check(log, ptxs)
    print(f"check_ptx: {total} kernels in {len(ptxs)} PTX files")
    for line in lines:
        print(line)
    for b in bad:
        print("FAIL " + b)
    print("check_ptx: " + ("FAIL" if bad else "PASS: every kernel has 16-byte global loads and "
                           "stores, no local memory, 0 bytes stack frame and spills"))
    return 1 if bad else 0


def scalarise_loads(ptx):
    return re.sub(r"ld\.global\.nc\.v4\.u32\s*\{(%r\d+),[^}]*\}", r"ld.global.nc.u32 \1", ptx)


def scalarise_stores(ptx):
    return re.sub(r"st\.global\.wb\.v4\.u32\s*(\[[^\]]*\]),\s*\{(%r\d+),[^}]*\}",
                  r"st.global.u32 \1, \2", ptx)


def cmd_selftest(argv):
    log, ptxs = read(argv[0]), [read(p) for p in argv[1:]]
    bad, _, _ = check(log, ptxs)
    if bad:
        print("check_ptx selftest: the real files fail already:\n  " + "\n  ".join(bad))
        return 1
    first = entries(ptxs[0])[0][0]
    cases = {
        "loads scalarised": (log, [scalarise_loads(p) for p in ptxs]),
        "stores scalarised": (log, [scalarise_stores(p) for p in ptxs]),
        "a spill": (log.replace("0 bytes spill stores", "8 bytes spill stores", 1), ptxs),
        "a stack frame": (log.replace("0 bytes stack frame", "16 bytes stack frame", 1), ptxs),
        "a kernel missing from the log": (log.replace(f"Function properties for {first}",
                                                      "Function properties for gone", 1), ptxs),
        "an unknown kernel": (log, [ptxs[0].replace(first, "mystery_kernel")] + ptxs[1:]),
        "local memory": (log, [ptxs[0].replace("ld.global.nc.v4.u32", "ld.local.u32 %r0, [%rd0];"
                                               "\n\tld.global.nc.v4.u32", 1)] + ptxs[1:]),
    }
    missed = []
    for what, (lg, px) in cases.items():
        b, _, _ = check(lg, px)
        print(f"check_ptx selftest: {what}: {'caught' if b else 'MISSED'}"
              + (f" ({len(b)} failures, e.g. {b[0]})" if b else ""))
        if not b:
            missed.append(what)
    return 1 if missed else 0


def main(argv):
    cmds = {"ptxas": (cmd_ptxas, 5), "check": (cmd_check, 3), "selftest": (cmd_selftest, 3)}
    if len(argv) < 2 or argv[1] not in cmds or len(argv) < cmds[argv[1]][1]:
        print(__doc__ if __doc__ else "usage: check_ptx.py ptxas|check|selftest ...",
              file=sys.stderr)
        print("usage: check_ptx.py ptxas PTXAS ARCH LOG PTX... | check LOG PTX... | "
              "selftest LOG PTX...", file=sys.stderr)
        return 2
    fn, _ = cmds[argv[1]]
    return fn(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
