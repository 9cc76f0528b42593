#!/usr/bin/env bash
# Exact resume after a crash. A 30-step run writes checkpoints every 15
# steps (checkpoint.every, keep, the `latest` pointer); a second run of the
# same script is killed (SIGKILL of its last rank, through the test hook
# ZT_TEST_KILL_AT_STEP) at step 20, after the step-15 checkpoint; a third
# run with --resume auto continues from step 15. Its losses for steps
# 16..30 and its final weights and optimizer state must be bitwise those of
# the uninterrupted run. Also: a checkpoint damaged by a flipped byte is
# skipped by --resume auto in favour of the one before, with a warning; a
# crash in the middle of a save leaves the previous checkpoint in charge.
# Usage: [ASYNC=true] resume.sh ZTRAIN [MPIRUN... -np N -e PARALLEL_STATEMENT]
# (ASYNC=true: the periodic checkpoints are written in the background)
set -eu
Z=$(realpath "$1"); shift
LAUNCH=("$@")
PAR=""
if [ ${#LAUNCH[@]} -gt 0 ]; then PAR=${LAUNCH[-1]}; unset 'LAUNCH[-1]'; unset 'LAUNCH[-1]'; fi
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 5 30000
cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 64}
train = {micro_batch = 1, global_batch = 8, steps = 30, log_every = 0,
         lr = zt.lr.cosine{peak = 1e-3, warmup = 2}}
data = {train = "$W/tok.bin", shuffle = true}
LUA
run() { # DIR [args...]
  local d=$1; shift
  mkdir -p "$d"
  (cd "$d" && OMP_NUM_THREADS=1 "${LAUNCH[@]}" "$Z" ../run.lua ${PAR:+-e "$PAR"} \
     -e "checkpoint = {dir = 'ck', every = 15, keep = 2, async = ${ASYNC:-false}}" "$@")
}
run full --metrics m.jsonl --save final.h5 > /dev/null
[ "$(ls full/ck)" = "$(printf 'latest\nstep_00000015.h5\nstep_00000030.h5')" ] || { echo "FAIL: ck/ holds $(ls full/ck)"; exit 1; }
[ "$(cat full/ck/latest)" = "step_00000030.h5" ] || { echo "FAIL: latest names $(cat full/ck/latest)"; exit 1; }
set +e
ZT_TEST_KILL_AT_STEP=20 run crash --metrics m.jsonl > /dev/null 2>&1
rc=$?
set -e
[ $rc != 0 ] || { echo "FAIL: the killed run exited 0"; exit 1; }
# In the background a save may still be in flight when the crash comes:
# then there is no checkpoint yet, and the resumed run starts from 0.
FROM=15
if [ "${ASYNC:-false}" = true ] && [ ! -e crash/ck/latest ]; then FROM=0; fi
if [ $FROM = 15 ]; then
  [ "$(cat crash/ck/latest)" = "step_00000015.h5" ] || { echo "FAIL: after the crash latest names $(cat crash/ck/latest)"; exit 1; }
fi
run crash --resume auto --metrics resumed.jsonl --save final.h5 > crash/out.txt
if [ $FROM = 15 ]; then
  grep -q "resuming from ck/step_00000015.h5 (step 15)" crash/out.txt || { echo "FAIL: $(cat crash/out.txt)"; exit 1; }
fi
export FROM
/usr/bin/python3 - <<'PY'
import json, sys
import h5py, numpy as np
full = [json.loads(l) for l in open("full/m.jsonl") if '"loss"' in l]
res = [json.loads(l) for l in open("crash/resumed.jsonl") if '"loss"' in l]
bad = []
import os
if [r["step"] for r in res] != list(range(int(os.environ["FROM"]) + 1, 31)):
    bad.append(f"resumed steps {[r['step'] for r in res]}")
for r in res:
    if full[r["step"] - 1]["loss"] != r["loss"]:
        bad.append(f"step {r['step']}: loss {r['loss']!r} vs {full[r['step'] - 1]['loss']!r}")
n = 0
with h5py.File("full/final.h5") as a, h5py.File("crash/final.h5") as b:
    for g in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
        for name in a[g]:
            n += 1
            if not np.array_equal(a[g][name][...], b[g][name][...]):
                bad.append(f"{g}/{name} differs")
    if a.attrs["step"] != b.attrs["step"]:
        bad.append("step differs")
print(f"{len(res)} resumed steps (from step {os.environ['FROM']}), {n} tensors compared bitwise")
for x in bad: print("FAIL:", x)
sys.exit(1 if bad or n == 0 else 0)
PY
# A flipped byte in the newest checkpoint: --resume auto falls back.
/usr/bin/python3 - <<'PY'
import h5py
with h5py.File("full/ck/step_00000030.h5", "r") as f:
    off = f["model/embed.tokens"].id.get_offset()
with open("full/ck/step_00000030.h5", "r+b") as f:
    f.seek(off + 100); b = f.read(1); f.seek(off + 100); f.write(bytes([b[0] ^ 0x40]))
PY
run full --resume auto -e "train.steps = 15" > full/out2.txt 2> full/err2.txt
grep -q "skips ck/step_00000030.h5: checkpoint ck/step_00000030.h5: tensor /model/embed.tokens fails its checksum" full/err2.txt \
  && grep -q "resuming from ck/step_00000015.h5" full/out2.txt || { echo "FAIL: no fallback: $(cat full/err2.txt full/out2.txt)"; exit 1; }
# A crash in the middle of writing the step-30 checkpoint: the step-15 one
# stays the one `latest` names, the half-written file is never renamed into
# place, and --resume auto continues from step 15.
set +e
ZT_TEST_KILL_IN_SAVE=30 run savecrash > /dev/null 2>&1
rc=$?
set -e
[ $rc != 0 ] || { echo "FAIL: the run killed while saving exited 0"; exit 1; }
[ "$(cat savecrash/ck/latest)" = "step_00000015.h5" ] && [ ! -e savecrash/ck/step_00000030.h5 ] \
  || { echo "FAIL: after a crash while saving: $(ls savecrash/ck), latest $(cat savecrash/ck/latest)"; exit 1; }
run savecrash --resume auto -e "train.steps = 16" -e "checkpoint.every = 1" > savecrash/out.txt
grep -q "resuming from ck/step_00000015.h5 (step 15)" savecrash/out.txt \
  || { echo "FAIL: $(cat savecrash/out.txt)"; exit 1; }
ls savecrash/ck | grep -q "tmp" && { echo "FAIL: a crashed save's temporary file is left: $(ls savecrash/ck)"; exit 1; }
echo "1 passed, 0 failed"
