#!/usr/bin/env bash
# ztrain eval prints the val_loss that training printed at the checkpoint's
# step: a run evaluates at steps 3 and 6 (train.eval_every, data.val_batches
# = 3) and saves checkpoints there; eval of step 6 (gpt: of each) on one
# process must equal the run's --metrics val_loss exactly (the same layout
# runs the same float operations on the same batches), and under tp 2
# (gpt: also dp 2 and pp 2) within the equivalence tests' 1e-5 relative
# (another reduction order). gpt, and llama with GQA split by tp.
# Training never read data.train again: eval runs with data.train naming a
# file that does not exist. The plain output names val_loss and perplexity
# = exp(val_loss).
# Usage: eval.sh ZTRAIN MPIRUN... (MPIRUN with its options)
set -eu
Z=$(realpath "$1"); shift
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 3 20000
zt_tokens val.bin 4 3000
export OMP_NUM_THREADS=1
# gpt, and llama with grouped-query attention (2 kv heads, so tp 2 splits them)
for m in 'gpt{heads = 2}' 'llama{heads = 4, kv_heads = 2, ffn_dim = 48}'; do
  arch=${m%%\{*}
  cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.$arch{vocab = 256, seq = 16, dim = 32, layers = 2, ${m#*\{}
train = {micro_batch = 2, global_batch = 8, steps = 6, log_every = 0, eval_every = 3,
         lr = zt.lr.cosine{peak = 3e-3, warmup = 2}}
data = {train = "tok.bin", val = "val.bin", val_batches = 3}
checkpoint = {dir = "ck", every = 3}
LUA
  rm -rf ck
  "$Z" run.lua --metrics m.jsonl > /dev/null
  check() { # STEP TOLERANCE LABEL [MPIRUN -np N] -- runs eval, compares
    local step=$1 tol=$2 label=$3; shift 3
    local got
    got=$("$@" "$Z" eval run.lua --load "ck/$(printf 'step_%08d.h5' "$step")" --json \
          -e 'data.train = "missing.bin"' ${EXTRA:+-e "$EXTRA"})
    /usr/bin/python3 - "$step" "$tol" "$label" "$got" <<'PY'
import json, sys
step, tol, label, got = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
want = [json.loads(l) for l in open("m.jsonl") if '"val_loss"' in l]
want = next(w["val_loss"] for w in want if w["step"] == step)
rel = abs(got["val_loss"] - want) / abs(want)
ok = got["step"] == step and rel <= tol and abs(got["perplexity"] - 2.718281828459045 ** got["val_loss"]) < 1e-9 * got["perplexity"]
print(f"{label}: step {step} val_loss {got['val_loss']!r} against training's {want!r} (rel {rel:.1e}, allowed {tol:g})")
sys.exit(0 if ok else 1)
PY
  }
  EXTRA= check 6 0 "$arch np 1"
  EXTRA='parallel = {tp = 2}' check 6 1e-5 "$arch tp 2" "$@" -np 2
  [ $arch = gpt ] || continue # the rest does not depend on the model
  EXTRA= check 3 0 "$arch np 1"
  EXTRA= check 6 1e-5 "$arch dp 2" "$@" -np 2
  EXTRA='parallel = {pp = 2}' check 6 1e-5 "$arch pp 2" "$@" -np 2
done
out=$("$Z" eval run.lua --load ck/step_00000006.h5)
echo "$out"
echo "$out" | grep -q '^step 6 | val_loss [0-9.]* | perplexity [0-9.]*'
