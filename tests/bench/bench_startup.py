#!/usr/bin/python3
"""Start-up time of a GPT-2 124M run to its first step, ztrain against PyTorch 2.x,
and weight initialisation alone in elements/s.

    bench_startup.py [--repeats 3] [--ztrain build/ztrain]
                     [--bench-init build/tests/bench_init]
                     [--torch-python /tmp/t2/bin/python] [--no-torch]
                     [--before OLD_ZTRAIN,OLD_BENCH_INIT] [--json PATH]

A benchmark, not a test: it asserts nothing and is not registered with
ctest; never run it in CI (it wants PyTorch 2.x from PyPI in a venv).

Start-up, per fresh process (wall clock from the spawn, read off the
stdout lines as they arrive):
  ready       spawn -> ztrain's banner, printed just before the first step
              (everything a run does before training: MPI, Lua, allocation,
              initialisation, ZeRO, the SGEMM probe); PyTorch: import, the
              model built with its default init, AdamW created
  first step  spawn -> the end of the first optimizer step (ztrain's
              "step 1/1" line); PyTorch: forward, loss, backward,
              clip_grad_norm_, AdamW's step on one batch; this includes
              what each side defers to the first step (PyTorch allocates
              gradients and AdamW's moments there, ztrain up front)
ztrain runs `ztrain bench.lua --steps 1` as a user would (default
log_every, so the SGEMM probe runs): one process with 2 OpenMP threads,
and 2 ranks under mpirun (dp 2, ZeRO-0 and ZeRO-3, 1 thread each).
PyTorch (tests/ref/ztorch.py's GPT, the model ztrain is checked against)
runs with torch.set_num_threads(2).

Init alone: bench_init (tests/bench/bench_init.c: zt_model_init_weights on
the 124M model, 2 threads) against torch.nn.init.normal_(std=0.02) on a
tensor of the same number of elements (touched beforehand, 2 threads):
median of 3 calls (ztrain) or 5 (PyTorch) in one process each.

Everything is interleaved: each repeat runs every side once, in an order
that rotates. Figures are medians over --repeats. The machine is shared:
the load average is printed before and after. Run it under
`flock /tmp/bench.lock` where others benchmark on the same machine.
--before OLD_ZTRAIN,OLD_BENCH_INIT adds the same measurements of another
build (e.g. the commit before a change), interleaved with the rest.

Prints Markdown tables; --json PATH also writes every raw number.
"""

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

SHAPE = dict(vocab=50304, seq=64, dim=768, layers=12, heads=12, micro_batch=4)
THREADS = 2
RUN_TIMEOUT_S = 600

ZTRAIN_SCRIPT = """\
local zt = require "ztrain"
model = zt.gpt{{vocab={vocab}, seq={seq}, dim={dim}, layers={layers}, heads={heads}}}
train = {{micro_batch={micro_batch}, global_batch={global_batch}, steps=1,
         lr=3e-4, weight_decay=0.1, betas={{0.9, 0.95}}, clip=1.0}}
data = {{train="{data}", shuffle=false}}
parallel = {{zero = {zero}}}
"""

# The PyTorch side, run by the venv's interpreter; prints one JSON line of
# time.time() stamps (the parent compares them with its spawn time).
TORCH_STARTUP = """\
import time, json, sys, os
sys.path.insert(0, {ref!r})
import torch
import torch.nn.functional as F
t_import = time.time()
torch.set_num_threads({threads})
torch.manual_seed(0)
import ztorch
s = {shape!r}
model = ztorch.build_model(dict(kind="gpt", vocab=s["vocab"], seq=s["seq"], dim=s["dim"],
    layers=s["layers"], heads=s["heads"], kv_heads=s["heads"], ffn_dim=4 * s["dim"],
    norm_eps=1e-5, rope_theta=10000.0, tied=True))  # PyTorch's default init
t_model = time.time()
opt = ztorch.make_optimizer(model, dict(weight_decay=0.1, betas=[0.9, 0.95], eps=1e-8))
for g in opt.param_groups:
    g["lr"] = 3e-4
t_ready = time.time()
B, T, V = s["micro_batch"], s["seq"], s["vocab"]
x = torch.randint(0, V, (B, T + 1))
logits = model(x[:, :-1])
loss = F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
opt.step()
opt.zero_grad(set_to_none=True)
t_step = time.time()
print(json.dumps(dict(import_=t_import, model=t_model, ready=t_ready, step=t_step,
                      loss=float(loss), version=torch.__version__)))
"""

TORCH_INIT = """\
import time, json, statistics, torch
torch.set_num_threads({threads})
x = torch.empty({numel}, dtype=torch.float32)
x.zero_()  # first touch outside the timing, as bench_init's buffers
s = []
for _ in range(5):
    t0 = time.perf_counter(); torch.nn.init.normal_(x, 0.0, 0.02); s.append(time.perf_counter() - t0)
m = statistics.median(s)
print(json.dumps(dict(numel={numel}, s=s, s_median=m, elements_per_s={numel} / m)))
"""


def env_with(**kv):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in kv.items()})
    return env


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def timed_lines(cmd, env, cwd, marks):
    """Runs cmd; returns {mark: seconds from the spawn to the first stdout line
    starting with that prefix}, plus "exit" and the lines."""
    t0 = time.perf_counter()
    err = tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True,
                         bufsize=1)
    seen, lines = {}, []
    deadline = t0 + RUN_TIMEOUT_S
    for line in p.stdout:
        now = time.perf_counter() - t0
        lines.append(line.rstrip("\n"))
        for name, prefix in marks.items():
            if name not in seen and line.startswith(prefix):
                seen[name] = now
        if time.perf_counter() > deadline:
            p.kill()
            break
    rc = p.wait()
    seen["exit"] = time.perf_counter() - t0
    if rc != 0 or len(seen) != len(marks) + 1:
        err.seek(0)
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}, marks {seen}:\n"
                           + "\n".join(lines[-20:]) + "\n" + err.read().decode()[-4000:])
    return seen, lines


def run_ztrain(ztrain, np_, zero, data, workdir):
    script = os.path.join(workdir, f"startup_np{np_}_z{zero}.lua")
    with open(script, "w") as f:
        f.write(ZTRAIN_SCRIPT.format(data=data, zero=zero, global_batch=SHAPE["micro_batch"] * np_,
                                     **SHAPE))
    if np_ == 1:
        cmd = [ztrain, script, "--steps", "1"]
        env = env_with(OMP_NUM_THREADS=THREADS, OMP_WAIT_POLICY="PASSIVE")
    else:
        cmd = ["mpirun", "--bind-to", "none", "-np", str(np_), ztrain, script, "--steps", "1"]
        env = env_with(OMP_NUM_THREADS=1, OMP_WAIT_POLICY="PASSIVE",
                       OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,
                       OMPI_MCA_rmaps_base_oversubscribe=1)
    seen, lines = timed_lines(cmd, env, workdir, {"ready": "ztrain ", "step": "step 1/"})
    step_ms = next(float(m.group(1)) for l in lines if l.startswith("step 1/")
                   for m in [re.search(r"\| ([0-9.]+) ms \|", l)] if m)
    return {"ready_s": seen["ready"], "first_step_s": seen["step"], "exit_s": seen["exit"],
            "step_ms": step_ms, "banner": [l for l in lines if l.startswith("ztrain ")][0]}


def run_torch(python):
    code = TORCH_STARTUP.format(ref=os.path.join(REPO, "tests", "ref"), threads=THREADS,
                                shape=SHAPE)
    t_spawn = time.time()
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                         env=env_with(OMP_NUM_THREADS=THREADS, OMP_WAIT_POLICY="PASSIVE"))
    t_exit = time.time()
    if res.returncode != 0:
        raise RuntimeError(f"torch start-up exited {res.returncode}:\n{res.stderr[-4000:]}")
    r = json.loads(res.stdout.strip().splitlines()[-1])
    return {"import_s": r["import_"] - t_spawn, "model_s": r["model"] - t_spawn,
            "ready_s": r["ready"] - t_spawn, "first_step_s": r["step"] - t_spawn,
            "exit_s": t_exit - t_spawn, "step_ms": 1e3 * (r["step"] - r["ready"]),
            "version": r["version"]}


def run_json(cmd, env):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_init_ztrain(bench_init):
    s = SHAPE
    return run_json([bench_init, str(s["vocab"]), str(s["seq"]), str(s["dim"]), str(s["layers"]),
                     str(s["heads"]), "3"], env_with(OMP_NUM_THREADS=THREADS, OMP_WAIT_POLICY="PASSIVE"))


def run_init_torch(python, numel):
    return run_json([python, "-c", TORCH_INIT.format(threads=THREADS, numel=numel)],
                    env_with(OMP_NUM_THREADS=THREADS, OMP_WAIT_POLICY="PASSIVE"))


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ztrain", default=os.path.join(REPO, "build", "ztrain"))
    p.add_argument("--bench-init", default=os.path.join(REPO, "build", "tests", "bench_init"))
    p.add_argument("--torch-python", default="/tmp/t2/bin/python",
                   help="an interpreter with PyTorch 2.x (default /tmp/t2/bin/python)")
    p.add_argument("--no-torch", action="store_true", help="ztrain only")
    p.add_argument("--ranks", default="1,2", help="ztrain process counts (default 1,2)")
    p.add_argument("--before", help="OLD_ZTRAIN,OLD_BENCH_INIT: another build, interleaved")
    p.add_argument("--json", help="write every raw number here")
    args = p.parse_args()

    builds = {"ztrain": (args.ztrain, args.bench_init)}
    if args.before:
        old = args.before.split(",")
        if len(old) != 2:
            p.error("--before wants OLD_ZTRAIN,OLD_BENCH_INIT")
        builds["before"] = tuple(old)
    layouts = []
    for n in (int(x) for x in args.ranks.split(",")):
        layouts += [(n, 0)] if n == 1 else [(n, 0), (n, 3)]

    load0 = loadavg()
    print(f"load average at the start: {load0}", file=sys.stderr)
    results = {"shape": SHAPE, "threads": THREADS, "load_start": load0, "runs": {}}
    runs = results["runs"]
    with tempfile.TemporaryDirectory(prefix="bench_startup.") as work:
        data = os.path.join(work, "tokens.bin")
        rng = random.Random(0)
        array("H", (rng.randrange(SHAPE["vocab"]) for _ in range(1 << 16))).tofile(open(data, "wb"))
        jobs = []
        for b, (zt, bi) in builds.items():
            for n, z in layouts:
                jobs.append((f"{b} np{n} zero{z}", lambda zt=zt, n=n, z=z: run_ztrain(zt, n, z, data, work)))
            jobs.append((f"{b} init", lambda bi=bi: run_init_ztrain(bi)))
        if not args.no_torch:
            jobs.append(("torch", lambda: run_torch(args.torch_python)))
        for rep in range(args.repeats):
            k = rep % len(jobs)
            for name, fn in jobs[k:] + jobs[:k]:
                t0 = time.perf_counter()
                r = fn()
                runs.setdefault(name, []).append(r)
                short = {k2: (round(v, 3) if isinstance(v, float) else v) for k2, v in r.items()
                         if k2 not in ("banner", "s")}
                print(f"[{rep + 1}/{args.repeats}] {name:20s} {short} ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
        numel = runs["ztrain init"][0]["numel"]
        if not args.no_torch:
            for rep in range(args.repeats):
                runs.setdefault("torch init", []).append(run_init_torch(args.torch_python, numel))
                print(f"[{rep + 1}/{args.repeats}] torch init {runs['torch init'][-1]['s_median']:.3f} s",
                      file=sys.stderr, flush=True)
    results["load_end"] = loadavg()
    print(f"load average at the end: {results['load_end']}", file=sys.stderr)

    print("| run | ready (s) | first step done (s) | of which the step (ms) | exit (s) |")
    print("|---|---:|---:|---:|---:|")
    for name, rows in runs.items():
        if "ready_s" in rows[0]:
            print(f"| {name} | {med(rows, 'ready_s'):.2f} | {med(rows, 'first_step_s'):.2f} | "
                  f"{med(rows, 'step_ms'):.0f} | {med(rows, 'exit_s'):.2f} |")
    print()
    print(f"| init of {numel / 1e6:.1f} M elements, {THREADS} threads | s (median) | elements/s |")
    print("|---|---:|---:|")
    for name, rows in runs.items():
        if "elements_per_s" in rows[0]:
            s = med(rows, "s_median")
            print(f"| {name} | {s:.3f} | {numel / s / 1e6:.0f} M |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
