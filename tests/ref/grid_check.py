#!/usr/bin/python3
"""Check parallel runs against the single-process run: equivalence, traffic
and memory.

    grid_check.py REF_DIR RUN_DIR [RUN_DIR ...]

Each directory holds m.jsonl (metrics), final.h5 (checkpoint) and run.json
({"dp", "tp", "zero", "sp", "accum", "micro_batch", "bucket_bytes"}; sp:
sequence parallelism). For every run:
  - equivalence: each step's loss within 1e-5 relative of the reference,
    every logical tensor within 1e-4 relative L2 (zcheck.weight_distance);
  - traffic on the dp group, bytes per step per rank (Ψ = this TP rank's
    parameter count, a = micro-batches per step, ring volumes):
      zero 0 and 1: 2Ψ(dp−1)/dp · 4;  zero 2: (a+1)Ψ(dp−1)/dp · 4;
      zero 3: 3aΨ(dp−1)/dp · 4;  within 1%;
    on the tp group: per micro-batch (4L+2) all-reduces of
    micro_batch·seq·dim floats and 3·micro_batch·seq floats for the
    vocab-parallel loss, 2n(tp−1)/tp each; with tp > kv_heads (llama) each
    kv head is replicated over r = tp/kv_heads ranks and the TP traffic
    adds, per micro-batch and layer, one all-reduce of its k and v weight
    gradient (2·head_dim·dim floats) over those r ranks, 2n(r−1)/r; with
    sequence parallelism each of the (4L+2) all-reduces becomes a
    reduce-scatter and an all-gather of the same total volume (the
    embedding's and the head's are split between forward and backward),
    and the norms' gradients (every *norm* tensor, P_norm floats) are
    all-reduced over tp, 2·P_norm(tp−1)/tp more per micro-batch; within 1%;
  - memory of model states on rank 0: fp32 params 4Ψ, grads 4Ψ, Adam 8Ψ,
    the sharded ones divided by dp as the stage says; within 1%; and the
    gather/bucket buffers within their bound.
Ψ is computed here from the logical shapes and Megatron's sharding rules,
independently of ztrain's own layout code: tensors cut over TP count
numel/tp, llama's k and v numel/min(tp, kv_heads) (one whole kv head per
rank once tp > kv_heads), the others numel. Exit 0 on pass, 1 on failure.
"""
import json
import os
import sys

import numpy as np

import zcheck
from zcheck import read_metrics, rel, weight_distance

# Logical tensors cut over the TP group (column-, row- or vocab-parallel);
# all others (norms, positions, row-parallel biases) are whole on every rank.
# llama's k and v are cut by kv heads: in tp slices, or in kv_heads slices
# (one kv head per rank, replicated) when tp > kv_heads.
TP_SHARDED = ("embed.tokens", "head.weight", "attn.qkv.weight", "attn.qkv.bias",
              "attn.q.weight", "attn.out.weight",
              "mlp.up.weight", "mlp.up.bias", "mlp.gate.weight", "mlp.down.weight")
KV = ("attn.k.weight", "attn.v.weight")


def local_count(name: str, numel: int, tp: int, kv_heads: int) -> int:
    if name.endswith(KV):
        return numel // min(tp, kv_heads)
    return numel // tp if name.endswith(TP_SHARDED) else numel


def unit_of(name: str, layers: int) -> int:
    if name.startswith("embed."):
        return 0
    if name.startswith("blocks."):
        return 1 + int(name.split(".")[1])
    return layers + 1


def check(ref, run_dir: str) -> list:
    cfg = json.load(open(os.path.join(run_dir, "run.json")))
    dp, tp, zero, a = cfg["dp"], cfg["tp"], cfg["zero"], cfg["accum"]
    sp = cfg.get("sp", False)
    label = f"dp={dp} tp={tp} zero={zero}" + (" sp" if sp else "")
    if tp > ref[1].plan["model"]["kv_heads"]:
        label += f" kv_rep={tp // ref[1].plan['model']['kv_heads']}"
    bad = []
    rows = read_metrics(os.path.join(run_dir, "m.jsonl"))
    ck = zcheck.read_checkpoint(os.path.join(run_dir, "final.h5"))
    ref_rows, ref_ck = ref
    m = ref_ck.plan["model"]
    if len(rows) != len(ref_rows) or not rows:
        return [f"{label}: {len(rows)} steps against {len(ref_rows)}"]
    worst_loss = max(rel(x["loss"], r["loss"]) for x, r in zip(rows, ref_rows))
    if not worst_loss <= 1e-5:
        bad.append(f"{label}: loss differs by {worst_loss:.3e} relative")
    worst_w = (0.0, "")
    for n, want in ref_ck.model.items():
        d = weight_distance(n, ck.model[n], want, m["dim"]) if n in ck.model else float("inf")
        worst_w = max(worst_w, (d, n))
    if not worst_w[0] <= 1e-4:
        bad.append(f"{label}: tensor {worst_w[1]} differs by {worst_w[0]:.3e}")

    kvh = m["kv_heads"]
    psi = sum(local_count(n, v.size, tp, kvh) for n, v in ref_ck.model.items())
    units = {}
    for n, v in ref_ck.model.items():
        u = unit_of(n, m["layers"])
        units[u] = units.get(u, 0) + local_count(n, v.size, tp, kvh)
    frac = (dp - 1) / dp
    want_dp = 4 * psi * frac * {0: 2, 1: 2, 2: a + 1, 3: 3 * a}[zero]
    N = cfg["micro_batch"] * m["seq"]
    want_tp = a * 4 * ((4 * m["layers"] + 2) * N * m["dim"] + 3 * N) * 2 * (tp - 1) / tp
    r = tp // kvh if tp > kvh else 1  # ranks sharing a kv head
    kv_grad = 2 * (m["dim"] // m["heads"]) * m["dim"]  # k and v rows of one head
    want_tp += a * 4 * m["layers"] * kv_grad * 2 * (r - 1) / r
    if sp:  # the norms' partial gradients, summed over tp
        p_norm = sum(v.size for n, v in ref_ck.model.items() if "norm" in n)
        want_tp += a * 4 * p_norm * 2 * (tp - 1) / tp
    S = psi / dp
    want_state = {0: 16 * psi, 1: 8 * psi + 8 * S, 2: 4 * psi + 12 * S, 3: 16 * S}[zero]
    bucket = cfg["bucket_bytes"]
    biggest = 4 * max(units.values())
    # stage 2: 3 bucket buffers (+ their receive halves); stage 3 adds 3
    # buffers of the largest unit for gathers
    bound = {0: 0, 1: 0, 2: 6 * max(bucket, biggest), 3: 6 * max(bucket, biggest) + 3 * biggest}[zero]
    for r in rows:
        got_dp, got_tp = r["bytes"]["dp"], r["bytes"]["tp"]
        for what, got, want in (("dp", got_dp, want_dp), ("tp", got_tp, want_tp)):
            if (want == 0 and got != 0) or (want and abs(got - want) > 0.01 * want):
                bad.append(f"{label}: step {r['step']}: {what} bytes {got}, formula {want:.0f}")
                break
    st = rows[-1]["state_bytes"]
    if abs(st - want_state) > 0.01 * want_state:
        bad.append(f"{label}: model states {st} bytes, formula {want_state:.0f}")
    if rows[-1]["buffer_bytes"] > bound:
        bad.append(f"{label}: buffers {rows[-1]['buffer_bytes']} bytes over the bound {bound}")
    print(f"{label}: loss {worst_loss:.1e}, weights {worst_w[0]:.1e}; dp bytes/step "
          f"{rows[-1]['bytes']['dp']} (formula {want_dp:.0f}), tp {rows[-1]['bytes']['tp']} "
          f"(formula {want_tp:.0f}); states {st} (formula {want_state:.0f})")
    return bad


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    ref_dir = sys.argv[1]
    ref_rows = read_metrics(os.path.join(ref_dir, "m.jsonl"))
    ref_ck = zcheck.read_checkpoint(os.path.join(ref_dir, "final.h5"))
    clip = ref_ck.plan["train"]["clip"]
    if not any(r["grad_norm"] > clip for r in ref_rows):
        print("FAIL: clipping never acted in the reference run")
        return 1
    bad = []
    for d in sys.argv[2:]:
        bad += check((ref_rows, ref_ck), d)
    for b in bad:
        print("FAIL:", b)
    print(f"{len(sys.argv) - 2 - len({b.split(':')[0] for b in bad})} passed, "
          f"{len({b.split(':')[0] for b in bad})} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
