#!/usr/bin/env bash
# --ds-config: a DeepSpeed JSON config is the same run as its Lua written by
# hand. (1) A realistic config (fp16 with dynamic loss scaling, ZeRO-2 with
# a bucket size, AdamW, gradient clipping, "auto" micro batch) trains with
# per-step losses, gradient norms and loss scales identical, bit for bit, to
# the script with the equivalent keys; (2) under mpirun -np 2 its "auto"
# resolves against dp 2, again equal to the hand-written run; -e still wins
# over the config; the plan records the config; (3) bad configs: exit 2, one
# message naming the key, nothing written; (4) ignored keys are listed with
# their reason; (5) DeepSpeed's LR schedulers: every step's lr equals
# tests/ref/ds_lr.py (DeepSpeed's formulas) for WarmupLR, WarmupDecayLR and
# WarmupCosineLR, log and linear warmup, over a run longer than the warmup.
# Usage: ds_config.sh ZTRAIN MPIRUN...
set -u
. "$(dirname "$0")/common.sh"
zt_setup "$@"
zt_tokens tok.bin 5 20000

cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}
train = {steps = 6, log_every = 0, seed = 7}
data = {train = "tok.bin"}
LUA

# What DeepSpeed users write (Hugging Face's "auto" micro batch included).
cat > ds.json <<'JSON'
{
  "train_batch_size": 8,
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0.5,
  "steps_per_print": 10,
  "wall_clock_breakdown": false,
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
           "loss_scale_window": 100, "hysteresis": 2, "min_loss_scale": 1},
  "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 5000,
                        "allgather_bucket_size": 5e8, "contiguous_gradients": true,
                        "offload_optimizer": {"device": "none"}},
  "optimizer": {"type": "AdamW",
                "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR",
                "params": {"warmup_num_steps": 3, "total_num_steps": "auto", "warmup_type": "linear"}}
}
JSON

# hand DP: the same run in the script's own keys (micro batch 8 / (2 * DP))
hand() {
  cat <<LUA
dofile("run.lua")
train.micro_batch = $((8 / (2 * $1))); train.global_batch = 8; train.clip = 0.5
train.precision = "fp16"
train.loss_scale = {initial_scale_power = 12, loss_scale_window = 100, hysteresis = 2, min_loss_scale = 1}
parallel.zero = {stage = 2, bucket_bytes = 20000, overlap = true}
train.betas = {0.9, 0.95}; train.eps = 1e-8; train.weight_decay = 0.1
train.lr = zt.lr.deepspeed{type = "WarmupCosineLR", lr = 2e-3, warmup_num_steps = 3, warmup_type = "linear"}
LUA
}

# same A.jsonl B.jsonl: every step's loss, grad_norm and loss_scale equal
same() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
keys = ("step", "loss", "grad_norm", "loss_scale", "skipped", "lr")
ra, rb = ([[r.get(k) for k in keys] for r in x] for x in (a, b))
if len(ra) != 6 or ra != rb:
    print("differ:\n %s\n %s" % (ra, rb)); sys.exit(1)
PY
}

run() { # NAME NP ARGS...: a run into NAME.jsonl, its output in NAME.txt
  local name=$1 np=$2
  shift 2
  local cmd=("$Z" "$@" --metrics "$name.jsonl")
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  OMP_NUM_THREADS=1 timeout 120 "${cmd[@]}" > "$name.txt" 2>&1 || { bad "$name: run failed"; tail -5 "$name.txt"; }
}

# (1) one process: the config against its Lua by hand
hand 1 > hand1.lua
run ds1 1 --ds-config ds.json run.lua --save ds1.h5
run hand1 1 hand1.lua
same ds1.jsonl hand1.jsonl && ok || bad "np 1: ds-config and hand-written losses differ"
grep -q 'train_micro_batch_size_per_gpu "auto" -> 4' ds1.txt && ok || bad "np 1: auto micro batch not shown as 4"
grep -q 'parallel.zero = {stage = 2, bucket_bytes = 20000, overlap = true}' ds1.txt && ok ||
  bad "np 1: the ZeRO mapping is not shown"
# the plan in the checkpoint records the config and its statements
/usr/bin/python3 -c "
import h5py, json, sys
d = json.loads(h5py.File('ds1.h5', 'r').attrs['plan']).get('ds_config', {})
sys.exit(0 if d.get('path') == 'ds.json' and 'train.global_batch = 8' in d.get('lua', '') else 1)" && ok ||
  bad "the checkpoint's plan does not record ds_config"

# DeepSpeed's optimizer offload to NVMe is the Lua offload table: the same
# run (offload is bitwise equal to the device placement), the mapping shown,
# every master and moment group recorded on nvme
mkdir -p nvme
/usr/bin/python3 -c "
import json; d = json.load(open('ds.json'))
d['zero_optimization']['offload_optimizer'] = {'device': 'nvme', 'nvme_path': 'nvme', 'pin_memory': True}
json.dump(d, open('dsoff.json', 'w'))"
run dsoff 1 --ds-config dsoff.json run.lua --save dsoff.h5
same dsoff.jsonl hand1.jsonl && ok || bad "offload_optimizer nvme: losses differ from the device run"
grep -qF 'zero_optimization.offload_optimizer -> offload = {dir = "nvme", master = "nvme", moments = "nvme"}' dsoff.txt &&
  grep -q 'offload_optimizer.pin_memory: ignored: ' dsoff.txt && ok || bad "the offload mapping is not shown"
/usr/bin/python3 -c "
import h5py, json, sys
g = json.loads(h5py.File('dsoff.h5', 'r').attrs['plan'])['parallel']['offload']['groups']
kinds = {(x['kind'], x['place']) for x in g if x['kind'] in ('master', 'moments')}
sys.exit(0 if kinds == {('master', 'nvme'), ('moments', 'nvme')} else 1)" && ok ||
  bad "the plan does not record the masters and moments on nvme"
[ -z "$(ls -A nvme)" ] && ok || bad "offload files left in nvme/: $(ls nvme)"

# a long nvme_path goes into the statement whole (statements had a fixed size)
long=$(printf 'd%.0s' $(seq 1 700))
echo "{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$W/$long\"}}}" > long.json
"$Z" schedule --ds-config long.json run.lua > long.txt 2>&1
grep -qF "offload = {dir = \"$W/$long\", master = \"nvme\", moments = \"nvme\"}" long.txt && ok ||
  bad "a long nvme_path is cut in the offload statement"

# offload_param cpu at ZeRO-3: the parameter tier, the same run as on the device
/usr/bin/python3 -c "
import json; d = json.load(open('ds.json'))
d['zero_optimization']['stage'] = 3
json.dump(d, open('dsz3.json', 'w'))
d['zero_optimization']['offload_param'] = {'device': 'cpu'}
json.dump(d, open('dsz3p.json', 'w'))"
run dsz3 1 --ds-config dsz3.json run.lua
run dsz3p 1 --ds-config dsz3p.json run.lua
same dsz3.jsonl dsz3p.jsonl && grep -qF 'offload_param -> offload = {params = "cpu"}' dsz3p.txt && ok ||
  bad "offload_param cpu: not mapped, or the run differs from the device's"
# and nvme (ZeRO-Infinity), with the optimizer's states in the same directory
/usr/bin/python3 -c "
import json; d = json.load(open('dsz3.json'))
d['zero_optimization']['offload_param'] = {'device': 'nvme', 'nvme_path': 'nvme'}
d['zero_optimization']['offload_optimizer'] = {'device': 'cpu'}
json.dump(d, open('dsz3n.json', 'w'))"
run dsz3n 1 --ds-config dsz3n.json run.lua
same dsz3.jsonl dsz3n.jsonl &&
  grep -qF 'offload_param -> offload = {dir = "nvme", master = "cpu", moments = "cpu", params = "nvme"}' dsz3n.txt &&
  ok || bad "offload_param nvme: not mapped, or the run differs from the device's"
[ -z "$(ls -A nvme)" ] && ok || bad "offload files left in nvme/: $(ls nvme)"

# (2) two ranks: "auto" micro batch = 8 / (2 accumulation * dp 2) = 2
hand 2 > hand2.lua
run ds2 2 --ds-config ds.json run.lua
run hand2 2 hand2.lua
same ds2.jsonl hand2.jsonl && ok || bad "np 2: ds-config and hand-written losses differ"
grep -q 'train_micro_batch_size_per_gpu 2 \* gradient_accumulation_steps 2 \* dp 2 = world 2' ds2.txt && ok ||
  bad "np 2: the batch arithmetic does not show dp 2"
# schedule --ds-config prints the statements; -e runs after them: it wins
# (global batch 16 of micro 4: 4 micro-batches per step instead of 2)
"$Z" schedule --ds-config ds.json run.lua > sched.txt 2>&1 && grep -q '^train.clip = 0.5$' sched.txt &&
  grep -q ' 2 micro-batches per step' sched.txt && ok || bad "schedule --ds-config does not print the statements"
"$Z" schedule --ds-config ds.json run.lua -e 'train.global_batch = 16' > sched.txt 2>&1 &&
  grep -q ' 4 micro-batches per step' sched.txt && ok || bad "-e does not win over --ds-config"

# optimizer params not given are DeepSpeed's FusedAdam defaults, not the script's
echo '{"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}' > opt.json
"$Z" schedule --ds-config opt.json run.lua > opt.txt 2>&1 && grep -q '^train.weight_decay = 0$' opt.txt &&
  grep -q '^train.betas = {0.9, 0.999}$' opt.txt && ok || bad "optimizer defaults are not DeepSpeed's"

# (4) ignored keys, each with its reason
grep -q 'zero_optimization.allgather_bucket_size: ignored: ' ds1.txt && ok ||
  bad "allgather_bucket_size is not listed as ignored"
grep -q 'steps_per_print: ignored: ztrain logs every train.log_every steps' ds1.txt && ok ||
  bad "steps_per_print is not listed as ignored with its reason"

# (3) bad configs: exit 2, the message once, nothing written
# refused JSON WANT: the config JSON is refused with a message containing WANT
refused() {
  rm -rf out && mkdir out
  printf '%s\n' "$1" > bad.json
  local np=${3:-1} cmd=("$Z" --ds-config bad.json run.lua --save out/f.h5 --metrics out/m.jsonl)
  [ "$np" -gt 1 ] && cmd=("${MPI[@]}" -np "$np" "${cmd[@]}")
  OMP_NUM_THREADS=1 timeout 60 "${cmd[@]}" > out.txt 2> err.txt
  local rc=$? why=""
  [ $rc = 2 ] || why="exit $rc"
  grep -qF -- "$2" err.txt || why="$why; message lacks '$2'"
  [ "$(grep -c 'error' err.txt)" = 1 ] || why="$why; $(grep -c error err.txt) error lines"
  [ -z "$(ls -A out)" ] || why="$why; wrote $(ls out)"
  [ -z "$why" ] && ok || { bad "[$2]: $why"; cat err.txt; }
}
refused '{"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}' \
  'train_batch_size 30 must equal train_micro_batch_size_per_gpu (4) * gradient_accumulation_steps (2) * dp 2 = world 2 / (tp 1 * pp 1)' 2
refused '{"zero_optimization": {"stage": "two"}}' 'zero_optimization.stage must be an integer from 0 to 3, got "two"'
refused '{"fp16": {"enabled": "yes"}}' 'fp16.enabled must be true or false, got "yes"'
refused '{"gradient_clipping": 1.0,
  "fp16": {"enabled": true,}}' 'not valid JSON at line 2, column'
refused '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}' \
  'zero_optimization.offload_optimizer.ratio 0.3 is refused: ztrain places whole state groups'
refused '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}' \
  'zero_optimization.offload_optimizer.device "nvme" needs zero_optimization.offload_optimizer.nvme_path'
refused '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}}' \
  'zero_optimization.offload_optimizer.device must be "none", "cpu" or "nvme", got "gpu"'
refused '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/a"},
  "offload_param": {"device": "nvme", "nvme_path": "/b"}}}' 'the offload sections name two nvme_path directories'
refused '{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}' \
  'zero_optimization.offload_param.device "nvme" needs zero_optimization.offload_param.nvme_path'
refused '{"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}}' \
  'params can be offloaded at ZeRO stage 3 only'
refused '{"activation_checkpointing": {"cpu_checkpointing": true}}' \
  'activation_checkpointing.cpu_checkpointing true is refused: ztrain keeps activations on the device'
refused '{"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}' 'optimizer.type must be "AdamW" or "Adam"'
refused '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4}}}' 'scheduler.type "OneCycle" is refused'
refused '{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": -5}}}' \
  'scheduler.params.warmup_num_steps must be an integer from 0 to 2147483647, got -5'
refused '{"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}}' \
  'scheduler.params.total_num_steps is missing'
refused '{"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 8}}}' \
  'total_num_steps = 8 must be >= warmup_num_steps (10'
refused '{"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 6, "total_num_steps": 6}}}' \
  'total_num_steps = 6 must be > warmup_num_steps (6'
refused '{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_max_lr": 1}}}' \
  'scheduler.params.warmup_max_lr is not a parameter of DeepSpeed'"'"'s WarmupCosineLR'
refused '{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}}' \
  'scheduler.params.warmup_type must be "log" or "linear", got "exp"'
refused '{"zero_optimization": {"stagee": 2}}' "unknown key zero_optimization.stagee (did you mean 'zero_optimization.stage'?)"
"$Z" schedule run.lua -e 'train.lr = zt.lr.deepspeed{type = "WarmupLR", warmup_num_steps = -1}' > lua.txt 2>&1
[ $? = 2 ] && grep -q 'warmup_num_steps' lua.txt && ok || bad "zt.lr.deepspeed: a negative warmup is not refused"
"$Z" schedule run.lua -e 'train.lr = zt.lr.deepspeed{type = "WarmupLR", cos_min_ratio = 0.1}' > lua.txt 2>&1
[ $? = 2 ] && grep -q 'cos_min_ratio is not a key of type "WarmupLR"' lua.txt && ok ||
  bad "zt.lr.deepspeed: a key of another type is not refused"

# (5) lrcheck NAME SCHEDULER REFERENCE: 12 steps (warmup 5) under the
# scheduler's JSON; each step's lr (update step-1's) against ds_lr.py's
REF=$(realpath "$(dirname "$0")/../ref")
lrcheck() {
  echo "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}, \"scheduler\": $2}" > "$1.json"
  run "$1" 1 --ds-config "$1.json" run.lua -e 'train.steps = 12'
  /usr/bin/python3 - "$REF" "$1.jsonl" "$3" <<'PY' && ok || bad "$1: lr differs from DeepSpeed's"
import json, sys
sys.path.insert(0, sys.argv[1])
from ds_lr import lr_at
rows = [json.loads(l) for l in open(sys.argv[2])]
p = json.loads(sys.argv[3])
bad = [(r["step"], r["lr"], lr_at(p, r["step"] - 1)) for r in rows
       if abs(r["lr"] - lr_at(p, r["step"] - 1)) > 1e-12 * abs(lr_at(p, r["step"] - 1))]
if len(rows) != 12 or bad:
    print("steps %d; (step, lr, DeepSpeed's): %s" % (len(rows), bad)); sys.exit(1)
PY
}
W='"warmup_num_steps": 5'
lrcheck wlog "{\"type\": \"WarmupLR\", \"params\": {$W, \"warmup_min_lr\": 1e-4, \"warmup_max_lr\": \"auto\"}}" \
  "{\"type\": \"WarmupLR\", $W, \"warmup_min_lr\": 1e-4, \"warmup_max_lr\": 2e-3}"
lrcheck wlin "{\"type\": \"WarmupLR\", \"params\": {$W, \"warmup_type\": \"linear\", \"warmup_max_lr\": 3e-3}}" \
  "{\"type\": \"WarmupLR\", $W, \"warmup_type\": \"linear\", \"warmup_max_lr\": 3e-3}"
lrcheck dlog "{\"type\": \"WarmupDecayLR\", \"params\": {$W, \"total_num_steps\": 10, \"warmup_max_lr\": \"auto\"}}" \
  "{\"type\": \"WarmupDecayLR\", $W, \"total_num_steps\": 10, \"warmup_max_lr\": 2e-3}"
lrcheck dlin "{\"type\": \"WarmupDecayLR\", \"params\": {$W, \"warmup_type\": \"linear\", \"warmup_min_lr\": 2e-4, \"total_num_steps\": \"auto\"}}" \
  "{\"type\": \"WarmupDecayLR\", $W, \"warmup_type\": \"linear\", \"warmup_min_lr\": 2e-4, \"total_num_steps\": 12}"
lrcheck clog "{\"type\": \"WarmupCosineLR\", \"params\": {$W, \"total_num_steps\": 11, \"warmup_min_ratio\": 0.1, \"cos_min_ratio\": 0.01}}" \
  "{\"type\": \"WarmupCosineLR\", $W, \"lr\": 2e-3, \"total_num_steps\": 11, \"warmup_min_ratio\": 0.1, \"cos_min_ratio\": 0.01}"
lrcheck clin "{\"type\": \"WarmupCosineLR\", \"params\": {$W, \"warmup_type\": \"linear\", \"total_num_steps\": \"auto\"}}" \
  "{\"type\": \"WarmupCosineLR\", $W, \"warmup_type\": \"linear\", \"lr\": 2e-3, \"total_num_steps\": 12}"

echo "ds_config: $pass passed, $fail failed"
[ "$fail" = 0 ]
