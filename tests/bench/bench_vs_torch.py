#!/usr/bin/python3
"""Training throughput of ztrain against PyTorch on the same model and batch.

    bench_vs_torch.py [--shapes 124m,small,llama] [--sides ztrain,eager,compile]
                      [--steps 8] [--warmup 2] [--repeats 3]
                      [--ztrain build/ztrain] [--torch-python /tmp/t2/bin/python]
                      [--json PATH]

A benchmark, not a test: it asserts nothing and is not registered with ctest.
Every side trains the same model (in fp32 unless the side says bf16) with AdamW (weight decay 0.1 on
matrices, betas 0.9/0.95, lr 3e-4), grad clipping at 1.0 and global_batch =
micro_batch (no accumulation), on random tokens, with 2 threads. Sides:

  ztrain          the binary as a user runs it: no OPENBLAS_CORETYPE set
                  (it is removed from the environment), so ztrain picks its
                  GEMM kernels itself
  ztrain_bf16     the same with train.precision = "bf16": activations and the
                  weights computed with in bf16, fp32 weights, gradients and
                  AdamW (docs/script.md)
  ztrain_openblas the float GEMMs on OpenBLAS instead of oneDNN: its kernels
                  that ztrain picked (named in OPENBLAS_CORETYPE, which
                  keeps the GEMMs on OpenBLAS)
  ztrain_sim      the same as ztrain with ZT_TEST_OPENBLAS_DETECTS=Prescott: OpenBLAS
                  "detects" its oldest kernels, as Debian's 0.3.21 does on
                  CPUs it does not know, and ztrain corrects it
  ztrain_prescott OPENBLAS_CORETYPE=Prescott: what the misdetection costs
                  when nothing corrects it (a user's variable is respected)
  eager           PyTorch (--torch-python, a 2.x from PyPI) with its
                  strongest eager settings: SDPA attention, fused AdamW
  autocast        eager under torch.autocast("cpu", torch.bfloat16): PyTorch's
                  bf16 mixed precision (fp32 weights, gradients, AdamW)
  compile         the same as eager plus torch.compile of the model
  torch113        Debian's python3-torch 1.13 (--python), plain attention
                  and AdamW: the earlier reference

Each run's figure is the median step time over --steps steps after --warmup
untimed ones (torch.compile compiles in the first); the reported figure is
the median over --repeats fresh processes per side. The sides run
interleaved, in an order that rotates each repeat. ztrain's banner gives the
GEMM path, its start-up SGEMM rate and the CPU's peak (threads x clock x
FLOPs per cycle), which MFU is measured against.

Prints a Markdown table; --json PATH also writes every raw number.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

SHAPES = {
    # GPT-2 small (124M with the tied head) at a batch small enough for a CPU.
    "124m": dict(model="gpt", vocab=50304, seq=64, dim=768, layers=12, heads=12, micro_batch=4),
    "small": dict(model="gpt", vocab=8192, seq=128, dim=256, layers=4, heads=4, micro_batch=8),
    "llama": dict(model="llama", vocab=8192, seq=128, dim=256, layers=4, heads=4, kv_heads=2,
                  ffn_dim=768, micro_batch=8),
}
SIDES = ["ztrain", "ztrain_bf16", "ztrain_openblas", "ztrain_sim", "ztrain_prescott", "eager",
         "autocast", "compile", "torch113"]

THREADS = 2
# A step of the 124M model with Prescott kernels takes ~5 s, compiling it
# minutes; this only catches a hung process.
RUN_TIMEOUT_S = 1800

ZTRAIN_SCRIPT = """\
local zt = require "ztrain"
model = zt.{model}{{{model_args}}}
train = {{micro_batch={micro_batch}, global_batch={micro_batch}, steps={steps},
         lr=3e-4, weight_decay=0.1, betas={{0.9, 0.95}}, clip=1.0, log_every={steps},
         precision="{precision}"}}
data = {{train="{data}", shuffle=false}}
"""


def clean_env(**overrides):
    """The environment a user has: no OpenBLAS core forced, no test hooks."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "ZT_TEST_OPENBLAS_DETECTS", "ZT_TEST_GEMM_CORRUPT")}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def run(cmd, env, cwd=None):
    """Runs cmd, raising with its stderr on failure so a broken side is obvious."""
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-4000:]}")
    return res


def flops_per_token(s):
    """6 * matmul parameters (forward + backward) plus attention scores and mixing.

    Embeddings are lookups, not matmuls, but the tied head is a V x C matmul.
    """
    L, C, T, V = s["layers"], s["dim"], s["seq"], s["vocab"]
    if s["model"] == "gpt":
        per_layer = 12 * C * C  # qkv 3C^2, out C^2, mlp 8C^2
    else:
        hd = C // s["heads"]
        per_layer = C * C * 2 + 2 * C * s["kv_heads"] * hd + 3 * C * s["ffn_dim"]
    n_matmul = L * per_layer + V * C
    return 6 * n_matmul + 12 * L * C * T


def write_tokens(path, n, vocab, python):
    # numpy lives in the Debian interpreter, which need not be the one running us.
    code = ("import sys, numpy as np; np.random.default_rng(0).integers("
            "0, int(sys.argv[2]), size=int(sys.argv[1]), dtype=np.uint16).tofile(sys.argv[3])")
    run([python, "-c", code, str(n), str(vocab), path], os.environ)


def model_args(shape):
    keys = ["vocab", "seq", "dim", "layers", "heads"]
    if shape["model"] == "llama":
        keys += ["kv_heads", "ffn_dim"]
    return ", ".join(f"{k}={shape[k]}" for k in keys)


def gemm_banner(text):
    """The GEMM line of ztrain's banner, parsed."""
    line = next((ln for ln in text.splitlines() if ln.startswith("GEMM: ")), "")
    m = re.search(r", (\d+) GFLOP/s per rank measured", line)
    p = re.search(r"CPU peak (\d+)", line)
    path = re.sub(r", \d+ GFLOP/s per rank measured(?: \([^)]*\))?|, CPU peak \d+ \([^)]*\)", "", line[len("GEMM: "):])
    return {"gemm": path,
            "gemm_line": line,
            "gemm_gflops": float(m.group(1)) if m else None,
            "cpu_peak_gflops": float(p.group(1)) if p else None}


OPENBLAS_CORE = "SkylakeX"  # replaced in main() by the core ztrain picks here


def run_ztrain(side, ztrain, shape, steps, warmup, data, workdir):
    """Median ms of one fresh ztrain process, from its --metrics file."""
    script = os.path.join(workdir, "bench.lua")
    metrics = os.path.join(workdir, "metrics.jsonl")
    with open(script, "w") as f:
        f.write(ZTRAIN_SCRIPT.format(steps=steps + warmup, data=data, model_args=model_args(shape),
                                     precision="bf16" if side == "ztrain_bf16" else "fp32",
                                     **shape))
    if os.path.exists(metrics):
        os.remove(metrics)
    extra = {"ztrain_sim": {"ZT_TEST_OPENBLAS_DETECTS": "Prescott"},
             "ztrain_prescott": {"OPENBLAS_CORETYPE": "Prescott"},
             "ztrain_openblas": {"OPENBLAS_CORETYPE": OPENBLAS_CORE}}.get(side, {})
    # cwd = workdir keeps anything ztrain writes (checkpoints) out of the repo.
    res = run([ztrain, script, "--metrics", metrics],
              clean_env(OMP_NUM_THREADS=THREADS, **extra), cwd=workdir)
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
    warnings = [ln for ln in res.stderr.splitlines() if "warning" in ln]
    return {"ms_median": statistics.median(ms), "ms_all": [round(x, 3) for x in ms],
            **gemm_banner(res.stdout), "warnings": warnings}


def run_torch(side, args, shape, steps, warmup):
    python = args.python if side == "torch113" else args.torch_python
    cmd = [python, os.path.join(HERE, "torch_bench.py"), "--model", shape["model"],
           "--vocab", str(shape["vocab"]), "--seq", str(shape["seq"]),
           "--dim", str(shape["dim"]), "--layers", str(shape["layers"]),
           "--heads", str(shape["heads"]), "--micro-batch", str(shape["micro_batch"]),
           "--steps", str(steps), "--warmup", str(warmup), "--threads", str(THREADS)]
    if shape["model"] == "llama":
        cmd += ["--kv-heads", str(shape["kv_heads"]), "--ffn-dim", str(shape["ffn_dim"])]
    if side in ("eager", "autocast", "compile"):
        cmd += ["--sdpa", "--fused-adamw"]
    if side == "autocast":
        cmd += ["--autocast"]
    if side == "compile":
        cmd += ["--compile"]
    # PASSIVE: spinning OpenMP workers would steal the only other core.
    env = clean_env(OMP_NUM_THREADS=THREADS, OMP_WAIT_POLICY="PASSIVE")
    res = json.loads(run(cmd, env).stdout.strip().splitlines()[-1])
    return {"ms_median": res["ms_median"], "ms_all": res["ms_all"]}


def bench_shape(name, args, sides, workdir):
    shape = SHAPES[name]
    tokens_per_step = shape["micro_batch"] * shape["seq"]
    data = os.path.join(workdir, f"tokens_{name}.bin")
    # Twice what the steps consume, so no loader stride convention can run short.
    write_tokens(data, 2 * ((args.steps + args.warmup) * tokens_per_step + shape["micro_batch"]) + 1,
                 shape["vocab"], args.python)

    runs = {s: [] for s in sides}
    for rep in range(args.repeats):
        # The machine is shared and noisy: running the sides close together,
        # in an order that rotates, spreads drift evenly.
        k = rep % len(sides)
        for side in sides[k:] + sides[:k]:
            t0 = time.perf_counter()
            if side.startswith("ztrain"):
                r = run_ztrain(side, args.ztrain, shape, args.steps, args.warmup, data, workdir)
            else:
                r = run_torch(side, args, shape, args.steps, args.warmup)
            runs[side].append(r)
            print(f"[{name} {rep + 1}/{args.repeats}] {side:15s} median {r['ms_median']:9.1f} ms/step"
                  f"  ({time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f})",
                  file=sys.stderr, flush=True)

    out = {"shape": name, **shape, "tokens_per_step": tokens_per_step,
           "flops_per_token": flops_per_token(shape), "sides": {}}
    for side, rs in runs.items():
        ms = statistics.median(r["ms_median"] for r in rs)
        d = {"ms": ms, "tokens_per_s": tokens_per_step / (ms / 1e3), "runs": rs}
        if side.startswith("ztrain"):
            d["gemm"] = rs[-1]["gemm"]
            rates = [r["gemm_gflops"] for r in rs if r["gemm_gflops"]]
            d["gemm_gflops"] = statistics.median(rates) if rates else None
            peak = rs[-1]["cpu_peak_gflops"]
            d["cpu_peak_gflops"] = peak
            if peak:
                d["mfu"] = d["tokens_per_s"] * out["flops_per_token"] / (max(peak, d["gemm_gflops"] or 0) * 1e9)
        out["sides"][side] = d
    return out


def markdown(results, sides):
    zsides = [s for s in sides if s.startswith("ztrain")]
    tsides = [s for s in sides if not s.startswith("ztrain")]
    head = ["shape"] + [f"{s} tok/s" for s in sides]
    for z in zsides:
        head += [f"{z} / {t}" for t in tsides]
    both = "ztrain" in zsides and "ztrain_bf16" in zsides
    if both:
        head += ["ztrain_bf16 / ztrain"]
    if "ztrain" in zsides:
        head += ["ztrain MFU"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in results:
        sd = r["sides"]
        row = [r["shape"]] + [f"{sd[s]['tokens_per_s']:.0f}" for s in sides]
        for z in zsides:
            row += [f"{sd[z]['tokens_per_s'] / sd[t]['tokens_per_s']:.2f}" for t in tsides]
        if both:
            row += [f"{sd['ztrain_bf16']['tokens_per_s'] / sd['ztrain']['tokens_per_s']:.2f}"]
        if "ztrain" in zsides:
            mfu = sd["ztrain"].get("mfu")
            row += [f"{100 * mfu:.1f}%" if mfu else "?"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for z in zsides:
        r0 = results[0]["sides"][z]
        rates = ", ".join(f"{r['shape']} {r['sides'][z]['gemm_gflops']:.0f}" for r in results
                          if r["sides"][z]["gemm_gflops"])
        lines.append(f"- {z}: GEMM {r0['gemm']}; start-up SGEMM GFLOP/s per rank: {rates}; "
                     f"CPU peak {r0['cpu_peak_gflops']}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="124m,small,llama",
                   help=f"comma-separated, from {', '.join(SHAPES)} (default: all)")
    p.add_argument("--sides", default="ztrain,eager,compile",
                   help=f"comma-separated, from {', '.join(SIDES)} (default: ztrain,eager,compile)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per run (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per side (default 3)")
    p.add_argument("--ztrain", default=os.path.join(REPO, "build", "ztrain"))
    p.add_argument("--python", default="/usr/bin/python3",
                   help="interpreter with numpy and Debian's torch 1.13 (default /usr/bin/python3)")
    p.add_argument("--torch-python", default="/tmp/t2/bin/python",
                   help="interpreter with PyTorch 2.x for eager and compile (default /tmp/t2/bin/python)")
    p.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    args = p.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    for s in shapes:
        if s not in SHAPES:
            p.error(f"unknown shape '{s}' (known: {', '.join(SHAPES)})")
    for s in sides:
        if s not in SIDES:
            p.error(f"unknown side '{s}' (known: {', '.join(SIDES)})")
    if args.steps < 5:
        p.error("--steps must be at least 5 for a meaningful median")
    if args.warmup < 1 or args.repeats < 1:
        p.error("--warmup must be >= 1 (torch.compile compiles in it) and --repeats >= 1")
    if not os.access(args.ztrain, os.X_OK):
        p.error(f"{args.ztrain} is not an executable (build with cmake --build build)")
    args.ztrain = os.path.abspath(args.ztrain)

    version = run([args.ztrain, "--version"], clean_env()).stdout.strip()
    core = re.search(r"OpenBLAS [0-9.]+ ([A-Za-z0-9_]+) kernels", version)
    if core:
        global OPENBLAS_CORE
        OPENBLAS_CORE = core.group(1)
    versions = {}
    for side, py in (("eager", args.torch_python), ("torch113", args.python)):
        if any(s in sides for s in ((side, "compile") if side == "eager" else (side,))):
            versions[side] = run([py, "-c", "import torch; print(torch.__version__)"], os.environ).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    # Other work on the machine skews every side; the load average tells a
    # reader of the numbers whether they were taken on a quiet machine.
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ztrain_bench_") as workdir:
        results = [bench_shape(s, args, sides, workdir) for s in shapes]
    load_after = os.getloadavg()[0]

    print(markdown(results, sides))
    print(f"\nCPU: {cpu}, {os.cpu_count()} cores. {version.splitlines()[0]}; "
          f"{version.splitlines()[-1]}. PyTorch: {versions}. fp32 AdamW, clip 1.0, {THREADS} threads; "
          f"median of {args.steps} steps after {args.warmup} warm-up, median over {args.repeats} "
          f"runs each. Load average (1 min) {load_before:.1f} before, {load_after:.1f} after.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": THREADS, "steps": args.steps, "warmup": args.warmup,
                       "repeats": args.repeats, "ztrain": args.ztrain, "ztrain_version": version,
                       "torch_versions": versions, "cpu": cpu,
                       "loadavg_before": load_before, "loadavg_after": load_after,
                       "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
