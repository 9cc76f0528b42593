#!/usr/bin/env python3
"""Writes a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx) the way
Megatron-LM's tools/preprocess_data.py does (megatron/core/datasets/
indexed_dataset.py, _IndexWriter and IndexedDatasetBuilder), written from
the format's description with the standard library only, for ztrain's
tests of its reader (src/data/megatron.c).

.idx, little-endian: b"MMIDIDX\\x00\\x00", u64 version 1, u8 dtype code
(1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16), u64 sequence count
S, u64 document-index count D, i32[S] sequence lengths, i64[S] sequence
byte offsets into .bin (each sequence right after the one before), i64[D]
document indices: 0, then after each document the number of sequences
written so far. .bin: the tokens of every sequence, back to back.

Usage: megatron_idx.py PREFIX CODE DOC [DOC...] [--corrupt KIND] [--scatter]
  DOC: a document, its sequences separated by '/', tokens by ','
       ("1,2,3/4,5" is one document of two sequences)
  KIND: magic, version, dtype, pointer, truncated, docs — one defect each
  --scatter: the sequences stored in .bin in reverse order (the pointers
       say where), which Megatron never writes but its format allows
"""
import struct
import sys

FORMATS = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 6: "d", 7: "f", 8: "H"}


def main(argv):
    corrupt = None
    if "--corrupt" in argv:
        i = argv.index("--corrupt")
        corrupt = argv[i + 1]
        del argv[i:i + 2]
    scatter = "--scatter" in argv
    if scatter:
        argv.remove("--scatter")
    prefix, code, docs = argv[0], int(argv[1]), argv[2:]
    fmt = FORMATS[code]
    size = struct.calcsize(fmt)
    seqs, doc_idx = [], [0]
    for doc in docs:
        for seq in doc.split("/"):
            seqs.append(struct.pack("<%d%s" % (seq.count(",") + 1 if seq else 0, fmt),
                                    *[int(t) for t in seq.split(",") if t != ""]))
        doc_idx.append(len(seqs))
    lengths = [len(b) // size for b in seqs]
    pointers, at = [0] * len(seqs), 0
    with open(prefix + ".bin", "wb") as b:
        for i in (reversed(range(len(seqs))) if scatter else range(len(seqs))):
            pointers[i] = at
            b.write(seqs[i])
            at += len(seqs[i])
    if corrupt == "pointer":  # the last sequence runs past the end of .bin
        pointers[-1] += size
    if corrupt == "docs":
        doc_idx[-1] += 1
    head = b"MMIDIDX\x00\x00"
    if corrupt == "magic":
        head = b"MMIDIDY\x00\x00"
    idx = head + struct.pack("<Q", 2 if corrupt == "version" else 1)
    idx += struct.pack("<B", 7 if corrupt == "dtype" else code)
    idx += struct.pack("<QQ", len(lengths), len(doc_idx))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_idx), *doc_idx)
    if corrupt == "truncated":
        idx = idx[:-5]
    with open(prefix + ".idx", "wb") as f:
        f.write(idx)


if __name__ == "__main__":
    main(sys.argv[1:])
