#!/usr/bin/env bash
# Loss scaling (train.loss_scale), DeepSpeed's dynamic scaler. Each run's
# per-step loss_scale and skipped flags must follow a Python transcription
# of DeepSpeed's DynamicLossScaler.update_scale (below), and:
#  - no overflow: bitwise the run without scaling (powers of two scale and
#    unscale exactly), the scale doubling every loss_scale_window steps;
#  - an overflow forced at step 3 (test hook ZT_TEST_NAN_AT_STEP; hysteresis
#    1): that step skipped, the scale halved, and the run bitwise the
#    unscaled run whose step 3 is skipped by the non-finite guard (the same
#    hook), i.e. one that never applied that batch's update; with hysteresis
#    2 the first overflow leaves the scale as it is;
#  - overflows at the minimum scale: max_bad_steps of them in a row stop the
#    run (exit 1) naming the step, the scale and the first non-finite
#    gradient; overflows above the minimum are no bad steps;
#  - at dp 2 x pp 2 with ZeRO-3 the same as one process;
#  - the scaler's state in checkpoints: a run resumed from step 4 continues
#    the scale sequence and ends bitwise equal.
# Usage: loss_scale.sh ZTRAIN MPIRUN...
set -eu
. "$(dirname "$0")/common.sh"
zt_setup "$@"
zt_tokens tok.bin 9 20000
cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}
train = {micro_batch = 2, global_batch = 8, steps = 8, log_every = 0, clip = 0.5,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 2}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
LUA
fail=0
run() { # NAME NP [args...]
  local d=$1 np=$2; shift 2
  mkdir -p "$d"
  local cmd=("$Z" ../run.lua --metrics m.jsonl --save final.h5 "$@")
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  (cd "$d" && OMP_NUM_THREADS=1 timeout 300 "${cmd[@]}" > out.txt 2> err.txt)
}
same() { # A B: bitwise
  printf '%-48s ' "$1 = $2:"
  /usr/bin/python3 "$HERE/ref/bitwise.py" "$1/m.jsonl" "$1/final.h5" "$2/m.jsonl" "$2/final.h5" ||
    { echo "FAIL: $1 and $2 differ"; fail=$((fail + 1)); }
}
# scales NAME POWER WINDOW HYSTERESIS OVERFLOW_STEPS...: the metrics follow DeepSpeed
scales() {
  /usr/bin/python3 - "$@" <<'PY' || fail=$((fail + 1))
import json, sys
name, power, window, hyst = sys.argv[1], *map(int, sys.argv[2:5])
over = {int(s) for s in sys.argv[5:]}
rows = [json.loads(l) for l in open(f"{name}/m.jsonl") if '"step"' in l]
# DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py)
cur, it, last, ch, want = 2.0 ** power, 0, -1, hyst, []
for step in range(1, len(rows) + 1):
    overflow = step in over
    want.append((cur, overflow))
    if overflow:
        if hyst == 1 or ch == 1:
            cur = max(cur / 2, 1.0)
        else:
            ch -= 1
        last = it
    else:
        if (it - last) % window == 0:
            ch = hyst
            cur *= 2
    it += 1
got = [(r["loss_scale"], r["skipped"]) for r in rows]
print(f"{name}: loss scales {[g[0] for g in got]}")
if got != want:
    sys.exit(f"FAIL: {name}: (loss_scale, skipped) per step {got}, DeepSpeed's rule gives {want}")
PY
}

run plain 1
DYN='train.loss_scale = {initial_scale_power = 10, loss_scale_window = 3, hysteresis = 1}'
run dyn 1 -e "$DYN"
same plain dyn
scales dyn 10 3 1
grep -q '"loss_scale"' plain/m.jsonl && { echo "FAIL: an unscaled run reports loss_scale"; fail=$((fail + 1)); }

# an overflow at step 3: skipped and halved; the same as the guard's skip
ZT_TEST_NAN_AT_STEP=3 run plain_nan3 1
ZT_TEST_NAN_AT_STEP=3 run dyn_nan3 1 -e "$DYN"
same plain_nan3 dyn_nan3
scales dyn_nan3 10 3 1 3
grep -q "step 3: gradient overflow at loss scale 1024: update skipped; loss scale 512 from the next step" \
  dyn_nan3/out.txt || { echo "FAIL: no overflow line: $(cat dyn_nan3/out.txt)"; fail=$((fail + 1)); }
grep -q "update skipped" dyn_nan3/err.txt && { echo "FAIL: an overflow above the minimum reported as a bad step"; fail=$((fail + 1)); }
ZT_TEST_NAN_AT_STEP=3 run dyn_h2 1 -e "train.loss_scale = {initial_scale_power = 10, loss_scale_window = 3}"
scales dyn_h2 10 3 2 3

# dp 2 x pp 2, ZeRO-3: the same as one process (rank 0 poisons its gradient)
ZT_TEST_NAN_AT_STEP=3 run grid_nan3 4 -e "$DYN" \
  -e "parallel = {dp = 2, pp = 2, zero = {stage = 3, bucket_bytes = 4096}}"
printf '%-48s ' "grid_nan3 ~ dyn_nan3:"
/usr/bin/python3 "$HERE/ref/equiv.py" dyn_nan3/m.jsonl dyn_nan3/final.h5 grid_nan3/m.jsonl grid_nan3/final.h5 ||
  { echo "FAIL: grid"; fail=$((fail + 1)); }
scales grid_nan3 10 3 1 3

# overflows from step 2 on with the scale starting at 2 = 2 x the minimum:
# step 2 halves it (no bad step), steps 3, 4, 5 overflow at the minimum:
# the third in a row ends the run
set +e
ZT_TEST_NAN_AT_STEP=2-100 run atmin 1 \
  -e "train.loss_scale = {initial_scale_power = 1, hysteresis = 1, min_loss_scale = 1}; train.max_bad_steps = 3"
rc=$?
set -e
if [ $rc = 1 ] && grep -q "step 5: 3 steps in a row with a non-finite loss or gradient norm (train.max_bad_steps = 3), the loss scale at its minimum (train.loss_scale.min_loss_scale): the gradient of .* is the first non-finite one" atmin/err.txt \
   && [ "$(grep -c "at loss scale 1 (its minimum): update skipped" atmin/err.txt)" = 3 ] && [ ! -e atmin/final.h5 ]; then
  echo "minimum scale: stopped at step 5, exit 1"
else
  echo "FAIL: minimum scale: exit $rc"; sed 's/^/    /' atmin/err.txt | head; fail=$((fail + 1))
fi

# the scaler's state goes through a checkpoint: resumed at step 4
ZT_TEST_NAN_AT_STEP=3 run ck 1 -e "$DYN" -e "checkpoint = {dir = 'ck', every = 4}"
mkdir res && (cd res && ZT_TEST_NAN_AT_STEP=3 OMP_NUM_THREADS=1 "$Z" ../run.lua -e "$DYN" \
  --load ../ck/ck/step_00000004.h5 --metrics m.jsonl --save final.h5 > out.txt 2>&1) ||
  { echo "FAIL: resume: $(tail -3 res/out.txt)"; fail=$((fail + 1)); }
/usr/bin/python3 - <<'PY' || fail=$((fail + 1))
import json, sys
import h5py
a = [json.loads(l) for l in open("ck/m.jsonl") if '"step"' in l]
b = [json.loads(l) for l in open("res/m.jsonl") if '"step"' in l]
if [(r["step"], r["loss"], r["loss_scale"]) for r in a[4:]] != [(r["step"], r["loss"], r["loss_scale"]) for r in b]:
    sys.exit(f"FAIL: resumed {[(r['step'], r['loss_scale']) for r in b]} vs {[(r['step'], r['loss_scale']) for r in a[4:]]}")
with h5py.File("ck/ck/step_00000004.h5") as f:
    state = json.loads(f.attrs["state"])
if state.get("loss_scaler") != {"scale": 512.0, "iter": 4, "last_overflow_iter": 2, "hysteresis": 1} \
        or state.get("loss_scale") != 512.0:
    sys.exit(f"FAIL: state record {state}")
print(f"resumed at step 4 with the scaler {state['loss_scaler']}")
with open("ck/tail.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in a[4:])
PY
printf '%-48s ' "ck (steps 5-8) = res:"
/usr/bin/python3 "$HERE/ref/bitwise.py" ck/tail.jsonl ck/final.h5 res/m.jsonl res/final.h5 ||
  { echo "FAIL: the resumed run differs"; fail=$((fail + 1)); }

[ $fail = 0 ] && echo "all passed" || { echo "$fail failed"; exit 1; }
