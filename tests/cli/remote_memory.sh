#!/usr/bin/env bash
# Nothing outside the device contract touches device memory: on the
# cpu-remote backend (ZT_TEST_BACKEND=remote: device pointers the host
# cannot dereference, as on a GPU; a stray read faults at once) runs end
# bitwise equal to the CPU backend:
#  - one process trains, evaluates, saves, loads and resumes, gpt and llama
#    in fp32, bf16 and fp16, with recomputation;
#  - several processes, whose collectives and pipeline transfers carry
#    device buffers through host copies (comm's staging path): ZeRO-3
#    with a resume, ZeRO-2 with bf16 gradient sums, tp 2 with sequence
#    parallelism under a zero-bubble pipeline, and interleaved pp with a
#    tied head over dp with ZeRO-1;
# and a failure the device reports late stops the run cleanly.
# Usage: remote_memory.sh ZTRAIN MPIRUN...
set -eu
. "$(dirname "$0")/common.sh"
zt_setup "$@"
ZTRAIN=$Z /usr/bin/python3 "$HERE/../examples/make_demo_data.py" data > /dev/null
fail=0
for arch in gpt llama; do
  if [ $arch = gpt ]; then
    model='zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4}'
  else
    model='zt.llama{vocab = 256, seq = 32, dim = 64, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 128}'
  fi
  cat > $arch.lua <<LUA
local zt = require "ztrain"
model = $model
train = {micro_batch = 2, global_batch = 4, steps = 6, log_every = 0, eval_every = 3,
         lr = zt.lr.cosine{peak = 3e-3, warmup = 2}, weight_decay = 0.1, clip = 1.0}
data = {train = "$W/data/demo_train.bin", val = "$W/data/demo_val.bin", val_batches = 2}
checkpoint = {dir = "ck", every = 3}
LUA
  for prec in fp32 bf16 fp16; do
    for be in cpu remote; do
      d=$arch-$prec-$be
      mkdir -p $d
      # 6 steps with a save at 3; then from that checkpoint to 6 again
      (cd $d && ZT_TEST_BACKEND=$be OMP_NUM_THREADS=1 \
        timeout 300 "$Z" ../$arch.lua -e "train.precision = '$prec'; train.recompute = 'full'" \
        --metrics m.jsonl --save final.h5 > out.txt 2>&1 &&
       ZT_TEST_BACKEND=$be OMP_NUM_THREADS=1 timeout 300 "$Z" ../$arch.lua \
        -e "train.precision = '$prec'" --load ck/step_00000003.h5 --metrics m3.jsonl \
        --save resumed.h5 > out3.txt 2>&1) ||
        { echo "FAIL: $d: run failed"; tail -3 $d/out*.txt; fail=$((fail + 1)); continue; }
    done
    printf '%-34s ' "$arch $prec remote = cpu:"
    /usr/bin/python3 "$HERE/ref/bitwise.py" $arch-$prec-cpu/m.jsonl $arch-$prec-cpu/final.h5 \
      $arch-$prec-remote/m.jsonl $arch-$prec-remote/final.h5 || fail=$((fail + 1))
    printf '%-34s ' "$arch $prec remote resumed = cpu:"
    /usr/bin/python3 "$HERE/ref/bitwise.py" $arch-$prec-cpu/m3.jsonl $arch-$prec-cpu/resumed.h5 \
      $arch-$prec-remote/m3.jsonl $arch-$prec-remote/resumed.h5 || fail=$((fail + 1))
  done
done
# several ranks, bf16 (16-bit weights gathered, 16-bit gradient sums)
cat > grid.lua <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 32, dim = 64, layers = 4, heads = 4}
train = {micro_batch = 2, global_batch = 8, steps = 4, log_every = 0, precision = "bf16",
         lr = zt.lr.cosine{peak = 3e-3, warmup = 2}, weight_decay = 0.1, clip = 1.0}
data = {train = "$W/data/demo_train.bin"}
checkpoint = {dir = "ck", every = 2}
LUA
layouts=(
  "z3|2|parallel = {dp = 2, zero = {stage = 3, bucket_bytes = 8192}}"
  "z2|2|parallel = {dp = 2, zero = {stage = 2, bucket_bytes = 8192}}; train.grad_reduce_dtype = 'bf16'"
  "tp_zb|4|parallel = {tp = 2, pp = 2, sequence_parallel = true}; schedule = zt.schedule.zero_bubble{}"
  "inter|4|parallel = {dp = 2, pp = 2, zero = 1}; schedule = zt.schedule.interleaved{chunks = 2}")
for l in "${layouts[@]}"; do
  IFS='|' read -r name np lay <<< "$l"
  for be in cpu remote; do
    mkdir -p $name-$be
    (cd $name-$be && ZT_TEST_BACKEND=$be OMP_NUM_THREADS=1 timeout 300 \
      "${MPI[@]}" -np $np -x ZT_TEST_BACKEND "$Z" ../grid.lua -e "$lay" --metrics m.jsonl \
      --save final.h5 > out.txt 2>&1) ||
      { echo "FAIL: $name-$be: run failed"; tail -3 $name-$be/out.txt; fail=$((fail + 1)); }
  done
  printf '%-34s ' "$name remote = cpu:"
  /usr/bin/python3 "$HERE/ref/bitwise.py" $name-cpu/m.jsonl $name-cpu/final.h5 \
    $name-remote/m.jsonl $name-remote/final.h5 || fail=$((fail + 1))
done
# ZeRO-3 on remote memory resumed from its step-2 checkpoint (each rank's
# shard loaded through a host copy)
mkdir -p z3res && (cd z3res && ZT_TEST_BACKEND=remote OMP_NUM_THREADS=1 timeout 300 \
  "${MPI[@]}" -np 2 -x ZT_TEST_BACKEND "$Z" ../grid.lua \
  -e "parallel = {dp = 2, zero = {stage = 3, bucket_bytes = 8192}}" \
  --load ../z3-remote/ck/step_00000002.h5 --metrics m.jsonl --save final.h5 > out.txt 2>&1) ||
  { echo "FAIL: z3 resume"; tail -3 z3res/out.txt; fail=$((fail + 1)); }
/usr/bin/python3 -c "
import json
rows = [l for l in open('z3-cpu/m.jsonl') if '\"loss\"' in l and json.loads(l)['step'] > 2]
open('z3-cpu/tail.jsonl', 'w').writelines(rows)"
printf '%-34s ' "z3 remote resumed at 2 = cpu:"
/usr/bin/python3 "$HERE/ref/bitwise.py" z3-cpu/tail.jsonl z3-cpu/final.h5 z3res/m.jsonl \
  z3res/final.h5 || fail=$((fail + 1))

# the test hook reaches the backend: a device pointer dereferenced by the
# host faults (this would pass on the CPU backend)
grep -q "cpu-remote" gpt-fp32-remote/out.txt ||
  { echo "FAIL: the banner does not name the cpu-remote backend"; fail=$((fail + 1)); }
# a device failure (reported late, as a GPU does) stops the run at the
# step that reads it: exit 1, the message names the step, the backend and
# what failed; no final checkpoint
rc=0
mkdir -p devfail && (cd devfail && ZT_TEST_BACKEND=remote ZT_TEST_DEVICE_FAIL=50 OMP_NUM_THREADS=1 \
  timeout 300 "$Z" ../gpt.lua --save final.h5 > out.txt 2>&1) || rc=$?
printf '%-34s ' "device failure:"
if [ $rc -eq 1 ] && grep -q "step [0-9]*: the cpu-remote backend failed on rank 0: test: injected failure of GEMM 50" devfail/out.txt &&
   [ ! -e devfail/final.h5 ]; then
  grep -o "step [0-9]*: the cpu-remote backend failed.*" devfail/out.txt | head -1
else
  echo "FAIL: exit $rc"; tail -3 devfail/out.txt; fail=$((fail + 1))
fi
[ $fail -eq 0 ] && echo "remote memory: all equal" || { echo "$fail failed"; exit 1; }
