#!/usr/bin/env bash
# GPU end to end: gpt and llama train 20 steps on one GPU (the CUDA
# backend, parallel.device = "cuda") and on the CPU backend from the same
# initial weights and batches; per-step loss and final weights (logical
# tensors) must agree within the tolerances of a change of reduction
# order, which is what another device's GEMMs and reductions are:
#   fp32: loss 1e-5 relative, weights 1e-4 relative L2 per tensor, as the
#         fp32 PyTorch references (docs/testing.md);
#   bf16: loss 5.7e-4, weights 4.3e-2, as the bf16 PyTorch references
#         (4 x the measured spread of reduction orders, docs/testing.md).
# Then a checkpoint written on the GPU resumes on the CPU and continues to
# the same end within those tolerances (the states travel through host
# memory both ways). Exit 77 (skipped) without a usable GPU.
# Usage: e2e.sh ZTRAIN
set -eu
Z=$(realpath "$1")
HERE=$(cd "$(dirname "$0")/.." && pwd)
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "SKIP: no GPU (nvidia-smi lists none)"
  exit 77
fi
. "$HERE/cli/common.sh"
zt_scratch
ZTRAIN=$Z /usr/bin/python3 "$HERE/../examples/make_demo_data.py" data > /dev/null
fail=0
for arch in gpt llama; do
  if [ $arch = gpt ]; then
    model='zt.gpt{vocab = 256, seq = 128, dim = 128, layers = 4, heads = 4}'
  else
    model='zt.llama{vocab = 256, seq = 128, dim = 128, layers = 4, heads = 4, kv_heads = 2, ffn_dim = 384}'
  fi
  cat > $arch.lua <<LUA
local zt = require "ztrain"
model = $model
train = {micro_batch = 4, global_batch = 8, steps = 20, log_every = 5,
         lr = zt.lr.cosine{peak = 3e-3, warmup = 5}, weight_decay = 0.1, clip = 1.0}
data = {train = "$W/data/demo_train.bin"}
checkpoint = {dir = "ck", every = 10}
LUA
  for prec in fp32 bf16; do
    for dev in cpu cuda; do
      d=$arch-$prec-$dev
      mkdir -p $d
      (cd $d && timeout 300 "$Z" ../$arch.lua \
        -e "parallel.device = '$dev'; train.precision = '$prec'" --metrics m.jsonl \
        --save final.h5 > out.txt 2>&1) ||
        { echo "FAIL: $d: run failed"; tail -5 $d/out.txt; fail=$((fail + 1)); continue; }
    done
    grep -q "backend cuda" $arch-$prec-cuda/out.txt ||
      { echo "FAIL: $arch $prec: the run did not use the CUDA backend"; fail=$((fail + 1)); }
    tol="1e-5 1e-4"
    [ $prec = bf16 ] && tol="5.7e-4 4.3e-2"
    set -- $tol
    printf '%-28s ' "$arch $prec cuda ~ cpu:"
    /usr/bin/python3 "$HERE/ref/equiv.py" $arch-$prec-cpu/m.jsonl $arch-$prec-cpu/final.h5 \
      $arch-$prec-cuda/m.jsonl $arch-$prec-cuda/final.h5 --loss-rtol "$1" --weight-rtol "$2" ||
      fail=$((fail + 1))
    # the GPU's step-10 checkpoint continued on the CPU
    d=$arch-$prec-resume
    mkdir -p $d
    (cd $d && timeout 300 "$Z" ../$arch.lua -e "parallel.device = 'cpu'; train.precision = '$prec'" \
      --load ../$arch-$prec-cuda/ck/step_00000010.h5 --metrics m.jsonl --save final.h5 \
      > out.txt 2>&1) || { echo "FAIL: $d: run failed"; tail -5 $d/out.txt; fail=$((fail + 1)); }
    /usr/bin/python3 -c "
import json
rows = [l for l in open('$arch-$prec-cpu/m.jsonl') if '\"loss\"' in l and json.loads(l)['step'] > 10]
open('$arch-$prec-cpu/tail.jsonl', 'w').writelines(rows)"
    printf '%-28s ' "$arch $prec cuda->cpu ~ cpu:"
    /usr/bin/python3 "$HERE/ref/equiv.py" $arch-$prec-cpu/tail.jsonl $arch-$prec-cpu/final.h5 \
      $d/m.jsonl $d/final.h5 --loss-rtol "$1" --weight-rtol "$2" || fail=$((fail + 1))
  done
done
[ $fail -eq 0 ] && echo "GPU end to end: all within tolerance" || { echo "$fail failed"; exit 1; }
