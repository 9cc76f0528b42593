#!/usr/bin/env python3
"""Costs and gains of ztrain's parallel machinery, each against its reference.

    bench_parallel.py [--part overlap|degree1|all] [--repeats 3] [--steps 8]
                      [--warmup 2] [--ztrain build/ztrain] [--json PATH]
                      [--baseline-rev REV | --baseline-ztrain PATH]

A benchmark, not a test: it asserts nothing and is not registered with ctest.

overlap: two ranks (mpirun -np 2, dp = 2, ZeRO stage 2, OMP_NUM_THREADS=1
each) train a small GPT with gradient accumulation 2 and 1 MiB gradient
buckets, once with the bucketed reduce-scatter overlapped with the backward
pass (parallel.zero.overlap = true) and once without. Reported: the ratio of
step times overlap / no-overlap (below 1 is a gain). With two ranks on two
cores there is little idle compute to hide communication behind, so a ratio
near 1 is the expected result here, not a failure.

dp: data-parallel scaling on 2 ranks x 1 thread (weak: each rank the
micro-batch one process trains), ztrain ZeRO 0-3 against its own single
process, and with --torch-python PyTorch DDP and FSDP2 over gloo against
PyTorch's single process (tests/bench/torch_dp_bench.py).

degree1: one process, OMP_NUM_THREADS=2, the "small" shape of
bench_vs_torch.py, with the current binary against the foundation's
single-process path (the binary built from --baseline-rev, by default the
commit that recorded ztrain's PyTorch comparison). Reported: the ratio of
step times current / foundation; the grid, watched collectives and unit hooks
should cost at most 3% (ratio <= 1.03) when nothing is parallel.

Each run's figure is the median step time from its --metrics file over
--steps steps after --warmup untimed ones; the reported figure is the median
over --repeats fresh runs of each side, the two sides interleaved with
alternating order because the machine is shared and noisy. Prints a Markdown
table; --json PATH also writes every raw number.
"""

import argparse
import array
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# The foundation's single-process path: the commit whose numbers are in
# docs/performance.md, so "degree 1 costs nothing" is measured against them.
BASELINE_SUBJECT = "^docs/performance.md: ztrain 1.69x"

# Small enough that a step takes well under a second on 2 cores. With
# micro 4 x dp 2 and global 16 each rank accumulates 2 micro-batches, so the
# reduce-scatter of the last micro-batch is the one overlap can hide; 1 MiB
# buckets split the ~21 MB of fp32 gradients into many pieces to overlap.
OVERLAP_SHAPE = dict(vocab=8192, seq=128, dim=256, layers=4, heads=4,
                     micro_batch=4, global_batch=16)
OVERLAP_RANKS = 2
BUCKET_BYTES = 1 << 20

# bench_vs_torch.py's "small" shape, one process, no accumulation.
DEGREE1_SHAPE = dict(vocab=8192, seq=128, dim=256, layers=4, heads=4,
                     micro_batch=8, global_batch=8)
DEGREE1_THREADS = 2
TARGET_DEGREE1 = 1.03

# A step here takes well under a second; this only catches a hung process
# (e.g. a rank stuck in a collective).
RUN_TIMEOUT_S = 300
BUILD_TIMEOUT_S = 1200

# Only keys the foundation also understands (model, train, data): it refuses
# unknown tables such as parallel.zero, so those come in through -e for the
# overlap part alone.
SCRIPT = """\
local zt = require "ztrain"
model = zt.gpt{{vocab={vocab}, seq={seq}, dim={dim}, layers={layers}, heads={heads}}}
train = {{micro_batch={micro_batch}, global_batch={global_batch}, steps={steps},
         lr=3e-4, weight_decay=0.1, betas={{0.9, 0.95}}, clip=1.0, log_every=0}}
data = {{train="{data}", shuffle=false}}
"""

# Open MPI refuses root and more ranks than it thinks there are slots without
# these; they change nothing about how the ranks run.
MPI_ENV = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def env_with(**overrides):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def run(cmd, env=None, cwd=None, timeout=RUN_TIMEOUT_S):
    """Runs cmd, raising with its output on failure so a broken side is obvious."""
    res = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}:\n"
                           f"{(res.stdout + res.stderr)[-4000:]}")
    return res.stdout


def write_tokens(path, n, vocab):
    # Plain Python rather than numpy: the interpreter running this need not
    # have it, and a few hundred thousand tokens take a fraction of a second.
    rng = random.Random(0)
    with open(path, "wb") as f:
        array.array("H", (rng.randrange(vocab) for _ in range(n))).tofile(f)


def tokens_needed(shape, steps):
    # Twice what the steps consume, so no loader stride convention can run short.
    return 2 * (steps * shape["global_batch"] * shape["seq"] + shape["global_batch"]) + 1


def write_script(path, shape, steps, data):
    with open(path, "w") as f:
        f.write(SCRIPT.format(steps=steps, data=data, **shape))


def step_times(metrics, shape, steps, warmup):
    """The timed steps of one run's --metrics file (rank 0 writes it)."""
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "ms" in r]  # eval lines carry no step time
    timed = [r for r in rows if r["step"] > warmup]
    if len(timed) != steps:
        raise RuntimeError(f"{metrics}: {len(timed)} timed steps, expected {steps}")
    expected = shape["global_batch"] * shape["seq"]
    if any(r.get("tokens", expected) != expected for r in timed):
        raise RuntimeError(f"{metrics}: steps are not {expected} tokens: the batch differs")
    return timed


def run_ztrain(cmd, env, workdir, shape, steps, warmup):
    """Median ms of one fresh run; cmd gets --metrics appended."""
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    # cwd = workdir keeps anything ztrain writes out of the repository.
    run(cmd + ["--metrics", metrics], env=env, cwd=workdir)
    timed = step_times(metrics, shape, steps, warmup)
    ms = [r["ms"] for r in timed]
    # The final loss lets a reader see that both sides trained the same thing.
    return {"ms_median": statistics.median(ms), "ms_all": [round(x, 3) for x in ms],
            "final_loss": timed[-1].get("loss"),
            "dp_bytes": timed[-1].get("bytes", {}).get("dp")}


def interleaved(label, sides, repeats):
    """Runs each side's thunk once per repeat, alternating which goes first.

    Drift on a shared machine (another job starting, thermal state) then
    lands on both sides evenly instead of on whichever ran last.
    """
    runs = {name: [] for name, _ in sides}
    for rep in range(repeats):
        order = sides if rep % 2 == 0 else sides[::-1]
        for name, thunk in order:
            t0 = time.perf_counter()
            r = thunk()
            runs[name].append(r)
            log(f"[{label} {rep + 1}/{repeats}] {name:12s} median {r['ms_median']:8.1f} ms/step"
                f"  ({time.perf_counter() - t0:.0f} s)")
    return runs


def prepare(workdir, name, shape, total):
    """Token file and Lua script for `total` steps of `shape`; the script's path."""
    data = os.path.join(workdir, f"tokens_{name}.bin")
    write_tokens(data, tokens_needed(shape, total), shape["vocab"])
    script = os.path.join(workdir, f"{name}.lua")
    write_script(script, shape, total, data)
    return script


def bench_overlap(args, workdir):
    shape = OVERLAP_SHAPE
    script = prepare(workdir, "overlap", shape, args.steps + args.warmup)
    # One thread per rank: two ranks on two cores, no oversubscription by OpenMP.
    # --bind-to none lets the OS place them; binding both to one core by
    # Open MPI's default policy would serialise them.
    env = env_with(OMP_NUM_THREADS=1, **MPI_ENV)
    base = [args.mpirun, "-np", str(OVERLAP_RANKS), "--bind-to", "none",
            "-x", "OMP_NUM_THREADS", args.ztrain, script]

    def side(overlap):
        stmt = (f"parallel = {{dp = {OVERLAP_RANKS}, zero = {{stage = 2, "
                f"overlap = {'true' if overlap else 'false'}, bucket_bytes = {BUCKET_BYTES}}}}}")
        return lambda: run_ztrain(base + ["-e", stmt], env, workdir, shape,
                                  args.steps, args.warmup)

    runs = interleaved("overlap", [("overlap", side(True)), ("no-overlap", side(False))],
                       args.repeats)
    on = statistics.median(r["ms_median"] for r in runs["overlap"])
    off = statistics.median(r["ms_median"] for r in runs["no-overlap"])
    return {"part": "overlap", **shape, "ranks": OVERLAP_RANKS, "zero": 2,
            "bucket_bytes": BUCKET_BYTES, "threads_per_rank": 1,
            "accum": shape["global_batch"] // (shape["micro_batch"] * OVERLAP_RANKS),
            "ms": on, "reference_ms": off, "ratio": on / off,
            "runs": runs["overlap"], "reference_runs": runs["no-overlap"]}


# dp: data-parallel scaling, weak: every rank trains the micro-batch one
# process trains alone, so the ideal 2-rank step takes as long as the
# 1-process one; efficiency = 1-process ms / 2-rank ms. 1 thread per rank.
DP_SHAPE = dict(vocab=8192, seq=128, dim=256, layers=4, heads=4, micro_batch=8)
DP_RANKS = 2


def run_torch(python, mode, workdir, steps, warmup):
    script = os.path.join(HERE, "torch_dp_bench.py")
    shape = ["--vocab", str(DP_SHAPE["vocab"]), "--seq", str(DP_SHAPE["seq"]),
             "--dim", str(DP_SHAPE["dim"]), "--layers", str(DP_SHAPE["layers"]),
             "--heads", str(DP_SHAPE["heads"]), "--micro-batch", str(DP_SHAPE["micro_batch"]),
             "--steps", str(steps), "--warmup", str(warmup), "--mode", mode]
    if mode == "single":
        cmd = [python, script] + shape
    else:
        torchrun = os.path.join(os.path.dirname(python), "torchrun")
        cmd = [torchrun, "--nproc_per_node", str(DP_RANKS), "--master_port", "29517",
               script] + shape
    out = run(cmd, env=env_with(OMP_NUM_THREADS=1), cwd=workdir)
    r = json.loads(out.strip().splitlines()[-1])
    return {"ms_median": r["ms_median"], "ms_all": r["ms_all"]}


def bench_dp(args, workdir):
    total = args.steps + args.warmup
    one = dict(DP_SHAPE, global_batch=DP_SHAPE["micro_batch"])
    two = dict(DP_SHAPE, global_batch=DP_SHAPE["micro_batch"] * DP_RANKS)
    s1, s2 = prepare(workdir, "dp1", one, total), prepare(workdir, "dp2", two, total)
    env = env_with(OMP_NUM_THREADS=1, **MPI_ENV)
    mpi = [args.mpirun, "-np", str(DP_RANKS), "--bind-to", "none", "-x", "OMP_NUM_THREADS"]
    sides = [("ztrain np1", lambda: run_ztrain([args.ztrain, s1], env, workdir, one,
                                                args.steps, args.warmup))]
    for z in range(4):
        sides.append((f"ztrain zero {z}", lambda z=z: run_ztrain(
            mpi + [args.ztrain, s2, "-e", f"parallel.zero = {z}"], env, workdir, two,
            args.steps, args.warmup)))
    if args.torch_python:
        for mode in ("single", "ddp", "fsdp2"):
            sides.append((f"torch {mode}", lambda m=mode: run_torch(
                args.torch_python, m, workdir, args.steps, args.warmup)))
    runs = interleaved("dp", sides, args.repeats)
    med = {name: statistics.median(r["ms_median"] for r in rs) for name, rs in runs.items()}
    rows = []
    for name in med:
        if name in ("ztrain np1", "torch single"):
            continue
        base = "ztrain np1" if name.startswith("ztrain") else "torch single"
        rows.append({"side": name, "ms": med[name], "single_ms": med[base],
                     "efficiency": med[base] / med[name],
                     "added_ms": med[name] - med[base]})
    return {"part": "dp", **DP_SHAPE, "ranks": DP_RANKS, "threads_per_rank": 1,
            "rows": rows, "medians": med, "runs": runs}


def find_baseline_rev():
    out = run(["git", "-C", REPO, "log", "--format=%H", "--grep", BASELINE_SUBJECT]).split()
    if not out:
        raise RuntimeError(f"no commit whose subject matches '{BASELINE_SUBJECT}'; "
                           "pass --baseline-rev")
    return out[-1]  # the oldest, should the subject ever recur


def build_baseline(rev, workdir):
    """Builds ztrain at rev in a throw-away worktree; returns (binary, worktree)."""
    tree = os.path.join(workdir, "baseline")
    run(["git", "-C", REPO, "worktree", "add", "--detach", tree, rev])
    build = os.path.join(tree, "build")
    t0 = time.perf_counter()
    # Release as the main build is (CMakeLists defaults to it; said explicitly
    # so a different default in either tree cannot skew the comparison).
    run(["cmake", "-S", tree, "-B", build, "-G", "Ninja", "-DBUILD_TESTING=OFF",
         "-DZT_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release"], timeout=BUILD_TIMEOUT_S)
    run(["cmake", "--build", build, "--target", "ztrain"], timeout=BUILD_TIMEOUT_S)
    log(f"[degree1] built foundation {rev[:12]} in {time.perf_counter() - t0:.0f} s")
    return os.path.join(build, "ztrain"), tree


def remove_worktree(tree):
    res = subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree],
                         capture_output=True, text=True)
    if res.returncode != 0:
        log(f"warning: could not remove worktree {tree}: {res.stderr.strip()}")


def build_type(ztrain):
    """CMAKE_BUILD_TYPE of the build tree next to a binary, if there is one."""
    cache = os.path.join(os.path.dirname(ztrain), "CMakeCache.txt")
    try:
        with open(cache) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def bench_degree1(args, workdir):
    shape = DEGREE1_SHAPE
    script = prepare(workdir, "degree1", shape, args.steps + args.warmup)
    env = env_with(OMP_NUM_THREADS=DEGREE1_THREADS)

    tree, rev = None, None
    try:
        if args.baseline_ztrain:
            baseline = os.path.abspath(args.baseline_ztrain)
        else:
            rev = run(["git", "-C", REPO, "rev-parse", "--verify",
                       (args.baseline_rev or find_baseline_rev()) + "^{commit}"]).strip()
            baseline, tree = build_baseline(rev, workdir)
        types = {"current": build_type(args.ztrain), "foundation": build_type(baseline)}
        if types["current"] != types["foundation"]:
            log(f"warning: build types differ ({types}); the ratio compares compilers' flags too")

        def side(binary):
            # No mpirun: the foundation's path is a plain process, and the
            # current binary must cost nothing extra when launched the same way.
            return lambda: run_ztrain([binary, script], env, workdir, shape,
                                      args.steps, args.warmup)

        runs = interleaved("degree1", [("current", side(args.ztrain)),
                                       ("foundation", side(baseline))], args.repeats)
    finally:
        if tree:
            remove_worktree(tree)

    cur = statistics.median(r["ms_median"] for r in runs["current"])
    ref = statistics.median(r["ms_median"] for r in runs["foundation"])
    return {"part": "degree1", **shape, "ranks": 1, "threads_per_rank": DEGREE1_THREADS,
            "baseline_rev": rev, "baseline_ztrain": None if tree else baseline,
            "build_types": types, "ms": cur, "reference_ms": ref, "ratio": cur / ref,
            "target": TARGET_DEGREE1,
            "runs": runs["current"], "reference_runs": runs["foundation"]}


def markdown(results):
    lines = []
    for r in results:
        if r["part"] != "dp":
            continue
        lines += [f"dp scaling: {r['ranks']} ranks x 1 thread, each micro-batch {r['micro_batch']}"
                  f" x {r['seq']} (L{r['layers']} C{r['dim']} V{r['vocab']}); efficiency = "
                  "1-process ms / 2-rank ms", "",
                  "| side | 2-rank ms/step | 1-process ms/step | added ms | efficiency |",
                  "|---|---:|---:|---:|---:|"]
        for row in r["rows"]:
            lines.append(f"| {row['side']} | {row['ms']:.1f} | {row['single_ms']:.1f} | "
                         f"{row['added_ms']:.1f} | {row['efficiency']:.3f} |")
        lines.append("")
    lines += ["| part | setup | measured | ms/step | reference | ms/step | ratio | target |",
              "|---|---|---|---:|---|---:|---:|---:|"]
    for r in results:
        if r["part"] == "dp":
            continue
        if r["part"] == "overlap":
            setup = (f"np {r['ranks']}, dp {r['ranks']}, zero 2, accum {r['accum']}, "
                     f"{r['bucket_bytes'] >> 20} MiB buckets, 1 thread/rank")
            names, target = ("overlap", "no overlap"), "< 1 is a gain"
        else:
            rev = (r["baseline_rev"] or "given binary")[:12]
            setup = f"1 process, {r['threads_per_rank']} threads"
            names, target = ("current", f"foundation {rev}"), f"<= {r['target']:.2f}"
        lines.append(f"| {r['part']} | {setup} | {names[0]} | {r['ms']:.1f} | {names[1]}"
                     f" | {r['reference_ms']:.1f} | {r['ratio']:.3f} | {target} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["overlap", "degree1", "dp", "all"], default="all")
    p.add_argument("--torch-python", metavar="PATH",
                   help="dp: a python with PyTorch 2.x (e.g. /tmp/t2/bin/python) for the DDP "
                        "and FSDP2 references; without it only ztrain is measured")
    p.add_argument("--steps", type=int, default=8, help="timed steps per run (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per run (default 2)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each side per part (default 3)")
    p.add_argument("--ztrain", default=os.path.join(REPO, "build", "ztrain"))
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--baseline-rev", metavar="REV",
                   help="foundation revision for degree1 (default: the commit "
                        f"whose subject matches '{BASELINE_SUBJECT}')")
    p.add_argument("--baseline-ztrain", metavar="PATH",
                   help="an already built foundation binary (skips the worktree build)")
    p.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    args = p.parse_args()
    if args.steps < 5:
        p.error("--steps must be at least 5 for a meaningful median")
    if args.warmup < 0 or args.repeats < 1:
        p.error("--warmup must be >= 0 and --repeats >= 1")
    if args.baseline_rev and args.baseline_ztrain:
        p.error("--baseline-rev and --baseline-ztrain exclude each other")
    if not os.access(args.ztrain, os.X_OK):
        p.error(f"{args.ztrain} is not an executable (build with cmake --build build)")
    args.ztrain = os.path.abspath(args.ztrain)
    parts = ["overlap", "degree1", "dp"] if args.part == "all" else [args.part]

    # Other work on the machine skews both sides; the load average tells a
    # reader of the numbers whether they were taken on a quiet machine.
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ztrain_bench_parallel_") as workdir:
        benches = {"overlap": bench_overlap, "degree1": bench_degree1, "dp": bench_dp}
        results = [benches[part](args, workdir) for part in parts]
    load_after = os.getloadavg()[0]

    print(markdown(results))
    print(f"\nfp32 AdamW, clip 1.0; median of {args.steps} steps after {args.warmup} "
          f"warm-up, median over {args.repeats} interleaved runs of each side. "
          f"Load average (1 min) {load_before:.1f} before, {load_after:.1f} after; "
          f"{time.perf_counter() - t0:.0f} s in all.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                       "ztrain": args.ztrain, "loadavg_before": load_before,
                       "loadavg_after": load_after, "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
