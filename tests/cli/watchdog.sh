#!/usr/bin/env bash
# A hang becomes a report: rank 1 skips the tenth collective of the world
# group (a test hook); with parallel.timeout = 2 the job must end within a
# minute, non-zero, with each stuck rank naming the operation, the sequence
# number, the group and the rank that has not arrived. The same for a
# pipeline transfer that never comes.
# Usage: watchdog.sh ZTRAIN MPIRUN...
set -u
Z=$(realpath "$1"); shift
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 0 5000
cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2}
train = {micro_batch = 1, global_batch = 2, steps = 20, log_every = 0}
data = {train = "tok.bin"}
parallel = {timeout = 2}
LUA
start=$(date +%s)
ZT_TEST_SKIP_COLLECTIVE="1:world:10" timeout 60 "$@" -x ZT_TEST_SKIP_COLLECTIVE -np 2 "$Z" run.lua \
  > out.txt 2> err.txt
rc=$?
took=$(( $(date +%s) - start ))
fail=0
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { echo "FAIL: exit code $rc (124 = hung until timeout)"; fail=1; }
# Both ranks time out; the first abort may kill the other before it
# prints, so one complete report, from either side, is the requirement.
r0="ztrain: watchdog: rank 0: allreduce #10 on group world (2 ranks) has waited"
r0b="rank 1 has not arrived: it is at #9 on world, waiting in allreduce #"
r1="ztrain: watchdog: rank 1: allreduce #"
r1b="rank 0 has not arrived: it is at #"
r1c="waiting in allreduce #10 on group world"
if grep -qF -- "$r0" err.txt && grep -qF -- "$r0b" err.txt; then :
elif grep -qF -- "$r1" err.txt && grep -qF -- "$r1b" err.txt && grep -qF -- "$r1c" err.txt; then :
else echo "FAIL: no complete watchdog report"; fail=1; fi
[ "$fail" = 0 ] || sed 's/^/    stderr: /' err.txt | head -20
echo "ended after ${took}s with exit code $rc"

# A pipeline transfer that never comes: rank 0 (stage 0) skips its third
# send on the pp group; the stage that waits for it, and the one waiting
# on that stage in turn, each name the transfer they wait in.
cat > pipe.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2}
train = {micro_batch = 1, global_batch = 4, steps = 20, log_every = 0}
data = {train = "tok.bin"}
parallel = {timeout = 2, pp = 2}
LUA
ZT_TEST_SKIP_COLLECTIVE="0:pp:3" timeout 60 "$@" -x ZT_TEST_SKIP_COLLECTIVE -np 2 "$Z" pipe.lua \
  > out2.txt 2> err2.txt
rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { echo "FAIL: pipeline: exit code $rc (124 = hung until timeout)"; fail=1; }
if grep -qE "ztrain: watchdog: rank [01]: recv #[0-9]+ on group pp \(2 ranks\) has waited" err2.txt &&
   grep -qE "ztrain: watchdog:   rank [01] is waiting in recv #[0-9]+ on group pp" err2.txt; then :
else
  echo "FAIL: pipeline: no complete watchdog report"; fail=1
  sed 's/^/    stderr: /' err2.txt | head -20
fi
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
[ "$fail" = 0 ]
