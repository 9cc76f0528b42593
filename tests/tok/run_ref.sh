#!/usr/bin/env bash
# tok_ref_*: ztrain's tokenizers against HF `tokenizers` (hf) or Python's
# sentencepiece (spm), in the test venv. A venv that cannot be made fails
# the test: the reference is what the test is for.
#   run_ref.sh ZTRAIN TOK_TOOL hf|spm
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=$(bash "$here/../ref/venv.sh" tokenizers==0.15.2 | tail -n 1)
exec "$py" "$here/check_tok.py" "$1" "$2" "$3"
