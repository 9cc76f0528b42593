#!/usr/bin/python3
"""PyTorch training-step throughput, the baseline ztrain is benchmarked against.

    torch_bench.py --model gpt --vocab V --seq T --dim C --layers L --heads H
                   --micro-batch B --steps N --warmup W [--threads 2]
                   [--sdpa] [--fused-adamw] [--compile]

Builds the ztrain reference model (tests/ref/ztorch.py) with N(0, 0.02)
weights and times N steps after W untimed ones, each step being forward,
backward, clip_grad_norm_(1.0), AdamW step, zero_grad on one random batch
of B x T tokens. PyTorch 2.x's strongest CPU settings are opt-in, so the
same script still runs on Debian's 1.13: --sdpa (attention through
F.scaled_dot_product_attention, causal), --fused-adamw (AdamW(fused=True)),
--compile (torch.compile of the model; the warm-up steps absorb the
compilation). Prints one JSON line:
    {"impl": "torch", "tokens_per_s_median": ..., "ms_median": ..., "ms_all": [...]}
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import ztorch  # noqa: E402


def time_steps(model, opt, vocab, B, T, warmup, steps, step_model=None, generator=None,
               before_step=None, autocast=False):
    """Trains warmup + steps steps on random tokens; the ms of the last
    `steps`. A step is forward, cross-entropy, backward,
    clip_grad_norm_(1.0), the optimizer and zero_grad; the batch is drawn
    (and before_step runs) outside the timed region. autocast: forward and
    loss under torch.autocast("cpu", torch.bfloat16), PyTorch's own mixed
    precision (weights, gradients and AdamW stay fp32)."""
    step_model = step_model or model
    ms_all = []
    for i in range(warmup + steps):
        rows = torch.randint(0, vocab, (B, T + 1), generator=generator)
        inputs, targets = rows[:, :-1], rows[:, 1:]
        if before_step:
            before_step()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = step_model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - t0
        if i >= warmup:
            ms_all.append(elapsed * 1e3)
    return ms_all


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["gpt", "llama"], default="gpt")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, help="llama only (default: heads)")
    p.add_argument("--ffn-dim", type=int, help="llama only (default: 4 * dim)")
    p.add_argument("--untied", action="store_true", help="gpt: separate head.weight")
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention")
    p.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--autocast", action="store_true", help="torch.autocast('cpu', torch.bfloat16)")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.compile and args.warmup < 1:
        p.error("--compile needs --warmup >= 1 (the first step compiles)")

    if args.sdpa:
        # ztorch's attention modules look the function up at call time.
        ztorch.causal_attention = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ztorch.build_model({
        "kind": args.model, "vocab": args.vocab, "seq": args.seq, "dim": args.dim,
        "layers": args.layers, "heads": args.heads, "kv_heads": args.kv_heads or args.heads,
        "ffn_dim": args.ffn_dim or 4 * args.dim,
        "norm_eps": 1e-5, "rope_theta": 10000.0,
        "tied": args.model == "gpt" and not args.untied,
    })
    ztorch.init_weights(model, std=0.02)
    opt = ztorch.make_optimizer(model, {"weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8})
    if args.fused_adamw:
        # the same groups (decay for matrices only) and hyper-parameters
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
        opt = torch.optim.AdamW(groups, lr=0.0, betas=(0.9, 0.95), eps=1e-8, fused=True)
    for group in opt.param_groups:
        group["lr"] = 3e-4
    step_model = torch.compile(model) if args.compile else model

    B, T = args.micro_batch, args.seq
    ms_all = time_steps(model, opt, args.vocab, B, T, args.warmup, args.steps, step_model,
                        autocast=args.autocast)

    ms_median = statistics.median(ms_all)
    print(json.dumps({
        "impl": "torch",
        "tokens_per_s_median": B * T / (ms_median / 1e3),
        "ms_median": ms_median,
        "ms_all": [round(ms, 3) for ms in ms_all],
    }))


if __name__ == "__main__":
    main()
