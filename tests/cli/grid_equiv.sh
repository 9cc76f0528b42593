#!/usr/bin/env bash
# The equivalence matrix: gpt or llama on every grid with tp in {1,2,4},
# dp in {1,2,4}, dp*tp <= 8, zero 0..3, against the single process, with
# gradient accumulation and clipping; traffic and memory against their
# formulas (tests/ref/grid_check.py).
# Usage: grid_equiv.sh ZTRAIN gpt|llama MPIRUN...
set -eu
Z=$(realpath "$1"); ARCH=$2; shift 2
HERE=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
/usr/bin/python3 -c "
import numpy as np
np.random.seed(7); np.random.randint(0, 256, 20000).astype('<u2').tofile('tok.bin')"
case $ARCH in
  gpt) M='zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}' ;;
  llama) M='zt.llama{vocab = 256, seq = 16, dim = 64, layers = 2, heads = 8, kv_heads = 4, ffn_dim = 64}' ;;
esac
BUCKET=4096
cat > run.lua <<LUA
local zt = require "ztrain"
model = $M
train = {micro_batch = 1, global_batch = 8, steps = 10, log_every = 0, clip = 0.3,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 3}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
LUA
run() { # DIR NP DP TP ZERO
  mkdir -p "$1"
  echo "{\"dp\": $3, \"tp\": $4, \"zero\": $5, \"accum\": $((8 / $3)), \"micro_batch\": 1, \"bucket_bytes\": $BUCKET}" > "$1/run.json"
  (cd "$1" && OMP_NUM_THREADS=1 timeout 300 "${MPI[@]}" -np "$2" "$Z" ../run.lua \
     -e "parallel = {dp = $3, tp = $4, zero = {stage = $5, bucket_bytes = $BUCKET}}" \
     --metrics m.jsonl --save final.h5 > out.txt 2>&1) || { echo "run $1 failed:"; tail -5 "$1/out.txt"; exit 1; }
}
MPI=("$@")
(mkdir ref && cd ref && OMP_NUM_THREADS=1 "$Z" ../run.lua --metrics m.jsonl --save final.h5 > out.txt)
dirs=()
for tp in 1 2 4; do for dp in 1 2 4; do
  [ $((dp * tp)) -le 8 ] && [ $((dp * tp)) -gt 1 ] || continue
  for zero in 0 1 2 3; do
    run "r_${tp}_${dp}_${zero}" $((dp * tp)) $dp $tp $zero
    dirs+=("r_${tp}_${dp}_${zero}")
  done
done; done
/usr/bin/python3 "$HERE/ref/grid_check.py" ref "${dirs[@]}"
