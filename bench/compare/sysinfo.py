# SPDX-License-Identifier: Apache-2.0
#
# sysinfo.py - what bench/compare records about the machine (CPU model, cores,
# caches, memory, kernel, load, package versions, loom's commit) and the two
# limits it measures in the same run with bench/peers' memcpy_bw and tcp_bw.
# It reads /proc, /sys, dpkg, pip's records and git; it runs no collective.
import glob
import json
import os
import platform
import subprocess
import tempfile

PACKAGES = ["openmpi-bin", "libopenmpi-dev", "mpich", "libmpich-dev", "python3-torch",
            "python3-matplotlib", "gcc", "meson"]


def _first(path, prefix):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cmd(args, cwd=None):
    try:
        r = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=60)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine():
    mem_kb = _first("/proc/meminfo", "MemTotal")
    os_name = None
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {
        "cpu_model": _first("/proc/cpuinfo", "model name"),
        "cpus_online": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(int(mem_kb.split()[0]) / (1 << 20), 1) if mem_kb else None,
        "kernel": platform.release(),
        "os": os_name,
        "hostname": platform.node(),
        "packages": cpu_packages(),
        "caches": caches(),
    }


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_packages():
    """How many CPU packages (sockets) the online CPUs sit in."""
    ids = {_read(p) for p in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/"
                                       "physical_package_id")}
    ids.discard(None)
    return len(ids) or None


def caches(cpu_dir="/sys/devices/system/cpu/cpu0/cache"):
    """CPU 0's data and unified caches: [{"level", "type", "size", "shared_cpus"}]
    (size as the kernel writes it, e.g. 2048K; shared_cpus: the CPUs that share
    it, so an L3 shared by every CPU of a package is the package's L3)."""
    out = []
    for d in sorted(glob.glob(os.path.join(cpu_dir, "index[0-9]*"))):
        kind = _read(os.path.join(d, "type"))
        if kind == "Instruction":
            continue
        out.append({"level": int(_read(os.path.join(d, "level")) or 0), "type": kind,
                    "size": _read(os.path.join(d, "size")),
                    "shared_cpus": _read(os.path.join(d, "shared_cpu_list"))})
    return out


def machine_text(m):
    """One line: CPU model, CPUs, packages and caches."""
    cache = ", ".join(f"L{c['level']} {c['size']} (CPUs {c['shared_cpus']})"
                      for c in m.get("caches") or [] if c["level"] >= 2)
    return (f"{m.get('cpu_model')}, {m.get('cpus_usable')} usable of {m.get('cpus_online')} "
            f"CPUs, {m.get('packages')} package(s), {cache or 'caches unknown'}, "
            f"{m.get('memory_gib')} GiB")


def load():
    """1, 5 and 15 minute load averages: how busy the machine was."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def packages(impi_prefix=None):
    """Debian packages' versions and, from pip's records in impi_prefix, Intel MPI's."""
    out = {}
    for p in PACKAGES:
        v = _cmd(["dpkg-query", "-W", "-f", "${Version}", p])
        out[p] = v or None
    if impi_prefix:
        for name in ("impi_rt", "impi_devel"):
            found = glob.glob(os.path.join(impi_prefix, "lib", "python3*", "site-packages",
                                           f"{name}-*.dist-info"))
            out[name.replace("_", "-")] = (os.path.basename(found[0])[len(name) + 1:
                                                                     -len(".dist-info")]
                                           if found else None)
    return out


def loom_source(root):
    commit = _cmd(["git", "rev-parse", "HEAD"], cwd=root)
    dirty = _cmd(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {"commit": commit, "modified": bool(dirty) if dirty is not None else None}


def limits(build, timeout_s, quick):
    """memcpy bandwidth (1 and 2 threads, 128 MiB) and TCP loopback throughput
    (one socket pair, one way and both ways), or the error of either."""
    peers = os.path.join(build, "bench", "peers")
    out = {}
    runs = {
        "memcpy": [os.path.join(peers, "memcpy_bw"), "-s", "128M", "-t", "1,2", "-r",
                   "3" if quick else "5"],
        "tcp": [os.path.join(peers, "tcp_bw"), "-s", "256M" if quick else "1G", "-r",
                "2" if quick else "3"],
    }
    for name, cmd in runs.items():
        fd, js = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            r = subprocess.run(cmd + ["-J", js], capture_output=True, text=True,
                               timeout=timeout_s)
            if r.returncode != 0:
                out[name] = {"error": (r.stderr or r.stdout).strip()[-500:]}
            else:
                with open(js) as f:
                    out[name] = json.load(f)
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            out[name] = {"error": str(e)}
        finally:
            os.unlink(js)
    return out


def memory_mbps(lim, nranks):
    """MB/s of memcpy with as many threads as nranks ranks keep busy (the usable CPUs at most),
    or the nearest thread count measured: what loom's LOOM_SHM_MEMORY_MBPS asks for. None
    where memcpy was not measured."""
    runs = (lim.get("memcpy") or {}).get("results", [])
    if not runs:
        return None
    want = max(1, min(nranks, len(os.sched_getaffinity(0))))
    best = min(runs, key=lambda r: (abs(r["threads"] - want), -r["threads"]))
    return int(best["median_gbps"] * 1000)


def limits_text(lim):
    """One line per limit, for the report."""
    lines = []
    m = lim.get("memcpy", {})
    if "results" in m:
        parts = [f"{r['threads']} thread{'s' if r['threads'] > 1 else ''} "
                 f"{r['median_gbps']:.2f} GB/s (best {r['best_gbps']:.2f})" for r in m["results"]]
        lines.append("memcpy 128 MiB per thread: " + ", ".join(parts))
    else:
        lines.append(f"memcpy: failed: {m.get('error')}")
    t = lim.get("tcp", {})
    if "one_way" in t:
        lines.append(f"tcp loopback, one socket pair: one way {t['one_way']['median_gbps']:.2f} "
                     f"GB/s (best {t['one_way']['best_gbps']:.2f}), both ways at once "
                     f"{t['both_ways']['median_gbps']:.2f} GB/s in sum "
                     f"(best {t['both_ways']['best_gbps']:.2f})")
    else:
        lines.append(f"tcp: failed: {t.get('error')}")
    return lines


def properties(m, lim, probe):
    """What every result carries about the machine, measured: CPU model,
    packages, caches, memcpy and TCP loopback rates (medians, GB/s) and loom's
    own probe lines."""
    runs = (lim.get("memcpy") or {}).get("results", [])
    mem = {str(r["threads"]): r["median_gbps"] for r in runs}
    tcp = lim.get("tcp") or {}
    return {"cpu_model": m.get("cpu_model"), "packages": m.get("packages"),
            "caches": m.get("caches"), "memcpy_gbps_by_threads": mem,
            "tcp_loopback_gbps": {k: tcp[k]["median_gbps"] for k in ("one_way", "both_ways")
                                  if k in tcp},
            "loom_probe": [p["line"] for p in probe]}
