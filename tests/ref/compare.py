#!/usr/bin/python3
"""Replay a ztrain run in PyTorch and compare losses and final weights.

    compare.py --init INIT.h5 --final FINAL.h5 --metrics METRICS.jsonl
               [--loss-rtol 1e-5] [--weight-rtol 1e-4]

The plan is read from FINAL.h5; the torch model starts from INIT.h5 (and, if
INIT.h5 is a checkpoint taken after step > 0, from its AdamW moments) and
trains one step per "loss" line of METRICS.jsonl on the same batches.
Failures: a step whose loss differs by more than --loss-rtol (relative to
torch), a /model tensor of FINAL.h5 whose relative L2 distance to the torch
parameter exceeds --weight-rtol, or inputs that would make the comparison
vacuous or meaningless (no steps, mismatched names, steps that do not line
up). Exit status 0 on pass, 1 on failure. The gpt key bias (rows C..2C of
attn.qkv.bias) is left out of the weight check: see the comment in run().

Grad norm and learning rate are shown for diagnosis only: their precision
in the metrics file is up to the writer.
"""

import argparse
import json
import math
import sys

import numpy as np

import ztorch


class Failure(Exception):
    pass


def rel(a: float, b: float) -> float:
    """|a - b| / |b|, with 0/0 = 0; NaN propagates so that it fails checks."""
    diff = abs(a - b)
    return diff / abs(b) if b != 0 else (0.0 if diff == 0 else math.inf)


def read_metrics(path: str) -> list:
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise Failure(f"{path}:{lineno}: not JSON: {e}")
            # Validation-only lines carry "val_loss" and no training step.
            if "loss" in row:
                rows.append(row)
    return rows


def metric(row: dict, key: str) -> float:
    """A metrics value as float; absent or null (a writer's NaN) reads as NaN."""
    value = row.get(key)
    return math.nan if value is None else float(value)


def check_names(model, tensors, what: str) -> None:
    problems = ztorch.name_mismatches(model, tensors)
    if problems:
        raise Failure(f"{what} does not match the torch model:\n  " + "\n  ".join(problems))


def weight_distance(name: str, value, ref, dim: int) -> float:
    """Relative L2 distance ‖value − ref‖ / ‖ref‖ of one logical tensor.

    The key bias of gpt's attn.qkv.bias (rows dim..2*dim) has an identically
    zero gradient (it shifts every score of a query by the same amount, which
    softmax ignores), so its value is rounding noise that Adam normalises up
    to ~lr-sized steps: it cannot match and does not affect the model. Only
    the q and v rows of that tensor are compared.
    """
    value, ref = np.asarray(value, np.float64), np.asarray(ref, np.float64)
    if name.endswith("attn.qkv.bias"):
        keep = np.r_[0:dim, 2 * dim : 3 * dim]
        value, ref = value[keep], ref[keep]
    num, den = np.linalg.norm(value - ref), np.linalg.norm(ref)
    return num / den if den else (0.0 if num == 0 else math.inf)


def fmt(x: float) -> str:
    return f"{x:.3e}" if math.isfinite(x) else str(x)


def run(args) -> bool:
    final = ztorch.read_checkpoint(args.final)
    init = ztorch.read_checkpoint(args.init)
    plan = final.plan
    if init.plan.get("model") != plan["model"]:
        raise Failure(f"model plans differ:\n  init:  {init.plan.get('model')}\n  final: {plan['model']}")

    metrics = read_metrics(args.metrics)
    if not metrics:
        raise Failure(f"{args.metrics}: no lines with a 'loss': nothing to compare")
    start, n = init.step, len(metrics)
    # The metrics must be exactly the steps between the two checkpoints, or
    # the replay would train on different batches / learning rates.
    steps = [row.get("step") for row in metrics]
    if steps != list(range(start + 1, start + n + 1)):
        raise Failure(f"metrics steps are {steps[:3]}...{steps[-1:]}, expected {start + 1}..{start + n}")
    if final.step != start + n:
        raise Failure(f"final checkpoint is at step {final.step}, expected {start} + {n} metrics lines")

    model = ztorch.build_model(plan["model"])
    check_names(model, init.model, f"{args.init} /model")
    check_names(model, final.model, f"{args.final} /model")
    ztorch.load_weights(model, init.model)
    opt = ztorch.make_optimizer(model, plan["train"])
    if start > 0:
        ztorch.load_optimizer_state(opt, model, init)

    data_plan = plan["data"]
    if data_plan.get("shuffle"):
        raise Failure("plan has shuffle=true: the reference only knows the unshuffled order")
    data = ztorch.TokenData(data_plan["train"], data_plan.get("dtype", "u16"), model.cfg.seq)

    ok = True
    print(f"{'step':>6} {'loss ztrain':>14} {'loss torch':>14} {'rel':>9}   "
          f"{'gnorm ztrain':>13} {'gnorm torch':>13} {'rel':>9}   {'lr rel':>9}")
    for i, row in enumerate(metrics):
        res = ztorch.train_step(model, opt, data, plan["train"], start + i, init.skipped)
        loss = metric(row, "loss")
        loss_rel = rel(loss, res.loss)
        bad = not loss_rel <= args.loss_rtol  # written so that NaN fails
        gn, lr = metric(row, "grad_norm"), metric(row, "lr")
        print(f"{row['step']:>6} {loss:>14.8f} {res.loss:>14.8f} {fmt(loss_rel):>9}   "
              f"{gn:>13.6e} {res.grad_norm:>13.6e} {fmt(rel(gn, res.grad_norm)):>9}   "
              f"{fmt(rel(lr, res.lr)):>9}{'  <-- FAIL' if bad else ''}")
        if bad:
            print(f"FAIL: step {row['step']}: loss rel diff {fmt(loss_rel)} > {args.loss_rtol}")
            ok = False

    params = dict(model.named_parameters())
    diffs = [(weight_distance(name, value, params[name].detach().numpy(), model.cfg.dim), name)
             for name, value in final.model.items()]
    # Worst first, NaN counting as worst of all.
    diffs.sort(key=lambda d: (math.isnan(d[0]), 0.0 if math.isnan(d[0]) else d[0]), reverse=True)
    note = "; k rows of attn.qkv.bias excluded" if model.cfg.kind == "gpt" else ""
    print(f"\nworst of {len(diffs)} tensors (relative L2 distance, ztrain vs torch{note}):")
    for d, name in diffs[:10]:
        print(f"  {fmt(d):>9}  {name}")
    for d, name in diffs:
        if not d <= args.weight_rtol:
            print(f"FAIL: tensor {name}: rel diff {fmt(d)} > {args.weight_rtol}")
            ok = False
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True, help="checkpoint the run started from")
    p.add_argument("--final", required=True, help="checkpoint the run ended with (its plan is used)")
    p.add_argument("--metrics", required=True, help="ztrain metrics JSONL of the run")
    p.add_argument("--loss-rtol", type=float, default=1e-5)
    p.add_argument("--weight-rtol", type=float, default=1e-4)
    args = p.parse_args()
    try:
        ok = run(args)
    except KeyError as e:
        print(f"FAIL: missing key {e} in a plan")
        return 1
    except (Failure, ValueError, OSError) as e:
        print(f"FAIL: {e}")
        return 1
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
