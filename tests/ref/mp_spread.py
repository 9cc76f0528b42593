#!/usr/bin/python3
"""How far two equally valid 16-bit trainings drift apart, and how far the
test's checks see policy errors: the measurement behind the tolerances of
the ref_torch_bf16/fp16 tests (docs/testing.md). Asserts nothing.

    mp_spread.py --init INIT.h5 --precision bf16|fp16 --steps N
                 [--loss-scale JSON] [--only NAME,...] [-v]
    mp_spread.py --init INIT.h5 --precision bf16|fp16 --steps N
                 [--loss-scale JSON] --write-run DIR --as NAME

INIT.h5 is a ztrain checkpoint at step 0 (`--steps 0 --save`); its plan is
used with train.precision (and train.loss_scale) replaced. The PyTorch
reference (tests/ref/ztorch.py) trains N steps from it, as the test replays
ztrain, with a snapshot (weights, AdamW moments, scaler) after each step.
Each other computation below is measured against it the way the test
measures ztrain (compare.py):

  whole run  N steps from INIT.h5: the largest relative loss difference over
             the steps and the largest relative L2 distance of a final
             tensor (the gpt key bias left out)
  one step   from each of the reference's snapshots k, step k+1: the largest
             relative loss difference and the largest relative L2
             difference of a tensor's gradient as AdamW took it (recovered
             from the first moments as compare.py does for ztrain)

The other computations, first those that change only reduction orders
(what the tolerances are derived from):

  split      every GEMM (forward, input and weight gradient) and attention
             product with its reduction cut in two halves summed after
             (ztorch._matmul): the values each 16-bit rounding sees move in
             their last fp32 bits, as between two GEMM kernels
  split3, split4  the same in three and four pieces
  reverse    the micro-batches' fp32 weight gradients accumulated last to
             first
  both       split and reverse together
  fp64       every op computed in float64 between the same rounding points
             (the weight gradients still summed into fp32): what float32's
             own rounding errors move, which bounds what two float32
             implementations (ztrain's kernels, torch's) differ by

then policy errors the test should see (what the tolerances must still
catch):

  fp32             no 16-bit rounding at all
  fp32-grads       activation gradients not rounded (forward rounded)
  fused-bias       bias added before the GEMM output is rounded (one
                   rounding instead of two)
  16bit-wgrads     each micro-batch's weight gradients rounded to 16 bit
  D-from-fp32-O    attention backward's D from the unrounded output

With a loss scale it also says whether the (loss_scale, skipped) sequences
agree, and for fp16 the margin of each step's overflow decision and how far
each computation moves it (the largest relative change of a one-step
replay's largest |gradient| at a rounding point, over the steps whose
decision agrees).

--write-run DIR --as NAME instead trains computation NAME and writes what a
ztrain run would (DIR/final.h5, DIR/ck/step_*.h5 after every step,
DIR/m.jsonl), a stand-in for ztrain to check compare.py with:
`compare.py --init INIT.h5 --final DIR/final.h5 --metrics DIR/m.jsonl
--steps-dir DIR/ck ...` must pass for a reduction order and should fail
for a policy error.
"""

import argparse
import copy
import json
import math
import os
import sys

import h5py
import torch

import compare
import ztorch


class Fp32Grads(ztorch.MixedPrecision):
    def round_grad(self, g):
        return g


class FusedBias(ztorch.MixedPrecision):
    def linear(self, x, lin, res=None):
        y = self.mm(x, self.w(lin.weight))
        y = y if res is None else res + y
        return self.r(y if lin.bias is None else y + self.w(lin.bias))


class _RoundBoth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, dtype):
        ctx.dtype = dtype
        return w.to(dtype).float()

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype).float(), None


class Wgrads16(ztorch.MixedPrecision):
    def w(self, p):
        return _RoundBoth.apply(p, self.dtype)


class _AttentionFp32D(ztorch._Attention16):
    """_Attention16 whose backward takes D from the unrounded output."""

    @staticmethod
    def forward(ctx, q, k, v, mp):
        ctx.mp, ctx.scale = mp, 1.0 / math.sqrt(q.shape[-1])
        scores = ztorch._matmul(q, k.transpose(-2, -1), mp.split) * ctx.scale
        future = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).triu(1)
        p = scores.masked_fill(future, float("-inf")).softmax(-1)
        o = ztorch._matmul(p, v, mp.split)
        ctx.save_for_backward(q, k, v, p, o)
        return o.to(mp.dtype).float()


class DFromFp32O(ztorch.MixedPrecision):
    def attention(self, q, k, v):
        return _AttentionFp32D.apply(q, k, v, self)


VARIANTS = {
    "split": lambda p: ztorch.MixedPrecision(p, split_gemms=2),
    "split3": lambda p: ztorch.MixedPrecision(p, split_gemms=3),
    "split4": lambda p: ztorch.MixedPrecision(p, split_gemms=4),
    "reverse": lambda p: ztorch.MixedPrecision(p, reverse_micro_batches=True),
    "both": lambda p: ztorch.MixedPrecision(p, split_gemms=2, reverse_micro_batches=True),
    "fp64": lambda p: ztorch.MixedPrecision(p, compute=torch.float64),
    "fp32": lambda p: None,
    "fp32-grads": Fp32Grads,
    "fused-bias": FusedBias,
    "16bit-wgrads": Wgrads16,
    "D-from-fp32-O": DFromFp32O,
}


def snapshot(model, opt, plan, step, skipped, scaler) -> ztorch.Checkpoint:
    state = {p: opt.state[p] for p in model.parameters() if p in opt.state}
    names = dict(model.named_parameters())
    model_np = {n: p.detach().numpy().copy() for n, p in names.items()}
    m = {n: state[p]["exp_avg"].numpy().copy() for n, p in names.items()} if state else None
    v = {n: state[p]["exp_avg_sq"].numpy().copy() for n, p in names.items()} if state else None
    sc = None
    if scaler is not None and scaler.dynamic:
        sc = {"scale": scaler.scale, "iter": scaler.iter, "last_overflow_iter": scaler.last_overflow,
              "hysteresis": scaler.left}
    return ztorch.Checkpoint(plan, step, model_np, m, v, skipped, sc)


def make_start(ck, plan, mp):
    """compare.start_from with the 16-bit policy replaced by mp."""
    model, opt, _, scaler = compare.start_from(ck, plan)
    if scaler is None:
        scaler = ztorch.LossScaler(plan["train"].get("loss_scale"), ck.loss_scaler)
    return model, opt, scaler


def trajectory(init, plan, steps, mp, data, snapshots=False):
    model, opt, scaler = make_start(init, plan, mp)
    rows, snaps, skipped = [], [], 0
    for s in range(steps):
        if snapshots:
            snaps.append(snapshot(model, opt, plan, s, skipped, scaler))
        r = ztorch.train_step(model, opt, data, plan["train"], s, skipped, mp, scaler)
        r.grad_max = mp.grad_max if mp is not None else math.nan
        skipped += r.skipped
        rows.append(r)
    return model, rows, snaps


def one_step(ck, plan, mp, data):
    model, opt, scaler = make_start(ck, plan, mp)
    r = ztorch.train_step(model, opt, data, plan["train"], ck.step, ck.skipped, mp, scaler)
    return model, opt, r


def grads_of(ck, model, opt, b1):
    """The gradients AdamW took in the step from ck, as compare.py recovers ztrain's."""
    after = {n: opt.state[p]["exp_avg"].numpy() for n, p in model.named_parameters()}
    return compare.step_grads(ck.exp_avg, after, b1)


def write_checkpoint(path: str, ck: ztorch.Checkpoint) -> None:
    """The parts of ztrain's checkpoint format that ztorch.read_checkpoint reads."""
    with h5py.File(path, "w") as f:
        f.attrs["format"] = ztorch.CHECKPOINT_FORMAT
        f.attrs["format_version"] = max(ztorch.CHECKPOINT_VERSIONS)
        f.attrs["plan"] = json.dumps(ck.plan)
        f.attrs["step"] = ck.step
        state = {"skipped_steps": ck.skipped}
        if ck.loss_scaler is not None:
            state["loss_scaler"] = ck.loss_scaler
        f.attrs["state"] = json.dumps(state)
        for group, tensors in (("model", ck.model), ("optim/exp_avg", ck.exp_avg),
                               ("optim/exp_avg_sq", ck.exp_avg_sq)):
            for name, value in (tensors or {}).items():
                f.require_group(group)[name] = value


def write_run(init, plan, steps, mp, data, out: str) -> None:
    plan = copy.deepcopy(plan)
    plan["train"]["steps"] = steps
    os.makedirs(os.path.join(out, "ck"), exist_ok=True)
    model, opt, scaler = make_start(init, plan, mp)
    skipped = 0
    with open(os.path.join(out, "m.jsonl"), "w") as metrics:
        for s in range(steps):
            r = ztorch.train_step(model, opt, data, plan["train"], s, skipped, mp, scaler)
            skipped += r.skipped
            row = {"step": s + 1, "loss": r.loss, "lr": r.lr,
                   "grad_norm": r.grad_norm if math.isfinite(r.grad_norm) else None}
            if scaler.dynamic:
                row.update(loss_scale=r.loss_scale, skipped=r.skipped)
            metrics.write(json.dumps(row) + "\n")
            ck = snapshot(model, opt, plan, s + 1, skipped, scaler)
            write_checkpoint(os.path.join(out, "ck", f"step_{s + 1:08d}.h5"), ck)
    write_checkpoint(os.path.join(out, "final.h5"), ck)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True)
    p.add_argument("--precision", required=True, choices=sorted(ztorch.HALF_DTYPES))
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--loss-scale", help="train.loss_scale as the plan writes it (JSON); default: the plan's")
    p.add_argument("--only", help="comma-separated names of the computations to measure (default: all)")
    p.add_argument("-v", action="store_true", help="per-step loss differences of whole runs")
    p.add_argument("--write-run", metavar="DIR", help="write a ztrain-like run of computation --as")
    p.add_argument("--as", dest="as_", metavar="NAME", choices=sorted(VARIANTS))
    args = p.parse_args()

    torch.set_num_threads(1)
    init = ztorch.read_checkpoint(args.init)
    plan = copy.deepcopy(init.plan)
    plan["train"]["precision"] = args.precision
    if args.loss_scale:
        plan["train"]["loss_scale"] = json.loads(args.loss_scale)
    data = ztorch.TokenData(plan["data"]["train"], plan["data"].get("dtype", "u16"), plan["model"]["seq"])
    dim = plan["model"]["dim"]
    b1 = float(plan["train"]["betas"][0])
    names = args.only.split(",") if args.only else list(VARIANTS)
    if args.write_run:
        if not args.as_:
            p.error("--write-run needs --as")
        write_run(init, plan, args.steps, VARIANTS[args.as_](args.precision), data, args.write_run)
        return 0
    print(f"{plan['model']['kind']} {args.precision}, {args.steps} steps, "
          f"loss_scale {plan['train'].get('loss_scale')}")

    mp = ztorch.MixedPrecision(args.precision)
    base_model, base, snaps = trajectory(init, plan, args.steps, mp, data, snapshots=True)
    base_params = {n: q.detach().numpy() for n, q in base_model.named_parameters()}
    gn = [r.grad_norm for r in base]
    print(f"  reference: loss {base[0].loss:.4f} -> {base[-1].loss:.4f}; "
          f"{sum(g > float(plan['train']['clip']) for g in gn)} of {len(gn)} steps clipped "
          f"(grad norms {min(gn):.3g}..{max(gn):.3g}); "
          f"skipped steps {[i + 1 for i, r in enumerate(base) if r.skipped]}; "
          f"loss scales {[r.loss_scale for r in base]}")
    if args.precision == "fp16":
        # each step's largest |gradient| at a rounding point (scaled, before
        # rounding) against fp16's overflow threshold: how clear each
        # overflow decision is
        print("  largest |gradient| / 65520 per step: " + " ".join(f"{r.grad_max / 65520:.3g}" for r in base))
    # one step of the reference itself from its snapshots (to compare the
    # others' one steps with)
    # (and its largest |gradient| at a rounding point, to see how far the
    # others move it)
    base_one = []
    for ck in snaps:
        mp1 = ztorch.MixedPrecision(args.precision)
        base_one.append((*one_step(ck, plan, mp1, data), mp1.grad_max))

    print(f"  {'':>14} {'whole run: loss':>16} {'final weights':>14}   {'one step: loss':>15} {'gradient':>10}")
    for name in names:
        make = VARIANTS[name]
        model, rows, _ = trajectory(init, plan, args.steps, make(args.precision), data)
        loss_rel = [compare.rel(r.loss, b.loss) for r, b in zip(rows, base)]
        dists = sorted(((compare.weight_distance(n, q.detach().numpy(), base_params[n], dim), n)
                        for n, q in model.named_parameters()), reverse=True)
        same = [(r.loss_scale, r.skipped) for r in rows] == [(b.loss_scale, b.skipped) for b in base]
        one_loss, one_grad = 0.0, (0.0, 0, "")
        one_same, gmax_moved = True, None
        for ck, (bm, bopt, br, bgmax) in zip(snaps, base_one):
            mp1 = make(args.precision)
            m1, opt1, r1 = one_step(ck, plan, mp1, data)
            one_loss = max(one_loss, compare.rel(r1.loss, br.loss))
            one_same &= (r1.loss_scale, r1.skipped) == (br.loss_scale, br.skipped)
            # (a computation that rounds no gradient measures none)
            if mp1 is not None and mp1.grad_max > 0 and (r1.loss_scale, r1.skipped) == (br.loss_scale, br.skipped):
                gmax_moved = max(gmax_moved or 0.0, compare.rel(mp1.grad_max, bgmax))
            if br.skipped or r1.skipped:
                continue
            g1, gb = grads_of(ck, m1, opt1, b1), grads_of(ck, bm, bopt, b1)
            for n in g1:
                one_grad = max(one_grad, (compare.weight_distance(n, g1[n], gb[n], dim), ck.step + 1, n))
        worst = max(range(len(loss_rel)), key=lambda i: loss_rel[i])
        print(f"  {name:>14} {max(loss_rel):>10.2e} (s{worst + 1:<2}) {dists[0][0]:>9.2e}        "
              f"{one_loss:>12.2e} {one_grad[0]:>12.2e} (s{one_grad[1]} {one_grad[2]})"
              + ("" if same and one_same else f"  scaler sequence differs: whole run {not same}, one step {not one_same}")
              + f"\n  {'':>14} final weights worst {dists[0][1]}, median {dists[len(dists) // 2][0]:.2e}"
              + (f"; one step's largest |gradient| moved up to {gmax_moved:.2e}"
                 if args.precision == "fp16" and gmax_moved is not None else ""))
        if args.v:
            print(f"  {'':>14} per step: " + " ".join(f"{x:.1e}" for x in loss_rel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
