#!/usr/bin/env bash
# The GEMM path: the banner names the kernels and their measured rate;
# OpenBLAS detecting a lesser core (simulated with ZT_TEST_OPENBLAS_DETECTS,
# since this CPU is detected right) is corrected, on one process and under
# mpirun; a user's OPENBLAS_CORETYPE is kept, with a warning when it is
# below the CPU; kernels that fail the self-check (ZT_TEST_GEMM_CORRUPT) are
# refused, OpenBLAS's and oneDNN's; --version and --help say what runs.
# Rates are compared only where they differ several times over (SSE kernels
# against AVX2 or AVX-512 ones).
# Usage: gemm_path.sh ZTRAIN MPIRUN... (MPIRUN with its options)
set -u
Z=$(realpath "$1"); shift
. "$(dirname "$0")/common.sh"
zt_scratch
zt_tokens tok.bin 1 20000
cat > run.lua <<'LUA'
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2}
train = {micro_batch = 2, global_batch = 4, steps = 2, log_every = 1}
data = {train = "tok.bin"}
LUA
unset OPENBLAS_CORETYPE ZT_TEST_OPENBLAS_DETECTS ZT_TEST_GEMM_CORRUPT
fail=0 pass=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; sed 's/^/     | /' out.txt err.txt | head -20; }
# expect NAME PATTERN FILE: grep -E PATTERN in FILE
expect() { if grep -Eq -- "$2" "$3"; then ok "$1"; else bad "$1: no /$2/ in $3"; fi; }
rate() { sed -nE 's/^GEMM: .*, ([0-9]+) GFLOP\/s per rank measured.*/\1/p' out.txt; }
loss() { sed -nE 's/^step 2\/2 \| loss ([0-9.]+).*/\1/p' out.txt; }
# the OpenBLAS kernels on the GEMM line, whether they run or are the fallback
openblas_core() { sed -nE 's/^GEMM: .*OpenBLAS [0-9.]+ ([A-Za-z0-9_]+) kernels \(.*/\1/p' "$1"; }
train() { "$@" run.lua > out.txt 2> err.txt; }

"$Z" --version > out.txt 2> err.txt
expect "version names the GEMM path" \
  '^GEMM: (oneDNN [0-9.]+ sgemm|OpenBLAS [0-9.]+ [A-Za-z0-9_]+ kernels) \(' out.txt
onednn=0
grep -q '^GEMM: oneDNN' out.txt && onednn=1
echo "     (this machine: $(sed -n 's/^GEMM: //p' out.txt))"
"$Z" --help > out.txt 2> err.txt
expect "help says what MFU is measured against" 'MFU is measured against that peak' out.txt

# the banner: path, measured rate, the CPU's peak, and MFU against it
if train "$Z"; then ok "plain run"; else bad "plain run exits $?"; fi
expect "banner names path, rate and its spread" \
  '^GEMM: (oneDNN|OpenBLAS) .*\), [0-9]+ GFLOP/s per rank measured \(best of [0-9]+ timings; median [0-9]+, slowest [0-9]+\), CPU peak [0-9]+ \(' out.txt
expect "MFU against the CPU peak" \
  'MFU against [0-9]+ GFLOP/s per rank \((the CPU peak below|measured SGEMM, above the CPU peak)\)' out.txt
isa=$(sed -nE 's/^GEMM: .* FLOP\/cycle of ([^;]*);.*/\1/p' out.txt)
loss_plain=$(loss)
cp out.txt plain.txt

# MFU is per rank, against one rank's peak: at dp 2 each rank computes half
# of a step's tokens. With a declared peak of 1 GFLOP/s (no probe), MFU% =
# tok/s x FLOPs per token (run.lua: 6 x 32768 matmul parameters + 12 x L x
# C x T = 208896) / 2 ranks / 1e9 x 100; before this was per rank, twice that.
if OMP_NUM_THREADS=1 "$@" -np 2 "$Z" run.lua -e 'train.peak_gflops = 1' > out.txt 2> err.txt; then
  ok "np 2 run with a declared peak"
else bad "np 2 run with a declared peak exits $?"; fi
expect "declared peak named" 'MFU against 1 GFLOP/s per rank \(train.peak_gflops\)' out.txt
if grep -q 'GFLOP/s per rank measured' out.txt; then bad "a declared peak still ran the probe"
else ok "a declared peak runs no probe"; fi
mfu_check=$(sed -nE 's/^step 2\/2 .*\| ([0-9]+) tok\/s \| MFU ([0-9.]+)%.*/\1 \2/p' out.txt |
  awk '{ want = $1 * 208896 / 2 / 1e9 * 100; d = $2 - want; if (d < 0) d = -d;
         printf "%s MFU %s%%, want %.2f%% from %s tok/s\n", (d <= 0.06 + 1e-4 * want) ? "ok" : "bad", $2, want, $1 }')
case "$mfu_check" in ok*) ok "MFU per rank: ${mfu_check#ok }" ;; *) bad "MFU per rank: '$mfu_check'" ;; esac

# a user's OPENBLAS_CORETYPE is respected; below the CPU it is a warning
if train env OPENBLAS_CORETYPE=Prescott "$Z"; then ok "user Prescott run"; else bad "user Prescott run exits $?"; fi
expect "user's variable respected" \
  '^GEMM: OpenBLAS [0-9.]+ Prescott kernels \(SSE; OPENBLAS_CORETYPE=Prescott\)' out.txt
slow=$(rate)
if [ "$isa" != SSE ]; then
  expect "user's lesser kernels warned" \
    'warning: OPENBLAS_CORETYPE=Prescott selects Prescott kernels \(SSE\) on a CPU with' err.txt
  expect "rate warning names the kernels" \
    'warning: GEMM runs at [0-9]+ GFLOP/s per rank, [0-9]+% of the CPU.s peak [0-9]+: the GEMM kernels \(Prescott, SSE\) are below' err.txt
fi

if [ "$isa" = SSE ]; then
  echo "skip correction checks: this CPU has nothing above SSE"
else
  # OpenBLAS "detects" Prescott: ztrain chooses the CPU's kernels
  if train env ZT_TEST_OPENBLAS_DETECTS=Prescott "$Z"; then ok "misdetection run"; else bad "misdetection run exits $?"; fi
  expect "misdetection corrected" \
    "^GEMM: .*OpenBLAS [0-9.]+ [A-Za-z0-9_]+ kernels \\($isa; chosen by ztrain, OpenBLAS detected Prescott\\)" out.txt
  chosen=$(openblas_core out.txt)
  fast=$(rate)
  if [ -n "$fast" ] && [ -n "$slow" ] && [ "$fast" -gt "$slow" ]; then ok "corrected rate $fast > simulated $slow GFLOP/s"
  else bad "corrected rate '$fast' not above simulated '$slow'"; fi
  l=$(loss)
  if [ -n "$l" ] && [ "$l" = "$loss_plain" ]; then ok "same loss as the plain run ($l)"; else bad "loss '$l' vs plain '$loss_plain'"; fi

  # the same under mpirun: each rank restarts itself before MPI starts
  if OMP_NUM_THREADS=1 ZT_TEST_OPENBLAS_DETECTS=Prescott "$@" -np 2 -x ZT_TEST_OPENBLAS_DETECTS "$Z" run.lua \
    > out.txt 2> err.txt; then ok "misdetection under mpirun"; else bad "mpirun run exits $?"; fi
  expect "corrected under mpirun" "^GEMM: .* kernels \\($isa; chosen by ztrain, OpenBLAS detected Prescott\\)" out.txt
  expect "mpirun run trains" '^step 2/2 \| loss' out.txt

  # the chosen OpenBLAS kernels compute wrong results: refused, back to the detected
  if train env ZT_TEST_OPENBLAS_DETECTS=Prescott ZT_TEST_GEMM_CORRUPT="$chosen" "$Z"; then ok "refused-kernels run"
  else bad "refused-kernels run exits $?"; fi
  expect "self-check refuses" \
    "^GEMM: .*OpenBLAS [0-9.]+ Prescott kernels \\(SSE; the self-check refused $chosen, OpenBLAS detected Prescott\\)" out.txt
  expect "refusal warned, naming both" \
    "warning: the GEMM self-check refused OpenBLAS's $chosen kernels \\(wrong results\\); running the Prescott kernels" err.txt
  expect "fallback trains" '^step 2/2 \| loss' out.txt

  # a user's choice that fails the check falls back to OpenBLAS's detection
  detected=$(sed -nE 's/^GEMM: .*OpenBLAS detected ([A-Za-z0-9_]+)\).*/\1/p' plain.txt)
  [ -n "$detected" ] || detected=$(openblas_core plain.txt)
  OPENBLAS_CORETYPE=Sandybridge ZT_TEST_GEMM_CORRUPT=Sandybridge "$Z" --version > out.txt 2> err.txt
  expect "user's wrong kernels refused" \
    "^GEMM: .*OpenBLAS [0-9.]+ $detected kernels \\(.*; the self-check refused Sandybridge, OpenBLAS detected $detected\\)" out.txt
fi

if [ $onednn = 1 ]; then
  # oneDNN's sgemm computes wrong results: the float GEMMs go to OpenBLAS
  if train env ZT_TEST_GEMM_CORRUPT=oneDNN "$Z"; then ok "oneDNN-refused run"; else bad "oneDNN-refused run exits $?"; fi
  expect "oneDNN refused" '^GEMM: OpenBLAS [0-9.]+ [A-Za-z0-9_]+ kernels \(.*; the self-check refused oneDNN [0-9.]+$' out.txt
  expect "oneDNN refusal warned" "warning: the GEMM self-check refused oneDNN [0-9.]+'s sgemm \\((NN|NT|TN|TT) " err.txt
  expect "OpenBLAS-only run trains" '^step 2/2 \| loss' out.txt
fi

# nothing passes: a runtime error that says what to do
ZT_TEST_GEMM_CORRUPT=any "$Z" run.lua > out.txt 2> err.txt
rc=$?
if [ $rc = 1 ]; then ok "no kernels pass: exit 1"; else bad "no kernels pass: exit $rc (want 1)"; fi
expect "self-check error" \
  'error: the GEMM self-check fails on OpenBLAS [0-9.]+.s [A-Za-z0-9_]+ kernels \((NN|NT|TN|TT) [0-9x]+: C\[' err.txt

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
