#!/usr/bin/env bash
# Checkpoints any topology loads. A run saved at step 5 on (dp, pp, tp,
# zero) = (2, 2, 2, 3) continues on (4, 1, 2, 1), (1, 4, 1, 0), (8, 1, 1, 2)
# and (1, 1, 1, 0), and, through `zreshard convert --dp 1 --pp 4 --tp 1
# --zero 0`, on (1, 4, 1, 0) from the converted file: every continuation
# matches the uninterrupted single-process run (loss 1e-5 relative per
# step, weights 1e-4 relative L2). And the initial checkpoint written by 8
# ranks at (2, 2, 2, 3) is bitwise the one written by one process, read
# back with h5py.
# Usage: reshard.sh ZTRAIN ZRESHARD MPIRUN...
set -eu
Z=$(realpath "$1"); R=$(realpath "$2"); shift 2
HERE=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 9 30000
cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 4, heads = 4}
train = {micro_batch = 1, global_batch = 8, steps = 10, log_every = 0, clip = 0.5,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 2, decay_steps = 10}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
LUA
export OMP_NUM_THREADS=1
SAVED="parallel = {dp = 2, pp = 2, tp = 2, zero = 3}"
"$Z" run.lua --metrics full.jsonl --save full.h5 > /dev/null
"$@" -np 8 "$Z" run.lua -e "$SAVED" --steps 5 --save half.h5 > /dev/null
cont() { # DP PP TP ZERO CHECKPOINT NAME MPIRUN...
  local dp=$1 pp=$2 tp=$3 zero=$4 ck=$5 name=$6; shift 6
  "$@" -np $((dp * pp * tp)) "$Z" run.lua -e "parallel = {dp = $dp, pp = $pp, tp = $tp, zero = $zero}" \
    --load $ck --metrics r_$name.jsonl --save r_$name.h5 > /dev/null
}
for cfg in "4 1 2 1" "1 4 1 0" "8 1 1 2" "1 1 1 0"; do
  set -- $cfg "$@"
  dp=$1 pp=$2 tp=$3 zero=$4; shift 4
  cont $dp $pp $tp $zero half.h5 ${dp}_${pp}_${tp}_${zero} "$@"
done
"$R" convert half.h5 --dp 1 --pp 4 --tp 1 --zero 0 -o conv.h5 > /dev/null
cont 1 4 1 0 conv.h5 converted "$@"
"$Z" run.lua --steps 0 --save init1.h5 > /dev/null
"$@" -np 8 "$Z" run.lua -e "$SAVED" --steps 0 --save init8.h5 > /dev/null
/usr/bin/python3 - "$HERE/ref" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import h5py, numpy as np
from zcheck import weight_distance
full = {r["step"]: r["loss"] for r in map(json.loads, open("full.jsonl")) if "loss" in r}
bad, n = [], 0
with h5py.File("full.h5") as f:
    ref = {k: f["model"][k][...] for k in f["model"]}
    dim = json.loads(f.attrs["plan"])["model"]["dim"]
for cfg in ("4_1_2_1", "1_4_1_0", "8_1_1_2", "1_1_1_0", "converted"):
    rows = [r for r in map(json.loads, open(f"r_{cfg}.jsonl")) if "loss" in r]
    if [r["step"] for r in rows] != list(range(6, 11)):
        bad.append(f"{cfg}: steps {[r['step'] for r in rows]}")
    worst = max(abs(r["loss"] - full[r["step"]]) / full[r["step"]] for r in rows)
    with h5py.File(f"r_{cfg}.h5") as f:
        wd = max(weight_distance(k, f["model"][k][...], v, dim) for k, v in ref.items())
    print(f"dp_pp_tp_zero {cfg}: loss {worst:.1e}, weights {wd:.1e}")
    if not worst <= 1e-5: bad.append(f"{cfg}: loss differs by {worst:.2e}")
    if not wd <= 1e-4: bad.append(f"{cfg}: weights differ by {wd:.2e}")
with h5py.File("init1.h5") as a, h5py.File("init8.h5") as b:
    for g in ("model", "optim/exp_avg", "optim/exp_avg_sq", "optim/master"):
        for k in a[g]:
            n += 1
            if not np.array_equal(a[g][k][...], b[g][k][...]):
                bad.append(f"init {g}/{k} differs between 1 and 8 ranks")
            if g != "optim/master" and a[g][k].attrs["checksum"] != b[g][k].attrs["checksum"]:
                bad.append(f"init {g}/{k}: checksums differ")
print(f"initial checkpoints: {n} tensors compared bitwise (h5py)")
for x in bad: print("FAIL:", x)
print(f"{0 if bad else 1} passed, {1 if bad else 0} failed")
sys.exit(1 if bad else 0)
PY
