#!/usr/bin/env bash
# Training data from several sources (docs/data-format.md): a blend of a
# token file and a Megatron-LM indexed dataset (written by
# tests/ref/megatron_idx.py, Megatron's format) with a list and a glob in
# it. The same blend trains the same at dp 1 and dp 2 (the order is a
# function of the global step, not of the layout), a run stopped and
# continued from its checkpoint equals the uninterrupted run bitwise
# (losses, weights, optimizer state), the checkpoint's plan records the
# files read (a run continued on other data says so), and bad sources (an
# index with a wrong magic or a pointer past its .bin, weights that sum to
# 0, a negative weight, a glob that matches nothing) end with exit 2, one
# message, nothing written.
# Usage: data_sources.sh ZTRAIN MPIRUN... (MPIRUN with its options)
set -eu
. "$(dirname "$0")/common.sh"
zt_setup "$@"
zt_tokens a.bin 11 6000
mkdir shards
zt_tokens shards/s0.bin 12 900
zt_tokens shards/s1.bin 13 700
# the Megatron part: documents of an easy pattern (each a count from its
# first token, EOD 255 at the end), so that which part a batch came from
# shows in its loss
/usr/bin/python3 - "$HERE/ref" <<'PY'
import random, sys
sys.path.insert(0, sys.argv[1])
import megatron_idx
random.seed(5)
docs = []
for d in range(300):
    s = random.randrange(200)
    docs.append(",".join(str((s + k) % 200) for k in range(random.randrange(5, 40))) + ",255")
megatron_idx.main(["corpus", "8"] + docs)
megatron_idx.main(["bad", "8"] + docs[:5] + ["--corrupt", "magic"])
megatron_idx.main(["far", "8"] + docs[:5] + ["--corrupt", "pointer"])
PY
cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 48}
train = {micro_batch = 2, global_batch = 8, steps = 12, log_every = 0,
         lr = zt.lr.cosine{peak = 3e-3, warmup = 2, decay_steps = 12}}
data = {train = {{0.6, "corpus"}, {0.4, {"a.bin", "shards/*.bin"}}}, shuffle = true}
LUA
t0=$(date +%s)
OMP_NUM_THREADS=1 "$Z" run.lua --metrics ref.jsonl --save ref.h5 > /dev/null
OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$Z" run.lua --metrics dp2.jsonl --save dp2.h5 > /dev/null
echo -n "blend dp=2: "
/usr/bin/python3 "$HERE/ref/equiv.py" ref.jsonl ref.h5 dp2.jsonl dp2.h5
# stopped at step 5 (the schedule fixed: --steps alone would shorten its decay), continued from its checkpoint to 12
OMP_NUM_THREADS=1 "$Z" run.lua --steps 5 --save mid.h5 > /dev/null
OMP_NUM_THREADS=1 "$Z" run.lua --load mid.h5 --metrics resumed.jsonl --save resumed.h5 > /dev/null 2> resumed.err
if grep -q "other data" resumed.err; then echo "FAIL: a warning on the same data: $(cat resumed.err)"; exit 1; fi
# continued on other weights: said, once
OMP_NUM_THREADS=1 "$Z" run.lua --load mid.h5 --steps 6 -e 'data.train[1][1] = 0.5' > /dev/null 2> other.err
grep -q "warning: checkpoint mid.h5 was trained on other data (part 1 had weight 0.6, now 0.555556); from step 6 on" other.err \
  || { echo "FAIL: no warning on other data: $(cat other.err)"; exit 1; }
/usr/bin/python3 - <<'PY'
import json, sys
import h5py, numpy as np
full = [json.loads(l) for l in open("ref.jsonl") if '"loss"' in l]
res = [json.loads(l) for l in open("resumed.jsonl") if '"loss"' in l]
bad = []
if [r["step"] for r in res] != list(range(6, 13)):
    bad.append(f"resumed steps {[r['step'] for r in res]}")
for r in res:
    if full[r["step"] - 1]["loss"] != r["loss"]:
        bad.append(f"step {r['step']}: loss {r['loss']!r} vs {full[r['step'] - 1]['loss']!r}")
# the blend's parts differ: a wrong order would not go unseen
spread = max(r["loss"] for r in full[4:]) - min(r["loss"] for r in full[4:])
if spread < 0.05:
    bad.append(f"the losses of steps 5..12 spread only {spread:.3f}: the test cannot tell orders apart")
n = 0
with h5py.File("ref.h5") as a, h5py.File("resumed.h5") as b:
    for g in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
        for name in a[g]:
            n += 1
            if not np.array_equal(a[g][name][...], b[g][name][...]):
                bad.append(f"{g}/{name} differs")
    plan = json.loads(a.attrs["plan"] if "plan" in a.attrs else a["plan"][()])
src = plan["data"]["sources"]["train"]
files = [[f["path"].rsplit("/", 1)[-1] for f in p["files"]] for p in src["parts"]]
if files != [["corpus.bin"], ["a.bin", "s0.bin", "s1.bin"]] or not src["blend"]:
    bad.append(f"the plan records {files}")
if [p["weight"] for p in src["parts"]] != [0.6, 0.4] or src["parts"][1]["tokens"] != 7600:
    bad.append(f"the plan records {src}")
print(f"resumed at step 5: {len(res)} steps, {n} tensors bitwise equal; plan records {files}")
for x in bad: print("FAIL:", x)
sys.exit(1 if bad or n == 0 else 0)
PY
# bad sources: exit 2, one message, nothing written
fails=0
expect() { # SUBSTRING DATA_STATEMENT
  rm -rf out && mkdir out
  set +e
  OMP_NUM_THREADS=1 "$Z" run.lua -e "$2" --save out/f.h5 --metrics out/m.jsonl > out.txt 2> err.txt
  local rc=$?
  set -e
  if [ $rc != 2 ] || ! grep -qF -- "$1" err.txt || [ "$(grep -c "ztrain: error" err.txt)" != 1 ] \
     || [ -n "$(ls -A out)" ]; then
    echo "FAIL [$2]: exit $rc, files: $(ls out); stderr: $(head -3 err.txt)"
    fails=$((fails + 1))
  fi
}
expect "bad.idx: not a Megatron-LM index: it does not start with the magic bytes MMIDIDX" \
  'data.train = {"a.bin", "bad"}'
expect "far.idx: sequence 4 (byte offset" 'data.train = "far.bin"'
expect 'data.train: the blend weights sum to 0; they must sum to a positive number' \
  'data.train = {{0, "a.bin"}, {0, "corpus"}}'
expect 'data.train[2]: the weight must be a finite number >= 0, got -0.5' \
  'data.train = {{1, "a.bin"}, {-0.5, "corpus"}}'
expect "data.val: the pattern 'shard/*.bin' matches no file" 'data.val = "shard/*.bin"'
[ $fails = 0 ] || exit 1
echo "5 bad sources refused; $(( $(date +%s) - t0 )) s"
