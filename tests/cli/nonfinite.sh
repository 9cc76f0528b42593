#!/usr/bin/env bash
# The non-finite guard. A step whose loss or gradient norm is not finite
# applies no update on any rank but still advances the data position; it is
# logged and marked "skipped": true in the metrics; max_bad_steps such steps
# in a row end the run (exit 1) before a checkpoint of that step, naming the
# first non-finite tensor; an update that makes weights non-finite ends it at
# once; metrics write non-finite values as null.
#   1. One poisoned gradient (test hook ZT_TEST_NAN_AT_STEP=STEP:RANK) at
#      np 1, at dp 2 x tp 2 with ZeRO 3 (poisoned on rank 3 only) and at
#      pp 2 (on the first stage, which has no loss): the checkpoint after the
#      skipped step is bitwise the one before it (weights and moments), the
#      losses up to the skip are bitwise the uninterrupted run's, rank 0
#      names the tensor another rank poisoned, and the whole run matches a
#      PyTorch replay that skips optimizer.step() there (AdamW's clock and
#      the LR schedule count applied updates, the next step takes the next
#      batch); the replay done the wrong ways (batch not advanced, skipped
#      step counted by the clock) must miss, so the comparison can fail.
#   2. train.lr = 1e3: the loss blows up, steps are skipped, the 5th in a
#      row ends the run with exit 1; `latest` is all finite.
#   3. max_bad_steps = 1 with NaN losses: exit 1 at the first; the log
#      prints nan, the metrics null; bad values of the key exit 2.
#   4. lr = 1e38 makes weights infinite from finite gradients: exit 1 at
#      step 1 naming the tensor, no checkpoint and no --save written.
# Usage: nonfinite.sh ZTRAIN MPIRUN...
set -u
Z=$(realpath "$1"); shift
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
zt_scratch
export OMP_NUM_THREADS=1

zt_tokens tok.bin 7 20000
cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2}
train = {micro_batch = 2, global_batch = 8, steps = 6, log_every = 0,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 4, final = 2e-4},
         weight_decay = 0.1, betas = {0.9, 0.95}, clip = 1.0}
data = {train = "tok.bin", shuffle = false}
checkpoint = {every = 1, keep = 100}
LUA

# ---- 1. one skipped step is exact -------------------------------------------
"$Z" run.lua --steps 0 --save init.h5 > /dev/null || bad "initial save"
"$Z" run.lua -e 'checkpoint.dir = "ckA"' --metrics a.jsonl > /dev/null 2> a.err || bad "run A: $(cat a.err)"
ZT_TEST_NAN_AT_STEP=3 "$Z" run.lua -e 'checkpoint.dir = "ckB"' --metrics b.jsonl > b.out 2> b.err ||
  bad "run B: $(cat b.err)"
ZT_TEST_NAN_AT_STEP=3:3 "$@" -x ZT_TEST_NAN_AT_STEP -np 4 "$Z" run.lua \
  -e 'parallel = {tp = 2, zero = 3}; checkpoint.dir = "ckG"' --metrics g.jsonl > g.out 2> g.err ||
  bad "run dp2 x tp2: $(cat g.err)"
ZT_TEST_NAN_AT_STEP=3:0 "$@" -x ZT_TEST_NAN_AT_STEP -np 2 "$Z" run.lua \
  -e 'parallel = {pp = 2}; checkpoint.dir = "ckP"' --metrics p.jsonl > p.out 2> p.err ||
  bad "run pp2: $(cat p.err)"
for r in b g p; do
  hooked=$(sed -n 's/^ztrain: test hook: rank [0-9]*: step 3: gradient of \([^ ]*\) set to NaN$/\1/p' $r.err)
  n=$(grep -c "update skipped" $r.err)
  if [ -n "$hooked" ] && [ "$n" = 1 ] && grep -qxE "ztrain: step 3: loss [0-9.]+, grad norm nan: update skipped \(1 in a row, stop after 5\); the gradient of $hooked is the first non-finite one" $r.err
  then ok; else bad "run $r: skip line (printed $n times) does not name the poisoned $hooked:"; sed 's/^/    /' $r.err; fi
done

# Continued from the checkpoint of the skipped step, the run must end as
# the uninterrupted one did: the count of skipped steps is part of the state.
"$Z" run.lua --load ckB/step_00000003.h5 -e 'checkpoint.every = 0' --save r.h5 --metrics r.jsonl \
  > /dev/null 2> r.err || bad "resume after the skip: $(cat r.err)"

PYTHONPATH="$HERE/../ref" /usr/bin/python3 - <<'PY'
import json, math, sys
import h5py, numpy as np, torch
import ztorch, compare

bad = []
def rows(path):
    out = []
    for n, line in enumerate(open(path), 1):
        try:
            out.append(json.loads(line))
        except ValueError as e:
            bad.append(f"{path}:{n}: not JSON ({e}): {line!r}")
    return [r for r in out if "loss" in r]

def datasets(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) and n != "script" else None)
        return out, int(f.attrs["step"]), json.loads(f.attrs["state"])

def ck(d, s):
    return f"{d}/step_{s:08d}.h5"

N, S = 3, 6
A, B = rows("a.jsonl"), rows("b.jsonl")
for name, rs in (("b", B), ("g", rows("g.jsonl")), ("p", rows("p.jsonl"))):
    if [r["step"] for r in rs] != list(range(1, S + 1)):
        bad.append(f"{name}: metrics steps {[r['step'] for r in rs]}")
        continue
    for r in rs:
        skip = r["step"] == N
        if r.get("skipped", False) is not skip:
            bad.append(f"{name} step {r['step']}: skipped = {r.get('skipped')}")
        want_null = {"grad_norm"} if skip else set()
        for k in ("loss", "lr", "grad_norm", "ms"):
            if (r[k] is None) != (k in want_null) or (r[k] is not None and not math.isfinite(r[k])):
                bad.append(f"{name} step {r['step']}: {k} = {r[k]}")
    # the skipped step left weights and moments exactly as they were
    before, s0, _ = datasets(ck("ck" + name.upper(), N - 1))
    after, s1, state = datasets(ck("ck" + name.upper(), N))
    diff = sorted(k for k in before if before[k].tobytes() != after[k].tobytes())
    if s0 != N - 1 or s1 != N or before.keys() != after.keys() or diff:
        bad.append(f"{name}: checkpoint after the skipped step differs from the one before: steps {s0}, {s1}, {diff[:4]}")
    if "skipped_steps" in json.dumps(state) and state.get("skipped_steps", state.get("data", {}).get("skipped_steps")) != 1:
        bad.append(f"{name}: state of step {N} records skipped_steps {state}")
    later, _, _ = datasets(ck("ck" + name.upper(), N + 1))
    if all(later[k].tobytes() == after[k].tobytes() for k in later if k.startswith("model/")):
        bad.append(f"{name}: the step after the skip did not update")
# resumed from the skipped step's checkpoint: bitwise the run that went on
resumed, rs, _ = datasets("r.h5")
final_b6, _, _ = datasets(ck("ckB", S))
diff = sorted(k for k in final_b6 if resumed.get(k) is None or resumed[k].tobytes() != final_b6[k].tobytes())
if rs != S or diff or [r["loss"] for r in rows("r.jsonl")] != [r["loss"] for r in B[N:]]:
    bad.append(f"resumed at step {N} (are skipped_steps saved and restored?): differs from the run that went on: {diff[:4]}, "
               f"losses {[r['loss'] for r in rows('r.jsonl')]} vs {[r['loss'] for r in B[N:]]}")
# up to the skip, the losses are the uninterrupted run's, bit for bit
if [r["loss"] for r in A[:N]] != [r["loss"] for r in B[:N]]:
    bad.append(f"losses of steps 1..{N}: {[r['loss'] for r in A[:N]]} vs {[r['loss'] for r in B[:N]]}")

# The grid runs against the single process (as mpi_grid_equiv: loss 1e-5, weights 1e-4).
final_b, _, _ = datasets(ck("ckB", S))
for name in ("g", "p"):
    for x, y in zip(rows(f"{name}.jsonl"), B):
        if not abs(x["loss"] - y["loss"]) <= 1e-5 * abs(y["loss"]):
            bad.append(f"{name} step {x['step']}: loss {x['loss']} vs np 1 {y['loss']}")
    final, _, _ = datasets(ck("ck" + name.upper(), S))
    for k, v in final.items():
        if k.startswith("model/") and not compare.weight_distance(k, v, final_b[k], 32) <= 1e-4:
            bad.append(f"{name}: {k} differs from np 1")

# PyTorch replay of run B: optimizer.step() is not called at step N, so
# torch's AdamW state step counts applied updates; the LR index follows it.
init = ztorch.read_checkpoint("init.h5")
plan = ztorch.read_checkpoint(ck("ckB", S)).plan
tp = plan["train"]
data = ztorch.TokenData(plan["data"]["train"], plan["data"].get("dtype", "u16"), plan["model"]["seq"])

def replay(variant):
    torch.manual_seed(0)
    model = ztorch.build_model(plan["model"])
    ztorch.load_weights(model, init.model)
    opt = ztorch.make_optimizer(model, tp)
    G, Bm = int(tp["global_batch"]), int(tp["micro_batch"])
    losses, skipped = [], 0
    for step in range(1, S + 1):
        batch = step - 1 - (skipped if variant == "batch not advanced" else 0)
        total = 0.0
        for x, y in data.micro_batches(batch, G, Bm):
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum") / (G * data.seq)
            loss.backward()
            total += loss.item()
        losses.append(total)
        if step == N:
            skipped += 1
            if variant == "clock counts the skip":
                for st in opt.state.values():
                    st["step"] += 1
            opt.zero_grad(set_to_none=True)
            continue
        params = [p for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, float(tp["clip"]))
        lr = ztorch.lr_at(tp["lr"], step - 1 - (0 if variant == "clock counts the skip" else skipped))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, dict(model.named_parameters())

losses, params = replay("right")
worst = max(abs(a - r["loss"]) / abs(a) for a, r in zip(losses, B))
wworst = max(compare.weight_distance(k, v, params[k[6:]].detach().numpy(), 32)
             for k, v in final_b.items() if k.startswith("model/"))
print(f"np 1 against the PyTorch replay: loss {worst:.1e}, weights {wworst:.1e} (relative)")
if not (worst <= 1e-5 and wworst <= 1e-4):
    bad.append(f"PyTorch replay: loss {worst:.2e} > 1e-5 or weights {wworst:.2e} > 1e-4")
# Done wrong, the replay must miss by far more than the tolerances.
for variant in ("batch not advanced", "clock counts the skip"):
    wrong, wparams = replay(variant)
    miss = max(abs(a - r["loss"]) / abs(a) for a, r in zip(wrong, B))
    wmiss = max(compare.weight_distance(k, v, wparams[k[6:]].detach().numpy(), 32)
                for k, v in final_b.items() if k.startswith("model/"))
    print(f"  replay with the {variant}: loss off by up to {miss:.1e}, weights by {wmiss:.1e}")
    if not (miss > 1e-4 or wmiss > 1e-3):
        bad.append(f"the test cannot tell a run with the {variant}: {miss:.2e}, {wmiss:.2e}")
for b in bad[:12]:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
[ $? = 0 ] && ok || bad "skipped step checks"

# ---- 2. lr = 1e3: skips, then the stop -----------------------------------------
"$Z" run.lua -e 'train.lr = 1e3; train.steps = 40' -e 'checkpoint = {dir = "ckL", every = 2, keep = 100}' \
  --metrics l.jsonl > l.out 2> l.err
rc=$?
last=$(sed -n 's/^ztrain: error: step \([0-9]*\): 5 steps in a row with a non-finite loss or gradient norm (train.max_bad_steps = 5): the gradient of [a-z0-9_.]* is the first non-finite one$/\1/p' l.err)
if [ "$rc" = 1 ] && [ -n "$last" ] && [ ! -e "ckL/step_$(printf %08d "$last").h5" ] && [ "$(grep -c "update skipped" l.err)" = 5 ]
then ok; else bad "lr = 1e3: exit $rc, stop at step '$last':"; sed 's/^/    /' l.err; ls ckL; fi
LAST=$last /usr/bin/python3 - <<'PY'
import json, os, sys
import h5py, numpy as np
last = int(os.environ["LAST"] or 0)
rows = [json.loads(l) for l in open("l.jsonl")]  # every line must parse
skipped = [r["step"] for r in rows if r.get("skipped")]
bad = []
if [r["step"] for r in rows] != list(range(1, last + 1)) or skipped != list(range(last - 4, last + 1)):
    bad.append(f"metrics steps {[r['step'] for r in rows]}, skipped {skipped}, stop at {last}")
for r in rows:
    if r.get("skipped") and r["grad_norm"] is not None:
        bad.append(f"step {r['step']} skipped with grad_norm {r['grad_norm']}")
latest = os.path.join("ckL", open("ckL/latest").read().strip())
with h5py.File(latest) as f:
    step = int(f.attrs["step"])
    nonfinite = []
    f.visititems(lambda n, o: nonfinite.append(n) if isinstance(o, h5py.Dataset) and o.dtype.kind == "f"
                 and not np.isfinite(o[()]).all() else None)
print(f"lr = 1e3: skipped {skipped}, stopped at {last}; latest {latest} (step {step}) all finite: {not nonfinite}")
if nonfinite or not 0 < step < last:
    bad.append(f"latest {latest} at step {step}: non-finite {nonfinite[:4]}")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
[ $? = 0 ] && ok || bad "lr = 1e3 checks"

# ---- 3. max_bad_steps = 1, NaN in the log and null in the metrics --------------
"$Z" run.lua -e 'train.lr = 1e37; train.max_bad_steps = 1; train.log_every = 1' \
  -e 'checkpoint.dir = "ckN"' --metrics n.jsonl > n.out 2> n.err
rc=$?
want="ztrain: error: step 2: 1 step in a row with a non-finite loss or gradient norm (train.max_bad_steps = 1): the gradient of embed.tokens is the first non-finite one"
if [ "$rc" = 1 ] && grep -qxF "$want" n.err && grep -q "^step 2/6 | loss nan | .* | grad_norm nan |" n.out &&
   ! grep -q -- "-nan" n.out n.err && [ ! -e ckN/step_00000002.h5 ]
then ok; else bad "max_bad_steps = 1: exit $rc"; sed 's/^/    /' n.out n.err; fi
/usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open("n.jsonl")]
r = rows[-1]
sys.exit(0 if len(rows) == 2 and r["step"] == 2 and r["loss"] is None and r["grad_norm"] is None
         and r["skipped"] is True and "skipped" not in rows[0] else 1)' && ok || { bad "NaN metrics as null:"; cat n.jsonl; }
for v in 0 2.5 '"5"'; do
  "$Z" run.lua -e "train.max_bad_steps = $v" --metrics v.jsonl > v.out 2> v.err
  rc=$?
  if [ "$rc" = 2 ] && grep -q "train.max_bad_steps must be an integer" v.err && [ ! -e v.jsonl ]
  then ok; else bad "max_bad_steps = $v: exit $rc: $(cat v.err)"; fi
done

# ---- 4. an update that makes weights non-finite ----------------------------------
"$Z" run.lua -e 'train.lr = 1e38; checkpoint.dir = "ckX"' --save x.h5 > x.out 2> x.err
rc=$?
if [ "$rc" = 1 ] && grep -q "^ztrain: error: step 1: the update made weights of embed.tokens non-finite (learning rate 1e+38" x.err &&
   [ ! -e x.h5 ] && [ -z "$(ls ckX 2> /dev/null)" ]
then ok; else bad "lr = 1e38: exit $rc"; sed 's/^/    /' x.err; ls ckX; fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
