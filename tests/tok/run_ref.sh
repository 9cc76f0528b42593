#!/usr/bin/env bash
# tok_ref_*: ztrain's tokenizers against HF `tokenizers` (hf) or Python's
# sentencepiece (spm), in a venv of their own (${ZT_TOK_VENV:-
# ~/.cache/ztrain-venv-tok}): LLaMA 3's ignore_merges needs tokenizers
# 0.19, which transformers 4.39 in the shared venv does not allow. A venv
# that cannot be made fails the test: the reference is what it is for.
#   run_ref.sh ZTRAIN TOK_TOOL hf|spm
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=$(ZT_VENV=${ZT_TOK_VENV:-$HOME/.cache/ztrain-venv-tok} bash "$here/../ref/venv.sh" \
       tokenizers==0.19.1 | tail -n 1)
exec "$py" "$here/check_tok.py" "$1" "$2" "$3"
