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
# headerless: u32 tokens (read as u16 by default) and u16 ones (read as u32)
with open("raw32.bin", "wb") as f:
    f.write(struct.pack("<300I", *[1 + i % 200 for i in range(300)]))
with open("raw16.bin", "wb") as f:
    f.write(struct.pack("<300H", *[1 + i % 200 for i in range(300)]))
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

# quick CODE SUBSTRING SCRIPT_TEXT [args...]: the same checks through
# `ztrain schedule`, which runs the same configuration code without MPI
# (for the many value checks; expect covers the full CLI)
quick() {
  local code=$1 want=$2 text=$3
  shift 3
  printf '%s\n' "$text" > case.lua
  timeout 60 "$Z" schedule case.lua "$@" > stdout.txt 2> stderr.txt
  local rc=$? why=""
  [ "$rc" = "$code" ] || why="exit code $rc, expected $code"
  grep -qF -- "$want" stderr.txt || why="$why; message lacks '$want'"
  [ "$(grep -c "error" stderr.txt)" = 1 ] || why="$why; not one error line"
  if [ -z "$why" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL (schedule) [$want]: $why"
    sed 's/^/    stderr: /' stderr.txt | head -5
  fi
}

# a checkpoint at step 2, for --load past train.steps
base "" > small.lua
"$Z" small.lua --save at2.h5 > /dev/null 2>&1 || { echo "FAIL: could not write at2.h5"; fail=$((fail + 1)); }

run_cases() {
  local np=$1
  # checkpoint.dir that cannot be made: at start-up, not at the first save
  expect 2 "checkpoint.dir ok.bin/ck: ok.bin is not a folder, so no folder can be made inside it" "$np" \
    "$(base "checkpoint = {dir = 'ok.bin/ck', every = 100}")"
  # --load at or past train.steps trains nothing: refused, with what works;
  # the checkpoint folder is not made for a refused run
  expect 2 "--load at2.h5 is at step 2 but train.steps is 1: nothing to train (train.steps counts from step 0, not from the checkpoint); use --steps 3 to train 1 more, or --steps 0 to only load and --save" \
    "$np" "$(base "checkpoint = {dir = 'out/new/dir', every = 1}")" --load at2.h5 --steps 1
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
  expect 2 "case.lua:5: zt.gpt: dim 30 is not divisible by heads 4" "$np" \
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
  expect 2 'train.recompute must be "none", "full" or a function(block) returning true or false, got "some"' \
    "$np" "$(base "train.recompute = 'some'")"
  expect 2 "train.recompute failed for block 0: case.lua:5: no recompute today" "$np" \
    "$(base "train.recompute = function(b) error('no recompute today') end")"
  expect 2 "train.recompute must return true or false for each block; for block 0 it returned 1" "$np" \
    "$(base "train.recompute = function(b) return b.index + 1 end")"
  expect 2 'train.loss_scale must be a number > 0 (a static scale), "dynamic" or {initial_scale_power' \
    "$np" "$(base "train.loss_scale = 0")"
  expect 2 "train.loss_scale.hysteresis must be an integer from 1 to 2147483647, got 0" "$np" \
    "$(base "train.loss_scale = {hysteresis = 0}")"
  expect 2 "train.loss_scale.initial_scale_power must be an integer from 0 to 100, got 200" "$np" \
    "$(base "train.loss_scale = {initial_scale_power = 200}")"
  expect 2 'train.precision must be one of "fp32", "bf16", "fp16", got "fp8"' "$np" \
    "$(base "train.precision = 'fp8'")"
  expect 2 'train.grad_reduce_dtype must be one of "fp32", "bf16", "fp16", got "int8"' "$np" \
    "$(base "train.grad_reduce_dtype = 'int8'")"
  expect 2 'parallel.device must be one of "auto", "cpu", "cuda", got "gpu"' "$np" \
    "$(base "parallel.device = 'gpu'")"
  if ! nvidia-smi -L > /dev/null 2>&1; then # a machine without GPUs
    expect 2 'parallel.device = "cuda": no usable CUDA device on this node' "$np" \
      "$(base "parallel.device = 'cuda'")"
  fi
  expect 2 "(-e):1:" "$np" "$(base "")" -e "train.steps = = 3"
  expect 2 "--steps needs a non-negative integer, got 'x'" "$np" "$(base "")" --steps x
}

run_cases 1
# A checkpoint of another model: name the tensor and both shapes.
"$Z" small.lua --steps 0 --save other.h5 > /dev/null 2>&1 || { echo "FAIL: could not write other.h5"; fail=$((fail + 1)); }
expect 2 "tensor embed.positions has shape [16, 32], the model expects [32, 32]" 1 \
  "$(base "model = zt.gpt{vocab = 256, seq = 32, dim = 32, layers = 1, heads = 2}")" --load other.h5
expect 2 "is not an HDF5 file" 1 "$(base "")" --load ok.bin
head -c 3000 other.h5 > cut.h5
expect 2 "checkpoint cut.h5 cannot be opened (damaged or truncated?)" 1 "$(base "")" --load cut.h5
expect 2 "--save nowhere/x.h5: cannot write to folder nowhere" 1 "$(base "")" --save nowhere/x.h5

expect 2 "parallel.zero must be a stage 0, 1, 2 or 3, or {stage = ..., bucket_bytes = ..., overlap = ...}, got 5" 1 \
  "$(base "parallel = {zero = 5}")"
expect 2 "parallel.zero: unknown key 'bucket' (did you mean 'bucket_bytes'?)" 1 \
  "$(base "parallel = {zero = {stage = 2, bucket = 1}}")"

# A misspelt table, near a known name or not, is not ignored in silence.
quick 2 "unknown global table 'datta' (did you mean 'data'?); ztrain reads only model, parallel, train, data, checkpoint, schedule, offload; a table of your own must be local (local datta = {...})" \
  "$(base "datta = {shuffle = false}")"
quick 2 "unknown global table 'settings'; ztrain reads only" "$(base "settings = {steps = 5}")"
# A headerless file of the other width: a hint, not zeros or a bare range error.
expect 2 'raw32.bin has no header and looks like 32-bit tokens: read as 16-bit ones (data.dtype = "u16", the default), every second token is 0 (in all 300 pairs sampled); set data.dtype = "u32"' \
  1 "$(base "data.train = 'raw32.bin'")"
expect 2 'out of range for vocab 256 (the file has no header: 16-bit tokens, read as 32-bit ones? data.dtype = "u16" reads it as two in range)' \
  1 "$(base "data = {train = 'raw16.bin', dtype = 'u32'}")"
# and each read with its own width trains
for f in "raw32.bin', dtype = 'u32" "raw16.bin"; do
  base "data = {train = '$f'}" > case.lua
  "$Z" case.lua > stdout.txt 2> stderr.txt || { fail=$((fail + 1)); echo "FAIL data = {train = '$f'}: exit $?"; head -3 stderr.txt; }
done

# A nested checkpoint.dir that does not exist yet: made with its parents
# at start-up (--resume auto finds it empty), then each save says so.
rm -rf out && mkdir out
base "checkpoint = {dir = 'out/a/b/c', every = 1}" > case.lua
"$Z" case.lua --resume auto > stdout.txt 2> stderr.txt
rc=$? why=""
[ "$rc" = 0 ] || why="exit code $rc"
grep -q "^no checkpoint in out/a/b/c: starting at step 0$" stdout.txt || why="$why; no fresh-start line"
for s in 1 2; do
  [ -f "out/a/b/c/step_0000000$s.h5" ] || why="$why; no step_0000000$s.h5"
  grep -Eq "^checkpoint out/a/b/c/step_0000000$s.h5 written: [0-9.]+ MB in [0-9.]+ s \([0-9.]+ GB/s\), step $s$" stdout.txt ||
    why="$why; no line for the save at step $s"
done
if [ -z "$why" ]; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "FAIL nested checkpoint.dir: $why"; sed 's/^/    /' stdout.txt stderr.txt | head -12
fi

# The library's errors name the user's file and line: a builder reached
# through pcall (a C function in between), a shape C checks after the
# script at the line that last set it, a script in a folder of its own.
quick 2 "case.lua:5: zt.gpt: unknown key 'head' (did you mean 'heads'?)" \
  "$(base "local ok, err = pcall(zt.gpt, {vocab = 256, seq = 16, dim = 32, layers = 1, head = 2}) if not ok then error(err, 0) end")"
quick 2 "(-e):1: zt.gpt: dim 32 is not divisible by heads 3" "$(base "")" -e "model.heads = 3"
mkdir -p runs/exp1
base "model = zt.llama{vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2, kv_head = 1}" > runs/exp1/my_run.lua
"$Z" runs/exp1/my_run.lua > stdout.txt 2> stderr.txt
rc=$?
if [ "$rc" = 2 ] && grep -qF "ztrain: error: runs/exp1/my_run.lua:5: zt.llama: unknown key 'kv_head' (did you mean 'kv_heads'?)" stderr.txt; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL script in a folder: exit $rc"; sed 's/^/    stderr: /' stderr.txt | head -3
fi

# Values: NaN, infinities, fractions and integers beyond the C type are
# refused with the value as written and the allowed range, never a Lua
# address or an internal file:line; an assignment after the builder is
# checked at the user's line.
expect 2 "zt.gpt.dim must be an integer from 1 to 2147483647, got 32.5" 1 "$(base "model.dim = 32.5")"
expect 2 "(-e):1: zt.gpt.heads must be an integer from 1 to 2147483647, got 0" 1 "$(base "")" -e "model.heads = 0"
expect 2 "train.clip must be a finite number >= 0, got nan" 1 "$(base "train.clip = 0/0")"
quick 2 "zt.gpt.dim must be an integer from 1 to 2147483647, got 1.1805916207174113e+21" "$(base "model.dim = 2^70")"
quick 2 "train.weight_decay must be a finite number >= 0, got nan" "$(base "train.weight_decay = 0/0")"
quick 2 "train.lr must be a finite number > 0 or zt.lr.cosine{...} / zt.lr.deepspeed{...}, got inf" "$(base "train.lr = math.huge")"
quick 2 "train.eps must be a finite number > 0, got inf" "$(base "train.eps = 1/0")"
quick 2 'train.betas must be a pair {beta1, beta2} with both in [0, 1), got {0.9, "x"}' \
  "$(base "train.betas = {0.9, 'x'}")"
quick 2 "case.lua:5: error(...) with a table value, not a message" "$(base "error({code = 1})")"
quick 2 "case.lua:5: zt.lr.cosine: unknown key 'warmpu' (did you mean 'warmup'?)" \
  "$(base "train.lr = zt.lr.cosine{peak = 1e-3, warmpu = 10}")"
# products of valid values that C ints cannot hold
expect 2 "tp*pp = 2147483647*1 = 2147483647" 1 "$(base "parallel = {tp = 2^31 - 1}")"
quick 2 "micro_batch*seq = 1073741824*16 = 17179869184 rows per micro-batch" "$(base "train.micro_batch = 2^30")"
quick 2 "--steps needs a non-negative integer, got '99999999999999999999'" "$(base "")" --steps 99999999999999999999
# a model larger than memory: refused before anything is allocated, with
# the estimate, what is available, and what would fit
huge="model = zt.gpt{vocab = 2^20, seq = 16, dim = 2^16, layers = 1, heads = 2^10}"
expect 2 "the model does not fit in memory: it needs 1792.41 GiB per rank" 1 "$(base "$huge")"
# the script's budget: time and memory, the script, -e and schedule
# functions alike; a pcall in the script does not swallow the end
expect 2 "case.lua:5: the script ran for more than 0.5 s (--script-timeout): an endless loop?" 1 \
  "$(base "while true do pcall(function() while true do end end) end")" --script-timeout 0.5
quick 2 "case.lua:5: the script needed more than 16 MiB of memory (--script-memory)" \
  "$(base "local t = {} for i = 1, 1e9 do t[i] = {} end")" --script-memory 16
quick 2 "(-e):1: the script ran for more than 0.5 s (--script-timeout): an endless loop?" \
  "$(base "")" -e "repeat until false" --script-timeout 0.5
quick 2 "building the action lists of schedule custom (1 stages, 1 micro-batches per step) took more than 0.5 s" \
  "$(base "schedule = function() while true do end end")" --script-timeout 0.5
# what hooks cannot stop (a finalizer): ended a little past the budget
expect 2 "in code that cannot be stopped in between (a __gc finalizer or one long library call)" 1 \
  "$(base "setmetatable({}, {__gc = function() while true do end end}) collectgarbage()")" --script-timeout 0.5
quick 2 "--script-timeout needs a number of seconds above 0 (at most 1e12), got 'inf'" "$(base "")" --script-timeout inf

# Every key of every table and builder against odd values, in one process
# (ztrain schedule runs the script without MPI): each value is accepted or
# refused in the user's terms (the key; a builder's or an assignment's
# error at this file's line), never an internal error; values outside a
# key's type are always refused.
cat > fuzz.lua <<'LUA'
local zt = require "ztrain"
local odd = { 0, -1, 0.5, 2^31, 2^40, 2^63, 2^70, -2^70, 0/0, 1/0, -1/0, 1e-50, 1e300,
              "x", "", {}, { 1, 2 }, true, false, print }
local INT, FLT = 2^31 - 1, 3.4028234663852886e38
-- kind: int (C int), int64, real (finite), float (a C float > 0), bool,
-- or any (no claim but a clean message); min: the least value allowed
local function refused_by_type(kind, min, v)
  if kind == "any" then return false end
  if kind == "bool" then return type(v) ~= "boolean" end
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then return true end
  if min and v < min then return true end
  if kind == "int" then return math.tointeger(v) == nil or v > INT end
  if kind == "int64" then return math.tointeger(v) == nil end
  if kind == "float" then return v < 1.1754943508222875e-38 or v > FLT end
  return false
end
local function show(v)
  if type(v) == "number" then return string.format("%.17g", v) end
  if type(v) == "string" then return string.format("%q", v) end
  return type(v) == "table" and "{...}" or tostring(v)
end
local cases, failures = 0, {}
local function clean(what, v, ok, msg, where, key, kind, min)
  cases = cases + 1
  local why
  if ok then
    if refused_by_type(kind, min, v) then why = "accepted" end
  elseif type(msg) ~= "string" then why = "error value " .. type(msg)
  elseif msg:find("[ztrain]", 1, true) or msg:find("attempt to", 1, true) or msg:find(": 0x", 1, true) then
    why = "internal: " .. msg
  elseif where and msg:sub(1, #where) ~= where then why = "not at " .. where .. ": " .. msg
  elseif key and not msg:find(key, 1, true) then why = "does not name " .. key .. ": " .. msg
  end
  if why then failures[#failures + 1] = what .. " = " .. show(v) .. ": " .. why end
end
local function copy(t) local c = {} for k, v in pairs(t) do c[k] = v end return c end

local n32 = { "int", 1 }
local gpt = { vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2 }
local costs = { "any" }
local builders = {
  { "zt.gpt", zt.gpt, gpt, { vocab = n32, seq = n32, dim = n32, layers = n32, heads = n32, tied = { "bool" } } },
  { "zt.llama", zt.llama, gpt, { vocab = n32, seq = n32, dim = n32, layers = n32, heads = n32,
    kv_heads = n32, ffn_dim = n32, norm_eps = { "float", 0 }, rope_theta = { "float", 0 } } },
  { "zt.lr.cosine", zt.lr.cosine, { peak = 1e-3 }, { peak = { "real", 0 }, warmup = { "int64", 0 },
    final = { "real", 0 }, decay_steps = { "int64", 1 } } },
  { "zt.lr.constant", zt.lr.constant, { value = 1e-3 }, { value = { "real", 0 } } },
  { "zt.lr.deepspeed", zt.lr.deepspeed, { type = "WarmupDecayLR" }, { warmup_num_steps = { "int", 0 },
    total_num_steps = n32, warmup_min_lr = { "real", 0 }, warmup_max_lr = { "real", 0 } } },
  { "zt.lr.deepspeed", zt.lr.deepspeed, { type = "WarmupCosineLR", lr = 1e-3 }, { lr = { "real", 0 },
    warmup_min_ratio = { "real", 0 }, cos_min_ratio = { "real", 0 } } },
  { "zt.schedule.gpipe", zt.schedule.gpipe, {}, { chunks = n32, costs = costs } },
  { "zt.schedule.interleaved", zt.schedule.interleaved, {}, { chunks = n32, costs = costs } },
  { "zt.schedule.zero_bubble", zt.schedule.zero_bubble, {}, { chunks = n32, costs = costs,
    max_deferred_w = { "int", 0 } } },
  { "zt.schedule.custom", zt.schedule.custom, { fn = function() return {} end },
    { fn = { "any" }, name = { "any" }, chunks = n32, costs = costs } },
}
local line = debug.getinfo(1, "S").short_src .. ":"
for _, b in ipairs(builders) do
  local name, build, base, keys = b[1], b[2], b[3], b[4]
  for key, kind in pairs(keys) do
    for _, v in ipairs(odd) do
      local t = copy(base)
      t[key] = v
      local ok, msg = pcall(function() local o = build(t); return o end)
      clean(name .. "{" .. key .. "}", v, ok, msg, line, key, kind[1], kind[2])
      if name == "zt.schedule.gpipe" then -- costs' own keys
        ok, msg = pcall(function() local o = build { costs = { F = v } }; return o end)
        clean(name .. "{costs.F}", v, ok, msg, line, "F", "real", 1e-300)
      end
      if not name:find("schedule") then -- an assignment to a built object
        local o = build(copy(base))
        ok, msg = pcall(function() o[key] = v end)
        clean(name .. "." .. key .. " (assigned)", v, ok, msg, line, key, kind[1], kind[2])
      end
    end
  end
end

-- the script's tables, through the check C runs after the script
local function reset()
  model = zt.gpt(copy(gpt))
  parallel, checkpoint, schedule = {}, {}, nil
  train = { steps = 2, micro_batch = 2 }
  data = { train = "ok.bin" }
end
local tables = {
  parallel = { dp = { "any" }, tp = n32, pp = n32, zero = { "any" }, order = { "any" },
               timeout = { "real", 0 }, sequence_parallel = { "bool" }, stages = { "any" } },
  train = { micro_batch = n32, global_batch = n32, steps = { "int64", 0 }, lr = { "real", 0 },
            weight_decay = { "real", 0 }, betas = { "any" }, eps = { "real", 0 }, clip = { "real", 0 },
            seed = { "int64", 0 }, log_every = { "int", 0 }, eval_every = { "int", 0 },
            peak_gflops = { "real", 0 }, max_bad_steps = n32 },
  data = { train = { "any" }, val = { "any" }, dtype = { "any" }, shuffle = { "bool" }, val_batches = n32 },
  checkpoint = { dir = { "any" }, every = { "int", 0 }, keep = n32, async = { "bool" } },
}
local subkeys = { zero = { "stage", "bucket_bytes", "overlap" }, stages = { 1 }, betas = { 1 } }
for tname, keys in pairs(tables) do
  for key, kind in pairs(keys) do
    for _, v in ipairs(odd) do
      reset()
      _G[tname][key] = v
      local ok, msg = pcall(zt._plan, "case.lua")
      clean(tname .. "." .. key, v, ok, msg, "case.lua: ", key, kind[1], kind[2])
      for _, sub in ipairs(subkeys[key] or {}) do -- a nested table with an odd value inside
        reset()
        _G[tname][key] = key == "stages" and { { 0, v } } or key == "betas" and { 0.9, v } or { [sub] = v }
        ok, msg = pcall(zt._plan, "case.lua")
        clean(tname .. "." .. key .. "." .. tostring(sub), v, ok, msg, "case.lua: ", key, "any")
      end
    end
  end
end
for _, g in ipairs { "model", "train", "data", "parallel", "checkpoint", "schedule" } do
  for _, v in ipairs(odd) do
    reset()
    _G[g] = v
    local ok, msg = pcall(zt._plan, "case.lua")
    clean(g, v, ok, msg, "case.lua: ", nil, "any")
  end
end

-- a schedule function's odd results, through the check of its lists
reset()
local plan = zt._plan("case.lua")
for _, v in ipairs(odd) do
  for i, result in ipairs { v, { v }, { { op = v, mb = 0 } }, { { op = "F", mb = v } },
                            { { op = "F", mb = 0, chunk = v } } } do
    plan.schedule.fn = function() return result end
    local ok, msg = pcall(zt._schedule_lists, plan.schedule, 2, 4)
    clean("schedule result " .. i, v, ok, msg, "schedule one_f_one_b", nil, "any")
  end
  plan.schedule.fn = function() error(v) end
  local ok, msg = pcall(zt._schedule_lists, plan.schedule, 2, 4)
  clean("schedule error", v, ok, msg, "schedule one_f_one_b", nil, "any")
end

reset()
for _, f in ipairs(failures) do print("FUZZ FAIL " .. f) end
print(string.format("fuzz: %d cases, %d failures", cases, #failures))
LUA
fuzz_out=$("$Z" schedule fuzz.lua 2>&1)
if echo "$fuzz_out" | grep -q "^fuzz: [0-9]* cases, 0 failures$"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1))
  echo "FAIL: the library's checks against odd values:"
  echo "$fuzz_out" | grep -v "^stage" | head -20 | sed 's/^/    /'
fi

if [ -n "$MPIRUN" ]; then
  run_cases 2
  # on every rank at once, one message: the script's budget and a model
  # too large for the node, its memory shared by the ranks on it
  expect 2 "case.lua:5: the script ran for more than 0.5 s (--script-timeout): an endless loop?" 2 \
    "$(base "while true do end")" --script-timeout 0.5
  expect 2 "shared by 2 ranks on this node" 2 "$(base "$huge")"
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
