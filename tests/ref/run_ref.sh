#!/usr/bin/env bash
# The whole model against PyTorch: ztrain writes its initial model, trains
# 24 steps (gradient accumulation 4, clipping and weight decay active), and
# tests/ref/compare.py replays the same steps in PyTorch from the same
# initial weights. Usage: run_ref.sh ZTRAIN gpt|gpt-untied|llama
set -eu
Z=$(realpath "$1")
ARCH=$2
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
ZTRAIN=$Z /usr/bin/python3 "$HERE/../../examples/make_demo_data.py" data > /dev/null
case $ARCH in
  gpt) M='zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4}' ;;
  gpt-untied) M='zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4, tied = false}' ;;
  llama) M='zt.llama{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 160}' ;;
  *) echo "unknown arch $ARCH"; exit 2 ;;
esac
cat > run.lua <<LUA
local zt = require "ztrain"
model = $M
train = {micro_batch = 2, global_batch = 8, steps = 24, log_every = 0,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 4, final = 2e-4},
         weight_decay = 0.1, betas = {0.9, 0.95}, clip = 1.0}
data = {train = "data/demo_train.bin", shuffle = false}
LUA
"$Z" run.lua --steps 0 --save init.h5 > /dev/null
"$Z" run.lua --metrics m.jsonl --save final.h5 > /dev/null
# The test is only meaningful if clipping actually cut some steps.
/usr/bin/python3 -c "
import json, sys
g = [json.loads(l)['grad_norm'] for l in open('m.jsonl') if '\"loss\"' in l]
clipped = sum(x > 1.0 for x in g)
print(f'{clipped} of {len(g)} steps clipped')
sys.exit(0 if clipped else 1)"
/usr/bin/python3 "$HERE/compare.py" --init init.h5 --final final.h5 --metrics m.jsonl \
  --loss-rtol 1e-5 --weight-rtol 1e-4
