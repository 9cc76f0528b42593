#!/usr/bin/env bash
# Pipeline parallelism against the single process: gpt (head tied to the
# embedding across the first and last stage) or llama, 8 blocks, 8
# micro-batches per step. Every built-in schedule at pp 2 and 4 alone;
# then every schedule under every ZeRO stage combined with tp 2, dp 2 or
# both (np <= 8), the layouts taken in turn so that each appears with
# several schedules and stages; then sequence parallelism and tp 4 (llama:
# kv heads replicated) with split backward and interleaving. Each run:
# every step's loss within 1e-5 relative, every tensor within 1e-4
# relative L2 (tests/ref/equiv.py), and
# the first stage's dp traffic and model-state bytes equal to ZeRO's
# formulas over that stage's parameters (tests/ref/pp_check.py).
# Usage: pp_equiv.sh ZTRAIN gpt|llama MPIRUN...
set -eu
Z=$(realpath "$1"); ARCH=$2; shift 2
MPI=("$@")
HERE=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 11 20000

case $ARCH in
  gpt) MODEL='zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 8, heads = 4, tied = true}' ;;
  llama) MODEL='zt.llama{vocab = 256, seq = 16, dim = 32, layers = 8, heads = 4, kv_heads = 2, ffn_dim = 64}' ;;
esac
cat > run.lua <<LUA
local zt = require "ztrain"
model = $MODEL
train = {micro_batch = 1, global_batch = 8, steps = 6, log_every = 0, clip = 0.3,
         lr = zt.lr.cosine{peak = 2e-3, warmup = 2}, weight_decay = 0.1}
data = {train = "$W/tok.bin", shuffle = true}
LUA
(mkdir ref && cd ref && OMP_NUM_THREADS=1 "$Z" ../run.lua --metrics m.jsonl --save final.h5 > out.txt)

SCHEDULES=("gpipe{}" "one_f_one_b{}" "interleaved{chunks = 2}" "zero_bubble{}")
n=0
run() { # PP TP DP ZERO SCHEDULE [SP: true|false]
  local d="run$n" np=$(($1 * $2 * $3)) sp=${6:-false}; n=$((n + 1))
  local what="pp $1 tp $2 dp $3 zero $4 ${5%%\{*}"
  [ "$sp" = true ] && what="$what sp"
  mkdir "$d"
  (cd "$d" && OMP_NUM_THREADS=1 timeout 300 "${MPI[@]}" -np $np "$Z" ../run.lua \
     -e "parallel = {pp = $1, tp = $2, dp = $3, zero = {stage = $4, bucket_bytes = 4096}, sequence_parallel = $sp}" \
     -e "schedule = zt.schedule.$5" --metrics m.jsonl --save final.h5 > out.txt 2>&1) ||
    { echo "FAIL: $what: run failed"; tail -5 "$d/out.txt"; exit 1; }
  local chunks=1
  case $5 in interleaved*) chunks=2 ;; esac
  printf '%s|%s|%s %s %s %s %s\n' "$d" "$what" $1 $2 $3 $4 $chunks >> runs.txt
}

# Every run against the single process and ZeRO's formulas, in one Python
# process at the end (one reading of the reference, one interpreter start
# instead of two per run): each run's lines, every failure listed.
check_all() {
  /usr/bin/python3 - "$HERE/ref" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import equiv, pp_check, zcheck
ref_rows, ref_ck = zcheck.read_metrics("ref/m.jsonl"), zcheck.read_checkpoint("ref/final.h5")
failed = 0
for line in open("runs.txt").read().splitlines():
    d, what, args = line.split("|")
    line, bad = equiv.check(ref_rows, ref_ck, zcheck.read_metrics(d + "/m.jsonl"),
                            zcheck.read_checkpoint(d + "/final.h5"))
    print("%-44s %s" % (what + ":", line))
    for b in bad[:20]:
        print("FAIL:", b)
    if bad:
        print("FAIL: " + what)
    try:
        line, bad2 = pp_check.check(d, *map(int, args.split()))
        print(line)
    except ValueError as e:
        bad2 = [str(e)]
    for b in bad2[:5]:
        print("FAIL:", b)
    if bad2:
        print("FAIL: %s: traffic or memory" % what)
    failed += bool(bad or bad2)
sys.exit(1 if failed else 0)
PY
}

for pp in 2 4; do
  for s in "${SCHEDULES[@]}"; do run $pp 1 1 0 "$s"; done
done
LAYOUTS=("2 2 1" "2 1 2" "4 2 1" "4 1 2" "2 2 2")
k=0
for s in "${SCHEDULES[@]}"; do
  for zero in 0 1 2 3; do
    run ${LAYOUTS[$((k % 5))]} $zero "$s"
    k=$((k + 1))
  done
done
# sequence parallelism inside a pipeline, split backward included; at tp 4
# llama's 2 kv heads are each replicated over 2 TP ranks
run 2 2 2 2 "zero_bubble{}" true
run 2 4 1 3 "zero_bubble{}"
run 2 4 1 1 "interleaved{chunks = 2}" true
check_all || { echo "FAIL: pp_equiv $ARCH"; exit 1; }
echo "pp_equiv $ARCH: $n runs equal to the single process"
