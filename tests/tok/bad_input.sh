#!/usr/bin/env bash
# tok_bad_input: `ztrain tokenize` and data.tokenizer refuse what they cannot
# read with one message and exit 2, and leave no file behind: an unknown
# tokenizer file, JSON that is not a byte-level BPE tokenizer.json, a
# corpus that is not UTF-8, a vocabulary too small to train. And that a run
# records the tokenizer it was given (path and hash in the plan JSON).
#   bad_input.sh ZTRAIN
set -u
Z=$(realpath "$1")
. "$(dirname "$0")/../cli/common.sh"
zt_scratch
fail=0 n=0
# NAME PATTERN -- args: exit 2, PATTERN on stderr (one line besides progress
# lines), no out.bin/val.bin/tokenizer.model
bad() {
  local name=$1 pat=$2
  shift 3
  n=$((n + 1))
  "$Z" "$@" > out.txt 2> err.txt
  local rc=$? left
  left=$(ls out.bin val.bin tokenizer.model ./*.tmp.* 2> /dev/null)
  if [ "$rc" != 2 ] || ! grep -q -- "$pat" err.txt || [ -n "$left" ] ||
     [ "$(grep -cv '^tokenize: ' err.txt)" != 1 ]; then
    echo "FAIL $name: rc $rc (want 2), left [$left], stderr: $(head -c 400 err.txt)"
    fail=$((fail + 1))
  fi
  rm -f out.bin val.bin tokenizer.model
}
good() { # NAME PATTERN -- args: exit 0, PATTERN on stdout
  local name=$1 pat=$2
  shift 3
  n=$((n + 1))
  if ! "$Z" "$@" > out.txt 2> err.txt || ! grep -q -- "$pat" out.txt; then
    echo "FAIL $name: $(head -c 400 err.txt) $(head -c 400 out.txt)"
    fail=$((fail + 1))
  fi
  rm -f out.bin
}

printf 'plain text, ok\n' > text.txt
printf 'caf\xc3\xa9 ok\nthen \xff bad\n' > latin.txt  # 0xFF at byte 14
printf 'ok\xe2\x82' > cut.txt                           # a sequence cut short at 2
printf 'hello, I am not a tokenizer\n' > notatok.txt
printf '{ "model": { "type": "WordPiece", "vocab": {} } }' > wordpiece.json
printf '{ "version": "1.0", "vocab": {} }' > nomodel.json
printf '{ "model": ' > broken.json
printf '{ "normalizer": { "type": "Lowercase" }, "model": { "type": "BPE", "vocab": {}, "merges": [] } }' > lower.json
printf '{ "model": { "type": "BPE", "vocab": { "a": 0 }, "merges": [] } }' > notbytes.json
# a minimal byte-level tokenizer.json: the 256 byte characters, one merge
/usr/bin/python3 - << 'EOF'
import json
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): i for i, c in enumerate(cs)}
vocab["\u0120t"] = 256
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": ["\u0120 t"]},
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
           "added_tokens": [{"id": 257, "content": "<|endoftext|>", "special": True}]},
          open("tok.json", "w"))
bl = {"type": "ByteLevel"}
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": ["\u0120 x"]}, "pre_tokenizer": bl},
          open("badmerge.json", "w"))
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []}}, open("nobytelevel.json", "w"))
json.dump({"model": {"type": "BPE", "vocab": dict(vocab, far=900000000), "merges": []},
           "pre_tokenizer": bl}, open("sparse.json", "w"))
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "pre_tokenizer": {
    "type": "Sequence", "pretokenizers": [bl, {"type": "Split", "pattern": {"String": "x"},
                                              "behavior": "Isolated"}]}}, open("bytelevelfirst.json", "w"))
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "pre_tokenizer": {
    "type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}}, open("badregex.json", "w"))
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []}, "pre_tokenizer": {
    "type": "Metaspace"}}, open("metaspace.json", "w"))
EOF

bad unknown-file "notatok.txt: unknown tokenizer file or format: neither a Hugging Face tokenizer.json nor a SentencePiece model (not a SentencePiece model file)$" -- tokenize text.txt out.bin --tokenizer notatok.txt
bad missing-file "nope.json: cannot read it" -- tokenize text.txt out.bin --tokenizer nope.json
bad directory "tokenizer \.: cannot read it: Is a directory" -- tokenize text.txt out.bin --tokenizer .
bad wordpiece "model.type WordPiece is not supported" -- tokenize text.txt out.bin --tokenizer wordpiece.json
bad no-model 'without a "model"' -- tokenize text.txt out.bin --tokenizer nomodel.json
bad broken-json "not valid JSON" -- tokenize text.txt out.bin --tokenizer broken.json
bad normalizer "normalizer Lowercase is not supported" -- tokenize text.txt out.bin --tokenizer lower.json
bad not-byte-level "no entry for byte 0x00" -- tokenize text.txt out.bin --tokenizer notbytes.json
bad bad-merge 'merges\[0\].*not in model.vocab' -- tokenize text.txt out.bin --tokenizer badmerge.json
bad sparse-ids "id 900000000 is far beyond its 258 entries" -- tokenize text.txt out.bin --tokenizer sparse.json
bad no-byte-level "pre_tokenizer without ByteLevel (not byte-level BPE) is not supported" -- \
  tokenize text.txt out.bin --tokenizer nobytelevel.json
bad byte-level-first "pre_tokenizer that does not end with ByteLevel" -- \
  tokenize text.txt out.bin --tokenizer bytelevelfirst.json
bad bad-regex "pattern /(unclosed/ at 9: missing closing parenthesis" -- \
  tokenize text.txt out.bin --tokenizer badregex.json
bad metaspace "pre_tokenizer type Metaspace is not supported" -- tokenize text.txt out.bin --tokenizer metaspace.json
bad not-utf8 "latin.txt is not UTF-8: bad byte 0xFF at offset 14" -- \
  tokenize text.txt latin.txt out.bin --tokenizer tok.json --val val.bin
bad cut-utf8 "cut.txt is not UTF-8: bad byte 0xE2 at offset 2" -- tokenize cut.txt out.bin --tokenizer tok.json
bad train-not-utf8 "latin.txt is not UTF-8" -- tokenize latin.txt out.bin --train-vocab 300
bad train-too-small "training the vocabulary: Vocabulary size is smaller than required_chars" -- tokenize text.txt out.bin --train-vocab 10
bad train-and-tokenizer "give one of them" -- tokenize text.txt out.bin --train-vocab 300 --tokenizer tok.json
bad train-vocab-nan "--train-vocab needs" -- tokenize text.txt out.bin --train-vocab lots
bad tokenizer-out-alone "give --train-vocab" -- tokenize text.txt out.bin --tokenizer-out m.model
bad unwritable-out "OUTPUT nodir/out.bin: cannot write to folder nodir" -- tokenize text.txt nodir/out.bin
bad unwritable-model "--tokenizer-out nodir/m.model: cannot write to folder nodir" -- \
  tokenize text.txt out.bin --train-vocab 300 --tokenizer-out nodir/m.model
bad val-fraction "--val-fraction must be in (0, 1)" -- tokenize text.txt out.bin --val val.bin --val-fraction 2

# what is fine: any bytes for the byte tokenizer, the minimal tokenizer.json
good byte-any-bytes "wrote 20 tokens (vocab 256, tokenizer byte) to out.bin" -- tokenize latin.txt out.bin
good hf-minimal "wrote 15 tokens (vocab 258, tokenizer hf-bpe tok.json) to out.bin" -- \
  tokenize text.txt out.bin --tokenizer tok.json

# data.tokenizer: checked at start-up against model.vocab
cat > run.lua << 'EOF'
model = zt.gpt { vocab = 256, seq = 8, dim = 16, layers = 1, heads = 2 }
train = { micro_batch = 1, steps = 0 }
data  = { train = "train.bin" }
EOF
"$Z" tokenize text.txt train.bin > /dev/null
bad script-unknown "notatok.txt: unknown tokenizer file or format" -- run.lua -e 'data.tokenizer = "notatok.txt"'
bad script-vocab "vocab 258.*more than model.vocab 256" -- run.lua -e 'data.tokenizer = "tok.json"'

# the plan (in every checkpoint) names the tokenizer and its hash
n=$((n + 1))
if "$Z" run.lua -e 'model.vocab = 258; data.tokenizer = "tok.json"' --save init.h5 > /dev/null 2>&1 &&
   h5dump -a plan init.h5 > plan.txt 2>&1 &&
   grep -q "\"tokenizer\":\"$(pwd -P)/tok.json\",\"tokenizer_hash\":\"xxh3-64:[0-9a-f]\{16\}\"" plan.txt; then :
else
  echo "FAIL record: $(grep -o 'data[^}]*}' plan.txt 2>/dev/null | head -c 400)"
  fail=$((fail + 1))
fi
echo "$((n - fail)) passed, $fail failed"
[ "$fail" = 0 ]
