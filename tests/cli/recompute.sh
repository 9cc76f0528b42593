#!/usr/bin/env bash
# Activation recomputation (train.recompute) changes no bit of training:
# at each layout, a run that recomputes ("full", or every second block by a
# function) ends with the same losses, gradient norms, weights and AdamW
# moments, bit for bit, as the same layout without it (tests/ref/bitwise.py),
# while it reports less activation memory. Layouts: one process (gpt,
# llama; llama in bf16), pp 2 with zero-bubble (split backward) and with interleaving,
# tp 2 with sequence parallelism, and dp 2 x pp 2 with ZeRO-3.
# Usage: recompute.sh ZTRAIN MPIRUN...
set -eu
. "$(dirname "$0")/common.sh"
zt_setup "$@"
zt_tokens tok.bin 5 20000

model() {
  case $1 in
    gpt) echo 'zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 4, heads = 4, tied = true}' ;;
    llama) echo 'zt.llama{vocab = 256, seq = 16, dim = 32, layers = 4, heads = 4, kv_heads = 2, ffn_dim = 64}' ;;
  esac
}
pass=0
# case NAME ARCH NP LAYOUT RECOMPUTE: the run with and without RECOMPUTE
case_() {
  local name=$1 arch=$2 np=$3 layout=$4 rc=$5
  mkdir "$name"
  cat > "$name/run.lua" <<LUA
local zt = require "ztrain"
model = $(model "$arch")
train = {micro_batch = 2, global_batch = 8, steps = 4, log_every = 0, clip = 0.3,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 2}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
$layout
LUA
  for v in plain re; do
    local extra=()
    [ $v = re ] && extra=(-e "train.recompute = $rc")
    local cmd=("$Z" run.lua --metrics $v.jsonl --save $v.h5 "${extra[@]}")
    [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
    (cd "$name" && OMP_NUM_THREADS=1 timeout 300 "${cmd[@]}" > $v.txt 2>&1) ||
      { echo "FAIL: $name ($v): run failed"; tail -5 "$name/$v.txt"; exit 1; }
  done
  printf '%-40s ' "$name:"
  /usr/bin/python3 "$HERE/ref/bitwise.py" "$name/plain.jsonl" "$name/plain.h5" \
    "$name/re.jsonl" "$name/re.h5" || { echo "FAIL: $name"; exit 1; }
  # rank 0's activation memory, as the metrics report it, must shrink
  /usr/bin/python3 - "$name" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
a, b = (json.loads(open(f"{d}/{v}.jsonl").readline())["act_bytes"] for v in ("plain", "re"))
if not 0 < b < a:
    sys.exit(f"FAIL: {d}: act_bytes {b} with recomputation, {a} without")
PY
  grep -q "blocks recomputed" "$name/re.txt" || { echo "FAIL: $name: the banner does not say so"; exit 1; }
  pass=$((pass + 1))
}

EVERY2='function(b) return b.index % 2 == 0 end'
case_ np1_gpt_full gpt 1 "" '"full"'
case_ np1_llama_every2 llama 1 "" "$EVERY2"
case_ np1_llama_bf16 llama 1 "train.precision = 'bf16'" '"full"'

case_ pp2_zero_bubble_llama llama 2 "parallel = {pp = 2}; schedule = zt.schedule.zero_bubble{}" '"full"'
case_ pp2_interleaved_gpt gpt 2 "parallel = {pp = 2}; schedule = zt.schedule.interleaved{chunks = 2}" "$EVERY2"
case_ tp2_sp_llama llama 2 "parallel = {tp = 2, sequence_parallel = true}" '"full"'
case_ tp2_gpt gpt 2 "parallel = {tp = 2}" "$EVERY2"
case_ dp2_pp2_zero3_zb_gpt gpt 4 \
  "parallel = {dp = 2, pp = 2, zero = {stage = 3, bucket_bytes = 4096}}; schedule = zt.schedule.zero_bubble{}" '"full"'
echo "$pass passed, 0 failed"
