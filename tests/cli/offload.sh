#!/usr/bin/env bash
# Offload by Lua policy is the same training, bit for bit: masters and
# moments placed on "cpu" (pinned host memory, AdamW on the host with the
# CPU backend's kernel, chunks copied down and back on a copy stream) or
# on "nvme" (a file per rank under offload.dir, read and written through
# parallel/nvme double-buffered) give the losses, gradient norms, final
# weights and moments of the same layout with everything on the device:
#  - ZeRO 0, 1, 2, 3 over dp 2 (fp32 and bf16; moments only, masters only);
#    nvme at ZeRO 1 and 3;
#  - tp 2, and pp 2 under 1F1B with a per-block policy (a function placing
#    only some blocks' states, so a state is spread over several memories)
#    and with files on one stage only;
#  - ZeRO 3 with params on "cpu" (each unit's shard piece in pinned host
#    memory, copied down ahead of its gather): all units (fp32, and bf16
#    with everything on the host), per block with a function (bf16), and
#    under pp 2 x dp 2 with 1F1B; resumed from a checkpoint;
#  - ZeRO 3 with params on "nvme" (ZeRO-Infinity: each unit's piece in the
#    rank's file, read into a host buffer a unit ahead of its gather and
#    written back by the update): all units (fp32), by block over nvme,
#    cpu and the device with masters and moments of some blocks in the
#    file too (bf16), under pp 2 x dp 2 interleaved, on the remote backend
#    and the threads engine; resumed from a checkpoint;
#  - the remote backend (device memory the host cannot address);
#  - a checkpoint written under cpu (asynchronously, with states spread
#    over memories) resumes under device, nvme and the per-block policy as
#    the uninterrupted run goes on;
#  - the nvme files are gone after the run, and a stale one is replaced;
#  - from ZeRO 2 the gradients of host-updated units go down as their
#    buckets' last reductions finish, during backward (ZeRO-Offload's
#    overlap; the trace shows "grads down" slices before the optimizer),
#    and a gradient written after that (a tied copy's, the test hook's
#    NaN) is read again at the step;
#  - a non-finite gradient is reported as on the device;
# and a bad policy (an unknown placement, an error, a kind that cannot be
# offloaded (grads; params below ZeRO 3), a misspelt key, nvme without a dir, a dir that is missing or
# not a directory) stops with exit 2 and one message before anything is
# written.
# Usage: offload.sh ZTRAIN MPIRUN...
set -eu
. "$(dirname "$0")/common.sh"
zt_setup "$@"
zt_tokens tok.bin 5 20000
export OMP_NUM_THREADS=1
cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 4, heads = 2}
train = {micro_batch = 2, global_batch = 8, steps = 4, log_every = 0, clip = 0.5,
         lr = zt.lr.cosine{peak = 3e-3, warmup = 2}, weight_decay = 0.1}
data = {train = "$W/tok.bin"}
checkpoint = {dir = "ck", every = 2}
LUA
CPU='offload = {master = "cpu", moments = "cpu"}'
# masters of even blocks and the embedding, moments of odd blocks and the head
SW=$W/swap
mkdir -p $SW
NVME="offload = {dir = '$SW', master = 'nvme', moments = 'nvme'}"
# nvme, cpu and device by block
MIXED="offload = {dir = '$SW', place = function(g) if g.kind == 'params' or g.kind == 'grads' then return 'device' end"\
" local b = g.block % 3 return b == 0 and 'nvme' or b == 1 and 'cpu' or 'device' end}"
# the last pipeline stage's moments in files, the first stage's on the
# device: only some ranks have a file
STAGES="offload = {dir = '$SW', place = function(g) if g.kind == 'moments' and g.stage == 1 then return 'nvme' end"\
" return g.kind == 'master' and g.block % 2 == 0 and 'cpu' or 'device' end}"
BLOCKS='offload = function(g)'\
' if g.kind == "master" then return (g.block % 2 == 0 or g.name == "embedding") and "cpu" or "device" end'\
' if g.kind == "moments" then return (g.block % 2 == 1 or g.name == "head") and "cpu" or "device" end'\
' return "device" end'

# params of odd blocks and the head on the host, moments of even blocks:
# units updated on the host for one reason or the other, or on the device
PBLOCKS='offload = function(g)'\
' if g.kind == "params" then return (g.block % 2 == 1 or g.name == "head") and "cpu" or "device" end'\
' if g.kind == "moments" then return g.block % 2 == 0 and "cpu" or "device" end'\
' return "device" end'
# params in the file too (ZeRO-Infinity): by block on nvme, cpu or the
# device, the masters and moments of some of them in the file as well
PNVME="offload = {dir = '$SW', place = function(g)"\
' if g.kind == "params" then local b = g.block % 3 return b == 0 and "nvme" or b == 1 and "cpu" or'\
' (g.name == "head" and "nvme" or "device") end'\
' if g.kind == "grads" then return "device" end'\
' return g.block % 2 == 0 and "nvme" or "device" end}'
Z3="parallel = {dp = 2, zero = {stage = 3, bucket_bytes = 4096}}"

# run NAME NP BACKEND LUA...: one run in folder NAME
run() {
  local name=$1 np=$2 be=$3; shift 3
  mkdir -p $name
  (cd $name && ZT_TEST_BACKEND=$be timeout 300 "${MPI[@]}" -np $np -x ZT_TEST_BACKEND "$Z" \
     ../run.lua -e "$*" --metrics m.jsonl --save final.h5 > out.txt 2>&1) ||
    { bad "$name: run failed"; tail -3 $name/out.txt; return 1; }
}
# same A B: the two runs bitwise equal
same() {
  printf '%-40s ' "$2 = $1:"
  if /usr/bin/python3 "$HERE/ref/bitwise.py" $1/m.jsonl $1/final.h5 $2/m.jsonl $2/final.h5; then ok
  else bad "$2 differs from $1"; fi
}
layouts=(
  "z0|2|parallel = {dp = 2, zero = 0}|$CPU"
  "z1|2|parallel = {dp = 2, zero = 1}; train.precision = 'bf16'|$CPU"
  "z2|2|parallel = {dp = 2, zero = {stage = 2, bucket_bytes = 4096}}|offload = {moments = 'cpu'}"
  "z3|2|parallel = {dp = 2, zero = {stage = 3, bucket_bytes = 4096}}; train.precision = 'bf16'|$CPU"
  "tp|2|parallel = {tp = 2}|offload = {master = 'cpu'}"
  "pp|2|parallel = {pp = 2}; schedule = zt.schedule.one_f_one_b{}; train.precision = 'bf16'|$BLOCKS"
  "ppn|2|parallel = {pp = 2}; schedule = zt.schedule.one_f_one_b{}|$STAGES"
  "z1blk|2|parallel = {dp = 2, zero = 1}|$BLOCKS; checkpoint.async = true"
  "z1n|2|parallel = {dp = 2, zero = 1}; train.precision = 'fp16'|$NVME"
  "z3n|2|parallel = {dp = 2, zero = {stage = 3, bucket_bytes = 4096}}|$NVME"
  "z2mix|2|parallel = {dp = 2, zero = 2}; train.precision = 'bf16'|$MIXED"
  "z3p|2|$Z3|offload = {params = 'cpu'}"
  "z3pa|2|$Z3; train.precision = 'bf16'|offload = {params = 'cpu', master = 'cpu', moments = 'cpu'}"
  "z3pblk|2|$Z3; train.precision = 'bf16'|$PBLOCKS"
  "z3ppp|4|parallel = {dp = 2, pp = 2, zero = 3}; schedule = zt.schedule.one_f_one_b{}; train.precision = 'bf16'|$PBLOCKS"
  "z3pn|2|$Z3|offload = {dir = '$SW', params = 'nvme'}"
  "z3pnb|2|$Z3; train.precision = 'bf16'|$PNVME"
  "z3pnpp|4|parallel = {dp = 2, pp = 2, zero = 3}; schedule = zt.schedule.interleaved{chunks = 2}; train.precision = 'bf16'|$PNVME")
for l in "${layouts[@]}"; do
  IFS='|' read -r name np lay pol <<< "$l"
  run $name-dev $np cpu "$lay" && run $name-cpu $np cpu "$lay; $pol" && same $name-dev $name-cpu
done
# ZeRO-Offload's overlap: in a traced step at ZeRO 2 the host-updated
# gradients are sent down inside backward, before the optimizer starts
mkdir -p trace2 && (cd trace2 && timeout 300 "${MPI[@]}" -np 2 "$Z" ../run.lua --steps 2 --trace t.json \
  -e "parallel = {dp = 2, zero = {stage = 2, bucket_bytes = 4096}}; checkpoint.every = 0; $CPU" \
  > out.txt 2>&1) || bad "the traced run failed"
/usr/bin/python3 - trace2/t.json <<'PY' && ok || bad "no gradients went down during backward"
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
for pid in {e["pid"] for e in ev if e.get("name") == "optimizer"}:
    opt = sorted(e["ts"] for e in ev if e.get("pid") == pid and e.get("name") == "optimizer")
    down = sorted(e["ts"] for e in ev if e.get("pid") == pid and e.get("name") == "grads down")
    # every step: some copies issued before its optimizer, after the last one
    for k, t in enumerate(opt):
        prev = opt[k - 1] if k else -1
        if not any(prev < d < t for d in down):
            sys.exit(f"rank pid {pid}: step {k + 1}: no grads down before the optimizer")
PY
grep -q "offload: params device .* | master cpu .* | moments cpu" z0-cpu/out.txt && ok ||
  bad "the banner does not sum up the placements"
# the checkpoint's plan records every group: 4 kinds x (embedding, 4 blocks, head)
/usr/bin/python3 -c "
import h5py, json, sys
p = h5py.File('z0-cpu/final.h5', 'r').attrs['plan']
g = json.loads(p if isinstance(p, str) else p.decode())['parallel']['offload']['groups']
want = {(k, u): 'cpu' if k in ('master', 'moments') else 'device'
        for k in ('params', 'grads', 'master', 'moments')
        for u in ['embedding', 'head'] + ['block %d' % b for b in range(4)]}
sys.exit(0 if {(x['kind'], x['unit']): x['place'] for x in g} == want else 1)" &&
  ok || bad "the plan does not record the groups' placements"

# the remote backend: device pointers the host cannot dereference
run z3r-remote 2 remote "parallel = {dp = 2, zero = 3}; train.precision = 'bf16'; $CPU" &&
  same z3-dev z3r-remote
run blk-remote 2 remote "parallel = {dp = 2, zero = 1}; $BLOCKS" && same z1blk-dev blk-remote
run z3p-remote 2 remote "$Z3; train.precision = 'bf16'; $PBLOCKS" && same z3pblk-dev z3p-remote
run mix-remote 2 remote "parallel = {dp = 2, zero = 2}; train.precision = 'bf16'; $MIXED" &&
  same z2mix-dev mix-remote
run pn-remote 2 remote "$Z3; train.precision = 'bf16'; $PNVME" && same z3pnb-dev pn-remote
# the pool of threads instead of io_uring, for params read ahead of use too
ZT_NVME_ENGINE=threads run pn-threads 2 cpu "$Z3; train.precision = 'bf16'; $PNVME" &&
  same z3pnb-dev pn-threads
grep -q "nvme files in $SW: threads" pn-threads/out.txt && ok ||
  bad "the threads engine is not named: $(grep -m1 'nvme files' pn-threads/out.txt)"
grep -q "nvme files in $SW: " z1n-cpu/out.txt && ok || bad "the banner does not name the nvme engine"
[ -z "$(ls -A $SW)" ] && ok || bad "nvme files left behind: $(ls $SW)"
# a stale file of this job (a killed run's) is replaced, not read
head -c 1000000 /dev/urandom > $SW/ztrain-run-rank1.offload
run z1n-stale 2 cpu "parallel = {dp = 2, zero = 1}; train.precision = 'fp16'; $NVME" &&
  same z1n-dev z1n-stale
[ -z "$(ls -A $SW)" ] && ok || bad "the stale nvme file is still there: $(ls $SW)"

# a step with a non-finite gradient: the scan that names it reads the
# offloaded states where they live, and says what the device run says
# (at ZeRO 2 the hook writes the gradients after their copy went down
# during backward: the step must read them again)
for z in 1 2; do
  for pol in dev cpu; do
    (ZT_TEST_NAN_AT_STEP=2 timeout 300 "${MPI[@]}" -np 2 -x ZT_TEST_NAN_AT_STEP "$Z" run.lua \
       -e "parallel = {dp = 2, zero = $z}; checkpoint.every = 0; $([ $pol = cpu ] && echo "$MIXED")" \
       2>&1 | grep "update skipped" > nan-$pol.txt) || true
  done
  [ -s nan-dev.txt ] && cmp -s nan-dev.txt nan-cpu.txt && ok ||
    { bad "the non-finite report differs under offload at ZeRO $z"; cat nan-dev.txt nan-cpu.txt; }
done

# resume across placements: the cpu run's step-2 checkpoint, resumed under
# the device and the per-block policy, ends as the uninterrupted run
/usr/bin/python3 -c "
import json
rows = [l for l in open('z1blk-dev/m.jsonl') if '\"loss\"' in l and json.loads(l)['step'] > 2]
open('tail.jsonl', 'w').writelines(rows)"
mkdir -p tail && cp tail.jsonl tail/m.jsonl && cp z1blk-dev/final.h5 tail/final.h5
for pol in "device|" "blocks|$BLOCKS" "nvme|$NVME"; do
  IFS='|' read -r name p <<< "$pol"
  mkdir -p res-$name
  (cd res-$name && timeout 300 "${MPI[@]}" -np 2 "$Z" ../run.lua -e "parallel = {dp = 2, zero = 1}; $p" \
     --load ../z1blk-cpu/ck/step_00000002.h5 --metrics m.jsonl --save final.h5 > out.txt 2>&1) ||
    { bad "resume under $name failed"; tail -3 res-$name/out.txt; continue; }
  same tail res-$name
done

# resume with params on the host: the checkpoint holds the masters, and the
# load fills each unit's shard piece where it lives
/usr/bin/python3 -c "
import json
rows = [l for l in open('z3pblk-dev/m.jsonl') if '\"loss\"' in l and json.loads(l)['step'] > 2]
open('ptail.jsonl', 'w').writelines(rows)"
mkdir -p ptail && cp ptail.jsonl ptail/m.jsonl && cp z3pblk-dev/final.h5 ptail/final.h5
mkdir -p res-params
(cd res-params && timeout 300 "${MPI[@]}" -np 2 "$Z" ../run.lua -e "$Z3; train.precision = 'bf16'; $PBLOCKS" \
   --load ../z3pblk-cpu/ck/step_00000002.h5 --metrics m.jsonl --save final.h5 > out.txt 2>&1) &&
  same ptail res-params || { bad "resume with params on the host failed"; tail -3 res-params/out.txt; }
# and the params in the file: the load writes them there, the passes read them
mkdir -p res-pnvme
(cd res-pnvme && timeout 300 "${MPI[@]}" -np 2 "$Z" ../run.lua -e "$Z3; train.precision = 'bf16'; $PNVME" \
   --load ../z3pblk-cpu/ck/step_00000002.h5 --metrics m.jsonl --save final.h5 > out.txt 2>&1) &&
  same ptail res-pnvme || { bad "resume with params in the file failed"; tail -3 res-pnvme/out.txt; }
[ -z "$(ls -A $SW)" ] && ok || bad "nvme files left behind: $(ls $SW)"

# bad policies: exit 2, one message, nothing written (on two ranks for
# the first two, whose message must come once)
np=2
badrun() {
  local what=$1 want=$2; shift 2
  local rc=0
  rm -rf badck
  timeout 60 "${MPI[@]}" -np $np "$Z" run.lua -e "parallel = {dp = $np}; checkpoint.dir = 'badck'; $*" \
    > bad.txt 2>&1 || rc=$?
  np=1
  printf '%-40s ' "$what:"
  if [ $rc -eq 2 ] && [ "$(grep -c "$want" bad.txt)" -eq 1 ] && [ ! -e badck ]; then
    grep -o "$want.*" bad.txt | head -1; ok
  else
    bad "$what: exit $rc, wanted 2 and one '$want'"; cat bad.txt
  fi
}
badrun "unknown placement" 'the policy returned "gpu" for the params of embedding' \
  'offload = function(g) return "gpu" end'
badrun "not a string" 'the policy returned a nil value for the params of embedding' \
  'offload = function(g) end'
badrun "policy error" '(-e):1: no idea' 'offload = function(g) error("no idea") end'
badrun "grads refused" 'grads stay on the device' 'offload = {grads = "cpu"}'
badrun "params refused" 'params can be offloaded at ZeRO stage 3' \
  'offload = function(g) return g.kind == "params" and g.block == 1 and "cpu" or "device" end'
badrun "params at zero 1" 'the params of embedding on cpu at ZeRO stage 1; params can be offloaded at ZeRO stage 3' \
  'parallel.zero = 1; offload = {params = "cpu"}'
badrun "params on nvme at zero 2" 'the params of embedding on nvme at ZeRO stage 2; params can be offloaded at ZeRO stage 3' \
  "parallel.zero = 2; offload = {dir = '$W', params = 'nvme'}"
badrun "misspelt key" "unknown key 'mastr' (did you mean 'master'?)" 'offload = {mastr = "cpu"}'
badrun "misspelt global" "unknown global table 'ofload' (did you mean 'offload'?)" 'ofload = {master = "cpu"}'
badrun "bad value" 'offload.moments must be one of "device", "cpu", "nvme"' 'offload = {moments = "ssd"}'
badrun "both forms" 'give either place' 'offload = {master = "cpu", place = function(g) return "cpu" end}'
badrun "nvme without dir" 'gives no directory' 'offload = {moments = "nvme"}'
badrun "missing dir" "offload.dir $W/nowhere does not exist" "offload = {dir = '$W/nowhere', moments = 'nvme'}"
badrun "dir not a directory" "offload.dir $W/tok.bin is not a directory" "offload = {dir = '$W/tok.bin', moments = 'nvme'}"
echo "offload: $pass passed, $fail failed"
[ $fail -eq 0 ]
