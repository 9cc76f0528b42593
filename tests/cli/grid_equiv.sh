#!/usr/bin/env bash
# The equivalence matrix: gpt or llama on every grid with tp in {1,2,4},
# dp in {1,2,4}, dp*tp <= 8, zero 0..3, against the single process, with
# gradient accumulation and clipping; traffic and memory against their
# formulas (tests/ref/grid_check.py); with sequence parallelism at tp 2
# and 4, dp 1 and 2, zero 0..3. llama also runs a second model with
# kv_heads 2 at tp 4 (each kv head replicated over 2 TP ranks), with and
# without sequence parallelism.
# Usage: grid_equiv.sh ZTRAIN gpt|llama MPIRUN...
set -eu
Z=$(realpath "$1"); ARCH=$2; shift 2
MPI=("$@")
HERE=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 7 20000
BUCKET=4096

run() { # DIR NP DP TP ZERO SP(true|false)
  mkdir -p "$1"
  echo "{\"dp\": $3, \"tp\": $4, \"zero\": $5, \"sp\": $6, \"accum\": $((8 / $3)), \"micro_batch\": 1, \"bucket_bytes\": $BUCKET}" > "$1/run.json"
  (cd "$1" && OMP_NUM_THREADS=1 timeout 300 "${MPI[@]}" -np "$2" "$Z" ../run.lua \
     -e "parallel = {dp = $3, tp = $4, zero = {stage = $5, bucket_bytes = $BUCKET}, sequence_parallel = $6}" \
     --metrics m.jsonl --save final.h5 > out.txt 2>&1) || { echo "run $1 failed:"; tail -5 "$1/out.txt"; exit 1; }
}

matrix() { # NAME MODEL TPS SP_TPS: the single process, then the grids with
           # tp in TPS, and with sequence parallelism at tp in SP_TPS
  echo "== $1: $2"
  mkdir "$1" && cd "$1"
  cat > run.lua <<LUA
local zt = require "ztrain"
model = $2
train = {micro_batch = 1, global_batch = 8, steps = 10, log_every = 0, clip = 0.3,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 3}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
LUA
  (mkdir ref && cd ref && OMP_NUM_THREADS=1 "$Z" ../run.lua --metrics m.jsonl --save final.h5 > out.txt)
  local dirs=()
  for tp in $3; do for dp in 1 2 4; do
    [ $((dp * tp)) -le 8 ] && [ $((dp * tp)) -gt 1 ] || continue
    for zero in 0 1 2 3; do
      run "r_${tp}_${dp}_${zero}" $((dp * tp)) $dp $tp $zero false
      dirs+=("r_${tp}_${dp}_${zero}")
    done
  done; done
  for tp in $4; do for dp in 1 2; do for zero in 0 1 2 3; do
    run "sp_${tp}_${dp}_${zero}" $((dp * tp)) $dp $tp $zero true
    dirs+=("sp_${tp}_${dp}_${zero}")
  done; done; done
  /usr/bin/python3 "$HERE/ref/grid_check.py" ref "${dirs[@]}"
  cd "$W"
}

case $ARCH in
  gpt) matrix gpt 'zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}' "1 2 4" "2 4" ;;
  llama)
    matrix llama 'zt.llama{vocab = 256, seq = 16, dim = 64, layers = 2, heads = 8, kv_heads = 4, ffn_dim = 64}' "1 2 4" "2 4"
    matrix llama_kv2 'zt.llama{vocab = 256, seq = 16, dim = 64, layers = 2, heads = 8, kv_heads = 2, ffn_dim = 64}' "4" "4" ;;
esac
