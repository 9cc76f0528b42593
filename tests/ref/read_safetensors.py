#!/usr/bin/env python3
"""Reads a safetensors file by the format's own rules (stdlib struct/json and
numpy, no safetensors package) and compares every tensor with the /model
tensors of the ztrain checkpoint it was exported from, as h5py reads them.

  read_safetensors.py FILE.safetensors CKPT.h5

Checks the layout (8-byte little-endian header length, JSON header padded
with spaces to a multiple of 8, data offsets that tile the data exactly,
string metadata with format "pt" and the checkpoint's step) and the values:
F32 bit for bit; BF16 bit for bit against round-to-nearest-even computed
here in float64 from the two bf16 neighbours of each value (not by the bit
trick the exporter uses). Exit 0 when everything matches."""
import json
import struct
import sys

import h5py
import numpy as np


def bf16_expected(x):
    """Nearest bf16 of each float32 (ties to even), as uint16 bit patterns."""
    u = x.reshape(-1).view("<u4").astype(np.uint64)
    lo = u & 0xFFFF0000  # toward zero: drop 16 mantissa bits
    hi = lo + 0x10000  # the next bf16 away from zero (sign-magnitude)

    def value(bits):
        b = bits.astype(np.uint32)
        v = b.view("<f4").astype(np.float64)
        # one past the largest finite bf16 reads as inf; 2^128 is its place
        over = (b & 0x7FFFFFFF) == 0x7F800000
        return np.where(over, np.copysign(2.0**128, v), v)

    x64 = x.reshape(-1).astype(np.float64)
    d_lo, d_hi = np.abs(x64 - value(lo)), np.abs(value(hi) - x64)
    even = ((lo >> 16) & 1) == 0
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(even, lo, hi)))
    return (pick >> 16).astype(np.uint16).reshape(x.shape)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, ckpt = sys.argv[1], sys.argv[2]
    blob = open(path, "rb").read()
    bad = []
    (n,) = struct.unpack("<Q", blob[:8])
    if n % 8 or 8 + n > len(blob):
        sys.exit(f"FAIL: header length {n} (file {len(blob)} bytes)")
    raw = blob[8 : 8 + n]
    text = raw.decode("utf-8")
    if len(text) - len(text.rstrip(" ")) > 7:
        bad.append("header padded with more than 7 spaces")
    header = json.loads(text)
    data = blob[8 + n :]
    meta = header.pop("__metadata__", None)
    with h5py.File(ckpt, "r") as f:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            bad.append(f"__metadata__ missing or not all strings: {meta!r}")
        else:
            if meta.get("format") != "pt":
                bad.append(f"metadata format {meta.get('format')!r}")
            if meta.get("ztrain_step") != str(int(f.attrs["step"])):
                bad.append(f"metadata ztrain_step {meta.get('ztrain_step')!r}")
        model = f["model"]
        if set(header) != set(model.keys()):
            bad.append(f"names differ: only in file {sorted(set(header) - set(model))}, "
                       f"only in checkpoint {sorted(set(model) - set(header))}")
        spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
        at = 0
        for b, e, k in spans:
            if b != at:
                bad.append(f"{k}: data starts at {b}, expected {at} (hole or overlap)")
            at = e
        if at != len(data):
            bad.append(f"offsets end at {at}, data has {len(data)} bytes")
        dtypes = set()
        for name, v in header.items():
            if name not in model:
                continue
            want = model[name][...]
            shape, dt = tuple(v["shape"]), v["dtype"]
            dtypes.add(dt)
            b, e = v["data_offsets"]
            size = {"F32": 4, "BF16": 2}.get(dt)
            if size is None or shape != want.shape or e - b != size * want.size:
                bad.append(f"{name}: dtype {dt} shape {shape} bytes {e - b}, "
                           f"checkpoint has {want.shape}")
                continue
            if dt == "F32":
                got = np.frombuffer(data[b:e], "<f4").reshape(shape)
                same = np.array_equal(got.view("<u4"), want.astype("<f4").view("<u4"))
            else:
                got = np.frombuffer(data[b:e], "<u2").reshape(shape)
                same = np.array_equal(got, bf16_expected(want.astype("<f4")))
            if not same:
                bad.append(f"{name}: values differ from the checkpoint")
    for x in bad:
        print("FAIL:", x)
    if not bad:
        print(f"{len(header)} tensors match the checkpoint ({', '.join(sorted(dtypes))})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
