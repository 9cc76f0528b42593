#!/usr/bin/env bash
# bench_gpu_train: training throughput on one GPU (the CUDA backend), bf16:
# GPT-2 124M at seq 1024 and a LLaMA ~1B shape (dim 2048, 16 layers, 16
# heads on 8 kv heads, ffn 5632, seq 2048), tokens/s and MFU against the
# device's datasheet dense bf16 peak (ZT_PEAK_TFLOPS, default 989: H100 /
# H200 SXM), the median of the steps after the first 3 (warm-up). Prints
# one JSON line per model and exits 77 without a GPU. Run by
# tests/gpu/run.sh; results go to docs/performance.md.
# Usage: bench_gpu_train.sh [ZTRAIN] (default build-gpu/ztrain)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
Z=$(realpath "${1:-$ROOT/${ZT_GPU_BUILD:-build-gpu}/ztrain}")
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "SKIP: no GPU"
  exit 77
fi
PEAK=${ZT_PEAK_TFLOPS:-989}
. "$ROOT/tests/cli/common.sh"
zt_scratch
zt_tokens train.bin 7 4000000 50257
run() { # NAME MODEL MICRO SEQ STEPS
  cat > $1.lua <<LUA
local zt = require "ztrain"
model = $2
train = {micro_batch = $3, global_batch = $3, steps = $5, log_every = 1, precision = "bf16",
         lr = 3e-4, peak_gflops = $PEAK * 1000, recompute = "none"}
data = {train = "$W/train.bin"}
parallel = {device = "cuda"}
LUA
  timeout 100 "$Z" $1.lua --metrics $1.jsonl > $1.out 2>&1 || { tail -5 $1.out; return 1; }
  /usr/bin/python3 - "$1" <<'PY'
import json, re, statistics, sys
name = sys.argv[1]
# the step lines: "... | 1646 tok/s | MFU 5.2%" (MFU against train.peak_gflops)
steps = [(float(a), float(b)) for a, b in
         re.findall(r"\| ([\d.]+) tok/s \| MFU ([\d.]+)%", open(f"{name}.out").read())]
warm = steps[3:] or steps
print(json.dumps({"model": name, "steps_timed": len(warm),
                  "tokens_per_s": round(statistics.median(t for t, _ in warm)),
                  "mfu_percent": statistics.median(m for _, m in warm)}))
PY
}
rc=0
run gpt2_124m 'zt.gpt{vocab = 50257, seq = 1024, dim = 768, layers = 12, heads = 12}' 16 1024 12 || rc=1
run llama_1b 'zt.llama{vocab = 50257, seq = 2048, dim = 2048, layers = 16, heads = 16, kv_heads = 8, ffn_dim = 5632}' 4 2048 8 || rc=1
exit $rc
