#!/usr/bin/env bash
# Checkpoint save and load throughput at np=8 (ZeRO-3, every rank writes its
# hyperslabs through MPI-IO) for the GPT-2 124M shape with optimizer state,
# against the raw sequential write speed of the same disk (dd with fsync),
# medians of REPEATS runs, interleaved. A benchmark, not a test.
#   bash tests/bench/bench_ckpt.sh [ZTRAIN] [REPEATS] [DIR]
set -eu
Z=$(realpath "${1:-build/ztrain}")
REPEATS=${2:-3}
DIR=${3:-$(mktemp -d -p "${TMPDIR:-/tmp}")}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
cd "$DIR"
python3 -c "
import array, random
random.seed(0)
array.array('H', [random.randrange(50304) for _ in range(20000)]).tofile(open('tok.bin', 'wb'))"
cat > m.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 50304, seq = 64, dim = 768, layers = 12, heads = 12}
train = {micro_batch = 4, global_batch = 32, steps = 0, log_every = 0}
data = {train = "tok.bin"}
parallel = {zero = 3}
LUA
for i in $(seq "$REPEATS"); do
  dd if=/dev/zero of=dd.bin bs=16M count=90 conv=fsync 2>&1 | awk '/copied/ {print "dd", $(NF-1), $NF}'
  rm -f dd.bin
  mpirun --bind-to none -np 8 "$Z" m.lua --save c.h5 | awk '/written/ {print "save", $(NF-1)}' | tr -d '('
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  mpirun --bind-to none -np 8 "$Z" m.lua --load c.h5 | awk '/loaded/ {print "load", $(NF-1)}' | tr -d '('
  rm -f c.h5
done > runs.txt
python3 - <<'PY'
import statistics
rows = [l.split() for l in open("runs.txt")]
def med(kind):
    vals = []
    for r in rows:
        if r[0] != kind: continue
        v = float(r[1])
        if kind == "dd": v = v / 1000 if r[2].startswith("MB") else v  # GB/s
        vals.append(v)
    return statistics.median(vals)
dd, save, load = med("dd"), med("save"), med("load")
print("| measure | GB/s (median) |\n|---|---:|")
print(f"| dd, 1.5 GB with fsync | {dd:.2f} |\n| save, np=8 ZeRO-3 | {save:.2f} |\n| load, np=8 ZeRO-3 | {load:.2f} |")
print(f"save / raw disk = {save / dd:.2f} (target >= 0.5)")
PY
rm -rf "$DIR"
