#!/usr/bin/python3
"""Host AdamW (the offload engine's optimizer step): ztrain's CPU AdamW
against PyTorch's fused CPU AdamW and against the memory bandwidth a
STREAM triad reaches in the same run.

    bench_host_adamw.py [--build build] [--python /tmp/t2/bin/python]
                        [--n-mi 64] [--rounds 5] [--repeats 5] [--threads T]
                        [--json PATH]

Each round runs build/tests/bench_host_adamw (ztrain's AdamW through the
backend table, with and without the bf16 copy, and the triad) and
torch_host_adamw.py (AdamW(fused=True), the same plus a bf16 copy,
AdamW(foreach=True)) on the same N_MI Mi fp32 elements, in fresh
processes, in an order that alternates each round; each process times
--repeats calls of each kernel after an untimed one. The figure per kernel
is the median over all rounds' calls. Threads: --threads, else
OMP_NUM_THREADS, else the cores in this process's affinity (what ztrain's
trainer picks for one rank per node); both sides get the same.

Bytes per element, as STREAM counts them (the arrays the loop names):
AdamW 28 (reads p, g, m, v, writes p, m, v), 30 with a bf16 copy written in
the same pass; torch's fused step plus its separate bf16 copy 34; the
triad 12. The fraction of bandwidth is GB/s over the triad's GB/s. The
triad writes a line it has not read, which costs the CPU a read of that
line first, so its counted 12 bytes are 16 moved and an in-place kernel
such as AdamW can pass 100% of it; the table says both. "same traffic as
AdamW" (in the C process) reads and writes what AdamW does with a
multiply-add for arithmetic: the bandwidth AdamW's own access pattern
reaches, its real ceiling. The best call of each kernel is printed too:
on a shared machine it is the one least disturbed by other load.

Prints a Markdown table and the ratios; --json also writes every raw
number. A benchmark, not a test: it asserts nothing."""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# kernel -> (side, bytes per element)
KERNELS = {
    "ztrain adamw": ("ztrain", "adamw", 28),
    "ztrain adamw + bf16 copy": ("ztrain", "adamw_bf16", 30),
    "torch fused": ("torch", "fused", 28),
    "torch fused + bf16 copy": ("torch", "fused_bf16", 34),
    "torch foreach": ("torch", "foreach", 28),
    "triad a = b + s*c": ("ztrain", "triad", 12),
    "same traffic as AdamW": ("ztrain", "traffic", 28),
}


def run(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench_host_adamw.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--python", default="/tmp/t2/bin/python")
    ap.add_argument("--n-mi", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json")
    a = ap.parse_args()
    threads = a.threads or int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    zbin = os.path.join(a.build, "tests", "bench_host_adamw")
    bad = [f"{k} {v}" for k, v in (("--n-mi", a.n_mi), ("--rounds", a.rounds),
                                   ("--repeats", a.repeats), ("threads", threads)) if v < 1]
    if bad or not os.access(zbin, os.X_OK) or not os.access(a.python, os.X_OK):
        print(f"bench_host_adamw.py: {', '.join(bad) or 'missing programs'}: want every count "
              f">= 1, {zbin} built (cmake --build {a.build} --target bench_host_adamw) and "
              f"--python {a.python} a PyTorch 2.x interpreter", file=sys.stderr)
        sys.exit(2)
    zcmd = [zbin, str(a.n_mi), str(a.repeats)]
    tcmd = [a.python, os.path.join(HERE, "torch_host_adamw.py"), "--n-mi", str(a.n_mi),
            "--repeats", str(a.repeats)]
    raw = {"ztrain": [], "torch": []}
    for r in range(a.rounds):
        for side in (("ztrain", "torch") if r % 2 == 0 else ("torch", "ztrain")):
            raw[side].append(run(zcmd if side == "ztrain" else tcmd, env))
    t = raw["torch"][0]
    n = raw["ztrain"][0]["n"]
    bad = [d["nonfinite"] for s in raw.values() for d in s if d["nonfinite"]]
    med = {k: statistics.median(x for d in raw[side] for x in d[key + "_s"])
           for k, (side, key, _) in KERNELS.items()}
    best = {k: min(x for d in raw[side] for x in d[key + "_s"])
            for k, (side, key, _) in KERNELS.items()}
    gbs = {k: n * KERNELS[k][2] / med[k] / 1e9 for k in KERNELS}
    triad = gbs["triad a = b + s*c"]

    print(f"n = {n} fp32 elements ({a.n_mi} Mi), {threads} threads, {a.rounds} rounds x "
          f"{a.repeats} calls; torch {t['torch']} ({t['cpu_capability']}, "
          f"{t['threads']} threads)")
    fused_ran = t["fused_flag"] and "aten::_fused_adamw_" in t["fused_ops"]
    print(f"torch fused=True: flag {t['fused_flag']}, "
          f"{'aten::_fused_adamw_ ran' if fused_ran else 'WARNING: aten::_fused_adamw_ NOT called'}; "
          f"foreach=True ops: {', '.join(o for o in t['foreach_ops'] if 'foreach' in o)}")
    if bad:
        print(f"WARNING: non-finite weights counted: {bad}")
    print()
    print("| kernel | median s | Gelem/s | bytes/elem | GB/s | of triad GB/s | best call Gelem/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k in KERNELS:
        print(f"| {k} | {med[k]:.4f} | {n / med[k] / 1e9:.3f} | {KERNELS[k][2]} | {gbs[k]:.1f} "
              f"| {100 * gbs[k] / triad:.0f}% | {n / best[k] / 1e9:.3f} |")
    print()
    print(f"triad counting its write-allocate reads (16 B/elem): {triad * 16 / 12:.1f} GB/s; "
          f"ztrain adamw is {100 * gbs['ztrain adamw'] / (triad * 16 / 12):.0f}% of that and "
          f"{100 * gbs['ztrain adamw'] / gbs['same traffic as AdamW']:.0f}% of the same traffic's")
    fz, fb = med["torch fused"] / med["ztrain adamw"], \
        med["torch fused + bf16 copy"] / med["ztrain adamw + bf16 copy"]
    print(f"ztrain / torch fused (elements/s): {fz:.2f}x; with the bf16 copy: {fb:.2f}x; "
          f"ztrain / torch foreach: {med['torch foreach'] / med['ztrain adamw']:.2f}x")
    print(f"best calls (the least disturbed by other load): ztrain / torch fused "
          f"{best['torch fused'] / best['ztrain adamw']:.2f}x; with the bf16 copy "
          f"{best['torch fused + bf16 copy'] / best['ztrain adamw + bf16 copy']:.2f}x")
    per_round = [statistics.median(t["fused_s"]) / statistics.median(z["adamw_s"])
                 for z, t in zip(raw["ztrain"], raw["torch"])]
    print("per round (each side's median): ztrain / torch fused "
          + ", ".join(f"{x:.2f}" for x in per_round))
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"threads": threads, "n": n, "medians": med, "raw": raw}, f)
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
