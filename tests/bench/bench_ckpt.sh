#!/usr/bin/env bash
# Checkpoint save and load throughput at np=8 (ZeRO-3, every rank writes its
# hyperslabs through MPI-IO) for the GPT-2 124M shape with optimizer state,
# against the raw sequential write speed of the same disk (dd with fsync).
# Each repeat measures dd and then, for each binary given, a save and a load,
# so that disk drift hits all alike; prints every run, the machine load
# before and after, and medians. A benchmark, not a test.
# dd runs twice: "cold" after 30 s idle, and "warm" right after it. On a VM
# whose freed memory goes back to the host (virtio balloon free page
# reporting), filling the page cache with pages unused for a few seconds
# costs host page faults: 1.5 GB then takes 3-5 s instead of 0.4 s, before
# any disk I/O. A save meets such memory (it starts tens of seconds after
# the last file was deleted), so it is compared with the cold dd; the warm
# one is printed for reference.
#   bash tests/bench/bench_ckpt.sh [ZTRAIN[,ZTRAIN2...]] [REPEATS] [DIR]
# Several comma-separated binaries (say, before and after a change) are
# measured interleaved under the same conditions.
set -eu
BINS=()
IFS=, read -ra names <<< "${1:-build/ztrain}"
for b in "${names[@]}"; do BINS+=("$(realpath "$b")"); done
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
echo "start $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
: > runs.txt
for i in $(seq "$REPEATS"); do
  sleep 30
  for kind in dd dd_warm; do # dd reports MB/s or GB/s; kept in GB/s
    dd if=/dev/zero of=dd.bin bs=16M count=90 conv=fsync 2>&1 |
      awk -v i="$i" -v k=$kind '/copied/ {v = $(NF-1); if ($NF ~ /^MB/) v /= 1000; print i, k, "-", v}' >> runs.txt
    rm -f dd.bin
  done
  for b in "${!BINS[@]}"; do
    mpirun --bind-to none -np 8 "${BINS[$b]}" m.lua --save c.h5 |
      awk -v i="$i" -v b="$b" '/written/ {print i, "save", b, $(NF-1)}' | tr -d '(' >> runs.txt
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    mpirun --bind-to none -np 8 "${BINS[$b]}" m.lua --load c.h5 |
      awk -v i="$i" -v b="$b" '/loaded/ {print i, "load", b, $(NF-1)}' | tr -d '(' >> runs.txt
    rm -f c.h5
  done
  tail -n $((2 + 2 * ${#BINS[@]})) runs.txt | sed 's/^/run /'
done
echo "end $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "${BINS[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open("runs.txt")]
dd = {r[0]: float(r[3]) for r in rows if r[1] == "dd"}
warm = [float(r[3]) for r in rows if r[1] == "dd_warm"]
def vals(kind, b):
    return [(r[0], float(r[3])) for r in rows if r[1] == kind and r[2] == str(b)]
print(f"dd, 1.5 GB with fsync, cold: median {statistics.median(dd.values()):.2f} GB/s "
      f"({len(dd)} runs, {min(dd.values()):.2f} to {max(dd.values()):.2f}); "
      f"warm: median {statistics.median(warm):.2f} ({min(warm):.2f} to {max(warm):.2f})")
print("| binary | save GB/s | load GB/s | save / cold dd, paired |\n|---|---:|---:|---:|")
for b, name in enumerate(sys.argv[1:]):
    save, load = vals("save", b), vals("load", b)
    # each save against the cold dd of its repeat: the disk's speed drifts
    ratio = [v / dd[i] for i, v in save if i in dd]
    print(f"| {name} | {statistics.median(v for _, v in save):.2f} "
          f"| {statistics.median(v for _, v in load):.2f} | {statistics.median(ratio):.2f} |")
print("(medians; target: save / dd >= 0.5)")
PY
rm -rf "$DIR"
