#!/usr/bin/env bash
# `ztrain plan SCRIPT --world N --mem-per-rank GiB` (src/cli/ztrain_plan_search.c)
# through its test driver (memory from the test double): a ranked table whose
# layouts multiply to the world and whose peaks fit; bad input exits 2 with
# one message and nothing on stdout.
# With ZTRAIN: ztrain's own search (memory from the planner) lists layouts
# whose peak device memory is what `ztrain plan --json` of each layout says.
# Usage: plan_search.sh PLAN_SEARCH_CLI SCRIPT.lua [ZTRAIN]
set -u
cli=$1 script=$2 ztrain=${3:-}
pass=0 fail=0
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$cli" plan "$script" --world 4 --mem-per-rank 0.01 --top 400 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc = 0 ] && ok "a table (rc 0)" || { bad "rc $rc: $(cat "$tmp/err")"; }
# every row: tp*pp*dp = 4, peak <= 0.01 GiB, step times ascending
awk '/^ +[0-9]+  tp=/ {
       split($2, a, "="); split($3, b, "="); split($4, c, "=");
       if (a[2] * b[2] * c[2] != 4) { print "world " $0; bad = 1 }
       for (i = 1; i <= NF; i++) if ($i ~ /^moments=/) k = i;
       peak = $(k + 1 + ($(k+1) == "sp")); step = $(k + 2 + ($(k+1) == "sp"));
       if (peak > 0.01) { print "peak " $0; bad = 1 }
       if (n && step < last) { print "order " $0; bad = 1 }
       last = step; n++ }
     END { if (!n) { print "no rows"; bad = 1 } exit bad }' "$tmp/out" >"$tmp/check" \
  && ok "$(grep -c ' tp=' "$tmp/out") rows: tp*pp*dp = world, peaks fit, fastest first" \
  || bad "rows: $(cat "$tmp/check")"
grep -q "over memory" "$tmp/out" && ok "counts shown" || bad "no counts"

expect2() { # name, args...
  local name=$1; shift
  "$cli" plan "$@" >"$tmp/o2" 2>"$tmp/e2"
  local rc=$?
  if [ $rc = 2 ] && [ ! -s "$tmp/o2" ] && [ "$(wc -l <"$tmp/e2")" = 1 ]; then
    ok "$name: exit 2, $(cat "$tmp/e2")"
  else
    bad "$name: rc $rc, stdout $(wc -c <"$tmp/o2") bytes, stderr: $(cat "$tmp/e2")"
  fi
}
expect2 "no --world" "$script" --mem-per-rank 1
expect2 "world 0" "$script" --world 0 --mem-per-rank 1
expect2 "fractional world" "$script" --world 2.5 --mem-per-rank 1
expect2 "fractional ranks per node" "$script" --world 4 --mem-per-rank 1 --ranks-per-node 1.5
expect2 "missing script" /nonexistent/x.lua --world 4 --mem-per-rank 1
expect2 "no memory" "$script" --world 4
expect2 "bad link" "$script" --world 4 --mem-per-rank 1 --link intra=fast
expect2 "efficiency > 1" "$script" --world 4 --mem-per-rank 1 --gemm-eff 1.5
expect2 "nothing fits" "$script" --world 4 --mem-per-rank 0.000001
expect2 "world that divides nothing" "$script" --world 7 --mem-per-rank 1
if [ -n "$ztrain" ]; then
  "$ztrain" plan "$script" --world 4 --mem-per-rank 0.02 --ranks-per-node 2 --top 400 >"$tmp/real" 2>"$tmp/err" &&
    ok "ztrain plan --world: $(grep -c ' tp=' "$tmp/real") layouts" || bad "ztrain plan --world: $(cat "$tmp/err")"
  # each of a spread of rows, planned on its own: the largest device peak of
  # its ranks, in GiB as the table shows it (2 decimals); every kind of row
  # (zero stages, pipelines, recomputation, offload) among those checked
  /usr/bin/python3 - "$ztrain" "$script" "$tmp/real" <<'PY' && ok "listed peaks equal ztrain plan --json of each layout" || bad "listed peaks differ from ztrain plan --json"
import json, re, subprocess, sys
z, script, table = sys.argv[1:]
rows = [l for l in open(table) if re.match(r' +\d+  tp=', l)]
seen, bad, checked = set(), 0, 0
for l in rows:
    d = dict(re.findall(r'(\w+)=(\S+)', l))
    sched = 'interleaved' if 'interleaved:2' in l else '1f1b'
    rec = 'recompute=full' in l
    key = (d['zero'], d['pp'] != '1', rec, d['moments'], sched)
    if key in seen: continue
    seen.add(key)
    stmts = ['parallel.tp = %s; parallel.pp = %s; parallel.dp = %s; parallel.zero = %s' % (d['tp'], d['pp'], d['dp'], d['zero']),
             'train.micro_batch = %s' % d['mb'],
             'schedule = require("ztrain").schedule.%s' % ('interleaved { chunks = 2 }' if sched == 'interleaved' else 'one_f_one_b {}'),
             'train.recompute = "%s"' % ('full' if rec else 'none')]
    if d['moments'] == 'cpu': stmts.append('offload = {master = "cpu", moments = "cpu"}')
    args = [z, 'plan', script, '--json'] + sum((['-e', s] for s in stmts), [])
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode:
        print('plan failed:', l.strip(), out.stderr); bad += 1; continue
    peak = max(r['peak']['device'] for r in json.loads(out.stdout)['ranks'])
    after = l.split('moments=')[1].split()  # the placement, maybe "sp", then the peak
    listed = float(after[2] if after[1] == 'sp' else after[1])
    if abs(peak / 2**30 - listed) > 0.006:
        print('differ: %s: --json %.4f GiB' % (l.strip(), peak / 2**30)); bad += 1
    checked += 1
print(checked, 'layouts checked')
sys.exit(1 if bad or checked < 8 else 0)
PY
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
