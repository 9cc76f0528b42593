#!/usr/bin/env python3
"""PyTorch's checkpoint paths, the references bench_ckpt.py measures ztrain's
saves and loads against. A benchmark helper, not a test.

    torch_ckpt.py save|load DIR [--dcp]                  # one process: torch.save / torch.load
    torchrun --nproc_per_node N torch_ckpt.py save|load DIR --dcp    # DCP with FSDP2 over gloo

Builds the ztrain reference GPT-2 124M (tests/ref/ztorch.py: tied head,
vocab 50304, seq 64) with AdamW state for every parameter (exp_avg,
exp_avg_sq: the same 3 x 124M floats a ztrain checkpoint holds), --threads
threads per process (1 by default). `save` writes DIR/ckpt.pt (torch.save of the model's
and the optimizer's state dicts, then fsync, as ztrain syncs its file) or,
with --dcp, the model sharded by FSDP2 (fully_shard on every block and the
root, like ztrain's ZeRO-3) saved with torch.distributed.checkpoint into
DIR (one file per rank plus .metadata, fsynced by DCP's FileSystemWriter).
`load` reads it back into a fresh model and optimizer. The timed part is
the call (from a barrier to the last rank's return, for DCP); rank 0
prints one JSON line: {"what", "ranks", "bytes", "seconds", "gbps"}.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import ztorch  # noqa: E402

PLAN = {"kind": "gpt", "vocab": 50304, "seq": 64, "dim": 768, "layers": 12, "heads": 12,
        "kv_heads": 12, "ffn_dim": 3072, "norm_eps": 1e-5, "rope_theta": 10000.0, "tied": True}


def build(dcp: bool):
    torch.manual_seed(0)
    model = ztorch.build_model(PLAN)
    ztorch.init_weights(model, std=0.02)
    if dcp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = ztorch.make_optimizer(model, {"weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8})
    # AdamW's state as after a step (values do not matter to the I/O)
    for group in opt.param_groups:
        for p in group["params"]:
            opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.full_like(p, 1e-3),
                            "exp_avg_sq": torch.full_like(p, 1e-6)}
    return model, opt


def tree_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["save", "load"])
    p.add_argument("dir")
    p.add_argument("--dcp", action="store_true", help="FSDP2 + torch.distributed.checkpoint")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rank, ranks = 0, 1
    if args.dcp:
        dist.init_process_group("gloo")
        rank, ranks = dist.get_rank(), dist.get_world_size()
    model, opt = build(args.dcp)
    target = args.dir if args.dcp else os.path.join(args.dir, "ckpt.pt")
    if args.dcp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dist.barrier()
        t0 = time.perf_counter()
        if args.mode == "save":
            dcp.save(state, checkpoint_id=target)
        else:
            dcp.load(state, checkpoint_id=target)
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        dist.barrier()
        dt = time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        if args.mode == "save":
            with open(target, "wb") as f:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
        else:
            sd = torch.load(target, weights_only=True)
            model.load_state_dict(sd["model"])
            opt.load_state_dict(sd["optim"])
        dt = time.perf_counter() - t0
    if rank == 0:
        n = tree_bytes(target)
        print(json.dumps({"what": ("dcp " if args.dcp else "torch.") + args.mode, "ranks": ranks,
                          "bytes": n, "seconds": round(dt, 4), "gbps": round(n / dt / 1e9, 4)}),
              flush=True)
    if args.dcp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
