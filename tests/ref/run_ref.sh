#!/usr/bin/env bash
# The whole model against PyTorch: ztrain writes its initial model, trains
# 24 steps (gradient accumulation 4, clipping and weight decay active), and
# tests/ref/compare.py replays the same steps in PyTorch from the same
# initial weights. Usage: run_ref.sh ZTRAIN gpt|gpt-untied|llama [bf16|fp16]
#
# With bf16 or fp16 (train.precision): 50 steps under the 16-bit policy
# (tests/ref/ztorch.py, "Mixed precision"), a checkpoint after every step,
# compared within the tolerances derived in docs/testing.md: the whole
# replay (loss per step, final weights) and one-step replays from each of
# ztrain's checkpoints (loss, gradients). fp16 runs a dynamic loss scale
# (gpt: 2^21, window 8; llama: 2^20, window 4; hysteresis 2) high enough
# that steps overflow and are skipped (gpt 7, llama 12) while the scale
# goes down and up again (hysteresis too); every step's scale and skip must
# be the replay's. The overflow decisions are clear: the largest gradient
# of each step is at most 0.82 or at least 1.5 (llama: 0.87, 1.15) times
# fp16's overflow threshold in the reference (mp_spread.py).
# ZT_REF_KEEP=DIR keeps the run's files in DIR.
set -eu
Z=$(realpath "$1")
ARCH=$2
PREC=${3:-fp32}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -n "${ZT_REF_KEEP:-}" ]; then
  W=$(mkdir -p "$ZT_REF_KEEP" && cd "$ZT_REF_KEEP" && pwd)
else
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
fi
cd "$W"
ZTRAIN=$Z /usr/bin/python3 "$HERE/../../examples/make_demo_data.py" data > /dev/null
case $ARCH in
  gpt) M='zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4}' ;;
  gpt-untied) M='zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4, tied = false}' ;;
  llama) M='zt.llama{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 160}' ;;
  *) echo "unknown arch $ARCH"; exit 2 ;;
esac
case $PREC in
  fp32)
    T='steps = 24, lr = zt.lr.cosine{peak = 2e-3, warmup = 4, final = 2e-4}, clip = 1.0'
    CLIP=1.0 EXTRA=() TOL=(--loss-rtol 1e-5 --weight-rtol 1e-4) ;;
  bf16|fp16)
    T='steps = 50, lr = zt.lr.cosine{peak = 1e-3, warmup = 4, final = 1e-4, decay_steps = 50}, clip = 1.8'
    CLIP=1.8 EXTRA=(-e "train.precision = \"$PREC\"" -e "checkpoint = {dir = 'ck', every = 1, keep = 1000}")
    # 4 x the largest spread between reduction orders of the reference
    # itself (docs/testing.md, measured by mp_spread.py): whole run (loss,
    # final weights), one step (loss, gradients)
    if [ "$PREC" = bf16 ]; then
      TOL=(--loss-rtol 5.7e-4 --weight-rtol 4.3e-2 --step-loss-rtol 6.6e-5 --step-grad-rtol 1.7e-2)
    else
      # llama's own scale (2^20, window 4): from 2^21 with window 8 one of
      # its steps comes within 0.3% of fp16's overflow threshold
      # (docs/testing.md); of 122 settings tried (2^17..2^24, windows 3..12,
      # hysteresis 1..3) this is the clearest with hysteresis 2
      if [ "$ARCH" = llama ]; then LS='initial_scale_power = 20, loss_scale_window = 4'
      else LS='initial_scale_power = 21, loss_scale_window = 8'; fi
      EXTRA+=(-e "train.loss_scale = {$LS, hysteresis = 2}")
      TOL=(--loss-rtol 1.2e-4 --weight-rtol 1.6e-2 --step-loss-rtol 2.3e-5 --step-grad-rtol 3.6e-3)
    fi
    TOL+=(--steps-dir ck) ;;
  *) echo "unknown precision $PREC"; exit 2 ;;
esac
cat > run.lua <<LUA
local zt = require "ztrain"
model = $M
train = {micro_batch = 2, global_batch = 8, log_every = 0, $T,
         weight_decay = 0.1, betas = {0.9, 0.95}}
data = {train = "data/demo_train.bin", shuffle = false}
LUA
# one thread: the 16-bit runs are 50 steps on a shared machine
[ "$PREC" = fp32 ] || export OMP_NUM_THREADS=1
"$Z" run.lua ${EXTRA[@]+"${EXTRA[@]}"} --steps 0 --save init.h5 > /dev/null
"$Z" run.lua ${EXTRA[@]+"${EXTRA[@]}"} --metrics m.jsonl --save final.h5 > /dev/null
# The test is only meaningful if clipping actually cut some steps (and,
# with fp16, if the loss scaler skipped some and went up again).
/usr/bin/python3 -c "
import json, sys
rows = [json.loads(l) for l in open('m.jsonl') if '\"loss\"' in l]
g = [r['grad_norm'] for r in rows if not r.get('skipped')]
clipped = sum(x > $CLIP for x in g)
print(f'{clipped} of {len(g)} applied steps clipped')
ok = clipped > 0
if '$PREC' == 'fp16':
    skipped = [r['step'] for r in rows if r.get('skipped')]
    scales = [r['loss_scale'] for r in rows]
    ups = sum(b > a for a, b in zip(scales, scales[1:]))
    print(f'steps skipped {skipped}, loss scale raised {ups} times')
    ok = ok and len(skipped) > 0 and ups > 0
sys.exit(0 if ok else 1)"
/usr/bin/python3 "$HERE/compare.py" --init init.h5 --final final.h5 --metrics m.jsonl "${TOL[@]}"
