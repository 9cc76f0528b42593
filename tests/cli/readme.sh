#!/usr/bin/env bash
# README.md's commands, run as written, in order, in a scratch copy of the
# project's layout (build/ztrain, build/zreshard, examples/), so that the
# README and the code cannot drift apart: the Quick start's demo line (less
# the install and build it shares with CI), every line of the Running block
# (its two export lines included, as a reader would paste them) and the
# full script shown, whose plan is checked with `ztrain schedule`.
# The suite's test command is CI itself and is not run again here.
#
# Only the sizes shrink, so that the whole README runs in about a minute:
# examples/demo.lua gets a smaller model and 30 steps instead of 300, and
# the step counts the commands name shrink tenfold (the table below). Each
# rewrite must find its text in the README, so a changed README fails here
# until this table follows it.
# Usage: readme.sh ZTRAIN ZRESHARD
set -eu
Z=$(realpath "$1")
R=$(realpath "$2")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/common.sh"
zt_scratch
mkdir build
ln -s "$Z" build/ztrain
ln -s "$R" build/zreshard
cp -r "$ROOT/examples" examples
cat >> examples/demo.lua <<'LUA'
-- readme.sh: the same run, small enough that the whole README takes a minute
model = zt.gpt { vocab = 256, seq = 32, dim = 32, layers = 4, heads = 4 }
train.steps = 30
LUA

python3 - "$ROOT/README.md" > commands.sh <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"^```(\w+)\n(.*?)^```", text, re.S | re.M)
sh = [b for lang, b in blocks if lang == "sh"]
lua = [b for lang, b in blocks if lang == "lua"]
assert len(sh) == 3 and len(lua) == 1, f"README has {len(sh)} sh and {len(lua)} lua blocks; readme.sh expects 3 and 1"
quick, suite, running = sh
assert "ctest" in suite and "ctest" not in quick and "ctest" not in running
# the Quick start line: what follows the install and the build
parts = [p.strip() for p in quick.strip().split("&&")]
assert parts[:3] == ["bash cluster/install-deps.sh", "cmake -S . -B build -G Ninja",
                     "cmake --build build"], parts
cmds = parts[3:] + [l for l in running.splitlines() if l.strip()]
rewrites = [("step_00000300", "step_00000030"), ("checkpoint.every = 100", "checkpoint.every = 10"),
            ("--steps 100", "--steps 10"), ("--steps 50", "--steps 5")]
for old, new in rewrites:
    hits = [i for i, c in enumerate(cmds) if old in c]
    assert hits, f"readme.sh rewrites '{old}', which the README no longer has"
    for i in hits:
        cmds[i] = cmds[i].replace(old, new)
open("script.lua", "w").write(lua[0])
print("trap 'echo \"README command failed (exit $?): $BASH_COMMAND\" >&2' ERR")
print("set -eE")
for c in cmds:
    print(f"echo '+ {c.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'")
    print(c)
print("build/ztrain schedule script.lua  # the README's full script plans")
PY
n=$(grep -c '^echo ' commands.sh)
bash commands.sh > log.txt 2>&1 || { cat log.txt; echo "FAIL: a README command failed (above)"; exit 1; }
# what the commands said they made is there
for f in report.html final.h5 init.h5 bpe.h5 imported.h5 model.safetensors data/tokenizer.model \
         hf_model/config.json hf_model/model.safetensors hf_model/tokenizer.model \
         checkpoints/demo/step_00000030.h5 t.json; do
  [ -s "$f" ] || { cat log.txt; echo "FAIL: $f was not written"; exit 1; }
done
echo "PASS: $n README commands ran as written; the full script plans"
