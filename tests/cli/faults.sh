#!/usr/bin/env bash
# Fault injection at one layout: nothing hangs and nothing is lost.
# Each case injects one fault into a run of 16 steps (checkpoints every 4,
# watchdog timeout 5 s), checks that the job ends within the timeout plus a
# margin with the right exit code and message, that no process is left
# behind, then continues it with --resume auto and checks that the final
# weights and AdamW moments are bitwise those of an uninterrupted run:
#   - SIGKILL of a random rank at a random moment (3 times), and of every
#     rank inside a synchronous and inside a background save (test hook);
#   - a write that fails on one rank in the middle of a save (test hook);
#   - SIGSTOP of rank 0 and of another rank at start-up, in a step and in a
#     save (test hook): exactly one watchdog report, naming the stopped
#     rank and no healthy one;
#   - with --enospc instead: the checkpoint folder on a tmpfs too small for
#     the second checkpoint, once refused by the free-space check before
#     anything is written and once failing for real in the middle of the
#     write (ENOSPC); then the tmpfs is enlarged, as a user freeing space
#     would, and the run resumes. Needs root for mount: exit 77 (skipped)
#     without it.
# Usage: faults.sh ZTRAIN NAME NP 'LUA STATEMENTS' [--enospc] MPIRUN...
set -u
Z=$(realpath "$1"); name=$2; np=$3; layout=$4; shift 4
enospc=0
[ "${1:-}" = "--enospc" ] && { enospc=1; shift; }
MPIRUN=("$@")
HERE=$(dirname "$(realpath "$0")")
. "$HERE/common.sh"
zt_scratch
zt_tokens tok.bin 0 20000
TIMEOUT=5
MARGIN=25 # reply waits (2 s each), the claim, the launcher's teardown, a loaded machine
cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2}
-- 16 steps: the faults land at step 6 and in the step-8 save, and a run
-- resumed from step 4 then still saves three times (8, 12, 16) and rotates
-- its files (keep 2); the 40 steps this had proved nothing more and cost
-- 1.6 times as much per launch (ten saves instead of four; 25 launches)
train = {micro_batch = 1, global_batch = 8, steps = 16, log_every = 0}
data = {train = "$W/tok.bin"}
checkpoint = {dir = "ck", every = 4, keep = 2}
$layout
parallel.timeout = $TIMEOUT
LUA
pass=0 fail=0 faults=0 worst=0

note() { echo "[$name] $*"; }
bad() { fail=$((fail + 1)); note "FAIL $case: $*"; }

# ztrain DIR [ENV=VALUE...] -- [ARGS...]: one run in DIR, in the background;
# stderr lines get a time stamp (to time the exit from the fault's report).
start_run() {
  local dir=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  mkdir -p "$dir"
  (cd "$dir" && env "${envs[@]}" "${MPIRUN[@]}" -np "$np" \
     $(for v in "${envs[@]}"; do printf -- '-x %s ' "${v%%=*}"; done) \
     "$Z" "$W/run.lua" "$@" > out.txt 2> >(while IFS= read -r l; do
       printf '%s %s\n' "$(date +%s.%N)" "$l"; done > err.txt)) &
  RUN=$!
}

# Waits for the run; sets RC and END (seconds since the epoch).
finish_run() {
  local limit=$1
  local t0=$SECONDS
  while kill -0 "$RUN" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.1; done
  if kill -0 "$RUN" 2>/dev/null; then
    RC=124
    pkill -9 -f "$W/run.lua" 2>/dev/null
    wait "$RUN" 2>/dev/null
  else
    wait "$RUN"
    RC=$?
  fi
  END=$(date +%s.%N)
  sleep 0.2 # the time-stamping pipe
}

# The job left nothing running.
no_orphans() {
  sleep 0.5
  if pgrep -f "$W/run.lua" > /dev/null; then
    bad "processes left behind: $(pgrep -f "$W/run.lua" | tr '\n' ' ')"
    pkill -9 -f "$W/run.lua"
    return 1
  fi
}

# Whole seconds from time A to time B (seconds since the epoch, fractional).
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%d", b - a }'; }

# Seconds from the first stderr line matching $1 (or from $2, a time) to END.
took_since() {
  local t
  t=$(grep -m1 -- "$1" "$DIR/err.txt" | cut -d' ' -f1)
  [ -z "$t" ] && t=${2:-}
  [ -z "$t" ] && { echo 999; return; }
  secs "$t" "$END"
}

record_exit() {
  local took=$1
  faults=$((faults + 1))
  [ "$took" -gt "$worst" ] && worst=$took
  if [ "$took" -gt $((TIMEOUT + MARGIN)) ]; then
    bad "ended ${took}s after the fault (limit $((TIMEOUT + MARGIN))s)"
    return 1
  fi
}

# Same step, weights and moments, bit for bit.
same_state() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
assert a.attrs["step"] == b.attrs["step"], ("step", a.attrs["step"], b.attrs["step"])
n = 0
for g in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
    for k in a[g]:
        x, y = a[g][k][()], b[g][k][()]
        assert x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32)), (g, k)
        n += 1
print(n)
PY
}

# Continues DIR's run with --resume auto and compares its end with the reference.
resume_and_compare() {
  local dir=$DIR
  (cd "$dir" && "${MPIRUN[@]}" -np "$np" "$Z" "$W/run.lua" --resume auto --save final.h5 \
     > resume.txt 2>&1)
  local rc=$?
  [ $rc = 0 ] || { bad "--resume auto exit $rc: $(grep -m2 'error\|warning' "$dir/resume.txt")"; return 1; }
  local n
  n=$(same_state "$W/ref/final.h5" "$dir/final.h5" 2>&1) ||
    { bad "resumed run differs from the uninterrupted one: $(echo "$n" | tail -1)"; return 1; }
}

# Waits (up to 30 s: 8 ranks start slowly on a busy machine) until the
# job's ranks run; sets PIDS and UP (a time).
ranks_up() {
  PIDS=()
  for t in $(seq 300); do
    PIDS=($(pgrep -f "^$Z $W/run.lua"))
    [ ${#PIDS[@]} = "$np" ] && break
    sleep 0.1
  done
  UP=$(date +%s.%N)
}

# ---- the uninterrupted run --------------------------------------------------------
case=reference
DIR=$W/ref
start_run "$DIR" -- --save final.h5
ranks_up
finish_run 300
span_ms=$(awk -v a="$UP" -v b="$END" 'BEGIN { printf "%d", (b - a) * 1000 }') # how long its ranks ran
[ "$RC" = 0 ] || { bad "exit $RC"; sed 's/^/    /' "$DIR/err.txt" | head; exit 1; }
ckpt_bytes=$(stat -c %s "$DIR/ck/$(cat "$DIR/ck/latest")")

if [ "$enospc" = 1 ]; then
  # ---- a full disk during a save ----------------------------------------------------
  mkdir -p "$W/probe" && mount -t tmpfs -o size=1m tmpfs "$W/probe" 2>/dev/null ||
    { echo "SKIP: cannot mount a tmpfs here (needs root)"; exit 77; }
  umount "$W/probe"
  size=$((ckpt_bytes * 3 / 2 / 1024 + 1))k # room for one checkpoint, not for the next
  for check in precheck real; do
    case=enospc-$check
    DIR=$W/$case
    mkdir -p "$DIR/ck"
    mount -t tmpfs -o size=$size tmpfs "$DIR/ck"
    env=()
    [ $check = real ] && env=(ZT_TEST_NO_SPACE_CHECK=1)
    start_run "$DIR" "${env[@]}" -- -e 'checkpoint.keep = 3'
    finish_run 120
    took=$(took_since "ztrain: error")
    if [ "$RC" != 1 ]; then bad "exit $RC, expected 1"
    elif ! grep -q "not written: .*needs about .* MB" "$DIR/err.txt" &&
         ! grep -q "not written: .*the file system is full" "$DIR/err.txt"; then
      bad "no message about the full disk: $(grep -m1 error "$DIR/err.txt")"
    elif [ "$(cat "$DIR/ck/latest")" != step_00000004.h5 ]; then bad "latest is $(cat "$DIR/ck/latest")"
    elif ls "$DIR/ck" | grep -q tmp; then bad "temporary file left: $(ls "$DIR/ck")"
    elif record_exit "$took" && no_orphans; then
      note "$case: $(grep -m1 -o 'not written: .*' "$DIR/err.txt" | cut -c1-150)"
      mount -o remount,size=64m "$DIR/ck" # the user makes room
      resume_and_compare && pass=$((pass + 1))
    fi
    umount "$DIR/ck"
  done
  echo "[$name] faults injected: $faults, worst time to exit after the fault: ${worst}s"
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
  exit
fi

# ---- SIGKILL of a random rank at a random moment -------------------------------------
killed=0
for attempt in $(seq 15); do
  [ $killed = 3 ] && break
  case=kill-random-$((killed + 1))
  DIR=$W/$case-$attempt
  start_run "$DIR" --
  # a random moment of the ranks' life, a random rank
  ranks_up
  ms=$((RANDOM % (${span_ms:-1000} > 0 ? ${span_ms:-1000} : 1000)))
  sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
  victim=${PIDS[$((RANDOM % (${#PIDS[@]} > 0 ? ${#PIDS[@]} : 1)))]:-}
  t_kill=$(date +%s.%N)
  # a rank that has exited stays a zombie until its launcher reaps it, and
  # kill succeeds on a zombie: such a kill lands on nothing
  state=$(awk '{print $3}' "/proc/$victim/stat" 2>/dev/null)
  if [ -z "$victim" ] || [ -z "$state" ] || [ "$state" = Z ] || [ "$state" = X ] ||
     ! kill -9 "$victim" 2>/dev/null; then
    finish_run 120
    ran_ms=$(awk -v a="$UP" -v b="$END" 'BEGIN { printf "%d", (b - a) * 1000 }')
    note "$case: the run ended before the kill (${ms} ms into a ${span_ms} ms run, after ${ran_ms} ms, exit $RC); not counted"
    [ "$RC" = 0 ] || sed 's/^/    /' "$DIR/err.txt" | tail -5
    # runs are as long as the machine's load lets them be: the next moment
    # is drawn from a span this run did not outlast
    [ "$ran_ms" -lt "$span_ms" ] && span_ms=$((ran_ms * 8 / 10))
    continue
  fi
  finish_run 120
  took=$(secs "$t_kill" "$END")
  if [ "$RC" = 0 ]; then
    # the signal can still reach a rank inside exit(), after its last
    # collective and its share of the last save: its exit status is already
    # 0 then. A success is believed only with the whole run's end in hand,
    # bit for bit the uninterrupted run's; the kill is not counted
    last=$(cat "$DIR/ck/latest" 2>/dev/null)
    if [ "$last" = step_00000016.h5 ] && same_state "$W/ref/final.h5" "$DIR/ck/$last" > /dev/null 2>&1; then
      note "$case: pid $victim was killed as it exited (${ms} ms into a ${span_ms} ms run), the run complete and equal to the reference; not counted"
      no_orphans
      continue
    fi
    killed=$((killed + 1))
    bad "exit 0 after a rank was killed, and the run's end (${last:-no checkpoint}) is not the uninterrupted run's"
    continue
  fi
  killed=$((killed + 1))
  if record_exit "$took" && no_orphans; then
    note "$case: pid $victim killed ${ms} ms into a ${span_ms} ms run ($(ls "$DIR/ck" 2>/dev/null | grep -c step) checkpoints there), ended after ${took}s"
    resume_and_compare && pass=$((pass + 1))
  fi
done
[ $killed = 3 ] || bad "only $killed random kills landed"

# ---- SIGKILL of every rank inside a save (test hook) ----------------------------------
for mode in sync async; do
  case=kill-in-$mode-save
  DIR=$W/$case
  start_run "$DIR" ZT_TEST_KILL_IN_SAVE=8 -- -e "checkpoint.async = $([ $mode = async ] && echo true || echo false)"
  finish_run 120
  if [ "$RC" = 0 ]; then bad "exit 0"
  elif [ "$(cat "$DIR/ck/latest")" != step_00000004.h5 ]; then bad "latest is $(cat "$DIR/ck/latest")"
  elif no_orphans; then
    faults=$((faults + 1))
    resume_and_compare && pass=$((pass + 1))
  fi
done

# ---- a write fails on one rank in the middle of a save (test hook) ---------------------
case=write-fails-on-one-rank
DIR=$W/$case
r=$((np - 1))
start_run "$DIR" ZT_TEST_FAIL_WRITE=$r:8 --
finish_run 120
took=$(took_since "ztrain: error")
if [ "$RC" != 1 ]; then bad "exit $RC, expected 1"
elif ! grep -q "step_00000008.h5 not written: rank $r could not write .*injected write failure" "$DIR/err.txt"; then
  bad "message: $(grep -m1 error "$DIR/err.txt")"
elif [ "$(cat "$DIR/ck/latest")" != step_00000004.h5 ]; then bad "latest is $(cat "$DIR/ck/latest")"
elif ls "$DIR/ck" | grep -q tmp; then bad "temporary file left: $(ls "$DIR/ck")"
elif record_exit "$took" && no_orphans; then
  resume_and_compare && pass=$((pass + 1))
fi

# ---- SIGSTOP of one rank (test hook): one report that names it -------------------------
other=$((1 + RANDOM % (np - 1)))
for where in start step:6 save:8; do
  for r in 0 $other; do
    case="stop-rank-$r-at-$where"
    DIR=$W/stop-$r-${where/:/-}
    extra=()
    # the background writer's stall too, once
    [ "$where" = save:8 ] && [ "$r" = 0 ] && extra=(-e 'checkpoint.async = true')
    start_run "$DIR" ZT_TEST_STOP=$r:$where -- "${extra[@]}"
    finish_run 120
    took=$(took_since "stops itself at")
    reports=$(grep -c 'has waited' "$DIR/err.txt")
    named=$(grep -oE 'rank [0-9]+ \(pid [0-9]+ on [^)]*\) (does not answer|was not running)' \
              "$DIR/err.txt" | awk '{print $2}' | sort -u | tr '\n' ' ')
    if [ "$RC" != 1 ]; then bad "exit $RC, expected 1"
    elif [ "$reports" != 1 ] || [ "$named" != "$r " ]; then
      bad "$reports reports naming [$named], expected one naming rank $r"
      cut -d' ' -f2- "$DIR/err.txt" | grep watchdog | sed 's/^/    /'
    elif record_exit "$took" && no_orphans; then
      resume_and_compare && pass=$((pass + 1))
    fi
  done
done

echo "[$name] faults injected: $faults, worst time to exit after the fault: ${worst}s"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
