#!/usr/bin/env python3
"""Checkpoint save and load throughput: ztrain against torch.save/torch.load
and PyTorch DCP (torch.distributed.checkpoint with FSDP2 over gloo), next to
dd with fsync on the same disk. A benchmark, not a test (never run in CI).

    python3 tests/bench/bench_ckpt.py [--ztrain build/ztrain[,OLD/ztrain]]
        [--ranks 1,2,8] [--dcp-ranks 1,2] [--repeats 3]
        [--torch-python /tmp/t2/bin/python] [--dir DIR] [--json out.json]

The model is GPT-2 124M (tied head, vocab 50304, seq 64) with AdamW state:
1.49 GB of weights, exp_avg and exp_avg_sq whichever system writes them.
ztrain runs ZeRO-3 over `ranks` processes (mpirun, every rank writes its
part of the one file); DCP runs FSDP2 over as many processes (torchrun,
one file per rank); torch.save/torch.load run in one process. Threads:
the machine's cores shared evenly among the ranks, for both.

Each repeat waits 30 s, then measures dd (1.5 GB, bs 16M, conv=fsync)
twice, "cold" and right after it "warm" (see below), and once with
oflag=direct (the disk without the page cache); then, for each rank
count, every system in an order that rotates between repeats: a save in a
fresh process, the page cache dropped, a load in a fresh process. Every
system's time is its own call as seen from inside (ztrain's log line, the
DCP call between barriers, torch.save plus fsync), and MB/s is the size
on disk over that time. Medians over the repeats; the load average is
printed before and after.

On a VM whose freed memory goes back to the host (virtio balloon free page
reporting), filling the page cache with pages unused for a few seconds
costs a host page fault per page: a 1.5 GB buffered write then takes 3-5
s instead of 0.4 s, before any disk I/O. A save in a real run meets such
memory (it starts long after the last file was deleted), so "cold" is the
dd a save is compared with; "warm" is printed for reference.
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GIB16 = 16 << 20
DD_COUNT = 90  # 1.5 GB in 16 MiB blocks

LUA = """local zt = require "ztrain"
model = zt.gpt{vocab = 50304, seq = 64, dim = 768, layers = 12, heads = 12}
train = {micro_batch = 4, global_batch = 32, steps = 0, log_every = 0}
data = {train = "tok.bin"}
parallel = {zero = 3}
"""


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def drop_caches() -> bool:
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run(cmd, env, cwd, timeout=1800) -> str:
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if p.returncode:
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p.stdout


def dd(path: str, direct: bool) -> float:
    """MB/s of a 1.5 GB sequential write with fsync."""
    cmd = ["dd", "if=/dev/zero", "of=" + path, "bs=16M", "count=%d" % DD_COUNT, "conv=fsync"]
    if direct:
        cmd.append("oflag=direct")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    os.unlink(path)
    return DD_COUNT * GIB16 / dt / 1e6


class Ztrain:
    def __init__(self, binary: str, label: str):
        self.binary, self.label = binary, label

    def measure(self, ranks, work, env):
        ck = os.path.join(work, "c.h5")
        out = {}
        for mode in ("save", "load"):
            if mode == "load" and not drop_caches():
                print("note: cannot drop the page cache (not root?): loads may read from memory")
            text = run(["mpirun", "--bind-to", "none", "-np", str(ranks), self.binary, "m.lua",
                        "--" + mode, ck], env, work)
            m = re.search(r"checkpoint \S+ (?:written|loaded): ([\d.]+) MB in ([\d.]+) s", text)
            if not m:
                sys.exit("FAIL: no checkpoint line from %s:\n%s" % (self.binary, text[-2000:]))
            out[mode] = float(m.group(1)) / float(m.group(2))
        os.unlink(ck)
        return out


class Torch:
    def __init__(self, python: str, dcp: bool):
        self.python, self.dcp = python, dcp
        self.label = "PyTorch DCP (FSDP2)" if dcp else "torch.save/load"

    def measure(self, ranks, work, env):
        target = os.path.join(work, "torch_ck")
        os.makedirs(target, exist_ok=True)
        out = {}
        for mode in ("save", "load"):
            if mode == "load":
                drop_caches()
            args = [os.path.join(HERE, "torch_ckpt.py"), mode, target,
                    "--threads", str(max(1, (os.cpu_count() or 1) // ranks))]
            if self.dcp:
                cmd = [self.python, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node", str(ranks)] + args + ["--dcp"]
            else:
                cmd = [self.python] + args
            text = run(cmd, env, work)
            line = [l for l in text.splitlines() if l.startswith("{")]
            if not line:
                sys.exit("FAIL: no result from %s:\n%s" % (" ".join(cmd), text[-2000:]))
            r = json.loads(line[-1])
            out[mode] = r["bytes"] / r["seconds"] / 1e6
        shutil.rmtree(target)
        return out


def machine(work: str, torch_python: str) -> dict:
    info = {"kernel": platform.release(), "cores": os.cpu_count()}
    with open("/proc/cpuinfo") as f:
        info["cpu"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    with open("/proc/meminfo") as f:
        info["memory_gb"] = round(int(f.readline().split()[1]) / 1e6, 1)
    df = subprocess.run(["df", "-T", work], stdout=subprocess.PIPE, text=True).stdout.splitlines()
    info["filesystem"] = " ".join(df[-1].split()[:2]) if len(df) > 1 else "?"
    mpi = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE, text=True).stdout
    info["mpi"] = mpi.splitlines()[0] if mpi else "?"
    t = subprocess.run([torch_python, "-c", "import torch; print(torch.__version__)"],
                       stdout=subprocess.PIPE, text=True)
    info["torch"] = t.stdout.strip() or "?"
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ztrain", default="build/ztrain",
                   help="binary, or several comma-separated (measured interleaved)")
    p.add_argument("--ranks", default="1,2,8", help="rank counts for ztrain")
    p.add_argument("--dcp-ranks", default="1,2", help="rank counts for DCP (empty: none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-python", default="/tmp/t2/bin/python",
                   help="a Python with PyTorch 2.x (FSDP2, DCP); empty: no PyTorch")
    p.add_argument("--dir", help="where files go (default: a new folder under $TMPDIR)")
    p.add_argument("--json", help="write every run and the medians here")
    p.add_argument("--idle", type=float, default=30, help="seconds of idle before each dd")
    args = p.parse_args()

    bins = [os.path.realpath(b) for b in args.ztrain.split(",")]
    ranks = [int(r) for r in args.ranks.split(",") if r]
    dcp_ranks = [int(r) for r in args.dcp_ranks.split(",") if r] if args.torch_python else []
    work = args.dir or tempfile.mkdtemp(prefix="bench_ckpt.", dir=os.environ.get("TMPDIR", "/tmp"))
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "m.lua"), "w") as f:
        f.write(LUA)
    import array
    import random
    random.seed(0)
    with open(os.path.join(work, "tok.bin"), "wb") as f:
        array.array("H", [random.randrange(50304) for _ in range(20000)]).tofile(f)

    info = machine(work, args.torch_python) if args.torch_python else machine(work, sys.executable)
    print("machine: " + json.dumps(info))
    print("start %s, load average %s" % (time.strftime("%FT%TZ", time.gmtime()), load_average()),
          flush=True)

    zts = [Ztrain(b, b if len(bins) > 1 else "ztrain") for b in bins]
    systems = {n: list(zts) for n in sorted(set(ranks) | set(dcp_ranks))}
    for n in systems:
        if n not in ranks:
            systems[n] = []
        if n in dcp_ranks:
            systems[n].append(Torch(args.torch_python, True))
        if n == 1 and args.torch_python:
            systems[n].append(Torch(args.torch_python, False))
    runs = []
    for rep in range(args.repeats):
        time.sleep(args.idle)
        for kind, direct in (("dd cold", False), ("dd warm", False), ("dd O_DIRECT", True)):
            v = dd(os.path.join(work, "dd.bin"), direct)
            runs.append({"repeat": rep, "what": kind, "ranks": 1, "save": v})
            print("run %d %-40s save %7.0f MB/s" % (rep, kind, v), flush=True)
        for n, syss in systems.items():
            order = syss[rep % len(syss):] + syss[:rep % len(syss)] if syss else []
            for s in order:
                env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_WAIT_POLICY="PASSIVE",
                           OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // n)))
                r = s.measure(n, work, env)
                runs.append({"repeat": rep, "what": s.label, "ranks": n, **r})
                print("run %d %-40s save %7.0f MB/s  load %7.0f MB/s" %
                      (rep, "%s, %d rank%s" % (s.label, n, "s" if n > 1 else ""), r["save"],
                       r["load"]), flush=True)
    print("end %s, load average %s" % (time.strftime("%FT%TZ", time.gmtime()), load_average()))

    def med(what, n, key):
        v = [r[key] for r in runs if r["what"] == what and r["ranks"] == n and key in r]
        return (statistics.median(v), min(v), max(v)) if v else None

    print("\n| ranks | system | save MB/s | load MB/s | save / DCP | load / DCP |")
    print("|---:|---|---:|---:|---:|---:|")
    for kind in ("dd cold", "dd warm", "dd O_DIRECT"):
        m = med(kind, 1, "save")
        print("| | %s, 1.5 GB with fsync | %.0f (%.0f-%.0f) | | | |" % (kind, *m))
    summary = []
    for n, syss in systems.items():
        dcp = {k: med("PyTorch DCP (FSDP2)", n, k) for k in ("save", "load")}
        for s in syss:
            sv, ld = med(s.label, n, "save"), med(s.label, n, "load")
            rel = ["%.2f" % (x[0] / dcp[k][0]) if dcp[k] and s.label != "PyTorch DCP (FSDP2)"
                   else "" for x, k in ((sv, "save"), (ld, "load"))]
            print("| %d | %s | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %s | %s |" %
                  (n, s.label, *sv, *ld, *rel))
            summary.append({"ranks": n, "system": s.label, "save_mbps": sv[0], "load_mbps": ld[0]})
    print("(medians of %d repeats, min-max in brackets)" % args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "runs": runs, "medians": summary}, f, indent=1)
    if not args.dir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
