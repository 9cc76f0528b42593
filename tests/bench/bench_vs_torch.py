#!/usr/bin/python3
"""Training throughput of ztrain against PyTorch on the same model and batch.

    bench_vs_torch.py [--shapes small,124m] [--steps 8] [--warmup 2]
                      [--repeats 3] [--ztrain build/ztrain] [--json PATH]

A benchmark, not a test: it asserts nothing and is not registered with ctest.
Both sides train a GPT in fp32 with AdamW (weight decay 0.1, betas 0.9/0.95,
lr 3e-4), grad clipping at 1.0 and global_batch = micro_batch (no
accumulation), on random tokens. Each side's per-run figure is the median
step time over --steps steps after --warmup untimed ones; the reported
figure is the median over --repeats fresh processes of each side.

ztrain runs with OMP_NUM_THREADS=2; PyTorch (tests/bench/torch_bench.py,
Debian's python3-torch, run by /usr/bin/python3) with 2 threads and
OMP_WAIT_POLICY=PASSIVE. ztrain's MFU is measured against a 2-thread sgemm
peak taken in the same run: the best of several numpy float32 2048x2048
matmuls (numpy here links OpenBLAS) with OMP/OPENBLAS threads = 2.

Prints a Markdown table; --json PATH also writes every raw number.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

SHAPES = {
    # GPT-2 small (124M with the tied head) at a batch small enough for a CPU.
    "124m": dict(vocab=50304, seq=64, dim=768, layers=12, heads=12, micro_batch=4),
    "small": dict(vocab=8192, seq=128, dim=256, layers=4, heads=4, micro_batch=8),
}

THREADS = 2
# A step of the 124M model takes ~1.5 s; this only catches a hung process.
RUN_TIMEOUT_S = 900

ZTRAIN_SCRIPT = """\
local zt = require "ztrain"
model = zt.gpt{{vocab={vocab}, seq={seq}, dim={dim}, layers={layers}, heads={heads}}}
train = {{micro_batch={micro_batch}, global_batch={micro_batch}, steps={steps},
         lr=3e-4, weight_decay=0.1, betas={{0.9, 0.95}}, clip=1.0, log_every=0}}
data = {{train="{data}", shuffle=false}}
"""

# Run in a child so the thread variables are read before OpenBLAS starts.
PEAK_SNIPPET = """\
import json, time, numpy as np
n = 2048
a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
a @ b
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t0)
print(json.dumps({"gflops": 2 * n**3 / best / 1e9}))
"""


def env_with(**overrides):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def run(cmd, env, cwd=None):
    """Runs cmd, raising with its stderr on failure so a broken side is obvious."""
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-4000:]}")
    return res.stdout


def flops_per_token(s):
    """6 * matmul parameters (forward + backward) plus attention scores and mixing.

    Embeddings are lookups, not matmuls, but the tied head is a V x C matmul.
    """
    L, C, T, V = s["layers"], s["dim"], s["seq"], s["vocab"]
    n_matmul = L * 12 * C * C + V * C  # qkv 3C^2, out C^2, mlp 8C^2; head VC
    return 6 * n_matmul + 12 * L * C * T


def sgemm_peak_gflops(python):
    env = env_with(OMP_NUM_THREADS=THREADS, OPENBLAS_NUM_THREADS=THREADS)
    return json.loads(run([python, "-c", PEAK_SNIPPET], env))["gflops"]


def write_tokens(path, n, vocab, python):
    # numpy lives in the Debian interpreter, which need not be the one running us.
    code = ("import sys, numpy as np; np.random.default_rng(0).integers("
            "0, int(sys.argv[2]), size=int(sys.argv[1]), dtype=np.uint16).tofile(sys.argv[3])")
    run([python, "-c", code, str(n), str(vocab), path], os.environ)


def run_ztrain(ztrain, shape, steps, warmup, data, workdir):
    """Median ms of one fresh ztrain process, from its --metrics file."""
    script = os.path.join(workdir, "bench.lua")
    metrics = os.path.join(workdir, "metrics.jsonl")
    with open(script, "w") as f:
        f.write(ZTRAIN_SCRIPT.format(steps=steps + warmup, data=data, **shape))
    if os.path.exists(metrics):
        os.remove(metrics)
    # cwd = workdir keeps anything ztrain writes (checkpoints) out of the repo.
    out = run([ztrain, script, "--metrics", metrics], env_with(OMP_NUM_THREADS=THREADS),
              cwd=workdir)
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "ms" in r]  # eval lines carry no step time
    timed = [r for r in rows if r["step"] > warmup]
    if len(timed) != steps:
        raise RuntimeError(f"ztrain logged {len(timed)} timed steps, expected {steps}")
    expected = shape["micro_batch"] * shape["seq"]
    if any(r["tokens"] != expected for r in timed):
        raise RuntimeError(f"ztrain steps are not {expected} tokens: the batch differs")
    ms = [r["ms"] for r in timed]
    return {"ms_median": statistics.median(ms), "ms_all": [round(x, 3) for x in ms],
            "banner": out.splitlines()[0] if out else ""}


def run_torch(python, shape, steps, warmup):
    cmd = [python, os.path.join(HERE, "torch_bench.py"), "--model", "gpt",
           "--vocab", str(shape["vocab"]), "--seq", str(shape["seq"]),
           "--dim", str(shape["dim"]), "--layers", str(shape["layers"]),
           "--heads", str(shape["heads"]), "--micro-batch", str(shape["micro_batch"]),
           "--steps", str(steps), "--warmup", str(warmup), "--threads", str(THREADS)]
    # PASSIVE: spinning OpenMP workers would steal the only other core.
    env = env_with(OMP_NUM_THREADS=THREADS, OMP_WAIT_POLICY="PASSIVE")
    res = json.loads(run(cmd, env).strip().splitlines()[-1])
    return {"ms_median": res["ms_median"], "ms_all": res["ms_all"]}


def bench_shape(name, args, workdir):
    shape = SHAPES[name]
    tokens_per_step = shape["micro_batch"] * shape["seq"]
    data = os.path.join(workdir, f"tokens_{name}.bin")
    # Twice what the steps consume, so no loader stride convention can run short.
    write_tokens(data, 2 * ((args.steps + args.warmup) * tokens_per_step + shape["micro_batch"]) + 1,
                 shape["vocab"], args.python)

    zt_runs, torch_runs, peaks = [], [], []
    for rep in range(args.repeats):
        # The machine is shared and noisy: measuring the peak and both sides
        # close together, alternating who goes first, spreads drift evenly.
        peaks.append(sgemm_peak_gflops(args.python))
        order = ["ztrain", "torch"] if rep % 2 == 0 else ["torch", "ztrain"]
        for impl in order:
            t0 = time.perf_counter()
            if impl == "ztrain":
                zt_runs.append(run_ztrain(args.ztrain, shape, args.steps, args.warmup, data, workdir))
                r = zt_runs[-1]
            else:
                torch_runs.append(run_torch(args.python, shape, args.steps, args.warmup))
                r = torch_runs[-1]
            print(f"[{name} {rep + 1}/{args.repeats}] {impl:6s} median {r['ms_median']:9.1f} ms/step"
                  f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    zt_ms = statistics.median(r["ms_median"] for r in zt_runs)
    torch_ms = statistics.median(r["ms_median"] for r in torch_runs)
    peak = statistics.median(peaks)
    fpt = flops_per_token(shape)
    zt_tok_s = tokens_per_step / (zt_ms / 1e3)
    torch_tok_s = tokens_per_step / (torch_ms / 1e3)
    return {
        "shape": name, **shape, "tokens_per_step": tokens_per_step,
        "flops_per_token": fpt,
        "ztrain_ms": zt_ms, "torch_ms": torch_ms,
        "ztrain_tokens_per_s": zt_tok_s, "torch_tokens_per_s": torch_tok_s,
        "ratio": zt_tok_s / torch_tok_s,
        "peak_gflops": peak, "peak_gflops_all": peaks,
        "ztrain_mfu": zt_tok_s * fpt / (peak * 1e9),
        "ztrain_runs": zt_runs, "torch_runs": torch_runs,
    }


def markdown(results):
    lines = ["| shape | ztrain tok/s | torch tok/s | ratio ztrain/torch | ztrain MFU |",
             "|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['shape']} | {r['ztrain_tokens_per_s']:.0f} | {r['torch_tokens_per_s']:.0f}"
                     f" | {r['ratio']:.2f} | {100 * r['ztrain_mfu']:.1f}% |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="small,124m",
                   help=f"comma-separated, from {', '.join(SHAPES)} (default: small,124m)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per run (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="(ztrain, torch) pairs (default 3)")
    p.add_argument("--ztrain", default=os.path.join(REPO, "build", "ztrain"))
    p.add_argument("--python", default="/usr/bin/python3",
                   help="interpreter with Debian's torch and numpy (default /usr/bin/python3)")
    p.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    args = p.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        if s not in SHAPES:
            p.error(f"unknown shape '{s}' (known: {', '.join(SHAPES)})")
    if args.steps < 5:
        p.error("--steps must be at least 5 for a meaningful median")
    if args.warmup < 0 or args.repeats < 1:
        p.error("--warmup must be >= 0 and --repeats >= 1")
    if not os.access(args.ztrain, os.X_OK):
        p.error(f"{args.ztrain} is not an executable (build with cmake --build build)")
    args.ztrain = os.path.abspath(args.ztrain)

    # Other work on the machine skews both sides; the load average tells a
    # reader of the numbers whether they were taken on a quiet machine.
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ztrain_bench_") as workdir:
        results = [bench_shape(s, args, workdir) for s in shapes]
    load_after = os.getloadavg()[0]

    print(markdown(results))
    peaks = ", ".join(f"{r['shape']} {r['peak_gflops']:.0f}" for r in results)
    print(f"\nfp32 AdamW, clip 1.0, {THREADS} threads; median of {args.steps} steps after "
          f"{args.warmup} warm-up, median over {args.repeats} runs each. "
          f"MFU vs {THREADS}-thread numpy sgemm 2048^3 peak (GFLOP/s): {peaks}. "
          f"Load average (1 min) {load_before:.1f} before, {load_after:.1f} after.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": THREADS, "steps": args.steps, "warmup": args.warmup,
                       "repeats": args.repeats, "ztrain": args.ztrain,
                       "loadavg_before": load_before, "loadavg_after": load_after,
                       "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
