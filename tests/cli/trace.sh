#!/usr/bin/env bash
# --trace and the measured bubble. A 2-step run at pp 2 x dp 2 with the
# zero-bubble schedule writes a Chrome trace: it must parse as trace-event
# JSON with one named track per rank, per rank and step one F, B and W
# slice per micro-batch (with its micro-batch and chunk), one step slice,
# transfers on the pp group and collectives, no slice with a negative
# time or length, and no part file left behind. Every metrics line carries
# bubble.measured and bubble.simulated in [0, 1).
# Usage: trace.sh ZTRAIN MPIRUN...
set -eu
Z=$(realpath "$1"); shift
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 3 20000
cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 4, heads = 4}
train = {micro_batch = 1, global_batch = 8, steps = 2, log_every = 1}
data = {train = "$W/tok.bin"}
parallel = {pp = 2, dp = 2}
schedule = zt.schedule.zero_bubble{}
LUA
OMP_NUM_THREADS=1 "$@" -np 4 "$Z" run.lua --trace t.json --metrics m.jsonl > out.txt
grep -q "bubble .*% (simulated .*%)" out.txt || { echo "FAIL: no bubble in the log:"; cat out.txt; exit 1; }
ls | grep -q part && { echo "FAIL: trace parts left: $(ls)"; exit 1; }
/usr/bin/python3 - <<'PY'
import json, sys
from collections import Counter
bad = []
d = json.load(open("t.json"))
ev = d["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
if sorted(names) != [0, 1, 2, 3]:
    bad.append(f"tracks {sorted(names)}, expected ranks 0..3")
x = [e for e in ev if e.get("ph") == "X"]
for e in x:
    if e["ts"] < 0 or e["dur"] < 0:
        bad.append(f"negative time in {e}")
        break
m = 8 // 2  # micro-batches per step on each dp rank
for pid in range(4):
    ops = Counter(e["name"] for e in x if e["pid"] == pid and e["cat"] == "compute")
    for op in "FBW":
        if ops[op] != 2 * m:
            bad.append(f"rank {pid}: {ops[op]} {op} slices, expected {2 * m}")
    mbs = sorted(e["args"]["mb"] for e in x if e["pid"] == pid and e["name"] == "F")
    if mbs != sorted(list(range(m)) * 2):
        bad.append(f"rank {pid}: F micro-batches {mbs}")
    steps = [e for e in x if e["pid"] == pid and e["name"] == "step"]
    if len(steps) != 2:
        bad.append(f"rank {pid}: {len(steps)} step slices")
    kinds = {e["name"] for e in x if e["pid"] == pid}
    for want in ("send pp", "recv pp", "allreduce world", "optimizer"):
        if want not in kinds:
            bad.append(f"rank {pid}: no '{want}' slice")
rows = [json.loads(l) for l in open("m.jsonl") if '"loss"' in l]
if len(rows) != 2:
    bad.append(f"{len(rows)} metrics lines")
for r in rows:
    b = r.get("bubble", {})
    for k in ("measured", "simulated"):
        if not 0 <= b.get(k, -1) < 1:
            bad.append(f"step {r['step']}: bubble.{k} = {b.get(k)}")
print(f"trace: {len(ev)} events, {len(names)} tracks; bubble {rows[-1]['bubble'] if rows else None}")
for b in bad[:10]:
    print("FAIL:", b)
print(f"{0 if bad else 1} passed, {1 if bad else 0} failed")
sys.exit(1 if bad else 0)
PY
