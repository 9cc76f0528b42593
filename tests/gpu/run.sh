#!/usr/bin/env bash
# run.sh: everything a GPU machine checks, in one go, from the repository
# root: configure and build for sm_90 (build-gpu), list the GPUs, run every
# GPU test (ctest -R '^gpu_'), then any GPU benchmarks (tests/bench/
# bench_gpu_* scripts, build-gpu executables named bench_gpu_*), and write
# a short report (report.json, report.txt, the logs) under $OUT when set,
# else build-gpu/gpu-report/.
#
# Fails (exit 1) when the build fails, a GPU test fails, or a GPU test is
# skipped on a machine that has a GPU (a skip there means the backend did
# not come up, which is a failure, not a pass). Budget: under 8 minutes on
# one H200 (the build is most of it; each step has its own timeout).
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
BUILD=${ZT_GPU_BUILD:-build-gpu}
REPORT=${OUT:-$ROOT/$BUILD/gpu-report}
mkdir -p "$REPORT"
TXT=$REPORT/report.txt
: >"$TXT"
say() { echo "$*" | tee -a "$TXT"; }
start=$(date +%s)

say "ztrain GPU run, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
gpus=$(command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 || echo "no nvidia-smi")
have_gpu=0
# a GPU by either sign: a skip must not pass where nvidia-smi alone is missing
if echo "$gpus" | grep -q '^GPU ' || [ -e /dev/nvidia0 ]; then have_gpu=1; fi
say "$gpus"

# ---- build ----
build_rc=0
jobs=$(nproc 2>/dev/null || echo 4)
{
  timeout 300 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 &&
    timeout 360 cmake --build "$BUILD" -j "$jobs"
} >"$REPORT/build.log" 2>&1 || build_rc=$?
say "build: $([ $build_rc = 0 ] && echo ok || echo "FAILED (rc $build_rc, see build.log)")"
if [ $build_rc != 0 ]; then tail -40 "$REPORT/build.log"; fi

# ---- tests ----
test_rc=0
passed=0 failed=0 skipped=0 total=0
if [ $build_rc = 0 ]; then
  timeout 330 ctest --test-dir "$BUILD" -R '^gpu_' --output-on-failure --timeout 300 \
    >"$REPORT/ctest.log" 2>&1 || test_rc=$?
  cat "$REPORT/ctest.log"
  total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$REPORT/ctest.log")
  passed=$(grep -E '^ *[0-9]+/[0-9]+ Test +#' "$REPORT/ctest.log" | grep -c ' Passed')
  skipped=$(grep -E '^ *[0-9]+/[0-9]+ Test +#' "$REPORT/ctest.log" | grep -c 'Skipped')
  failed=$((total - passed - skipped))
fi
say "GPU tests: $total run, $passed passed, $failed failed, $skipped skipped"

# ---- benchmarks (none is fine) ----
bench_n=0 bench_failed=0
if [ $build_rc = 0 ]; then
  for b in "$ROOT"/tests/bench/bench_gpu_* "$ROOT/$BUILD"/tests/bench_gpu_* "$ROOT/$BUILD"/bench_gpu_*; do
    [ -f "$b" ] || continue
    case "$b" in *.o | *.d) continue ;; esac
    name=$(basename "$b")
    bench_n=$((bench_n + 1))
    case "$b" in
      *.py) cmd=(python3 "$b") ;;
      *.sh) cmd=(bash "$b") ;;
      *) [ -x "$b" ] || continue; cmd=("$b") ;;
    esac
    rc=0
    timeout 220 "${cmd[@]}" >"$REPORT/$name.log" 2>&1 || rc=$?
    [ $rc = 0 ] || bench_failed=$((bench_failed + 1))
    say "bench $name: rc $rc (log $name.log)"
    tail -15 "$REPORT/$name.log"
  done
fi
say "GPU benchmarks: $bench_n run, $bench_failed failed"

# ---- verdict ----
verdict=pass
why=""
if [ $build_rc != 0 ]; then verdict=fail; why="build failed"
elif [ "$total" = 0 ]; then verdict=fail; why="no GPU test found"
elif [ "$failed" != 0 ] || [ $test_rc != 0 ]; then verdict=fail; why="GPU tests failed (ctest rc $test_rc)"
elif [ $have_gpu = 1 ] && [ "$skipped" != 0 ]; then verdict=fail; why="GPU tests skipped on a machine with a GPU"
elif [ $have_gpu = 0 ]; then why="no GPU here: the tests skip"
fi
[ $bench_failed = 0 ] || { verdict=fail; why="${why:+$why; }a benchmark failed"; }
secs=$(($(date +%s) - start))
say "verdict: $verdict${why:+ ($why)}, ${secs} s"

json_str() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1" 2>/dev/null || echo '""'; }
cat >"$REPORT/report.json" <<EOF
{
  "commit": $(json_str "$(git rev-parse HEAD 2>/dev/null || echo '?')"),
  "gpus": $(json_str "$gpus"),
  "have_gpu": $have_gpu,
  "build_ok": $([ $build_rc = 0 ] && echo true || echo false),
  "tests": {"total": $total, "passed": $passed, "failed": $failed, "skipped": $skipped},
  "benchmarks": {"run": $bench_n, "failed": $bench_failed},
  "seconds": $secs,
  "verdict": "$verdict",
  "why": $(json_str "$why")
}
EOF
echo "report: $REPORT"
[ $verdict = pass ]
