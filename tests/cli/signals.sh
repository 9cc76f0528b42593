#!/usr/bin/env bash
# Preemption: a signal makes ztrain write a checkpoint at the end of the
# step and exit 0, so that a requeue script can tell a clean stop from a
# failure. One process gets SIGTERM; under mpirun, mpirun gets SIGUSR1 and
# SIGUSR2 (which it forwards; SIGTERM it turns into an abort). Each time:
# exit 0, the message, `latest` naming the stop's checkpoint, and
# --resume auto finishing the run.
# Usage: signals.sh ZTRAIN MPIRUN...
set -u
Z=$(realpath "$1"); shift
MPIRUN=("$@")
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 0 20000
cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2}
train = {micro_batch = 1, global_batch = 2, steps = 1000000, log_every = 0}
data = {train = "tok.bin"}
checkpoint = {dir = "ck"}
LUA
pass=0 fail=0
check() { # NAME SIGNAL NP
  local name=$1 sig=$2 np=$3
  rm -rf ck
  if [ "$np" = 1 ]; then "$Z" run.lua > out.txt 2> err.txt &
  else "${MPIRUN[@]}" -np "$np" "$Z" run.lua > out.txt 2> err.txt &
  fi
  local pid=$!
  # until it trains (a checkpoint of the first steps is not the point)
  for i in $(seq 100); do grep -q '^ztrain' out.txt 2>/dev/null && break; sleep 0.1; done
  sleep 1
  kill -"$sig" "$pid"
  wait "$pid"
  local rc=$? why=""
  [ "$rc" = 0 ] || why="exit $rc"
  grep -q "ztrain: SIG$sig: checkpoint ck/step_[0-9]*.h5 written at step [0-9]*; stopping" out.txt ||
    why="$why; no stop message"
  local latest
  latest=$(cat ck/latest 2>/dev/null)
  [ -n "$latest" ] && [ -f "ck/$latest" ] || why="$why; latest is '$latest'"
  local at=${latest#step_}; at=$((10#${at%.h5}))
  "$Z" run.lua -e "train.steps = $((at + 2))" --resume auto > res.txt 2>&1 ||
    why="$why; --resume auto failed: $(tail -1 res.txt)"
  grep -q "resuming from ck/$latest (step $at)" res.txt || why="$why; did not resume from $latest"
  if [ -z "$why" ]; then pass=$((pass + 1)); echo "$name: stopped at step $at, exit 0, resumed"
  else fail=$((fail + 1)); echo "FAIL $name: $why"; sed 's/^/    /' err.txt | head -5; fi
}
check "1 process, SIGTERM" TERM 1
check "mpirun -np 2, SIGUSR1 to mpirun" USR1 2
check "mpirun -np 2, SIGUSR2 to mpirun" USR2 2
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
