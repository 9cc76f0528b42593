#!/usr/bin/env bash
# Makes the Python environment of the tests that need packages Debian does
# not ship (transformers): a venv at ${ZT_VENV:-$HOME/.cache/ztrain-venv}
# built on Debian's interpreter with its site packages, so that Debian's
# torch 1.13, numpy and h5py are the ones used. Installs each pinned
# requirement given as an argument ("transformers==4.39.3") with pip, and
# skips those whose module already imports at that version: rerunning it
# costs nothing. Prints the venv's python on the last line.
#   bash tests/ref/venv.sh transformers==4.39.3
# Without arguments it makes the test suite's two venvs (what .ci/run and
# README's test command do): transformers 4.39 for the Hugging Face tests,
# and, apart, HF tokenizers 0.19 for the tokenizer tests (the first with
# LLaMA 3's ignore_merges; transformers 4.39 refuses it).
set -eu
if [ $# = 0 ]; then
  ZT_VENV=${ZT_VENV:-$HOME/.cache/ztrain-venv} bash "$0" transformers==4.39.3 >/dev/null
  ZT_VENV=${ZT_TOK_VENV:-$HOME/.cache/ztrain-venv-tok} bash "$0" tokenizers==0.19.1
  exit
fi
venv=${ZT_VENV:-$HOME/.cache/ztrain-venv}
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
py=$venv/bin/python
for req in "$@"; do
  name=${req%%[=<>]*}
  want=${req#"$name"}; want=${want#==}
  have=$("$py" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
  if [ -n "$have" ] && { [ "$want" = "$req" ] || [ "$have" = "$want" ]; }; then
    continue
  fi
  "$py" -m pip install -q --disable-pip-version-check "$req"
done
echo "$py"
