#!/usr/bin/env bash
# ztrain report: a run's metrics drawn as one self-contained HTML page.
# - From a short real run (20 steps, evaluation every 5): every plot the
#   run has data for is there (<svg id="plot-...">) with a line through
#   every step, the validation loss as points, plots without data left out
#   with a note, no URL, script or external resource anywhere in the page.
# - Headless Chromium renders the page: the screenshot is not blank, shows
#   the plots' frames, and each frame holds colored ink (the curves). The
#   same page with its curves cut out must fail that check, so it can fail.
# - Metrics with a pipeline, traffic, loss scaling, skipped steps (null
#   loss: a gap in the line, not a zero), an empty line, a line of another
#   kind and a last line cut short: all plots, the gaps where they belong.
# - Bad input (no such file, a line that is not JSON, a value that is not
#   a number, no step lines, a directory without metrics.jsonl): exit 2, a
#   message naming the file and line, nothing written.
# Chromium is required, not optional: cluster/install-deps.sh installs it.
# Usage: report.sh ZTRAIN
set -u
Z=$(realpath "$1")
. "$(dirname "$0")/common.sh"
zt_scratch
PY=/usr/bin/python3 # Debian's, with python3-numpy and python3-pil

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || bad "no chromium: bash cluster/install-deps.sh installs it (Debian package chromium)"

# --- a real run ---------------------------------------------------------
zt_tokens train.bin 3 20000
zt_tokens val.bin 4 4000
cat > run.lua <<LUA
local zt = require "ztrain"
model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}
train = {micro_batch = 4, global_batch = 4, steps = 20, log_every = 0, eval_every = 5,
         lr = zt.lr.cosine{peak = 3e-3, warmup = 4}}
data = {train = "$W/train.bin", val = "$W/val.bin"}
LUA
mkdir run
OMP_NUM_THREADS=1 "$Z" run.lua --metrics run/metrics.jsonl > train.log 2>&1 || bad "training: $(tail -3 train.log)"
if "$Z" report run > out.txt 2> err.txt && [ -f run/report.html ]; then ok; else bad "report of run/: $(cat err.txt)"; fi
grep -q "wrote run/report.html: 20 steps, 4 evaluations" out.txt && ok || bad "report said: $(cat out.txt)"
"$Z" report run/metrics.jsonl -o page.html > /dev/null 2> err.txt && ok || bad "report -o: $(cat err.txt)"
cmp -s page.html run/report.html && ok || bad "the run directory and its metrics.jsonl gave different pages"

# structure: which plots, how many points, nothing from outside
"$PY" - run/report.html <<'PY' && ok || bad "structure of the run's page"
import re, sys
html = open(sys.argv[1]).read()
errs = []
def svg(pid):
    m = re.search(r'<svg id="%s".*?</svg>' % pid, html, re.S)
    return m.group(0) if m else None
for pid in ["plot-loss", "plot-lr", "plot-grad-norm", "plot-tok-s", "plot-mfu", "plot-memory"]:
    s = svg(pid)
    if not s:
        errs.append(pid + " missing"); continue
    paths = re.findall(r'<path class="line"[^>]* d="([^"]*)"', s)
    pts = [len(re.findall(r"[ML]-?[0-9.]+,-?[0-9.]+", d)) for d in paths]
    if not paths or min(pts) < 20:
        errs.append("%s: lines of %s points, want 20 each" % (pid, pts))
    if len(re.findall(r"<text", s)) < 8:
        errs.append(pid + ": fewer than 8 labels (title, ticks, axis names)")
if svg("plot-memory") and len(re.findall(r'<path class="line"', svg("plot-memory"))) != 5:
    errs.append("plot-memory: want 5 lines (states, buffers, activations, scratch, total)")
if svg("plot-loss") and len(re.findall(r'<circle class="point"', svg("plot-loss"))) != 4:
    errs.append("plot-loss: want 4 validation points")
for pid in ["plot-bubble", "plot-traffic", "plot-loss-scale"]:
    if svg(pid): errs.append(pid + " drawn for a run without its data")
    if 'id="note-%s"' % pid not in html: errs.append(pid + ": no note says why it is left out")
for bad in [r"://", r"<script", r"\b(src|href)\s*=", r"@import", r"url\(", r"<link", r"<img"]:
    if re.search(bad, html, re.I): errs.append("external or active content: " + bad)
summary = re.search(r'<table id="summary">.*?</table>', html, re.S)
for want in ["steps", "final loss", "best validation loss", "mean tokens/s", "mean MFU", "peak memory"]:
    if not summary or "<th>%s" % want not in summary.group(0): errs.append("summary lacks " + want)
print("\n".join(errs))
sys.exit(1 if errs else 0)
PY

# --- the page in a browser ----------------------------------------------
shot() { # HTML PNG
  # scale 1: ink.py measures the frames in CSS pixels
  timeout 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --force-device-scale-factor=1 --user-data-dir="$W/chrome" --window-size=1200,2400 \
    --screenshot="$2" "file://$1" \
    > chrome.log 2>&1 && [ -s "$2" ]
}
cat > ink.py <<'PY'
# ink.py PNG MIN_PLOTS: the screenshot shows MIN_PLOTS plot frames (the
# dark horizontal edges, 196 px apart, of each plot's frame) and colored
# ink (curves, points) inside each; and it is not blank overall.
import sys
import numpy as np
from PIL import Image
a = np.asarray(Image.open(sys.argv[1]).convert("RGB")).astype(int)
want = int(sys.argv[2])
gray = (a.max(axis=2) - a.min(axis=2)) < 30
dark = gray & (a.max(axis=2) < 200)
color = (a.max(axis=2) - a.min(axis=2)) > 60
nonwhite = (a.min(axis=2) < 240).mean()
rows = np.nonzero(dark.sum(axis=1) > 700)[0]  # rows of a frame's top or bottom edge
edges = [r for i, r in enumerate(rows) if i == 0 or r > rows[i - 1] + 1]
boxes = [(t, b) for t, b in zip(edges, edges[1:]) if 185 <= b - t <= 207]
inked = [(t, b) for t, b in boxes if color[t + 3:b - 2, :].sum() >= 150]
print("non-white %.1f%%, %d frames, %d with ink" % (100 * nonwhite, len(boxes), len(inked)))
sys.exit(0 if nonwhite > 0.02 and len(boxes) >= want and len(inked) >= want else 1)
PY
if [ -n "$CHROMIUM" ]; then
  if shot "$W/run/report.html" run.png; then
    "$PY" ink.py run.png 6 > ink.txt && ok || bad "screenshot of the run's page: $(cat ink.txt)"
  else
    bad "chromium did not render the page: $(tail -3 chrome.log)"
  fi
  # the same page without its curves and points: the check must see that
  grep -v -e '<path class="line"' -e '<circle class="point"' run/report.html > bare.html
  if shot "$W/bare.html" bare.png; then
    "$PY" ink.py bare.png 6 > ink.txt && bad "a page without curves passed the ink check: $(cat ink.txt)" || ok
  else
    bad "chromium did not render the bare page: $(tail -3 chrome.log)"
  fi
fi

# --- everything a run can write -----------------------------------------
"$PY" - <<'PY'
import json, math
out = []
for s in range(1, 201):
    r = {"step": s, "loss": 5 * math.exp(-s / 60) + 1, "lr": 1e-3, "grad_norm": 1.0,
         "tokens": 4096, "ms": 100.0, "bytes": {"dp": 3 << 20, "tp": 1 << 20},
         "state_bytes": 200 << 20, "buffer_bytes": 30 << 20, "act_bytes": 500 << 20,
         "scratch_bytes": 8 << 20, "tok_s": 40960.0, "mfu": 0.3,
         "bubble": {"measured": 0.2, "simulated": 0.18}, "loss_scale": 65536.0, "skipped": False}
    if s in (50, 51, 120):  # skipped for a non-finite loss: null, never a zero
        r.update(loss=None, grad_norm=None, skipped=True)
    out.append(json.dumps(r))
    if s % 50 == 0:
        out.append(json.dumps({"step": s, "val_loss": 5 * math.exp(-s / 60) + 1.1}))
out.insert(5, "")
out.insert(7, json.dumps({"note": "a kind of line a newer ztrain may write"}))
open("all.jsonl", "w").write("\n".join(out) + '\n{"step": 201, "lo')
PY
"$Z" report all.jsonl -o all.html > out.txt 2> err.txt && ok || bad "report of all.jsonl: $(cat err.txt)"
grep -q "cut short" err.txt && ok || bad "no warning for the cut-short last line: $(cat err.txt)"
"$PY" - all.html <<'PY' && ok || bad "structure of the full page"
import re, sys
html = open(sys.argv[1]).read()
errs = []
ids = re.findall(r'<svg id="([a-z-]+)"', html)
want = ["plot-loss", "plot-lr", "plot-grad-norm", "plot-tok-s", "plot-mfu", "plot-memory",
        "plot-bubble", "plot-traffic", "plot-loss-scale"]
if ids != want: errs.append("plots %s, want %s" % (ids, want))
loss = re.search(r'<svg id="plot-loss".*?</svg>', html, re.S).group(0)
d = re.search(r'<path class="line"[^>]* d="([^"]*)"', loss).group(1)
# gaps at 50-51 and 120: three pieces; 197 finite losses, one point each
if d.count("M") != 3: errs.append("loss line in %d pieces, want 3 (gaps at null losses)" % d.count("M"))
ys = [float(y) for y in re.findall(r"[ML][0-9.]+,([0-9.]+)", d)]
if len(ys) != 197: errs.append("loss line has %d points, want 197" % len(ys))
if len(re.findall(r"M[0-9.]+,[0-9.]+ v-9", loss)) != 3: errs.append("want 3 skipped-step marks")
if "<th>skipped updates</th><td>3 " not in html: errs.append("summary: skipped updates")
if "<th>other lines</th><td>1 " not in html: errs.append("summary: the unknown line")
print("\n".join(errs))
sys.exit(1 if errs else 0)
PY

# a resumed run's metrics appended to the first run's: the line starts again
# where the steps go back, without a stroke back across the plot
(head -12 run/metrics.jsonl; sed -n 5,14p run/metrics.jsonl) > resumed.jsonl
"$Z" report resumed.jsonl -o resumed.html > /dev/null 2> err.txt || bad "report of resumed.jsonl: $(cat err.txt)"
d=$(grep -o '<path class="line"[^>]* d="[^"]*"' resumed.html | head -1 | sed 's/.* d="//')
[ "$(echo "$d" | tr -cd M | wc -c)" = 2 ] && ok || bad "resumed metrics: loss line $d, want 2 pieces"

# --- bad input: exit 2, the reason, nothing written ---------------------
refuse() { # WHAT WANT_IN_MESSAGE ARGS...
  local what=$1 want=$2; shift 2
  rm -rf outdir && mkdir outdir
  "$Z" report "$@" -o outdir/r.html > /dev/null 2> err.txt
  local rc=$?
  if [ $rc -ne 2 ]; then bad "$what: exit $rc, want 2 ($(cat err.txt))"
  elif ! grep -q -- "$want" err.txt; then bad "$what: message lacks '$want': $(cat err.txt)"
  elif [ -n "$(ls -A outdir)" ]; then bad "$what: wrote $(ls outdir)"
  else ok; fi
}
refuse "no such file" "cannot read nothere.jsonl" nothere.jsonl
printf '{"step":1,"loss":2}\n{"step":2,"loss":2}\nstep 3 loss 2\n{"step":4,"loss":2}\n' > notjson.jsonl
refuse "a line not JSON" "notjson.jsonl line 3: not JSON" notjson.jsonl
printf '{"step":1,"loss":2}\n["step",2]\n' > array.jsonl
refuse "a line not an object" "array.jsonl line 2: not a JSON object" array.jsonl
printf '{"step":1,"loss":2}\n{"step":2,"loss":"low"}\n' > string.jsonl
refuse "a value not a number" 'string.jsonl line 2: "loss" is not a number' string.jsonl
printf '{"note":1}\n\n' > nosteps.jsonl
refuse "no step lines" "nosteps.jsonl has no step lines" nosteps.jsonl
: > empty.jsonl
refuse "an empty file" "has no step lines" empty.jsonl
mkdir emptydir
refuse "a directory without metrics" "emptydir is a directory without metrics.jsonl" emptydir
printf '{"step":1,"loss":2,"bytes":7}\n' > scalar.jsonl
refuse "a number where an object belongs" 'scalar.jsonl line 1: "bytes.dp" is not a number' scalar.jsonl
refuse "no metrics argument" "no metrics given"
refuse "an unknown option" "unexpected argument '--bogus'" run --bogus
mkdir outdir/sub
"$Z" report run -o outdir/sub > /dev/null 2> err.txt
[ $? -eq 2 ] && grep -q "is a directory" err.txt && [ -z "$(ls -A outdir/sub)" ] && ok || bad "-o onto a directory: $(cat err.txt)"
cp run/metrics.jsonl self.jsonl
"$Z" report self.jsonl -o self.jsonl > /dev/null 2> err.txt
[ $? -eq 2 ] && cmp -s self.jsonl run/metrics.jsonl && ok || bad "-o onto the metrics file: $(cat err.txt)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
