#!/usr/bin/python3
"""Two runs that must be the same run, bit for bit.

    bitwise.py A_METRICS A.h5 B_METRICS B.h5 [--norm-rtol R]

Every step's loss (and grad_norm) equal, and every tensor of the two
checkpoints (weights and both AdamW moments) equal as arrays of bits.
--norm-rtol lets the reported gradient norm differ by that much relative:
across pipeline stages its sum of squares is added up in another order
(one double rounding apart), which changes no weight unless it moved the
clipping coefficient, and the weights are still compared bit for bit.
Exit 0 when so; 1, naming what differs, when not, or when there is
nothing to compare.
"""
import json
import sys

import h5py
import numpy as np


def steps(path):
    return [json.loads(line) for line in open(path) if '"loss"' in line]


def main() -> int:
    ma, ca, mb, cb = sys.argv[1:5]
    norm_rtol = float(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--norm-rtol" else 0.0
    a, b = steps(ma), steps(mb)
    bad = []
    if not a or [s["step"] for s in a] != [s["step"] for s in b]:
        bad.append(f"steps {[s['step'] for s in a]} vs {[s['step'] for s in b]}")
    for x, y in zip(a, b):
        if x.get("loss") != y.get("loss"):
            bad.append(f"step {x['step']}: loss {x.get('loss')!r} vs {y.get('loss')!r}")
        gx, gy = x.get("grad_norm"), y.get("grad_norm")
        if gx != gy and not (gx is not None and gy is not None and
                             abs(gx - gy) <= norm_rtol * abs(gy)):
            bad.append(f"step {x['step']}: grad_norm {gx!r} vs {gy!r}")
    n = 0
    with h5py.File(ca, "r") as fa, h5py.File(cb, "r") as fb:
        for g in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            if set(fa[g]) != set(fb[g]):
                bad.append(f"{g}: tensors {sorted(fa[g])} vs {sorted(fb[g])}")
            for name in fa[g]:
                n += 1
                x, y = fa[g][name][...], fb[g][name][...]
                if x.shape != y.shape or x.tobytes() != y.tobytes():
                    bad.append(f"{g}/{name} differs (max |diff| {np.max(np.abs(x - y)):.3g})")
    print(f"{len(a)} steps, {n} tensors: " + ("bitwise equal" if not bad else "DIFFERENT"))
    for x in bad[:20]:
        print("FAIL:", x)
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
