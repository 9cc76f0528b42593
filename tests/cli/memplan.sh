#!/usr/bin/env bash
# The memory planner is right: for a matrix of real runs (1-4 ranks; ZeRO
# 0-3, tp, pp with schedules, recomputation on and off, fp32 and bf16,
# offload of masters and moments to cpu and nvme, of params to cpu and nvme),
# every rank's measured peak — its resident high-water mark less the empty
# process (what ztrain prints as "memory rank R: peak X MiB above the empty
# process") — is within 5% of `ztrain plan --json`'s peak_bytes for that
# rank. The models hold tens to hundreds of MiB of states and activations
# per rank, so 5% is megabytes; the plan includes the MPI library's own
# temporaries in the gradients' reduction over dp (parallel/mpi_mem.c),
# tens of MiB here. ZeRO 2-3 run with overlap = false but one: with
# overlap the library holds one or two buckets' temporaries at once as the
# timing falls (peak_bytes counts two, a bound; peak_floor_bytes one), and
# that run must land between the two (5% either side); without overlap
# exactly one. Prints predicted / measured / ratio per rank. Before any of
# that, rank 0's banner (what the allocations counted: model states,
# buffers, activations) must be the plan's rows, to the 0.1 MiB printed.
# The runs fix glibc's mmap threshold (MALLOC_MMAP_THRESHOLD_): by default
# a freed block under 32 MiB raises the threshold to its size, later ones
# come from the heap, and freed heap memory stays resident — memory no
# allocation holds any more, which the plan does not count (on the rank
# that receives the MPI library's reduce-scatter temporaries, a few MiB:
# docs/plan.md). With a fixed threshold freed large blocks go back.
# The layouts name dp: the plan of a script is the layout it asks for.
# Usage: memplan.sh ZTRAIN MPIRUN...
set -eu
. "$(dirname "$0")/common.sh"
zt_setup "$@"
zt_tokens tok.bin 3 100000 4096

GPT='zt.gpt{vocab = 4096, seq = 128, dim = 512, layers = 4, heads = 8}'
TIED='zt.gpt{vocab = 4096, seq = 128, dim = 512, layers = 4, heads = 8, tied = true}'
LLAMA='zt.llama{vocab = 4096, seq = 128, dim = 512, layers = 4, heads = 8, kv_heads = 4, ffn_dim = 1024}'
# the command's own bad input: one message, exit 2
printf 'local zt = require "ztrain"\nmodel = %s\ndata = {train = "%s/tok.bin"}\n' "$GPT" "$W" > s.lua
for args in "--world 8 s.lua|--mem-per-rank GiB is required" \
            "--bogus s.lua|unknown option '--bogus'" "missing.lua|missing.lua"; do
  rc=0
  "$Z" plan ${args%%|*} > o.txt 2> e.txt || rc=$?
  [ "$rc" = 2 ] && grep -qF -- "${args#*|}" e.txt && [ "$(wc -l < e.txt)" = 1 ] ||
    { echo "FAIL: ztrain plan ${args%%|*}: exit $rc, $(cat e.txt)"; exit 1; }
done
cases=0
printf '%-28s %4s %12s %12s %7s\n' case rank "plan MiB" "measured" ratio
# case NAME NP MODEL LUA: train 2 steps, compare every rank with the plan
case_() {
  local name=$1 np=$2 model=$3 lua=$4
  mkdir "$name"
  cat > "$name/run.lua" <<LUA
local zt = require "ztrain"
model = $model
train = {micro_batch = 2, global_batch = 4, steps = 2, log_every = 0,
         lr = zt.lr.cosine{peak = 1e-3, warmup = 1}}
data = {train = "$W/tok.bin"}
$lua
LUA
  "$Z" plan "$name/run.lua" --json > "$name/plan.json" ||
    { echo "FAIL: $name: ztrain plan failed"; exit 1; }
  local cmd=("$Z" run.lua)
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  (cd "$name" && OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=131072 timeout 120 "${cmd[@]}" \
     > out.txt 2>&1) ||
    { echo "FAIL: $name: run failed"; tail -5 "$name/out.txt"; exit 1; }
  /usr/bin/python3 - "$name" "$np" <<'PY' || exit 1
import json, re, sys
d, np = sys.argv[1], int(sys.argv[2])
plan = json.load(open(f"{d}/plan.json"))
if plan["layout"]["world"] != np:
    sys.exit(f"FAIL: {d}: the plan's layout has {plan['layout']['world']} ranks, the run {np}")
meas = {int(r): float(m) for r, m in
        re.findall(r"memory rank (\d+): peak ([0-9.]+) MiB above", open(f"{d}/out.txt").read())}
if sorted(meas) != list(range(np)):
    sys.exit(f"FAIL: {d}: ranks measured: {sorted(meas)}")
bad = 0
for r in plan["ranks"]:
    p = r["peak_bytes"] / 1048576.0
    lo = r["peak_floor_bytes"] / 1048576.0  # less what timing decides (overlap)
    m = meas[r["rank"]]
    ratio = m / p
    ok = 0.95 * lo <= m <= 1.05 * p
    bad += not ok
    span = f"  (timing: {lo:.1f}-{p:.1f})" if lo < p else ""
    print(f"{d:<28} {r['rank']:>4} {p:>12.1f} {m:>12.1f} {ratio:>7.3f}{span}{'' if ok else '  FAIL'}")
# the allocations themselves, as rank 0's banner counts them, are the
# plan's rows: one source of truth, before any resident-memory question
b = plan["ranks"][0]["breakdown"]
tot = lambda k: (b[k]["device"] + b[k]["host"]) / 1048576.0  # memory, not nvme files
ban = re.search(r"model states ([0-9.]+) MiB/rank \(\+ buffers ([0-9.]+) MiB\) \| "
                r"activations ([0-9.]+) MiB", open(f"{d}/out.txt").read())
want = [sum(tot(k) for k in ("params", "masters", "grads", "moments", "tied_copy")),
        None if plan["layout"]["pp"] > 1 else tot("comm"),  # comm adds the pipeline's there
        tot("activations") + b["workspace"]["device"] / 1048576.0]
if not ban:
    sys.exit(f"FAIL: {d}: no banner")
for name, got, w in zip(("states", "buffers", "activations"), map(float, ban.groups()), want):
    if w is not None and abs(got - w) > 0.051:
        bad += 1
        print(f"FAIL: {d}: rank 0's banner says {name} {got} MiB, the plan {w:.2f}")
sys.exit(1 if bad else 0)
PY
  cases=$((cases + 1))
}

case_ z0_fp32            1 "$GPT"   ''
case_ z0_bf16            1 "$GPT"   'train.precision = "bf16"'
case_ z0_recompute       1 "$GPT"   'train.recompute = "full"'
case_ llama_bf16         1 "$LLAMA" 'train.precision = "bf16"'
case_ dp2_z0             2 "$GPT"   'parallel = {dp = 2, zero = 0}'
case_ dp2_z1             2 "$GPT"   'parallel = {dp = 2, zero = 1}'
case_ dp2_z2_bf16        2 "$GPT"   'parallel = {dp = 2, zero = {stage = 2, overlap = false}} train.precision = "bf16"'
case_ dp2_z3             2 "$TIED"  'parallel = {dp = 2, zero = {stage = 3, overlap = false}}'
case_ dp2_z2_overlap     2 "$GPT"   'parallel = {dp = 2, zero = 2}'
case_ tp2_sp             2 "$LLAMA" 'parallel = {tp = 2, sequence_parallel = true}'
case_ pp2_1f1b           2 "$TIED"  'parallel = {pp = 2} train.global_batch = 8
schedule = zt.schedule.one_f_one_b{}'
case_ pp2_zb_recompute   2 "$GPT"   'parallel = {pp = 2} train.global_batch = 8 train.recompute = "full"
schedule = zt.schedule.zero_bubble{}'
case_ dp2_tp2_z2         4 "$GPT"   'parallel = {dp = 2, tp = 2, zero = {stage = 2, overlap = false}}'
case_ dp2_pp2_z3_bf16    4 "$LLAMA" 'parallel = {dp = 2, pp = 2, zero = {stage = 3, overlap = false}} train.precision = "bf16"
train.global_batch = 8 schedule = zt.schedule.one_f_one_b{}'
case_ tp2_pp2_interleaved 4 "$GPT"  'parallel = {tp = 2, pp = 2, zero = 1} train.global_batch = 8
train.recompute = function(b) return b.index % 2 == 0 end
schedule = zt.schedule.interleaved{chunks = 2}'
# offload: the cpu tier's pinned states (params at ZeRO 3 too) and staging
# are resident, the nvme
# tier's states are not (its files are the plan's nvme column)
mkdir -p nv
case_ dp2_z1_offload_cpu 2 "$GPT"   'parallel = {dp = 2, zero = 1} train.precision = "bf16"
offload = {master = "cpu", moments = "cpu"}'
case_ dp2_z3_offload_nvme 2 "$GPT"  "parallel = {dp = 2, zero = {stage = 3, overlap = false}}
offload = {dir = '$W/nv', master = 'nvme', moments = 'nvme'}"
case_ dp2_z3_params_cpu  2 "$GPT"   'parallel = {dp = 2, zero = {stage = 3, overlap = false}} train.precision = "bf16"
offload = {params = "cpu"}'
# ZeRO-Infinity: params, masters and moments all in the file; resident are
# the params' two device staging buffers and the host buffers they are read into
case_ dp2_z3_infinity    2 "$GPT"   "parallel = {dp = 2, zero = {stage = 3, overlap = false}} train.precision = 'bf16'
offload = {dir = '$W/nv', params = 'nvme', master = 'nvme', moments = 'nvme'}"
case_ offload_by_block   1 "$LLAMA" "train.precision = 'bf16'
offload = {dir = '$W/nv', place = function(g)
  if g.kind == 'moments' then return g.block % 2 == 0 and 'nvme' or 'cpu' end
  return 'device' end}"
echo "memplan: $cases runs, every rank within 5% of its plan"
