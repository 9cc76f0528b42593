#!/usr/bin/env python3
"""bench_nvme: the NVMe engine's sequential write and read bandwidth
(parallel/nvme.h, both engines) against dd (oflag=direct, iflag=direct)
and fio (--direct=1, ioengine io_uring and psync) on the same file system,
same block and file size, in one run.

  flock /tmp/bench.lock python3 tests/bench/bench_nvme.py \
      --bench build/tests/bench_nvme [--dir /tmp] [--mib 1024] [--kib 1024] \
      [--depth 16] [--rounds 5]

Every round runs each tool once (a fresh file written, then read back,
then removed), the tools in a rotating order; prints a markdown table of
the medians (MB/s, 10^6 bytes; read+write with its min-max over the
rounds) and the ztrain/reference ratios of the medians. With O_DIRECT
the page cache is out of the way, so a file of 1 GiB measures the disk. Each tool times its own transfers (fio and dd
report theirs; bench_nvme times its passes, not the fallocate at open).
Without fio the fio rows are left out, and said so. A benchmark, not a
test: it asserts nothing."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys


def engine(a, eng, depth):
    def run(path):
        out = subprocess.run([a.bench, path, str(a.mib), str(a.kib), str(depth), eng],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"bench_nvme failed: {out.stderr.strip()}")
        m = re.match(r"write_s (\S+) read_s (\S+) engine (.*)", out.stdout)
        run.name = m.group(3)
        return float(m.group(1)), float(m.group(2))
    run.name = ""
    return run


def dd(a):
    def seconds(args):
        out = subprocess.run(["dd", f"bs={a.kib}K"] + args, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"dd failed: {out.stderr.strip()}")
        return float(re.search(r"copied, ([0-9.e+-]+) s", out.stderr).group(1))

    def run(path):
        w = seconds(["if=/dev/zero", f"of={path}", f"count={a.mib * 1024 // a.kib}",
                     "oflag=direct"])
        r = seconds([f"if={path}", "of=/dev/null", "iflag=direct"])
        return w, r
    return run


def fio(a, ioengine, depth):
    def seconds(path, rw):
        out = subprocess.run(["fio", "--name=bench", f"--filename={path}", f"--rw={rw}",
                              f"--bs={a.kib}k", f"--size={a.mib}m", "--direct=1",
                              f"--ioengine={ioengine}", f"--iodepth={depth}",
                              "--output-format=json"], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"fio failed: {out.stderr.strip()}")
        job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0][rw]
        return job["io_bytes"] / job["bw_bytes"]

    def run(path):
        return seconds(path, "write"), seconds(path, "read")
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", required=True, help="the bench_nvme binary")
    p.add_argument("--dir", default="/tmp", help="a directory on the file system to measure")
    p.add_argument("--mib", type=int, default=1024, help="file size (MiB)")
    p.add_argument("--kib", type=int, default=1024, help="block size (KiB)")
    p.add_argument("--depth", type=int, default=16, help="requests in flight (ztrain, fio io_uring)")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()

    d = a.depth
    tools = [(f"ztrain io_uring, depth {d}", engine(a, "uring", d)),
             (f"ztrain threads, depth {d}", engine(a, "threads", d)),
             ("ztrain io_uring, depth 1", engine(a, "uring", 1)),
             ("dd (depth 1)", dd(a))]
    if shutil.which("fio"):
        tools += [(f"fio io_uring, iodepth {d}", fio(a, "io_uring", d)),
                  ("fio psync (depth 1)", fio(a, "psync", 1))]
    else:
        print("fio not found (Debian: apt-get install fio): the fio rows are left out",
              file=sys.stderr)
    load0 = os.getloadavg()[0]
    path = os.path.join(a.dir, f"bench_nvme.{os.getpid()}.bin")
    times = {name: [] for name, _ in tools}
    for r in range(a.rounds):
        for k in range(len(tools)):
            name, run = tools[(k + r) % len(tools)]
            w, rd = run(path)
            if os.path.exists(path):
                os.unlink(path)
            times[name].append((w, rd))
            print(f"round {r} {name}: write {w:.3f} s read {rd:.3f} s", file=sys.stderr)

    mb = a.mib * 1048576 / 1e6
    med = {}
    for name, ts in times.items():
        rw = [2 * mb / (w + r) for w, r in ts]
        med[name] = (mb / statistics.median(w for w, _ in ts),
                     mb / statistics.median(r for _, r in ts),
                     statistics.median(rw), min(rw), max(rw))
    print(f"file {a.mib} MiB on {a.dir}, blocks of {a.kib} KiB, {a.rounds} rounds (medians); "
          f"load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after")
    for name, run in tools[:3]:
        print(f"{name}: {run.name}")
    if not shutil.which("fio"):
        print("fio not found: no fio rows")
    print()
    print("| tool | write MB/s | read MB/s | read+write MB/s | (min–max) |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in tools:
        w, r, rw, lo, hi = med[name]
        print(f"| {name} | {w:.0f} | {r:.0f} | {rw:.0f} | {lo:.0f}–{hi:.0f} |")
    refs = [name for name, _ in tools[3:]]
    print()
    print("| ztrain / reference (read+write) | " + " | ".join(refs) + " |")
    print("|---|" + "---:|" * len(refs))
    for name, _ in tools[:3]:
        print(f"| {name} | " + " | ".join(f"{med[name][2] / med[ref][2]:.2f}" for ref in refs)
              + " |")


if __name__ == "__main__":
    main()
