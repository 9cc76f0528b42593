#!/usr/bin/env bash
# Equivalence across nodes: dp x tp x pp runs spread over 2 and 4 nodes of
# the test cluster (cluster.sh: network namespaces with their own hostname,
# one slurmd each, ranks started by srun --mpi=pmix) against the single
# process, within the equivalence tolerances of the other tests (loss 1e-5,
# weights 1e-4 relative L2: tests/ref/equiv.py); each run's own placement
# line must put its TP groups inside nodes, and its metrics must count the
# dp traffic that crosses nodes (bytes_inter_node) and no tp traffic.
# A TP group across nodes is warned about, or refused under parallel.strict.
# Usage: equiv.sh ZTRAIN
set -u
. "$(dirname "$0")/common.sh"
zct_setup "$1" 4 || exit $?

# (outside Slurm the script sees no job)
(mkdir ref && cd ref && env -u SLURM_JOB_ID "$Z" ../run.lua -e "assert(zt.slurm == nil, 'zt.slurm outside a job')" \
   --metrics m.jsonl --save final.h5 > out.txt 2>&1) ||
  { echo "the single-process run failed"; tail ref/out.txt; exit 1; }

# NAME NODES PER_NODE LAYOUT PLACEMENT DP_CROSSES(0|1): a run of NODES x
# PER_NODE ranks
case_() {
  local name=$1 nodes=$2 per=$3 lay=$4 want=$5 dpx=$6
  mkdir -p "$name"
  if ! (cd "$name" && timeout 300 srun -N "$nodes" --ntasks-per-node="$per" -O --mpi=pmix \
        "$Z" ../run.lua -e "$lay" --metrics m.jsonl --save final.h5 > out.txt 2>&1); then
    bad "$name: the run failed"; tail -5 "$name/out.txt"; return
  fi
  local got; got=$(grep '^placement: ' "$name/out.txt")
  if [ "$got" = "placement: $want | slurm job ${got##*slurm job }" ]; then ok
  else bad "$name: placement '$got', expected '$want'"; fi
  # ztrain plan gives the same placement without running (its nodes are
  # numbered from 0, not named)
  local planned; planned=$("$Z" plan run.lua -e "${lay%%; assert*}" --ranks-per-node "$per" |
    sed -n 's/^placement with [0-9]* ranks per node: //p' | sed -E 's/node ([0-9]+)/node\1/g')
  planned=$(echo "$planned" | perl -pe 's/node(\d+)/"node".($1+1)/ge')
  [ "$planned" = "$want" ] && ok || bad "$name: ztrain plan's placement '$planned'"
  if /usr/bin/python3 "$HERE/ref/equiv.py" ref/m.jsonl ref/final.h5 "$name/m.jsonl" "$name/final.h5" \
       > "$name/equiv.txt" 2>&1; then ok; echo "$name: $(tail -1 "$name/equiv.txt")"
  else bad "$name differs from the single process: $(tail -3 "$name/equiv.txt")"; fi
  # rank 0's tp group is its node's; its dp ring sends to another node or not
  /usr/bin/python3 - "$name/m.jsonl" "$dpx" <<'PY' && ok || bad "$name: bytes_inter_node"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert rows and all(r["bytes_inter_node"]["tp"] == 0 < r["bytes"]["tp"] for r in rows), "tp traffic"
want = [r["bytes"]["dp"] if sys.argv[2] == "1" else 0 for r in rows]
assert all(r["bytes"]["dp"] > 0 for r in rows), "no dp traffic"
assert [r["bytes_inter_node"]["dp"] for r in rows] == want, "dp traffic across nodes"
PY
}

case_ dp2_tp2_z1 2 2 "parallel = {dp = 2, tp = 2, zero = 1}; assert(zt.slurm and zt.slurm.nnodes == 2 and zt.slurm.ntasks == 4 and zt.slurm.restart_count == 0 and #zt.slurm.job_id > 0, 'zt.slurm')" \
  "2 nodes (node1: ranks 0-1; node2: ranks 2-3); tp groups inside nodes, dp groups across 2 nodes" 1
case_ dp2_tp2_pp2_z2 4 2 \
  "parallel = {dp = 2, tp = 2, pp = 2, zero = {stage = 2, bucket_bytes = 4096}}; schedule = zt.schedule.one_f_one_b{}" \
  "4 nodes (node1: ranks 0-1; node2: ranks 2-3; node3: ranks 4-5; node4: ranks 6-7); tp groups inside nodes, dp groups across 2 nodes, pp groups across 2 nodes" 1
case_ dp2_tp2_pp2_z3 2 4 \
  "parallel = {dp = 2, tp = 2, pp = 2, zero = 3}; schedule = zt.schedule.interleaved{chunks = 2}" \
  "2 nodes (node1: ranks 0-3; node2: ranks 4-7); tp groups inside nodes, dp groups inside nodes, pp groups across 2 nodes" 0

# the nodes are separate hosts to Open MPI: without its TCP transport two
# of them cannot talk (shared memory only reaches a node's own ranks),
# while one node's ranks can
OMPI_MCA_btl=self,vader timeout 120 srun -N 2 --ntasks-per-node=1 -O --mpi=pmix "$Z" run.lua \
  -e "parallel = {dp = 2}; train.steps = 1" > shm2.txt 2>&1 && bad "two nodes over shared memory alone ran" || ok
OMPI_MCA_btl=self,vader timeout 120 srun -N 1 --ntasks-per-node=2 -O --mpi=pmix "$Z" run.lua \
  -e "parallel = {dp = 2}; train.steps = 1" > shm1.txt 2>&1 && ok || bad "one node over shared memory: $(tail -3 shm1.txt)"

# tp across nodes: a warning from rank 0 only; refused with strict (exit 2, one message)
timeout 120 srun -N 2 --ntasks-per-node=2 -O --mpi=pmix "$Z" run.lua -e "parallel = {tp = 4}; train.steps = 1" \
  > tpx.txt 2>&1 && [ "$(grep -c 'warning: tp = 4 spans 2 nodes' tpx.txt)" = 1 ] && ok ||
  bad "tp across nodes: no single warning: $(tail -3 tpx.txt)"
timeout 120 srun -N 2 --ntasks-per-node=2 -O --mpi=pmix "$Z" run.lua -e "parallel = {tp = 4, strict = true}" \
  > strict.txt 2>&1; rc=$?
if [ $rc = 2 ] && [ "$(grep -c '^ztrain: error: parallel.strict: tp = 4 spans 2 nodes' strict.txt)" = 1 ] &&
   ! grep -q '^placement' strict.txt; then ok
else bad "strict: exit $rc: $(tail -3 strict.txt)"; fi

echo "cluster equiv: $pass passed, $fail failed"
[ $fail = 0 ]
