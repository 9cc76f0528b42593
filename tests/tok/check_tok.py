"""ztrain's tokenizers against the reference libraries, token for token.

  check_tok.py ZTRAIN TOK_TOOL hf|spm

hf: trains small byte-level BPE tokenizer.json files with Hugging Face
`tokenizers` (GPT-2's ByteLevel pre-tokenizer, the same with a prefix space,
and LLaMA 3's Split regex + ByteLevel, also with ignore_merges and vocab
entries merges do not reach), then encodes a text of ASCII,
accents, CJK, emoji, numbers, whitespace runs, contractions and special
tokens with ztrain (tokenizer.h through tok_tool, and `ztrain tokenize`)
and with HF: the ids must be the same, and decoding must give the text back.
A 600 kB text in 64 kB pieces (ZT_TEST_TOKENIZE_PIECE; 4 MB otherwise)
checks that `ztrain tokenize`'s pieces change nothing.

spm: `ztrain tokenize --train-vocab` trains a SentencePiece BPE model; the
ids of ztrain and of Python's sentencepiece must be the same.
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

ZTRAIN, TOOL, WHAT = sys.argv[1], sys.argv[2], sys.argv[3]

TEST_TEXT = (
    "Hello world! It's a test: we're sure they'll say I'd've done it, don't you?\n"
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve fa\u00e7ade \u2014 \u00dcber \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0440\u0443\u0441\u0441\u043a\u0438\u0439.\n"
    "\u6771\u4eac\u3067\u5bff\u53f8\u3092\u98df\u3079\u305f\u3002\u4e2d\u6587\u6d4b\u8bd5\uff0c\ud55c\uad6d\uc5b4 \ud14c\uc2a4\ud2b8\n"
    "Emoji: \U0001F600\U0001F680 \U0001F469\u200d\U0001F4BB and \u2764\ufe0f!\n"
    "Unreachable zqxv and zqxvzqxv words\n"
    "Numbers 1234567 3.14159 2024-06-01 0x1F 1,000,000\n"
    "Whitespace    runs\t\ttabs   \n\n\n  leading and trailing   \n"
    "<|endoftext|>After the special token<|endoftext|><|endoftext|>twice, <|endof not one\n"
    "SHOUTING: IT'S WE'RE THEY'LL I'D'VE DON'T\n"
    "Code: for (int i = 0; i < n; i++) { x += a[i] * 2; } // done\n"
    "MIXED case WORDS and 'quotes' \"double\" ... --- ___ ***\n"
    "\r\nWindows line\r\nend \u00a0nbsp\u3000ideographic space\n"
    # the edges of \p{N} and \p{L} (superscript, fraction, Arabic-Indic digit,
    # combining acute, Roman numeral, titlecase, modifier, Thai, Devanagari,
    # Hebrew points), then of \s: NEL, vertical tab, form feed, line and paragraph separators
    # (whitespace); Mongolian vowel separator, zero-width space, BOM (not)
    "x\u00b2\u00bd\u0663 e\u0301 \u216b \u01c5 \u02b0 \u0e01\u0e34 \u0915\u094d\u0937 \u05d0\u05b7\n"
    "a\u0085b \u000bc\u000c d\u2028e\u2029 f\u180eg\u200bh\ufeffi \u2009thin\u205fmath\n"
    # long pieces, which take the heap path (over 32 bytes)
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa "
    "thethethethethethethethethethethethethethethethethethethe 12341234123412341234123412341234123412341234 "
    "https://example.com/the/model/train/token/byte/level/merge?rank=1234&caf\u00e9=\u6771\u4eac\n"
    "\u6771\u4eac\u5bff\u53f8\u4e2d\u6587\u6d4b\u8bd5\u6771\u4eac\u5bff\u53f8\u4e2d\u6587\u6d4b\u8bd5\u6771\u4eac\u5bff\u53f8\n"
)

WORDS = ("the of and to in is was for on that with as by at from it's we're they'll "
         "caf\u00e9 cr\u00e8me \u00fcber na\u00efve \u6771\u4eac \u5bff\u53f8 \u4e2d\u6587 \u6d4b\u8bd5 "
         "\ud55c\uad6d\uc5b4 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \U0001F600 \u2764\ufe0f "
         "model train token byte level merge rank 1234 2024 3.14 { } ( ) ; // == += "
         "Hello World Special Tokens quick brown fox jumps over lazy dog "
         "aaaaaaaa thethethe 12341234 \u6771\u4eac\u5bff\u53f8\u4e2d\u6587").split()


def corpus(n_words, seed):
    rnd = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rnd.choice(WORDS))
        out.append(rnd.choice([" ", " ", " ", " ", "  ", "\n", ", ", ". ", "\t", "\n\n"]))
    return "".join(out)


def run(*args, check=True):
    p = subprocess.run(args, capture_output=True, text=True)
    if check and p.returncode:
        sys.exit(f"FAIL: {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def zt_ids(tokenizer, text_path):
    out = run(TOOL, tokenizer, text_path).stdout.split("\n")
    kind, vocab, eos = out[0].split()
    text = bytes.fromhex(out[2]).decode("utf-8")
    return kind, int(vocab), int(eos), [int(x) for x in out[1].split()], text


def read_bin(path):
    with open(path, "rb") as f:
        b = f.read()
    assert b[:8] == b"ZTRAINTK", path
    width, count, vocab = struct.unpack_from("<IQI", b, 12)
    fmt = "<%d%s" % (count, "H" if width == 2 else "I")
    return list(struct.unpack_from(fmt, b, 32)), vocab


fails = 0


def same(name, got, want, text=None):
    global fails
    if got == want:
        print(f"ok   {name}: {len(got)} ids")
        return
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    print(f"FAIL {name}: ids differ at {i} (ztrain {len(got)}, reference {len(want)} ids)\n"
          f"     ztrain    {got[max(0, i - 3):i + 5]}\n     reference {want[max(0, i - 3):i + 5]}")
    fails += 1


def check(name, got, want):
    global fails
    if got == want:
        print(f"ok   {name}")
        return
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    print(f"FAIL {name}: differs at character {i}: {got[i:i + 20]!r} vs {want[i:i + 20]!r}")
    fails += 1


def hf(tmp):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    qwen2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    kinds = {
        "gpt2": (pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"]),
        "gpt2-prefix-space": (pre_tokenizers.ByteLevel(add_prefix_space=True), ["<|endoftext|>"]),
        "llama3": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(llama3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            ["<|begin_of_text|>", "<|end_of_text|>"]),  # <|endoftext|> is plain text here
        # Qwen2's kind: a Unicode normalizer before the split (NFKC too)
        "nfc": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(qwen2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ["<|endoftext|>"]),
        "nfkc": (pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"]),
    }
    train_txt = os.path.join(tmp, "train.txt")
    with open(train_txt, "w") as f:
        f.write(corpus(20000, 1) + TEST_TEXT)
    test_txt = os.path.join(tmp, "test.txt")
    with open(test_txt, "w", newline="") as f:
        f.write(TEST_TEXT)
    big_txt = os.path.join(tmp, "big.txt")
    with open(big_txt, "w", newline="") as f:
        f.write((corpus(50000, 2) + TEST_TEXT) * 2)
    for name, (pre, special) in kinds.items():
        tok = Tokenizer(models.BPE())
        if name in ("nfc", "nfkc"):
            tok.normalizer = normalizers.NFC() if name == "nfc" else normalizers.NFKC()
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        tok.train([train_txt], trainers.BpeTrainer(
            vocab_size=700, special_tokens=special, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        path = os.path.join(tmp, name + ".json")
        tok.save(path)
        if name == "llama3":  # LLaMA 3's ignore_merges: a piece in the vocab is one token
            plain = tok.encode(TEST_TEXT, add_special_tokens=False).ids
            j = json.loads(tok.to_str())
            j["model"]["ignore_merges"] = True
            top = max(list(j["model"]["vocab"].values()) + [a["id"] for a in j["added_tokens"]])
            for k, word in enumerate(("\u0120zqxv", "\u0120zqxvzqxv")):  # merges never make these
                j["model"]["vocab"][word] = top + 1 + k
            with open(path, "w") as f:
                json.dump(j, f)
            tok = Tokenizer.from_file(path)
            assert tok.encode(TEST_TEXT, add_special_tokens=False).ids != plain, "ignore_merges unused"
        kind, vocab, eos, ids, back = zt_ids(path, test_txt)
        assert kind == "hf-bpe", kind
        want = tok.encode(TEST_TEXT, add_special_tokens=False).ids
        same(f"{name} tokenizer.h", ids, want)
        # a prefix space stays in the decoded text, in HF's decoder too, and
        # normalized text is what comes back
        plain = "prefix" not in name and name not in ("nfc", "nfkc")
        check(f"{name} decode", back, TEST_TEXT if plain else tok.decode(want, skip_special_tokens=False))
        if not plain:
            assert back != TEST_TEXT, f"{name}: nothing normalized or prefixed"
        ids_all = list(tok.get_vocab().values())
        assert vocab == max(ids_all) + 1, (vocab, max(ids_all), len(ids_all), tok.get_vocab_size())
        # the CLI: several inputs, end-of-text after each, u16
        out = os.path.join(tmp, name + ".bin")
        p = run(ZTRAIN, "tokenize", test_txt, test_txt, out, "--tokenizer", path)
        got, hdr_vocab = read_bin(out)
        eot = tok.token_to_id(special[-1])
        same(f"{name} ztrain tokenize", got, (want + [eot]) * 2)
        assert hdr_vocab == vocab, (hdr_vocab, vocab)
        assert f"wrote {len(got)} tokens (vocab {vocab}, tokenizer hf-bpe {path})" in p.stdout, p.stdout
        if name in ("gpt2", "llama3", "nfc"):
            os.environ["ZT_TEST_TOKENIZE_PIECE"] = "65536"
            p = run(ZTRAIN, "tokenize", big_txt, out, "--tokenizer", path)
            del os.environ["ZT_TEST_TOKENIZE_PIECE"]
            with open(big_txt, newline="") as f:
                want = tok.encode(f.read(), add_special_tokens=False).ids + [eot]
            same(f"{name} ztrain tokenize in pieces", read_bin(out)[0], want)
            assert "tokenize:" in p.stderr and "MB/s" in p.stderr, p.stderr


def spm(tmp):
    import sentencepiece as sp
    train_txt = os.path.join(tmp, "train.txt")
    with open(train_txt, "w") as f:
        f.write(corpus(20000, 3) + TEST_TEXT.replace("<|endoftext|>", ""))
    test_txt = os.path.join(tmp, "test.txt")
    with open(test_txt, "w", newline="") as f:
        f.write(TEST_TEXT)
    model, out = os.path.join(tmp, "m.model"), os.path.join(tmp, "train.bin")
    p = run(ZTRAIN, "tokenize", train_txt, out, "--train-vocab", "500", "--tokenizer-out", model)
    proc = sp.SentencePieceProcessor(model_file=model)
    # byte fallback: a piece for every byte; BPE: merged pieces scored by
    # minus their rank (a unigram model's scores are log probabilities)
    assert all(proc.is_byte(proc.piece_to_id("<0x%02X>" % b)) for b in range(256))
    merged = [i for i in range(proc.get_piece_size())
              if not (proc.is_byte(i) or proc.is_control(i) or proc.is_unknown(i))]
    assert all(proc.get_score(i) == int(proc.get_score(i)) for i in merged[:100]), "not BPE"
    assert f"(vocab {proc.get_piece_size()}, tokenizer sentencepiece {model})" in p.stdout, p.stdout
    with open(train_txt, newline="") as f:
        same("spm ztrain tokenize (trained)", read_bin(out)[0], proc.encode(f.read()) + [proc.eos_id()])
    kind, vocab, eos, ids, back = zt_ids(model, test_txt)
    assert (kind, vocab, eos) == ("sentencepiece", proc.get_piece_size(), proc.eos_id())
    same("spm tokenizer.h", ids, proc.encode(TEST_TEXT))
    check("spm decode", back, TEST_TEXT)
    check("spm decode (sentencepiece's)", proc.decode(ids), TEST_TEXT)


with tempfile.TemporaryDirectory() as tmp:
    {"hf": hf, "spm": spm}[WHAT](tmp)
print(f"{'FAIL' if fails else 'ok'}: {fails} mismatches")
sys.exit(1 if fails else 0)
