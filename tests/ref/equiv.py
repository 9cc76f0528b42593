#!/usr/bin/python3
"""Compare a ztrain run against a reference ztrain run (usually np=1).

    equiv.py REF_METRICS REF.h5 METRICS RUN.h5 [--loss-rtol 1e-5] [--weight-rtol 1e-4]

Every step's loss must agree within --loss-rtol (relative) and every /model
tensor within --weight-rtol in relative L2 distance ‖a−b‖/‖b‖ (Adam turns
reduction-order noise in rarely-updated rows into element-wise differences
of order lr, so an element-wise maximum is the wrong measure; the gpt key
bias is left out, see zcheck.weight_distance). Exit 0 on pass, 1 on
failure; an empty or misaligned run fails.
"""
import argparse
import sys

import zcheck
from zcheck import read_metrics, rel, weight_distance


def check(ref_rows: list, want, run_rows: list, got, loss_rtol: float = 1e-5,
          weight_rtol: float = 1e-4) -> tuple:
    """One run against the reference: (summary line, failures). want and got
    are zcheck.Checkpoint; the rows are read_metrics' (pp_equiv.sh checks
    its runs in one process, against one reading of the reference)."""
    ref, run = ref_rows, run_rows
    bad = []
    if not ref or len(ref) != len(run):
        bad.append(f"{len(run)} steps against {len(ref)} in the reference")
    worst_loss = 0.0
    for r, x in zip(ref, run):
        if r["step"] != x["step"]:
            bad.append(f"step {x['step']} lines up with reference step {r['step']}")
        d = rel(x["loss"], r["loss"])
        worst_loss = max(worst_loss, d)
        if not d <= loss_rtol:
            bad.append(f"step {x['step']}: loss {x['loss']!r} vs {r['loss']!r} (rel {d:.3e})")

    names = sorted(want.model)
    if not names or names != sorted(got.model):
        bad.append("the checkpoints hold different tensors")
    dim = want.plan["model"]["dim"]
    worst = (0.0, "")
    for n in (n for n in names if n in got.model):
        d = weight_distance(n, got.model[n], want.model[n], dim)
        worst = max(worst, (d, n))
        if not d <= weight_rtol:
            bad.append(f"tensor {n}: relative L2 distance {d:.3e}")
    if want.step != got.step:
        bad.append(f"step {got.step} vs {want.step}")
    return (f"{len(run)} steps, worst loss rel {worst_loss:.3e}; "
            f"{len(names)} tensors, worst {worst[0]:.3e} ({worst[1]})"), bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref_metrics")
    ap.add_argument("ref_ckpt")
    ap.add_argument("metrics")
    ap.add_argument("ckpt")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--weight-rtol", type=float, default=1e-4)
    a = ap.parse_args()

    line, bad = check(read_metrics(a.ref_metrics), zcheck.read_checkpoint(a.ref_ckpt),
                      read_metrics(a.metrics), zcheck.read_checkpoint(a.ckpt),
                      a.loss_rtol, a.weight_rtol)
    print(line)
    for b in bad[:20]:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
