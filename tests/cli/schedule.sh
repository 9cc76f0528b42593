#!/usr/bin/env bash
# Pipeline schedules, checked before they run (`ztrain schedule`):
# - the simulated bubble for unit costs equals the formulas: GPipe and 1F1B
#   (p-1)/(m+p-1), interleaved with v chunks (p-1)/(v*m+p-1); zero-bubble
#   lies below 1F1B; peak in-flight micro-batches: m for GPipe, <= p (and
#   p - stage) for 1F1B;
# - broken user schedules (an action missing, a B before its F, two stages
#   waiting on each other) and bad pipeline layouts are refused, exit 2,
#   with the stage, action and step named.
# Usage: schedule.sh ZTRAIN
set -u
Z=$(realpath "$1")
. "$(dirname "$0")/common.sh"
zt_scratch

script() { # LAYERS PP GLOBAL_BATCH EXTRA
  cat <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = $1, heads = 4}
train = {micro_batch = 1, global_batch = $3, steps = 1}
data = {train = "none.bin"}
parallel = {pp = $2}
$4
LUA
}

# bubble and peak against the formulas
for p in 2 4; do for m in 4 8 16; do
  script 16 $p $m "" > s.lua
  for sched in "gpipe{}" "one_f_one_b{}" "interleaved{chunks = 2}" "zero_bubble{}"; do
    "$Z" schedule s.lua -e "schedule = zt.schedule.$sched" > out.txt 2> err.txt || { bad "p=$p m=$m $sched: $(cat err.txt)"; continue; }
    python3 - "$p" "$m" "$sched" <<'PY' && ok || bad "p=$p m=$m $sched: $(head -4 out.txt | tr '\n' ' ')"
import re, sys
p, m, sched = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = open("out.txt").read()
bubble = float(re.search(r"bubble ([0-9.]+)%", out).group(1)) / 100
peak = [int(x) for x in re.search(r"per stage: ([0-9 ]+)", out).group(1).split()]
one_f = (p - 1) / (m + p - 1)
if sched.startswith(("gpipe", "one_f")):
    assert abs(bubble - one_f) < 1e-3, (bubble, one_f)
if sched.startswith("gpipe"):
    assert peak == [m] * p, peak
if sched.startswith("one_f"):
    assert peak == [min(m, p - s) for s in range(p)], peak
if sched.startswith("interleaved"):
    assert abs(bubble - (p - 1) / (2 * m + p - 1)) < 1e-3, (bubble, (p - 1) / (2 * m + p - 1))
if sched.startswith("zero"):
    assert bubble < one_f - 0.01, (bubble, one_f)
PY
  done
done; done

expect() { # WHAT SUBSTRING -- ztrain schedule args
  local what=$1 want=$2; shift 3
  "$Z" schedule "$@" > out.txt 2> err.txt
  local rc=$?
  if [ $rc = 2 ] && grep -qF -- "$want" err.txt; then ok; else bad "$what: rc $rc, stderr: $(cat err.txt)"; fi
}
script 8 2 4 "" > s.lua
# a 1F1B written by hand, then broken three ways
cat >> s.lua <<'LUA'
function my1f1b(stage, stages, m)
  local l = {}
  for mb = 0, m - 1 do l[#l + 1] = {op = "F", mb = mb} end
  for mb = 0, m - 1 do l[#l + 1] = {op = "B", mb = mb} end
  return l
end
LUA
"$Z" schedule s.lua -e "schedule = my1f1b" > out.txt 2> err.txt && grep -q "^schedule custom" out.txt \
  && ok || bad "a valid user schedule is refused: $(cat err.txt)"
expect "missing action" "schedule custom: stage 1 misses B(mb 3, chunk 0)" -- s.lua -e \
  "schedule = function(s, n, m) local l = my1f1b(s, n, m) if s == 1 then table.remove(l) end return l end"
expect "B before F" "schedule custom: stage 0, step 0: B(mb 0, chunk 0) comes before F of the same micro-batch and chunk" -- s.lua -e \
  "schedule = function(s, n, m) local l = my1f1b(s, n, m) if s == 0 then table.insert(l, 1, table.remove(l, m + 1)) end return l end"
# stage 0 alternates F and B, stage 1 wants every F before any B: each waits on the other
expect "deadlock" "schedule custom deadlocks: stage 0 stalls at step 1, B(mb 0, chunk 0), waiting for B(mb 0) of stage 1" -- s.lua -e \
  "schedule = function(s, n, m) if s == 1 then return my1f1b(s, n, m) end local l = {} for mb = 0, m - 1 do l[#l + 1] = {op = 'F', mb = mb}; l[#l + 1] = {op = 'B', mb = mb} end return l end"
expect "repeated action" "is repeated" -- s.lua -e \
  "schedule = function(s, n, m) local l = my1f1b(s, n, m) l[#l + 1] = {op = 'B', mb = 0} return l end"
expect "pp larger than blocks" "parallel.pp = 4 needs 4 blocks but the model has 2; use pp <= 2" -- s.lua -e \
  "model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}; parallel.pp = 4"
expect "partition not a cover" "parallel.stages[2] starts at block 5 but block 4 comes next" -- s.lua -e \
  "parallel.stages = {{0, 3}, {5, 7}}"
expect "partition drops blocks" "parallel.stages ends at block 6 but the model has blocks 0..7" -- s.lua -e \
  "parallel.stages = {{0, 3}, {4, 6}}"
expect "empty stage" "parallel.stages[2] = {4, 3} is empty" -- s.lua -e \
  "parallel.stages = {{0, 3}, {4, 3}}"
expect "chunks do not divide" "interleaving 3 chunks on 2 stages needs layers divisible by 6; 8 is not" -- s.lua -e \
  "schedule = zt.schedule.interleaved{chunks = 3}"
expect "too few micro-batches" "schedule interleaved needs the micro-batches per step to be a multiple of pp = 2 (at least 2); this run has 3" -- s.lua -e \
  "schedule = zt.schedule.interleaved{chunks = 2}; train.global_batch = 3"
# the default partition balances compute: a head worth ~2.6 blocks (vocab
# 2048, dim 64) leaves the last of 2 stages 3 of 8 blocks; a light head an
# even split; spare blocks go to the middle stages (the first holds the
# embedding); a 24-layer llama with a 32k vocab gives its last stage 4
part() { # WHAT WANT MODEL PP
  "$Z" schedule s.lua -e "model = $3; parallel = {pp = $4}" > out.txt 2> err.txt
  if grep -qF -- "partition: $2" out.txt; then ok; else bad "$1: $(grep partition out.txt) $(cat err.txt)"; fi
}
part "heavy head" "stage 0 blocks 0-4, stage 1 blocks 5-7" \
  "zt.gpt{vocab = 2048, seq = 16, dim = 64, layers = 8, heads = 4}" 2
part "light head" "stage 0 blocks 0-3, stage 1 blocks 4-7" \
  "zt.gpt{vocab = 256, seq = 16, dim = 64, layers = 8, heads = 4}" 2
part "spare blocks" "stage 0 blocks 0-1, stage 1 blocks 2-4, stage 2 blocks 5-7, stage 3 blocks 8-9" \
  "zt.gpt{vocab = 256, seq = 16, dim = 64, layers = 10, heads = 4}" 4
part "llama 32k" "stage 0 blocks 0-5, stage 1 blocks 6-12, stage 2 blocks 13-19, stage 3 blocks 20-23" \
  "zt.llama{vocab = 32000, seq = 512, dim = 1024, layers = 24, heads = 16}" 4
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
