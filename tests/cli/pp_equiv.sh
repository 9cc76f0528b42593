#!/usr/bin/env bash
# Pipeline parallelism against the single process: gpt (head tied to the
# embedding across the first and last stage) or llama, 8 blocks, 8
# micro-batches per step. Every built-in schedule at pp 2 and 4 alone;
# then every schedule under every ZeRO stage combined with tp 2, dp 2 or
# both (np <= 8), the layouts taken in turn so that each appears with
# several schedules and stages; then sequence parallelism and tp 4 (llama:
# kv heads replicated) with split backward and interleaving. Each run:
# every step's loss within 1e-5 relative, every tensor within 1e-4
# relative L2 (tests/ref/equiv.py), and
# the first stage's dp traffic and model-state bytes equal to ZeRO's
# formulas over that stage's parameters (tests/ref/pp_check.py).
# Usage: pp_equiv.sh ZTRAIN gpt|llama MPIRUN...
set -eu
Z=$(realpath "$1"); ARCH=$2; shift 2
MPI=("$@")
HERE=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 11 20000

case $ARCH in
  gpt) MODEL='zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 8, heads = 4, tied = true}' ;;
  llama) MODEL='zt.llama{vocab = 256, seq = 16, dim = 32, layers = 8, heads = 4, kv_heads = 2, ffn_dim = 64}' ;;
esac
cat > run.lua <<LUA
local zt = require "ztrain"
model = $MODEL
train = {micro_batch = 1, global_batch = 8, steps = 6, log_every = 0, clip = 0.3,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 2}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
LUA
(mkdir ref && cd ref && OMP_NUM_THREADS=1 "$Z" ../run.lua --metrics m.jsonl --save final.h5 > out.txt)

SCHEDULES=("gpipe{}" "one_f_one_b{}" "interleaved{chunks = 2}" "zero_bubble{}")
n=0
run() { # PP TP DP ZERO SCHEDULE [SP: true|false]
  local d="run$n" np=$(($1 * $2 * $3)) sp=${6:-false}; n=$((n + 1))
  local what="pp $1 tp $2 dp $3 zero $4 ${5%%\{*}"
  [ "$sp" = true ] && what="$what sp"
  mkdir "$d"
  (cd "$d" && OMP_NUM_THREADS=1 timeout 300 "${MPI[@]}" -np $np "$Z" ../run.lua \
     -e "parallel = {pp = $1, tp = $2, dp = $3, zero = {stage = $4, bucket_bytes = 4096}, sequence_parallel = $sp}" \
     -e "schedule = zt.schedule.$5" --metrics m.jsonl --save final.h5 > out.txt 2>&1) ||
    { echo "FAIL: $what: run failed"; tail -5 "$d/out.txt"; exit 1; }
  printf '%-44s ' "$what:"
  /usr/bin/python3 "$HERE/ref/equiv.py" ref/m.jsonl ref/final.h5 "$d/m.jsonl" "$d/final.h5" ||
    { echo "FAIL: $what"; exit 1; }
  local chunks=1
  case $5 in interleaved*) chunks=2 ;; esac
  /usr/bin/python3 "$HERE/ref/pp_check.py" "$d" $1 $2 $3 $4 $chunks ||
    { echo "FAIL: $what: traffic or memory"; exit 1; }
}

for pp in 2 4; do
  for s in "${SCHEDULES[@]}"; do run $pp 1 1 0 "$s"; done
done
LAYOUTS=("2 2 1" "2 1 2" "4 2 1" "4 1 2" "2 2 2")
k=0
for s in "${SCHEDULES[@]}"; do
  for zero in 0 1 2 3; do
    run ${LAYOUTS[$((k % 5))]} $zero "$s"
    k=$((k + 1))
  done
done
# sequence parallelism inside a pipeline, split backward included; at tp 4
# llama's 2 kv heads are each replicated over 2 TP ranks
run 2 2 2 2 "zero_bubble{}" true
run 2 4 1 3 "zero_bubble{}"
run 2 4 1 1 "interleaved{chunks = 2}" true
echo "pp_equiv $ARCH: $n runs equal to the single process"
