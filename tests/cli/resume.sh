#!/usr/bin/env bash
# Periodic checkpoints and exact resume at the same topology: a 12-step run
# writes checkpoint.every = 4 with keep = 2 (so steps 8 and 12 remain); a
# second run loads step 8 and trains to 12. Losses of steps 9..12 and the
# final weights and optimizer state must be bitwise identical.
# Usage: resume.sh ZTRAIN
set -eu
Z=$(realpath "$1")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
/usr/bin/python3 -c "
import numpy as np
np.random.seed(5); np.random.randint(0, 256, 30000).astype('<u2').tofile('tok.bin')"
cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 64}
train = {micro_batch = 2, global_batch = 4, steps = 12, log_every = 0,
         lr = zt.lr.cosine{peak = 1e-3, warmup = 2}}
data = {train = "tok.bin", shuffle = true}
checkpoint = {dir = "ck", every = 4, keep = 2}
LUA
"$Z" run.lua --metrics full.jsonl --save full.h5 > /dev/null
ls ck
[ "$(ls ck)" = "$(printf 'step_00000008.h5\nstep_00000012.h5')" ] || { echo "FAIL: ck/ holds $(ls ck)"; exit 1; }
"$Z" run.lua --load ck/step_00000008.h5 --metrics resumed.jsonl --save resumed.h5 > /dev/null
/usr/bin/python3 - <<'PY'
import json, sys
import h5py, numpy as np
full = [json.loads(l) for l in open("full.jsonl")]
res = [json.loads(l) for l in open("resumed.jsonl")]
bad = []
if [r["step"] for r in res] != [9, 10, 11, 12]:
    bad.append(f"resumed steps {[r['step'] for r in res]}")
for r in res:
    f = full[r["step"] - 1]
    if f["loss"] != r["loss"]:
        bad.append(f"step {r['step']}: loss {r['loss']!r} vs {f['loss']!r}")
n = 0
with h5py.File("full.h5") as a, h5py.File("resumed.h5") as b:
    def visit(name, obj):
        global n
        if isinstance(obj, h5py.Dataset):
            n += 1
            if not np.array_equal(obj[...], b[name][...]):
                bad.append(f"{name} differs")
    a.visititems(visit)
    if a.attrs["step"] != b.attrs["step"]:
        bad.append("step attribute differs")
print(f"{len(res)} resumed steps, {n} datasets compared bitwise")
for x in bad: print("FAIL:", x)
sys.exit(1 if bad or n == 0 else 0)
PY
