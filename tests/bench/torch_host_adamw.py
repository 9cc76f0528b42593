#!/usr/bin/python3
"""PyTorch's CPU AdamW on one flat fp32 parameter, the reference
bench_host_adamw.c's AdamW is compared with.

    torch_host_adamw.py [--n-mi 64] [--repeats 7]

Needs PyTorch 2.x (--python of bench_host_adamw.py; fused=True on CPU came
in 2.4). One parameter of N_MI Mi fp32 elements with a gradient, the same
hyperparameters as the C side (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight
decay 0.1) and whatever threads OMP_NUM_THREADS gives (torch reads it).
Times, REPEATS times after one untimed round that creates the state, in a
rotating order:
  fused          AdamW(fused=True).step(): ATen's fused CPU kernel, one pass
  fused_bf16     the same plus the weights copied to a bf16 tensor, what a
                 mixed-precision trainer needs after its step (torch has no
                 fused output of a 16-bit copy)
  foreach        AdamW(foreach=True).step(): the multi-tensor path of
                 elementwise ops, one pass per op
Before timing, one step of each optimizer runs under torch.profiler and
the ATen ops it called are recorded ("fused_ops", "foreach_ops"): the proof
that fused=True ran aten::_fused_adamw_ and not a fallback. Prints one JSON
line."""

import argparse
import json
import os
import time

import torch


def profile_ops(opt):
    """The aten ops one step of opt calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::")})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-mi", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    n = a.n_mi << 20
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    gen = torch.Generator().manual_seed(5)
    p = torch.nn.Parameter(torch.randn(n, generator=gen) * 0.02)
    p.grad = torch.randn(n, generator=gen) * 1e-3
    p16 = torch.empty(n, dtype=torch.bfloat16)
    hp = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    fused = torch.optim.AdamW([p], fused=True, **hp)
    foreach = torch.optim.AdamW([p], foreach=True, **hp)
    out = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "n": n,
           "fused_flag": fused.param_groups[0]["fused"],
           "foreach_flag": foreach.param_groups[0]["foreach"],
           "fused_ops": profile_ops(fused), "foreach_ops": profile_ops(foreach)}

    def fused_bf16():
        fused.step()
        p16.copy_(p.detach())

    kernels = [("fused", fused.step), ("fused_bf16", fused_bf16), ("foreach", foreach.step)]
    times = {k: [] for k, _ in kernels}
    with torch.no_grad():
        for r in range(-1, a.repeats):
            for j in range(len(kernels)):
                name, fn = kernels[j if r < 0 else (j + r) % len(kernels)]
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                if r >= 0:
                    times[name].append(dt)
    out["nonfinite"] = int((~torch.isfinite(p.detach())).sum())
    for k, v in times.items():
        out[k + "_s"] = v
    print(json.dumps(out))


if __name__ == "__main__":
    main()
