#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""nccl_shim_perf on 2 ranks with tiny sizes, briefly. Checks what does not depend on the clock:
every collective has its table, with the title, column heads, one row per size (the sizes and
counts of the sweep, the calls per block of the program's rule, positive times, the ratio of the
two, no wrong element) and the overhead line; the JSON parses and repeats the rows; -c picks
collectives. And that it fails as it should: outputs that differ (AllReduce sent to Echo's 4-bit
path by LOOM_NCCL_ROUTE) are counted and fail the run, another LOOM_NCCL_MODE and an unknown
collective are refused with a message."""
import json
import os
import re
import subprocess
import sys
import tempfile

P = 2
NAMES = ["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AllToAll", "SendRecv"]
SIZES = [8, 128, 2048]  # -b 8 -e 4K -f 16
ROW = re.compile(r"^ +(\d+) +(\d+) +(\d+) +([0-9.]+) +([0-9.]+) +([0-9.]+) +(\d+)$")
HEAD = re.compile(r"^# +size +count +calls +shim +direct +shim/direct +#wrong$")
OVERHEAD = re.compile(r"^# (\w+): the library's per-call overhead at (\d+) B: [+-]\d+ ns ")


def run(loomrun, prog, args, env_extra=None, want_ok=True):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LOOM_NCCL") and k not in ("LOOM_RANK", "RANK")}
    env.update(env_extra or {})
    p = subprocess.run([loomrun, "-n", str(P), prog] + args, capture_output=True, text=True,
                       timeout=30, env=env)
    if (p.returncode == 0) != want_ok:
        sys.exit(f"{prog} {' '.join(args)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout, p.stderr


def block_calls(nbytes):
    """nsp_block_calls: 256 KiB worth of calls, from 1 to 32."""
    return max(1, min(32, (256 << 10) // nbytes))


def parse_tables(text):
    """{name: (rows, overhead line's size)} from the printed tables."""
    tables, name, lines = {}, None, text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^# (\w+) \(float", line)
        if m:
            name = m.group(1)
            assert HEAD.match(lines[i + 1]), lines[i + 1]
            tables[name] = ([], None)
            continue
        m = ROW.match(line)
        if m:
            assert name is not None, line
            tables[name][0].append(tuple(float(x) for x in m.groups()))
            continue
        m = OVERHEAD.match(line)
        if m:
            assert m.group(1) == name, (line, name)
            tables[name] = (tables[name][0], int(m.group(2)))
    return tables


def check_table(name, rows, overhead_at):
    assert [int(r[0]) for r in rows] == SIZES, (name, rows)
    for size, count, calls, shim, direct, ratio, wrong in rows:
        assert count == size / 4 and calls == block_calls(int(size)), (name, size, count, calls)
        assert shim > 0 and direct > 0, (name, size, shim, direct)
        # Printed to 2 decimals (times) and 3 (ratio): compare within their rounding.
        lo, hi = (shim - 0.005) / (direct + 0.005), (shim + 0.005) / max(direct - 0.005, 1e-9)
        assert lo - 0.0005 <= ratio <= hi + 0.0005, (name, size, shim, direct, ratio)
        assert wrong == 0, (name, size, wrong)
    assert overhead_at == SIZES[0], (name, overhead_at)


def check_json(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["program"] == "nccl_shim_perf" and doc["nccl_version"] == 22809, doc
    cfg = doc["config"]
    assert cfg["nranks"] == P and cfg["nccl_mode"] == "loom" and cfg["iterations"] == 3, cfg
    assert doc["out_of_bounds"] == {"count": 0, "okay": True} and doc["errors"] == [], doc
    recs = doc["results"]
    assert [r["experiment_name"] for r in recs] == [n for n in NAMES for _ in SIZES], recs
    for r in recs:
        assert r["size"] in SIZES and r["count"] * 4 == r["size"] and r["nranks"] == P, r
        assert r["nwrong"] == 0 and r["shim_time"] > 0 and r["direct_time"] > 0, r
        assert abs(r["ratio"] - r["shim_time"] / r["direct_time"]) < 1e-4 * r["ratio"], r
        assert r["redop"] == ("sum" if r["experiment_name"] in ("AllReduce", "ReduceScatter")
                              else "none"), r
        assert r["root"] == (0 if r["experiment_name"] == "Broadcast" else -1), r
        assert isinstance(r["overhead_ns"], float), r


def main():
    loomrun, prog = sys.argv[1], sys.argv[2]
    quick = ["-b", "8", "-e", "4K", "-f", "16", "-n", "3", "-w", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "shim.json")
        text, _ = run(loomrun, prog, quick + ["-J", out])
        tables = parse_tables(text)
        assert list(tables) == NAMES, list(tables)
        for name, (rows, overhead_at) in tables.items():
            check_table(name, rows, overhead_at)
        assert "# Out of bounds values : 0 OK" in text, text
        check_json(out)

    text, _ = run(loomrun, prog, quick + ["-c", "sendrecv,Broadcast"])
    assert list(parse_tables(text)) == ["Broadcast", "SendRecv"], text

    text, _ = run(loomrun, prog, quick + ["-c", "allreduce"],
                  {"LOOM_NCCL_ROUTE": "coll=allreduce -> echo"}, want_ok=False)
    rows = parse_tables(text)["AllReduce"][0]
    assert len(rows) == len(SIZES) and any(r[6] > 0 for r in rows), text
    assert re.search(r"^# Out of bounds values : [1-9]\d* FAILED$", text, re.M), text

    _, err = run(loomrun, prog, quick, {"LOOM_NCCL_MODE": "route"}, want_ok=False)
    assert "LOOM_NCCL_MODE=route" in err and "HINT:" in err, err
    _, err = run(loomrun, prog, ["-c", "allreduce,gather"], want_ok=False)
    assert "unknown collective 'gather'" in err, err
    print("nccl_shim_perf: tables, JSON, -c and the failures as expected")


if __name__ == "__main__":
    main()
