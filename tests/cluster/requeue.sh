#!/usr/bin/env bash
# Preemption and requeue through Slurm: cluster/ztrain.sbatch submitted to
# the test cluster (2 nodes x 2 ranks, dp 2 x tp 2) gets Slurm's warning
# signal mid-run (scancel --signal=USR1 --batch: what --signal=B:USR1@120
# sends at the time limit), checkpoints, requeues itself and finishes with
# --resume auto under the same job id (SLURM_RESTART_COUNT 1): its losses
# and final weights and moments must be bitwise equal to an uninterrupted
# job's. The signal's checkpoint then resumes on one node of 4 ranks (the
# same layout, another node count), bitwise equal again.
# Usage: requeue.sh ZTRAIN
set -u
. "$(dirname "$0")/common.sh"
zct_setup "$1" 2 || exit $?
cat >> run.lua <<'LUA'
model = zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 4, heads = 4}
train.steps = 60
parallel = {dp = 2, tp = 2}
checkpoint = {every = 0}
LUA

state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
restarts() { scontrol show job "$1" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2; }
# JOB STATE SECONDS: until the job is in STATE (and the restarts as given)
wait_job() {
  for _ in $(seq $(($3 * 5))); do
    [ "$(state "$1")" = "$2" ] && { [ -z "${4:-}" ] || [ "$(restarts "$1")" = "$4" ]; } && return 0
    sleep 0.2
  done
  echo "job $1: $(state "$1") after $3 s, not $2" >&2
  return 1
}
submit() { # RUN_DIR NODES PER_NODE: the job id
  sbatch --parsable -N "$2" --ntasks-per-node="$3" -o "$1.log" \
    --export=ALL,ZT_RUN_DIR="$1" "$SB" "$W/run.lua" --save final.h5
}

# the uninterrupted job
mkdir -p full
j=$(submit "$W/full" 2 2) && wait_job "$j" COMPLETED 120 && [ -s full/final.h5 ] && ok ||
  { bad "the uninterrupted job: $(state "$j")"; tail -5 full.log; }

# the interrupted one: the warning signal once it is a few steps in
mkdir -p int
j=$(submit "$W/int" 2 2)
for _ in $(seq 300); do
  [ "$(grep -c '"loss"' int/metrics.0.jsonl 2>/dev/null)" -ge 3 ] 2>/dev/null && break
  sleep 0.1
done
scancel --signal=USR1 --batch "$j"
if wait_job "$j" COMPLETED 180 1; then ok; else bad "no requeue: $(tail -5 int.log)"; fi
stop=$(grep -c '"loss"' int/metrics.0.jsonl 2>/dev/null)
if [ "${stop:-0}" -ge 3 ] && [ "$stop" -lt 60 ] && grep -q "SIGUSR1: checkpoint .* written at step $stop; stopping" int.log &&
   grep -q "requeueing job $j" int.log && grep -q "slurm job $j, restart 1" int.log; then ok
else bad "the job did not stop mid-run and come back (stopped after ${stop:-?} steps): $(grep -E 'SIGUSR1|requeue|placement' int.log)"; fi
cat int/metrics.0.jsonl int/metrics.1.jsonl > int/all.jsonl 2>/dev/null
if /usr/bin/python3 "$HERE/ref/bitwise.py" full/metrics.0.jsonl full/final.h5 int/all.jsonl int/final.h5; then ok
else bad "the requeued job differs from the uninterrupted one"; fi
echo "requeue: signalled at step $stop of 60, requeued, finished bitwise equal"

# the signal's checkpoint on one node (4 ranks there, not 2 x 2)
mkdir -p one && cp -r int/checkpoints one/
j=$(submit "$W/one" 1 4) && wait_job "$j" COMPLETED 120 && ok || bad "the one-node job: $(tail -5 one.log)"
grep -q "placement: 1 node (node1: ranks 0-3)" one.log && ok || bad "one node: $(grep placement one.log)"
cat int/metrics.0.jsonl one/metrics.0.jsonl > one/all.jsonl
if /usr/bin/python3 "$HERE/ref/bitwise.py" full/metrics.0.jsonl full/final.h5 one/all.jsonl one/final.h5; then ok
else bad "resumed on one node, the run differs from the uninterrupted one"; fi

echo "cluster requeue: $pass passed, $fail failed"
[ $fail = 0 ]
