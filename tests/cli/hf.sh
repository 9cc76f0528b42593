#!/usr/bin/env bash
# Hugging Face in and out, against transformers itself (tests/ref/hf_check.py
# in the venv of tests/ref/venv.sh), for a tiny gpt (tied head) and a tiny
# llama (GQA, untied):
#   export  ztrain trains 3 steps; `zreshard export --format hf`;
#           from_pretrained's logits of a batch equal ztorch.py's model of
#           the checkpoint (itself proven equal to ztrain) within 1e-5
#           relative, and HF's loss on batch 3 equals the loss ztrain
#           reports for step 4 from that checkpoint.
#   import  a random HF model saved with save_pretrained; `zreshard import`;
#           ztrain's step-1 loss from the import, and from `--load DIR`
#           directly, equals HF's loss on that batch; three fine-tune steps
#           from it replay in PyTorch (tests/ref/compare.py: AdamW's moments
#           start at zero) to 1e-5.
#   offline (no transformers needed) export then import gives the same
#           tensors (F32 bitwise, BF16 rounded to nearest even); the run's
#           tokenizer file copied into
#           the export (tokenizer.json, tokenizer.model); HF folders no
#           ztrain model matches:
#           exit 2 naming the field, nothing written; a script whose model
#           differs from the folder's; and one reader of string attributes:
#           a checkpoint whose attributes h5py rewrote as variable-length
#           strings loads in ztrain and zreshard alike, and one that holds
#           an array is refused by both with the same message.
# A missing venv fails the test (bash tests/ref/venv.sh makes it; CI does).
# Usage: hf.sh export|import|offline ZTRAIN ZRESHARD
set -u
MODE=$1
Z=$(realpath "$2")
R=$(realpath "$3")
REF=$(cd "$(dirname "$0")/../ref" && pwd)
PY=/usr/bin/python3
VPY=${ZT_VENV:-$HOME/.cache/ztrain-venv}/bin/python
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 # local folders only, never the hub
. "$(dirname "$0")/common.sh"
zt_scratch

if [ "$MODE" != offline ] && ! "$VPY" -c "import transformers" 2> /dev/null; then
  echo "FAIL: no transformers in $VPY: run bash tests/ref/venv.sh transformers==4.39.3"
  exit 1
fi

zt_tokens tok.bin 7 20000
for arch in gpt llama; do
  model='zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4}'
  [ $arch = llama ] && model='zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 64}'
  cat > $arch.lua <<LUA
local zt = require "ztrain"
model = $model
train = {micro_batch = 2, global_batch = 4, steps = 3, log_every = 0}
data = {train = "tok.bin", shuffle = false}
LUA
done

# The loss of step S in a metrics file.
loss_at() { $PY -c "
import json, sys
for l in open('$1'):
    o = json.loads(l)
    if o.get('step') == $2 and 'loss' in o: print(repr(o['loss'])); sys.exit(0)
sys.exit('no step $2 in $1')"; }

# same A B: |A - B| <= 1e-5 |B|
same() { $PY -c "import sys; a, b = float('$1'), float('$2'); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)"; }

if [ "$MODE" = export ]; then
  for arch in gpt llama; do
    "$Z" $arch.lua --save $arch.h5 > /dev/null || { bad "$arch: ztrain did not write a checkpoint"; continue; }
    "$R" export $arch.h5 --format hf -o $arch.hf > out.txt 2>&1 || { bad "$arch: export: $(cat out.txt)"; continue; }
    [ -e $arch.hf/config.json ] && [ -e $arch.hf/model.safetensors ] && ! ls -d $arch.hf.tmp* 2> /dev/null &&
      ok || bad "$arch: export left $(ls)"
    "$Z" $arch.lua --load $arch.h5 --steps 4 --metrics m.jsonl > /dev/null || bad "$arch: ztrain --load"
    want=$(loss_at m.jsonl 4)
    "$VPY" "$REF/hf_check.py" logits $arch.h5 $arch.hf tok.bin 3 4 > hf.txt 2>&1 && ok || bad "$arch: $(tail -3 hf.txt)"
    got=$(sed -n 's/^hf_loss //p' hf.txt)
    echo "$arch: $(grep '^logits' hf.txt); loss of batch 3: ztrain $want, transformers $got"
    same "$got" "$want" && ok || bad "$arch: HF loss $got, ztrain's $want"
  done
  # bf16: HF reads it too (values rounded, so only a loose check: it loads)
  "$R" export gpt.h5 --format hf --dtype bf16 -o gpt16.hf > /dev/null && grep -q '"BF16"' gpt16.hf/model.safetensors &&
    ok || bad "bf16 export"
fi

if [ "$MODE" = import ]; then
  for arch in gpt llama; do
    "$VPY" "$REF/hf_check.py" random $arch r$arch 5 tok.bin 0 4 > hf.txt 2>&1 || { bad "$arch: $(tail -3 hf.txt)"; continue; }
    want=$(sed -n 's/^hf_loss //p' hf.txt)
    [ $arch = gpt ] || ls r$arch/model.safetensors.index.json > /dev/null || bad "llama was not saved in shards"
    "$R" import r$arch -o r$arch.h5 > out.txt 2>&1 && ok || bad "$arch: import: $(cat out.txt)"
    "$R" verify r$arch.h5 > out.txt 2>&1 && ok || bad "$arch: the import does not verify: $(cat out.txt)"
    for from in r$arch.h5 r$arch; do
      rm -f m.jsonl
      "$Z" $arch.lua --load $from --steps 1 --metrics m.jsonl > out.txt 2>&1 || bad "$arch: --load $from: $(tail -3 out.txt)"
      got=$(loss_at m.jsonl 1)
      echo "$arch --load $from: step 1 loss ztrain $got, transformers $want"
      same "$got" "$want" && ok || bad "$arch --load $from: step 1 loss $got, HF's $want"
    done
    ls /tmp/ztrain-hf-* 2> /dev/null && bad "$arch: --load DIR left its temporary checkpoint"
    # fine-tuning from the import: three steps replayed in PyTorch
    "$Z" $arch.lua --load r$arch --steps 3 --metrics ft.jsonl --save ft.h5 > /dev/null || bad "$arch: fine-tune"
    $PY "$REF/compare.py" --init r$arch.h5 --final ft.h5 --metrics ft.jsonl > cmp.txt 2>&1 &&
      ok || bad "$arch: fine-tune replay: $(tail -5 cmp.txt)"
  done
fi

if [ "$MODE" = offline ]; then
  "$Z" gpt.lua --save gpt.h5 > /dev/null && "$Z" llama.lua --save llama.h5 > /dev/null || bad "train"
  "$R" export gpt.h5 --format hf -o gpt.hf > /dev/null && "$R" export llama.h5 --format hf -o llama.hf > /dev/null || bad "export"
  # round trips: F32 exactly (names and transposes undone), BF16 as the
  # values rounded to nearest even
  for arch in gpt llama; do
    "$R" export $arch.h5 --format hf --dtype bf16 -o $arch.b16 > /dev/null || bad "$arch: bf16 export"
    "$R" import $arch.hf -o $arch.back.h5 > /dev/null && "$R" import $arch.b16 -o $arch.b16.h5 > /dev/null || bad "$arch: import"
    $PY -c "
import h5py, numpy as np, sys
def bf16(x):
    u = x.astype('<f4').view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view('<f4')
a, b, c = (h5py.File(p, 'r')['model'] for p in ('$arch.h5', '$arch.back.h5', '$arch.b16.h5'))
assert sorted(a) == sorted(b) == sorted(c), (sorted(a), sorted(b))
for n in a:
    x = a[n][()]
    assert np.array_equal(x, b[n][()]), n + ': f32 round trip differs'
    assert np.array_equal(bf16(x), c[n][()]), n + ': bf16 round trip differs'
" > rt.txt 2>&1 && ok || bad "$arch round trip: $(tail -2 rt.txt)"
  done
  # case NAME SRC JSON-EDIT PATTERN: a copy of SRC's folder whose config
  # the Python statement changes (c is the config) must be refused
  case_() {
    local name=$1 src=$2 edit=$3 pat=$4
    rm -rf in out.h5*; cp -r $src in
    $PY -c "import json; c = json.load(open('in/config.json')); $edit; json.dump(c, open('in/config.json', 'w'))"
    "$R" import in -o out.h5 > out.txt 2>&1
    local rc=$?
    if [ $rc != 2 ] || ! grep -qF -- "$pat" out.txt || [ "$(ls out.h5* 2> /dev/null)" ]; then
      bad "$name: rc $rc (want 2), $(ls out.h5* 2> /dev/null) output: $(head -c 400 out.txt)"
    else
      ok
    fi
  }
  case_ model-type gpt.hf 'c["model_type"] = "bert"' 'model_type "bert" is not a ztrain family'
  case_ no-model-type gpt.hf 'del c["model_type"]' 'model_type is missing'
  case_ architectures gpt.hf 'c["architectures"] = ["GPT2Model"]' 'architectures must be ["GPT2LMHeadModel"]'
  case_ n-inner gpt.hf 'c["n_inner"] = 100' 'n_inner is 100'
  case_ gpt-eps gpt.hf 'c["layer_norm_epsilon"] = 1e-6' 'layer_norm_epsilon is 1e-06'
  case_ activation gpt.hf 'c["activation_function"] = "relu"' 'activation_function is "relu"'
  case_ no-embd gpt.hf 'del c["n_embd"]' 'n_embd is missing'
  case_ heads gpt.hf 'c["n_head"] = 5' 'no ztrain model fits'
  case_ layers-more gpt.hf 'c["n_layer"] = 3' 'transformer.h.2.ln_1.weight (ztrain'"'"'s blocks.2.norm1.weight) is missing'
  case_ layers-fewer gpt.hf 'c["n_layer"] = 1' 'tensor transformer.h.1.'
  case_ vocab gpt.hf 'c["vocab_size"] = 128' 'has shape [256, 32]; config.json makes it [128, 32]'
  case_ attn-bias llama.hf 'c["attention_bias"] = True' 'attention_bias is true'
  case_ rope-scaling llama.hf 'c["rope_scaling"] = {"type": "linear", "factor": 2.0}' 'rope_scaling is set'
  case_ llama-tied llama.hf 'c["tie_word_embeddings"] = True' 'tie_word_embeddings is true'
  case_ head-dim llama.hf 'c["head_dim"] = 16' 'head_dim is 16'
  case_ act llama.hf 'c["hidden_act"] = "gelu"' 'hidden_act is "gelu"'
  # damaged weights: a header that claims more data than the file holds
  rm -rf in; cp -r gpt.hf in
  truncate -s -100 in/model.safetensors
  "$R" import in -o out.h5 > out.txt 2>&1
  [ $? = 2 ] && grep -q "do not fit the file" out.txt && [ ! -e out.h5 ] && ok || bad "truncated: $(cat out.txt)"
  "$R" import gpt.h5 -o out.h5 > out.txt 2>&1
  [ $? = 2 ] && grep -q "is not a folder" out.txt && ok || bad "import of a file: $(cat out.txt)"
  "$R" export gpt.h5 --format hf -o slash/ > out.txt 2>&1 && [ -e slash/config.json ] && ! ls -d slash/.tmp* slash.tmp* 2> /dev/null &&
    ok || bad "export -o DIR/: $(cat out.txt)"
  mkdir -p full && touch full/x
  "$R" export gpt.h5 --format hf -o full > out.txt 2>&1
  [ $? = 2 ] && grep -q "exists and is not empty" out.txt && [ "$(ls full)" = x ] && ok || bad "export into a full folder: $(cat out.txt)"
  # the run's tokenizer (the plan's data.tokenizer) goes with the export
  echo '{"model": {"type": "BPE"}}' > tok.json
  printf 'sentencepiece\0bytes' > sp.model
  for t in tok.json sp.model missing.json; do
    cp gpt.h5 t.h5
    $PY -c "
import h5py, json
with h5py.File('t.h5', 'r+') as f:
    p = json.loads(f.attrs['plan']); p['data']['tokenizer'] = '$PWD/$t'
    del f.attrs['plan']; f.attrs['plan'] = json.dumps(p)"
    rm -rf t.hf
    "$R" export t.h5 --format hf -o t.hf > out.txt 2>&1 || bad "export with tokenizer $t: $(cat out.txt)"
    case $t in
      tok.json) cmp -s tok.json t.hf/tokenizer.json && ok || bad "tokenizer.json not copied: $(ls t.hf)" ;;
      sp.model) cmp -s sp.model t.hf/tokenizer.model && ok || bad "tokenizer.model not copied: $(ls t.hf)" ;;
      *) grep -q "missing.json is not readable here" out.txt && [ "$(ls t.hf)" = "config.json
model.safetensors" ] && ok || bad "missing tokenizer: $(cat out.txt; ls t.hf)" ;;
    esac
  done
  # the script's model must be the folder's
  "$Z" gpt.lua -e 'model = zt.gpt{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2}' --load gpt.hf --steps 1 > out.txt 2>&1
  [ $? = 2 ] && grep -qF "the script's model has heads = 2, the Hugging Face model has 4" out.txt && ok ||
    bad "--load DIR of another model: $(tail -2 out.txt)"
  "$Z" llama.lua -e 'model = zt.llama{vocab = 256, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn_dim = 64, norm_eps = 1e-6}' --load llama.hf --steps 1 > out.txt 2>&1
  [ $? = 2 ] && grep -qF "norm_eps = 1e-06" out.txt && ok || bad "--load DIR, other eps: $(tail -2 out.txt)"

  # one reader of string attributes: h5py's variable-length strings
  cp gpt.h5 vlen.h5
  cp gpt.h5 arr.h5
  $PY -c "
import h5py, numpy as np
with h5py.File('vlen.h5', 'r+') as f:
    for k in ('format', 'plan', 'topology', 'state'):
        v = f.attrs[k]
        v = v.decode() if isinstance(v, bytes) else str(v)
        del f.attrs[k]
        f.attrs[k] = v  # h5py's default: a variable-length UTF-8 string
    assert h5py.check_string_dtype(f.attrs.get_id('plan').dtype).length is None
with h5py.File('arr.h5', 'r+') as f:
    del f.attrs['format']
    f.attrs['format'] = ['ztrain-checkpoint', 'ztrain-checkpoint']
"
  "$Z" gpt.lua --load vlen.h5 --steps 4 > out.txt 2>&1 && ok || bad "ztrain refuses variable-length attributes: $(tail -2 out.txt)"
  "$R" info vlen.h5 > out.txt 2>&1 && ok || bad "zreshard refuses variable-length attributes: $(tail -2 out.txt)"
  "$Z" gpt.lua --load arr.h5 --steps 4 > z.txt 2>&1; zrc=$?
  "$R" info arr.h5 > r.txt 2>&1; rrc=$?
  msg="attribute format is not a string"
  [ $zrc = 2 ] && [ $rrc = 2 ] && grep -qF "$msg" z.txt && grep -qF "$msg" r.txt && ok ||
    bad "an array attribute: ztrain rc $zrc $(tail -1 z.txt); zreshard rc $rrc $(tail -1 r.txt)"
fi

echo "hf $MODE: $pass passed, $fail failed"
[ $fail = 0 ] && [ $pass -gt 0 ]
