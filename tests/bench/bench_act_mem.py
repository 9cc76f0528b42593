#!/usr/bin/python3
"""Activation memory of GPT-2 124M, measured (peak RSS) against what ztrain
reports, with and without activation recomputation.

    bench_act_mem.py [--ztrain build/ztrain] [--seqs 1024,2048]
                     [--micro-batch 1] [--precision fp32,bf16] [--json PATH]

A benchmark, not a test: it asserts nothing and is not registered with
ctest (each run trains one step of a 124M model at T = 2048).

ztrain allocates every buffer once, at start-up, and touches it there (the
CPU backend zeroes what it allocates), so a run's peak resident set is its
allocations plus the process's own (libraries, MPI, Lua): the latter is
measured as the peak RSS of the same script with a tiny model (2 blocks,
dim 64, T = 64) less that model's own reported buffers, and subtracted. What is left is compared with the figures
the run reports in its metrics line: model states (`state_bytes`: weights,
gradients, AdamW moments), ZeRO buffers (`buffer_bytes`) and activations
(`act_bytes`: every activation slot and the scratch of a pass, from the
same sizes that allocated them), and the backend scratch the GEMMs keep
(`scratch_bytes`: the 16-bit GEMMs' widened operands, 0 in fp32; 0 too
for a ztrain that does not report it). In 16-bit runs the states include
the 16-bit copy of the weights. "act measured" is the measured remainder
less the model states, buffers and scratch; the ratio to `act_bytes` is
what should be 1 (anything a step allocates outside the reported figures,
such as attention's per-call tiles or the BLAS's own buffers, shows up
as a ratio above 1). One process, one
OpenMP thread, one step (log_every = 0: no SGEMM probe). Peak RSS comes
from wait4's ru_maxrss of the ztrain process.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

MIB = 1 << 20


def run(ztrain, script, extra, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([ztrain, script, "--metrics", "m.jsonl"] + extra, cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"ztrain failed ({p.returncode}):\n{out}")
    rows = [json.loads(l) for l in open(os.path.join(cwd, "m.jsonl")) if '"step"' in l]
    return ru.ru_maxrss * 1024, rows[-1] if rows else {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ztrain", default="build/ztrain")
    ap.add_argument("--seqs", default="1024,2048")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--precision", default="fp32", help="comma-separated: fp32, bf16, fp16")
    ap.add_argument("--json")
    a = ap.parse_args()
    ztrain = os.path.abspath(a.ztrain)
    d = tempfile.mkdtemp(prefix="actmem")
    np.random.seed(0)
    np.random.randint(0, 50257, 200000).astype("<u2").tofile(os.path.join(d, "tok.bin"))

    def script(model, seq, recompute, precision="fp32"):
        path = os.path.join(d, "run.lua")
        with open(path, "w") as f:
            f.write(f"""local zt = require "ztrain"
model = {model}
train = {{micro_batch = {a.micro_batch}, steps = 1, log_every = 0, recompute = "{recompute}",
         precision = "{precision}"}}
data = {{train = "{d}/tok.bin", dtype = "u16", shuffle = false}}
""")
        return path

    tiny = "zt.gpt{vocab = 50257, seq = 64, dim = 64, layers = 2, heads = 2}"
    rss, m = run(ztrain, script(tiny, 64, "none"), [], d)
    base = rss - (m["state_bytes"] + m["buffer_bytes"] + m["act_bytes"] + m.get("scratch_bytes", 0))
    print(f"process baseline: {base / MIB:.0f} MiB (a tiny model's peak RSS {rss / MIB:.0f} MiB "
          f"less its reported buffers)")
    hdr = (f"{'precision':>9} {'seq':>5} {'recompute':>9} {'peak RSS':>9} {'states':>8} {'scratch':>8} "
           f"{'act reported':>12} {'act measured':>12} {'ratio':>6}")
    print(hdr + "   (MiB)")
    results = []
    for prec, seq in [(p, int(s)) for p in a.precision.split(",") for s in a.seqs.split(",")]:
        model = f"zt.gpt{{vocab = 50257, seq = {seq}, dim = 768, layers = 12, heads = 12}}"
        for rc in ("none", "full"):
            rss, m = run(ztrain, script(model, seq, rc, prec), [], d)
            states = m["state_bytes"] + m["buffer_bytes"]
            scratch = m.get("scratch_bytes", 0)
            measured = rss - base - states - scratch
            r = {"precision": prec, "seq": seq, "micro_batch": a.micro_batch, "recompute": rc, "peak_rss": rss,
                 "baseline_rss": base, "state_bytes": m["state_bytes"],
                 "buffer_bytes": m["buffer_bytes"], "scratch_bytes": scratch, "act_bytes": m["act_bytes"],
                 "act_measured": measured, "ratio": measured / m["act_bytes"]}
            results.append(r)
            print(f"{prec:>9} {seq:>5} {rc:>9} {rss / MIB:>9.0f} {states / MIB:>8.0f} {scratch / MIB:>8.0f} "
                  f"{m['act_bytes'] / MIB:>12.0f} {measured / MIB:>12.0f} {r['ratio']:>6.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
