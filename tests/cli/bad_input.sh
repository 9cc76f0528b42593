#!/usr/bin/env bash
# Bad input gets one clear message, exit code 2, and nothing written.
# Each case runs ztrain with --save and --metrics into an empty folder and
# checks: the exit code, a substring of the message, that the message is
# printed once, and that the folder is still empty afterwards.
# Usage: bad_input.sh ZTRAIN [MPIRUN]   (with MPIRUN, the cases also run on 2 ranks)
set -u
Z=$(realpath "$1")
MPIRUN=${2:-}
. "$(dirname "$0")/common.sh"
zt_scratch
pass=0 fail=0

/usr/bin/env python3 - <<'PY'
import struct
# 300 byte tokens, ztrain header; and one file with a token of 300 at index 5
def write(path, toks, vocab=256):
    with open(path, "wb") as f:
        f.write(b"ZTRAINTK" + struct.pack("<IIQII", 1, 2, len(toks), vocab, 0))
        f.write(struct.pack("<%dH" % len(toks), *toks))
write("ok.bin", [i % 200 for i in range(300)])
write("big.bin", [300 if i == 5 else 7 for i in range(300)], vocab=0)
PY

base() { # a valid script; $1 = extra lines
  cat <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2}
train = {micro_batch = 2, steps = 2, log_every = 0}
data = {train = "ok.bin"}
$1
LUA
}

# expect CODE SUBSTRING NP SCRIPT_TEXT [ztrain args...]
expect() {
  local code=$1 want=$2 np=$3 text=$4
  shift 4
  rm -rf out && mkdir out
  printf '%s\n' "$text" > case.lua
  local cmd=("$Z" case.lua --save out/final.h5 --metrics out/m.jsonl "$@")
  [ "$np" -gt 1 ] && cmd=($MPIRUN -np "$np" "${cmd[@]}")
  timeout 120 "${cmd[@]}" > stdout.txt 2> stderr.txt
  local rc=$? why=""
  [ "$rc" = "$code" ] || why="exit code $rc, expected $code"
  grep -qF -- "$want" stderr.txt || why="$why; message lacks '$want'"
  local n
  n=$(grep -c "ztrain: error" stderr.txt)
  [ "$n" = 1 ] || why="$why; $n error lines, expected 1"
  [ -z "$(ls -A out)" ] || why="$why; files written: $(ls out)"
  if [ -z "$why" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL (np=$np) [$want]: $why"
    sed 's/^/    stderr: /' stderr.txt | head -5
  fi
}

run_cases() {
  local np=$1
  expect 2 "case.lua:3:" "$np" "local zt = require 'ztrain'
model = zt.gpt{vocab = 256,
train = }"
  expect 2 "case.lua:2: attempt to call a nil value (field 'gtp')" "$np" \
    "local zt = require 'ztrain'
model = zt.gtp{vocab = 256}"
  expect 2 "train: unknown key 'micro_bach' (did you mean 'micro_batch'?)" "$np" \
    "$(base "train.micro_bach = 4")"
  expect 2 "zt.gpt: unknown key 'head' (did you mean 'heads'?)" "$np" \
    "local zt = require 'ztrain'
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 1, head = 2}"
  expect 2 "train.steps must be an integer >= 0, got \"ten\"" "$np" "$(base "train.steps = 'ten'")"
  expect 2 "unknown global table 'trian' (did you mean 'train'?)" "$np" \
    "$(base "trian = train; train = nil")"
  expect 2 "dim 30 is not divisible by heads 4" "$np" \
    "$(base "model = zt.gpt{vocab = 256, seq = 16, dim = 30, layers = 1, heads = 4}")"
  expect 2 "heads 6 is not divisible by kv_heads 4" "$np" \
    "$(base "model = zt.llama{vocab = 256, seq = 16, dim = 48, layers = 1, heads = 6, kv_heads = 4}")"
  expect 2 "holds 300 tokens; seq 400 needs at least 401" "$np" \
    "$(base "model = zt.gpt{vocab = 256, seq = 400, dim = 32, layers = 1, heads = 2}")"
  expect 2 "data file missing.bin: No such file or directory" "$np" "$(base "data.train = 'missing.bin'")"
  expect 2 "token 300 at index 5 (byte offset 42) is out of range for vocab 256" "$np" \
    "$(base "data.train = 'big.bin'")"
  expect 2 "global_batch 6 is not divisible by micro_batch*dp" "$np" \
    "$(base "train.micro_batch = 4; train.global_batch = 6")"
  expect 2 "(-e):1:" "$np" "$(base "")" -e "train.steps = = 3"
  expect 2 "--steps needs a non-negative integer, got 'x'" "$np" "$(base "")" --steps x
}

run_cases 1
# A checkpoint of another model: name the tensor and both shapes.
base "" > small.lua
"$Z" small.lua --steps 0 --save other.h5 > /dev/null 2>&1 || { echo "FAIL: could not write other.h5"; fail=$((fail + 1)); }
expect 2 "tensor embed.positions has shape [16, 32], the model expects [32, 32]" 1 \
  "$(base "model = zt.gpt{vocab = 256, seq = 32, dim = 32, layers = 1, heads = 2}")" --load other.h5
expect 2 "is not an HDF5 file" 1 "$(base "")" --load ok.bin
head -c 3000 other.h5 > cut.h5
expect 2 "checkpoint cut.h5 cannot be opened (damaged or truncated?)" 1 "$(base "")" --load cut.h5
expect 2 "--save nowhere/x.h5: cannot write to folder nowhere" 1 "$(base "")" --save nowhere/x.h5

expect 2 "parallel.zero must be a stage 0, 1, 2 or 3 (got 5)" 1 "$(base "parallel = {zero = 5}")"
expect 2 "parallel.zero: unknown key 'bucket' (did you mean 'bucket_bytes'?)" 1 \
  "$(base "parallel = {zero = {stage = 2, bucket = 1}}")"

if [ -n "$MPIRUN" ]; then
  run_cases 2
  expect 2 "dp*tp*pp = 3*1*1 = 3 but the world has 2 ranks; run with -np 3" 2 "$(base "parallel = {dp = 3}")"
  expect 2 "world size 2 is not divisible by tp*pp = 4*1 = 4" 2 "$(base "parallel = {tp = 4}")"
  expect 2 "tp = 2 does not divide heads = 3; tp values that work for this model: 1, 3" 2 \
    "$(base "model = zt.gpt{vocab = 258, seq = 16, dim = 48, layers = 1, heads = 3}; parallel = {tp = 2}")"
  expect 2 "tp = 2 does not divide kv_heads = 3" 2 \
    "$(base "model = zt.llama{vocab = 256, seq = 16, dim = 48, layers = 1, heads = 6, kv_heads = 3}; parallel = {tp = 2}")"
  expect 2 "the 15 rows of a micro-batch (micro_batch 1 * seq 15) do not split evenly over tp = 2" 2 \
    "$(base "model = zt.gpt{vocab = 256, seq = 15, dim = 32, layers = 1, heads = 2}; train.micro_batch = 1; parallel = {tp = 2, sequence_parallel = true}")"
  expect 2 "ffn_dim" 2 \
    "$(base "model = zt.llama{vocab = 256, seq = 16, dim = 64, layers = 1, heads = 4, ffn_dim = 33}; parallel = {tp = 2}")"
  expect 2 "vocab" 2 \
    "$(base "model = zt.gpt{vocab = 255, seq = 16, dim = 32, layers = 1, heads = 2}; parallel = {tp = 2}")"
  expect 2 "global_batch 2 is not divisible by micro_batch*dp = 2*2 = 4" 2 \
    "$(base "train.micro_batch = 2; train.global_batch = 2")"
  # pipelines: refused on every rank before anything is allocated, one message
  pipe="model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 4, heads = 2}; parallel = {pp = 2}"
  expect 2 "parallel.pp = 2 needs 2 blocks but the model has 1; use pp <= 1" 2 \
    "$(base "parallel = {pp = 2}")"
  expect 2 "parallel.stages[2] starts at block 3 but block 2 comes next" 2 \
    "$(base "$pipe; parallel.stages = {{0, 1}, {3, 3}}")"
  expect 2 "interleaving 2 chunks on 2 stages needs layers divisible by 4; 6 is not" 2 \
    "$(base "$pipe; model.layers = 6; schedule = zt.schedule.interleaved{chunks = 2}")"
  expect 2 "schedule interleaved needs the micro-batches per step to be a multiple of pp = 2 (at least 2); this run has 1" 2 \
    "$(base "$pipe; train.global_batch = 2; schedule = zt.schedule.interleaved{chunks = 2}")"
  expect 2 "schedule custom: stage 1 misses B(mb 0, chunk 0)" 2 \
    "$(base "$pipe; schedule = function(s, n, m) local l = {} for mb = 0, m - 1 do l[#l + 1] = {op = 'F', mb = mb} end if s == 0 then for mb = 0, m - 1 do l[#l + 1] = {op = 'B', mb = mb} end end return l end")"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
