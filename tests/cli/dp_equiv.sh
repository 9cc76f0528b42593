#!/usr/bin/env bash
# Data parallelism (zero 0) equals the single process: the same global batch
# split over 2 and 4 ranks gives the same losses and weights as np=1.
# Usage: dp_equiv.sh ZTRAIN MPIRUN... (MPIRUN with its options)
set -eu
. "$(dirname "$0")/common.sh"
zt_setup "$@"
zt_tokens tok.bin 3 20000
for arch in gpt llama; do
  if [ $arch = gpt ]; then m='zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2}'
  else m='zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 48}'; fi
  cat > run.lua <<LUA
local zt = require "ztrain"
model = $m
train = {micro_batch = 2, global_batch = 8, steps = 10, log_every = 0, clip = 0.5,
         lr = zt.lr.cosine{peak = 1e-3, warmup = 3}, weight_decay = 0.1}
data = {train = "tok.bin", shuffle = true}
LUA
  OMP_NUM_THREADS=1 "$Z" run.lua --metrics ref.jsonl --save ref.h5 > /dev/null
  for np in 2 4; do
    OMP_NUM_THREADS=1 "${MPI[@]}" -np $np "$Z" run.lua --metrics dp$np.jsonl --save dp$np.h5 > /dev/null
    echo -n "$arch dp=$np: "
    /usr/bin/python3 "$HERE/ref/equiv.py" ref.jsonl ref.h5 dp$np.jsonl dp$np.h5
  done
done
