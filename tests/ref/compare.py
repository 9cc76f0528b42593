#!/usr/bin/python3
"""Replay a ztrain run in PyTorch and compare losses and final weights.

    compare.py --init INIT.h5 --final FINAL.h5 --metrics METRICS.jsonl
               [--loss-rtol 1e-5] [--weight-rtol 1e-4]
               [--steps-dir DIR --step-loss-rtol X --step-grad-rtol Y]

The plan is read from FINAL.h5; the torch model starts from INIT.h5 (and, if
INIT.h5 is a checkpoint taken after step > 0, from its AdamW moments) and
trains one step per "loss" line of METRICS.jsonl on the same batches.
Failures: a step whose loss differs by more than --loss-rtol (relative to
torch), a /model tensor of FINAL.h5 whose relative L2 distance to the torch
parameter exceeds --weight-rtol, or inputs that would make the comparison
vacuous or meaningless (no steps, mismatched names, steps that do not line
up). Exit status 0 on pass, 1 on failure. The gpt key bias (rows C..2C of
attn.qkv.bias) is left out of the weight check: see the comment in run().

A plan with train.precision "bf16" or "fp16" replays under ztrain's 16-bit
policy (ztorch.MixedPrecision) with its loss scaler: each step's
"loss_scale" and "skipped" in METRICS.jsonl must then be the replay's.

--steps-dir DIR (the run's periodic checkpoints, every step) adds one-step
replays: from each checkpoint k whose successor k+1 is there too (INIT.h5
counting as its step), one step in PyTorch from ztrain's own weights,
moments and scaler state, against ztrain's step k+1: the loss of step k+1
(relative, --step-loss-rtol) and each tensor's gradient as AdamW took it
(unscaled and clipped, recovered from the first moments of checkpoints k
and k+1; relative L2, --step-grad-rtol); a skipped step must leave weights
and moments as they were. Unlike the whole replay, where 16-bit rounding
differences compound from step to step (and Adam turns small gradient
differences into lr-sized ones), this compares one step's forward and
backward at a time.

Grad norm and learning rate are shown for diagnosis only: their precision
in the metrics file is up to the writer.
"""

import argparse
import glob
import json
import math
import os
import sys

import numpy as np

import ztorch
from zcheck import Failure, read_metrics, rel, weight_distance  # noqa: F401


def metric(row: dict, key: str) -> float:
    """A metrics value as float; absent or null (a writer's NaN) reads as NaN."""
    value = row.get(key)
    return math.nan if value is None else float(value)


def check_names(model, tensors, what: str) -> None:
    problems = ztorch.name_mismatches(model, tensors)
    if problems:
        raise Failure(f"{what} does not match the torch model:\n  " + "\n  ".join(problems))


def fmt(x: float) -> str:
    return f"{x:.3e}" if math.isfinite(x) else str(x)


def start_from(ck, plan: dict):
    """The torch model, optimizer, 16-bit policy (None: fp32) and loss
    scaler (None: none) of a run at checkpoint ck."""
    model = ztorch.build_model(plan["model"])
    ztorch.load_weights(model, ck.model)
    opt = ztorch.make_optimizer(model, plan["train"])
    if ck.step > 0:
        ztorch.load_optimizer_state(opt, model, ck)
    mp = ztorch.MixedPrecision.from_plan(plan["train"])
    scale = plan["train"].get("loss_scale")
    scaled = scale is not None and scale != 1.0
    scaler = ztorch.LossScaler(scale, ck.loss_scaler) if mp is not None or scaled else None
    return model, opt, mp, scaler


def scaler_mismatch(row: dict, res) -> str:
    """How the step's loss scale and skip differ from the replay's ("" if not)."""
    got = (row.get("loss_scale", 1.0), bool(row.get("skipped", False)))
    want = (res.loss_scale, res.skipped)
    return "" if got == want else f"(loss_scale, skipped) ztrain {got}, torch {want}"


def worst_distances(final_model: dict, params: dict, dim: int) -> list:
    """(distance, name) per tensor, worst first, NaN counting as worst of all."""
    diffs = [(weight_distance(name, value, params[name].detach().numpy(), dim), name)
             for name, value in final_model.items()]
    diffs.sort(key=lambda d: (math.isnan(d[0]), 0.0 if math.isnan(d[0]) else d[0]), reverse=True)
    return diffs


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
    model, opt, mp, scaler = start_from(init, plan)
    print(f"precision {'fp32' if mp is None else mp.name}"
          + ("" if scaler is None else f", loss scale {plan['train'].get('loss_scale')}"))

    data_plan = plan["data"]
    if data_plan.get("shuffle"):
        raise Failure("plan has shuffle=true: the reference only knows the unshuffled order")
    data = ztorch.TokenData(data_plan["train"], data_plan.get("dtype", "u16"), model.cfg.seq)

    ok = True
    skipped = init.skipped
    print(f"{'step':>6} {'loss ztrain':>14} {'loss torch':>14} {'rel':>9}   "
          f"{'gnorm ztrain':>13} {'gnorm torch':>13} {'rel':>9}   {'lr rel':>9}")
    for i, row in enumerate(metrics):
        res = ztorch.train_step(model, opt, data, plan["train"], start + i, skipped, mp, scaler)
        skipped += res.skipped
        loss = metric(row, "loss")
        loss_rel = rel(loss, res.loss)
        bad = not loss_rel <= args.loss_rtol  # written so that NaN fails
        gn, lr = metric(row, "grad_norm"), metric(row, "lr")
        mismatch = scaler_mismatch(row, res)
        print(f"{row['step']:>6} {loss:>14.8f} {res.loss:>14.8f} {fmt(loss_rel):>9}   "
              f"{gn:>13.6e} {res.grad_norm:>13.6e} {fmt(rel(gn, res.grad_norm)):>9}   "
              f"{fmt(rel(lr, res.lr)):>9}{'  <-- FAIL' if bad or mismatch else ''}"
              + (f"  scale {res.loss_scale:g}" if scaler is not None else "")
              + ("  skipped" if res.skipped else ""))
        if bad:
            print(f"FAIL: step {row['step']}: loss rel diff {fmt(loss_rel)} > {args.loss_rtol}")
            ok = False
        if mismatch:
            print(f"FAIL: step {row['step']}: {mismatch}")
            ok = False

    diffs = worst_distances(final.model, dict(model.named_parameters()), model.cfg.dim)
    note = "; k rows of attn.qkv.bias excluded" if model.cfg.kind == "gpt" else ""
    print(f"\nworst of {len(diffs)} tensors (relative L2 distance, ztrain vs torch{note}):")
    for d, name in diffs[:10]:
        print(f"  {fmt(d):>9}  {name}")
    for d, name in diffs:
        if not d <= args.weight_rtol:
            print(f"FAIL: tensor {name}: rel diff {fmt(d)} > {args.weight_rtol}")
            ok = False
    if args.steps_dir:
        ok = one_steps(args, init, plan, metrics, data) and ok
    return ok


def step_grads(before: dict, after: dict, b1: float) -> dict:
    """Each tensor's gradient as AdamW took it in one step (unscaled, clipped),
    recovered from its first moment before and after: (m' − b1·m) / (1 − b1),
    in double; before None: a step from zero moments."""
    return {n: (np.asarray(m, np.float64) - (0.0 if before is None else b1 * np.asarray(before[n], np.float64)))
            / (1.0 - b1) for n, m in after.items()}


def one_steps(args, init, plan: dict, metrics: list, data) -> bool:
    """One-step replays from each of ztrain's checkpoints (see the module doc)."""
    cks = {init.step: args.init}
    for path in glob.glob(os.path.join(args.steps_dir, "step_*.h5")):
        cks[int(os.path.basename(path)[5:-3])] = path
    pairs = [k for k in sorted(cks) if k + 1 in cks and k >= init.step and k + 1 - init.step <= len(metrics)]
    if not pairs:
        raise Failure(f"{args.steps_dir}: no two checkpoints of consecutive steps")
    b1 = float(plan["train"]["betas"][0])
    ok = True
    worst_loss, worst_grad = (0.0, 0), (0.0, 0, "")
    print(f"\none-step replays from ztrain's checkpoints at steps {pairs[0]}..{pairs[-1]} ({len(pairs)}):")
    after = ztorch.read_checkpoint(cks[pairs[0]])
    for k in pairs:
        before, after = after, ztorch.read_checkpoint(cks[k + 1])
        where = f"step {k + 1} from ztrain's step {k}"
        if after.exp_avg is None:
            raise Failure(f"{cks[k + 1]}: no /optim state")
        model, opt, mp, scaler = start_from(before, plan)
        res = ztorch.train_step(model, opt, data, plan["train"], k, before.skipped, mp, scaler)
        row = metrics[k - init.step]
        loss_rel = rel(metric(row, "loss"), res.loss)
        worst_loss = max(worst_loss, (loss_rel, k + 1))
        if not loss_rel <= args.step_loss_rtol:
            print(f"FAIL: {where}: loss rel diff {fmt(loss_rel)} > {args.step_loss_rtol}")
            ok = False
        mismatch = scaler_mismatch(row, res)
        if mismatch:
            print(f"FAIL: {where}: {mismatch}")
            ok = False
        if res.skipped or mismatch:
            # a skipped step must leave weights and moments as they were
            if res.skipped and k > 0 and not all(
                    np.array_equal(a[n], b[n]) for a, b in ((after.model, before.model),
                                                            (after.exp_avg, before.exp_avg)) for n in a):
                print(f"FAIL: {where}: skipped, but ztrain's weights or moments changed")
                ok = False
            continue
        params = dict(model.named_parameters())
        torch_m = {n: opt.state[p]["exp_avg"].numpy() for n, p in params.items()}
        gz = step_grads(before.exp_avg, after.exp_avg, b1)
        gt = step_grads(before.exp_avg, torch_m, b1)
        for name in gz:
            d = weight_distance(name, gz[name], gt[name], model.cfg.dim)
            worst_grad = max(worst_grad, (d, k + 1, name))
            if not d <= args.step_grad_rtol:
                print(f"FAIL: {where}: gradient of {name}: rel diff {fmt(d)} > {args.step_grad_rtol}")
                ok = False
    print(f"  worst loss rel diff {fmt(worst_loss[0])} (step {worst_loss[1]}); worst gradient rel "
          f"diff {fmt(worst_grad[0])} (step {worst_grad[1]}, {worst_grad[2]})")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True, help="checkpoint the run started from")
    p.add_argument("--final", required=True, help="checkpoint the run ended with (its plan is used)")
    p.add_argument("--metrics", required=True, help="ztrain metrics JSONL of the run")
    p.add_argument("--loss-rtol", type=float, default=1e-5)
    p.add_argument("--weight-rtol", type=float, default=1e-4)
    p.add_argument("--steps-dir", help="the run's checkpoints (every step) for one-step replays")
    p.add_argument("--step-loss-rtol", type=float, default=1e-5)
    p.add_argument("--step-grad-rtol", type=float, default=1e-4)
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
