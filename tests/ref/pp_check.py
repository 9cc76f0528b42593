#!/usr/bin/python3
"""ZeRO's traffic and memory under a pipeline, on the first stage.

    pp_check.py RUN_DIR PP TP DP ZERO CHUNKS

RUN_DIR holds m.jsonl (rank 0's metrics) and final.h5. Rank 0 is the first
stage's rank (dp 0, tp 0). Its Ψ is computed here from the logical shapes
and Megatron's sharding rules (tests/ref/grid_check.py), over the tensors of
the first stage only: the embedding and the blocks of virtual stages
c·pp (c < CHUNKS), as the plan stored in the checkpoint lists them
(parallel.stages). Per step, the bytes rank 0 moved on its dp
group must equal the formulas of docs/parallelism.md with that Ψ and a = the
micro-batches per step (zero 0, 1: 2Ψ(dp−1)/dp · 4; zero 2: (a+1)Ψ(dp−1)/dp
· 4; zero 3: 3aΨ(dp−1)/dp · 4), and its model-state bytes the state formula,
within 1%. Exit 0 on pass, 1 on failure.
"""
import sys

import zcheck
from zcheck import read_metrics
from grid_check import local_count, unit_of


def check(run: str, pp: int, tp: int, dp: int, zero: int, chunks: int) -> tuple:
    """(summary line, failures) for the run in RUN_DIR; raises ValueError
    when the plan's stages do not match pp * chunks."""
    rows = read_metrics(run + "/m.jsonl")
    ck = zcheck.read_checkpoint(run + "/final.h5")
    m, train = ck.plan["model"], ck.plan["train"]
    L, V = m["layers"], pp * chunks
    stages = ck.plan["parallel"]["stages"]
    if len(stages) != V:
        raise ValueError(f"pp_check: the plan lists {len(stages)} stages, pp * chunks = {V}")
    first = {0} | {1 + b for v in range(0, V, pp) for b in range(stages[v][0], stages[v][1] + 1)}
    psi = sum(local_count(n, t.size, tp, m["kv_heads"]) for n, t in ck.model.items()
              if unit_of(n, L) in first)
    a = train["global_batch"] // (train["micro_batch"] * dp)
    frac = (dp - 1) / dp
    want_dp = 4 * psi * frac * {0: 2, 1: 2, 2: a + 1, 3: 3 * a}[zero]
    S = psi / dp
    want_state = {0: 16 * psi, 1: 8 * psi + 8 * S, 2: 4 * psi + 12 * S, 3: 16 * S}[zero]
    bad = []
    for r in rows:
        got = r["bytes"]["dp"]
        if (want_dp == 0 and got != 0) or (want_dp and abs(got - want_dp) > 0.01 * want_dp):
            bad.append(f"step {r['step']}: dp bytes {got}, formula {want_dp:.0f}")
    st = rows[-1]["state_bytes"] if rows else -1
    if abs(st - want_state) > 0.01 * want_state:
        bad.append(f"model states {st} bytes, formula {want_state:.0f}")
    return (f"   first stage: Ψ {psi}, dp bytes/step {rows[-1]['bytes']['dp'] if rows else None} "
            f"(formula {want_dp:.0f}), states {st} (formula {want_state:.0f})"), bad


def main() -> int:
    if len(sys.argv) != 7:
        print(__doc__)
        return 2
    run, (pp, tp, dp, zero, chunks) = sys.argv[1], map(int, sys.argv[2:])
    try:
        line, bad = check(run, pp, tp, dp, zero, chunks)
    except ValueError as e:
        print(e)
        return 2
    print(line)
    for b in bad[:5]:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
