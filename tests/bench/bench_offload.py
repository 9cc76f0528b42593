#!/usr/bin/env python3
"""bench_offload: step time with the optimizer states offloaded (moments on
"cpu" or "nvme", masters on the device) against the same model with
everything on the device, and how much of the offload's transfer time the
pipeline hides, in one run.

  flock /tmp/bench.lock python3 tests/bench/bench_offload.py \
      --ztrain build/ztrain [--dir /tmp] [--rounds 5] [--steps 8] [--dim 512] \
      [--layers 4] [--threads 1] [--zero 0]

Every round runs each placement once (device, cpu, nvme: one process, the
same script, bf16, --trace), in a rotating order. Step time is the median
over a run's steps after the first two (warm-up), and the table shows the
median over rounds with its min-max, and the ratio to the device
placement's median. Hidden transfer: the trace's "host pieces" slice is
the host's part of the optimizer step and its "host update" slices the
AdamW inside it; the difference is transfer time the host spent waiting
for or doing copies and file requests (exposed). Each offloaded placement
also runs with ZT_TEST_OFFLOAD_SERIAL=1, where the engine waits for every
chunk's transfers as soon as it starts them, so that difference is the
whole transfer time; hidden = 1 - exposed / whole. On the CPU backend the
device copies are memcpy done when issued (never hidden), so only the
nvme requests can be. With --zero 2 (ZeRO stage 2 on the one process: the
gradients reduced bucket by bucket) the host-updated gradients go down
during backward as each bucket is final (ZeRO-Offload's overlap): the
"grads down" column is the time backward spent issuing those copies, per
step, which the optimizer step no longer waits for. A benchmark, not a
test: it asserts nothing."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np


def run(a, work, place, serial=False):
    """One run; returns (median step ms after warm-up, waited ms per step,
    grads-down ms per step)."""
    tag = f"{place}{'-serial' if serial else ''}"
    met, tr = os.path.join(work, f"{tag}.jsonl"), os.path.join(work, f"{tag}.trace.json")
    pol = {"device": "", "cpu": "offload = {moments = 'cpu'}",
           "nvme": f"offload = {{dir = '{a.dir}', moments = 'nvme'}}"}[place]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if serial:
        env["ZT_TEST_OFFLOAD_SERIAL"] = "1"
    if a.zero:
        pol = f"parallel.zero = {a.zero}; " + pol
    out = subprocess.run([a.ztrain, os.path.join(work, "run.lua"), "-e", pol, "--metrics", met,
                          "--trace", tr], capture_output=True, text=True, env=env, cwd=work)
    if out.returncode:
        sys.exit(f"ztrain ({tag}) failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    ms = [json.loads(l)["ms"] for l in open(met) if '"loss"' in l][2:]
    ev = json.load(open(tr))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    off = [e for e in ev if e.get("cat") == "offload"]
    wait = (sum(e["dur"] for e in off if e["name"] == "host pieces")
            - sum(e["dur"] for e in off if e["name"] == "host update"))
    down = sum(e["dur"] for e in off if e["name"] == "grads down")
    steps = [e for e in ev if e.get("name") == "step" and e.get("ph") == "X"]
    n = max(len(steps), 1)
    return statistics.median(ms), wait / 1e3 / n, down / 1e3 / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ztrain", required=True)
    ap.add_argument("--dir", default="/tmp", help="offload.dir of the nvme runs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--zero", type=int, default=0, help="ZeRO stage (2: grads down in backward)")
    a = ap.parse_args()
    a.ztrain = os.path.abspath(a.ztrain)
    with tempfile.TemporaryDirectory() as work:
        np.random.seed(1)
        np.random.randint(0, 256, 200000).astype("<u2").tofile(os.path.join(work, "tok.bin"))
        with open(os.path.join(work, "run.lua"), "w") as f:
            f.write(f"""local zt = require "ztrain"
model = zt.gpt{{vocab = 256, seq = 64, dim = {a.dim}, layers = {a.layers}, heads = 8}}
train = {{micro_batch = 4, global_batch = 4, steps = {a.steps}, log_every = 0,
         precision = "bf16", lr = 1e-3}}
data = {{train = "{work}/tok.bin"}}
""")
        places = ["device", "cpu", "nvme"]
        ms = {p: [] for p in places}
        hidden = {p: [] for p in places[1:]}
        down = {p: [] for p in places[1:]}
        for r in range(a.rounds):
            for p in places[r % 3:] + places[:r % 3]:
                t, wait, d = run(a, work, p)
                ms[p].append(t)
                if p != "device":
                    _, whole, _ = run(a, work, p, serial=True)
                    hidden[p].append((wait, whole))
                    down[p].append(d)
    params = 12 * a.dim * a.dim * a.layers + 256 * a.dim + 64 * a.dim
    print(f"gpt dim {a.dim} x {a.layers} layers (~{params / 1e6:.1f}M params), bf16, micro_batch 4 "
          f"x seq 64, {a.threads} thread(s), ZeRO {a.zero}, {a.rounds} rounds, moments offloaded "
          f"({8 * params / 1e6:.0f} MB)\n")
    print("| moments on | step ms (median, min-max) | vs device | exposed transfer ms/step, pipelined | "
          "transfer ms/step, serial | transfer hidden | grads down in backward ms/step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    dev = statistics.median(ms["device"])
    for p in places:
        m = statistics.median(ms[p])
        row = f"| {p} | {m:.1f} ({min(ms[p]):.1f}-{max(ms[p]):.1f}) | {m / dev:.2f}x |"
        if p == "device":
            row += " - | - | - | - |"
        else:
            w = statistics.median(x for x, _ in hidden[p])
            s = statistics.median(y for _, y in hidden[p])
            row += f" {w:.2f} | {s:.2f} | {100 * (1 - w / s):.0f}% | {statistics.median(down[p]):.2f} |"
        print(row)


if __name__ == "__main__":
    main()
