#!/usr/bin/python3
"""The attention kernels alone (tests/bench/bench_attn.c), this build
against another one, interleaved.

    bench_attn.py [--bench build/tests/bench_attn] [--before OLD/tests/bench_attn]
                  [--rounds 5] [--threads 2] [--json PATH]

A benchmark, not a test: it asserts nothing and is not registered with
ctest. Shapes: GPT-2 124M's (B 4, 12 heads of 64) at T = 1024 and 256.
Each round runs every binary once per shape, in an order that rotates;
each run reports the median of 5 calls of attn_fwd and of attn_bwd, and
the tables show the median over rounds. The machine is shared: the load
average is printed before and after; run it under `flock /tmp/bench.lock`
where others benchmark on the same machine.
"""

import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(4, 1024, 12, 12, 64), (4, 256, 12, 12, 64)]


def run(binary, shape, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, *map(str, shape), "5"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "..", "build", "tests", "bench_attn"))
    ap.add_argument("--before")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    sides = {"this build": a.bench}
    if a.before:
        sides["before"] = a.before
    names = list(sides)
    load0 = os.getloadavg()[0]
    raw = {(n, s): [] for n in names for s in SHAPES}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for s in SHAPES:
            for n in order:
                raw[(n, s)].append(run(sides[n], s, a.threads))
    load1 = os.getloadavg()[0]
    print(f"{a.threads} threads, medians of {a.rounds} rounds, load average {load0:.1f} -> {load1:.1f}\n")
    print("| shape | build | forward (ms) | backward (ms) | saved for backward (MiB) |")
    print("|---|---|---:|---:|---:|")
    for s in SHAPES:
        for n in names:
            runs = raw[(n, s)]
            f = statistics.median(x["fwd_median"] for x in runs) * 1e3
            b = statistics.median(x["bwd_median"] for x in runs) * 1e3
            print(f"| B{s[0]} T{s[1]} H{s[2]} hd{s[4]} | {n} | {f:.1f} | {b:.1f} | "
                  f"{runs[0]['saved_bytes'] / 2**20:.2f} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"load": [load0, load1], "threads": a.threads,
                       "runs": [{"build": n, "shape": s, "results": raw[(n, s)]}
                                for (n, s) in raw]}, fh, indent=1)


if __name__ == "__main__":
    main()
