#!/usr/bin/env python3
"""Writes the demo corpus and its token files: examples/make_demo_data.py DIR.

The text is generated here from a small grammar (seeded, so every machine
gets the same bytes): no download and no third-party prose. It has enough
structure for a small byte-level model to learn within a minute — spelling,
word order, agreement between a count and a plural, sums that add up — so the
demo's falling loss means something. Then `ztrain tokenize` turns it into
DIR/demo_train.bin and DIR/demo_val.bin.

It also writes more of the same text (another seed) as a Megatron-LM
indexed dataset, DIR/demo_docs.bin + DIR/demo_docs.idx, one paragraph per
document, byte tokens as uint16: what Megatron's preprocess_data.py would
give with a byte tokenizer, for the README's blend of two sources.
"""
import array
import os
import random
import struct
import subprocess
import sys

NAMES = ["Ada", "Bram", "Cleo", "Dara", "Emil", "Fenna", "Gus", "Hana", "Ivo", "Juno"]
ANIMALS = ["fox", "heron", "otter", "badger", "lynx", "wren", "seal", "moth"]
COLOURS = ["red", "grey", "green", "amber", "white", "black", "blue"]
PLACES = ["the harbour", "the old mill", "the north field", "the river bank",
          "the market", "the hill", "the quiet wood", "the station"]
THINGS = ["apple", "stone", "lamp", "book", "coin", "shell", "kite", "bell"]
VERBS = [("sees", "saw"), ("finds", "found"), ("follows", "followed"),
         ("paints", "painted"), ("counts", "counted"), ("carries", "carried")]
WEATHER = ["rain", "fog", "sun", "wind", "snow"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def plural(n, word):
    return f"{NUMBERS[n - 1]} {word}" + ("" if n == 1 else "s")


def sentence(r):
    kind = r.randrange(6)
    name = r.choice(NAMES)
    if kind == 0:
        present, past = r.choice(VERBS)
        tense = present if r.random() < 0.5 else past
        return f"{name} {tense} a {r.choice(COLOURS)} {r.choice(ANIMALS)} near {r.choice(PLACES)}."
    if kind == 1:
        n = r.randint(1, 9)
        return f"{name} has {plural(n, r.choice(THINGS))}."
    if kind == 2:
        a, b = r.randint(0, 49), r.randint(0, 49)
        return f"{a} plus {b} is {a + b}."
    if kind == 3:
        return f"In the morning there was {r.choice(WEATHER)} over {r.choice(PLACES)}."
    if kind == 4:
        other = r.choice([n for n in NAMES if n != name])
        return f"{name} gave {other} a {r.choice(THINGS)}, and {other} said thank you."
    animal = r.choice(ANIMALS)
    return f"The {animal} is {r.choice(COLOURS)}. The {animal} lives by {r.choice(PLACES)}."


def corpus(seed=1, paragraphs=3000):
    r = random.Random(seed)
    return "\n\n".join(" ".join(sentence(r) for _ in range(r.randint(3, 7)))
                       for _ in range(paragraphs)) + "\n"


def write_megatron(prefix, docs):
    """PREFIX.bin/.idx in Megatron's MMapIndexedDataset layout (version 1):
    each document one sequence of uint16 tokens (dtype code 8)."""
    lens = [len(d) for d in docs]
    with open(prefix + ".bin.tmp", "wb") as f:
        for d in docs:
            array.array("H", d).tofile(f)
    with open(prefix + ".idx.tmp", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        array.array("i", lens).tofile(f)
        ptrs, at = [], 0
        for n in lens:
            ptrs.append(at)
            at += 2 * n
        array.array("q", ptrs).tofile(f)
        array.array("q", range(len(docs) + 1)).tofile(f)
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    text_path = os.path.join(out, "demo.txt")
    with open(text_path + ".tmp", "w") as f:
        f.write(corpus())
    os.replace(text_path + ".tmp", text_path)
    docs = corpus(seed=2, paragraphs=1000).strip("\n").split("\n\n")
    write_megatron(os.path.join(out, "demo_docs"), [list((d + "\n\n").encode()) for d in docs])
    ztrain = os.environ.get("ZTRAIN", os.path.join(os.path.dirname(__file__), "..", "build", "ztrain"))
    return subprocess.call([ztrain, "tokenize", text_path, os.path.join(out, "demo_train.bin"),
                            "--val", os.path.join(out, "demo_val.bin"), "--val-fraction", "0.05"])


if __name__ == "__main__":
    sys.exit(main())
