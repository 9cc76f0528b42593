#!/usr/bin/env python3
"""PyTorch data-parallel step time, the reference for ztrain's dp scaling.

    torchrun --nproc_per_node 2 torch_dp_bench.py --mode ddp|fsdp2 [shape...]
    python torch_dp_bench.py --mode single [shape...]

Needs PyTorch 2.x (FSDP2's fully_shard); run it with the venv's python, not
Debian's 1.13. Every rank trains the ztrain reference model (tests/ref/
ztorch.py, a GPT) on its own micro-batch of B x T random tokens with one
thread (gloo over shared memory between ranks): forward, backward (DDP
all-reduces 25 MB buckets during it; FSDP2 reduce-scatters per block and
all-gathers before use), clip_grad_norm_(1.0), AdamW (foreach), zero_grad.
Rank 0 prints one JSON line: {"impl", "mode", "ranks", "ms_median", "ms_all"}.
"""

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import ztorch  # noqa: E402
from torch_bench import time_steps  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["single", "ddp", "fsdp2"], required=True)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()

    torch.set_num_threads(1)
    rank, world = 0, 1
    if args.mode != "single":
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = ztorch.build_model({
        "kind": "gpt", "vocab": args.vocab, "seq": args.seq, "dim": args.dim,
        "layers": args.layers, "heads": args.heads, "kv_heads": args.heads,
        "ffn_dim": 4 * args.dim, "norm_eps": 1e-5, "rope_theta": 10000.0, "tied": True})
    ztorch.init_weights(model, std=0.02)
    if args.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=True)

    B, T = args.micro_batch, args.seq
    g = torch.Generator().manual_seed(rank)
    # every rank starts the step together, as ztrain's do
    ms_all = time_steps(model, opt, args.vocab, B, T, args.warmup, args.steps, generator=g,
                        before_step=dist.barrier if world > 1 else None)
    if world > 1:
        # a step ends for the job when its slowest rank ends it
        t = torch.tensor(ms_all, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms_all = t.tolist()
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"impl": "torch", "mode": args.mode, "ranks": world,
                          "ms_median": statistics.median(ms_all),
                          "ms_all": [round(m, 3) for m in ms_all]}))


if __name__ == "__main__":
    main()
