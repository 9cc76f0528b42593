#!/usr/bin/env bash
# ztrain eval and ztrain sample refuse bad input with one clear message,
# exit code 2 and nothing on stdout: a missing --load or --prompt, a
# script without data.val (eval), an empty prompt, one as long as the
# model's seq, --top-k below 1, a negative temperature, --tokens 0, an
# option of the other command, a checkpoint that is missing or of another
# model, and sample under mpirun with 2 ranks (message once).
# Usage: infer_bad_input.sh ZTRAIN MPIRUN...
set -u
Z=$(realpath "$1"); shift
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 3 2000
cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2}
train = {micro_batch = 2, steps = 2, log_every = 0}
data = {train = "tok.bin", val = "tok.bin"}
LUA
OMP_NUM_THREADS=1 "$Z" run.lua --steps 0 --save init.h5 > /dev/null || exit 1
pass=0 fail=0

# expect SUBSTRING [launcher...] -- ztrain args...: exit 2, the message
# once (from one rank), stdout empty
expect() {
  local want=$1 cmd=()
  shift
  while [ "$1" != -- ]; do cmd+=("$1"); shift; done
  shift
  OMP_NUM_THREADS=1 timeout 120 "${cmd[@]}" "$Z" "$@" > stdout.txt 2> stderr.txt
  local rc=$? why=""
  [ "$rc" = 2 ] || why="exit code $rc, expected 2"
  grep -qF -- "$want" stderr.txt || why="$why; message lacks '$want'"
  local n
  n=$(grep -c "error:" stderr.txt)
  [ "$n" = 1 ] || why="$why; $n error lines, expected 1"
  [ ! -s stdout.txt ] || why="$why; stdout: $(head -c 200 stdout.txt)"
  if [ -z "$why" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL [$*]: $why"
    sed 's/^/    stderr: /' stderr.txt | head -5
  fi
}

S=(sample run.lua --load init.h5)
expect 'needs --load CKPT' -- eval run.lua
expect 'needs --load CKPT' -- sample run.lua --prompt hi
expect 'needs --prompt TEXT' -- sample run.lua --load init.h5
expect 'has no data.val' -- eval run.lua --load init.h5 -e 'data.val = nil'
expect '--prompt is empty' -- "${S[@]}" --prompt ''
expect '--prompt is 16 tokens but the model sees 16 positions' -- "${S[@]}" --prompt 0123456789abcdef
expect '--top-k needs an integer from 1' -- "${S[@]}" --prompt hi --top-k 0
expect '--temperature needs a number from 0' -- "${S[@]}" --prompt hi --temperature -0.5
expect '--tokens needs an integer from 1' -- "${S[@]}" --prompt hi --tokens 0
expect 'ztrain eval takes no --prompt' -- eval run.lua --load init.h5 --prompt hi
expect 'ztrain sample takes no --json' -- "${S[@]}" --prompt hi --json
expect 'missing.h5' -- sample run.lua --load missing.h5 --prompt hi
expect 'missing.h5' -- eval run.lua --load missing.h5
expect 'embed.tokens has shape [256, 32], the model expects [256, 64]' -- "${S[@]}" --prompt hi -e 'model.dim = 64'
expect 'embed.tokens has shape [256, 32], the model expects [256, 64]' -- eval run.lua --load init.h5 -e 'model.dim = 64'
expect 'runs as one process, not 2 ranks' "$@" -np 2 -- "${S[@]}" --prompt hi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
