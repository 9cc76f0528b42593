#!/usr/bin/env bash
# Failure on the test cluster: a job of cluster/ztrain.sbatch (2 nodes x 2
# ranks, dp 2 x tp 2, parallel.timeout 10 s) loses (a) one rank to SIGKILL,
# (b) a whole compute node (not the batch host): its link goes down and every process in it is killed
# (slurmd and slurmstepd with the ranks: a node that lost power). Either
# way every other rank must exit, non-zero, within the watchdog's timeout
# and a margin, the job's log must name the rank and the node that failed
# and say how to resume, and no ztrain process may be left on any node.
# Prints the time from the failure until the last rank exited.
# Usage: failure.sh ZTRAIN
set -u
. "$(dirname "$0")/common.sh"
zct_setup "$1" 2 || exit $?
export ZT_REQUEUE=0
TIMEOUT=10
cat >> run.lua <<LUA
model = zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 4, heads = 4}
train.steps = 100000
parallel = {dp = 2, tp = 2, timeout = $TIMEOUT}
checkpoint = {every = 5}
LUA

ranks_on() { # NODE: pids of ztrain processes running inside it (not
              # zombies: a killed node's ranks wait there to be reaped)
  local p
  for p in $(zc_node_pids "$1"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = ztrain ] &&
      [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" != Z ] && echo "$p"
  done
}
all_ranks() { ranks_on 1; ranks_on 2; }
now() { date +%s.%N; }

start() { # NAME: submits, waits until the ranks have done 3 steps
  mkdir -p "$1"
  j=$(sbatch --parsable -N 2 --ntasks-per-node=2 -o "$W/$1.log" --export=ALL,ZT_RUN_DIR="$W/$1" "$SB" "$W/run.lua")
  for _ in $(seq 600); do
    [ "$(grep -c '"loss"' "$1/metrics.0.jsonl" 2>/dev/null)" -ge 3 ] 2>/dev/null && return 0
    sleep 0.1
  done
  bad "$1: the job did not start: $(tail -3 "$1.log")"
  return 1
}
# NAME T0 SURVIVOR_NODE: every rank gone within the timeout and a margin
ended() {
  local t
  for _ in $(seq $(( (TIMEOUT + 50) * 10 ))); do
    [ -z "$(all_ranks)" ] && break
    sleep 0.1
  done
  t=$(awk "BEGIN { printf \"%.1f\", $(now) - $2 }")
  if [ -z "$(all_ranks)" ] && awk "BEGIN { exit !($t < $TIMEOUT + 30) }"; then ok
  else bad "$1: ranks left after ${t} s: $(all_ranks | tr '\n' ' '); log: $(tail -8 "$1.log")"; fi
  echo "$1: every rank exited ${t} s after the failure (timeout ${TIMEOUT} s)"
  T=$t
}

# (a) one rank killed
if start kill; then
  victim=$(ranks_on 2 | tail -1)
  t0=$(now)
  kill -9 "$victim"
  ended kill "$t0"
  for _ in $(seq 100); do case $(scontrol show job "$j" | grep -o 'JobState=[A-Z]*') in
    *RUNNING|*COMPLETING) sleep 0.2 ;; *) break ;; esac; done
  st=$(scontrol show job "$j" | grep -o 'JobState=[A-Z]*\|ExitCode=[0-9:]*' | tr '\n' ' ')
  case $st in *FAILED*|*CANCELLED*) ok ;; *) bad "kill: the job ended as: $st" ;; esac
  grep -q "node2" kill.log && grep -Eq "task [23]|rank [23]" kill.log && grep -q "resume auto" kill.log && ok ||
    bad "kill: the log does not name the rank and node: $(tail -5 kill.log)"
  T_KILL=$T
fi

# (b) a compute node down: cut off, then everything in it killed. Not the
# job's batch host: losing that one takes srun and the job's log with it,
# and Slurm itself ends the job once it declares the node dead
# (SlurmdTimeout); here the survivors must find out on their own.
if start down; then
  batch=$(scontrol show job "$j" | grep -o 'BatchHost=node[0-9]*' | cut -d= -f2)
  k=2; [ "$batch" = node2 ] && k=1
  lo=$(( (k - 1) * 2 )); hi=$((lo + 1))
  t0=$(now)
  ip link set "zt7v$k" down
  for p in $(zc_node_pids $k); do kill -9 "$p" 2>/dev/null; done
  ended down "$t0"
  if grep -Eq "rank [$lo$hi] \(pid [0-9]+ on node$k\) does not answer" down.log &&
     grep -q "resume auto" down.log; then ok
  else bad "down (node$k, batch host $batch): the log does not name the silent ranks on node$k or say how to resume: $(tail -12 down.log)"; fi
  T_DOWN=$T
fi
echo "failure: rank killed: ranks gone after ${T_KILL:-?} s; node down: after ${T_DOWN:-?} s (watchdog timeout $TIMEOUT s)"
echo "cluster failure: $pass passed, $fail failed"
[ $fail = 0 ]
