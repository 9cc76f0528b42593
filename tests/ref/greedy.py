#!/usr/bin/python3
"""Greedy decoding in PyTorch, for `ztrain sample --temperature 0`.

    greedy.py CKPT PROMPT_IDS N [--min-gap G]

Loads the checkpoint's model (ztorch.Transformer, fp32) and appends the
argmax token N times, each from a full forward of the whole sequence so far
(no cache): what ztrain's KV-cache decoding must reproduce. It stops, as
ztrain does, when the model's seq positions are used up (the token after
the last position is still predicted). Prints the new ids on one line.
The comparison is meaningful only where every choice is clear: exit 1 if
the two largest logits of any step are closer than --min-gap (default
1e-3, some 50 times the float differences between two fp32
implementations at these logit scales), naming the step.
"""
import argparse
import sys

import torch

import ztorch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("prompt_ids", help="space-separated token ids")
    ap.add_argument("n", type=int)
    ap.add_argument("--min-gap", type=float, default=1e-3)
    a = ap.parse_args()
    ck = ztorch.read_checkpoint(a.ckpt)
    model = ztorch.build_model(ck.plan["model"])
    ztorch.load_weights(model, ck.model)
    model.eval()
    seq = model.cfg.seq
    ids = [int(x) for x in a.prompt_ids.split()]
    new, gaps = [], []
    with torch.no_grad():
        while len(new) < a.n and len(ids) <= seq:
            logits = model(torch.tensor([ids]))[0, -1]
            top = torch.topk(logits, 2)
            gaps.append((top.values[0] - top.values[1]).item())
            nxt = int(top.indices[0])
            ids.append(nxt)
            new.append(nxt)
    print(" ".join(map(str, new)))
    worst = min(range(len(gaps)), key=gaps.__getitem__)
    print(f"{len(new)} greedy tokens, smallest gap between the two best logits "
          f"{gaps[worst]:.2e} (step {worst + 1})", file=sys.stderr)
    if gaps[worst] < a.min_gap:
        print(f"step {worst + 1}: the two best logits are {gaps[worst]:.2e} apart, below "
              f"--min-gap {a.min_gap}: greedy choices this close prove nothing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
