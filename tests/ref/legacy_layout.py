#!/usr/bin/python3
"""Rewrite a ztrain checkpoint in HDF5's earliest file format.

    legacy_layout.py IN.h5 OUT.h5

ztrain writes HDF5 1.10's file format (superblock v3, object headers v2),
whose metadata carries checksums. Checkpoints written before that use the
earliest format (superblock v0, object headers v1, no metadata checksums),
and ztrain must keep loading them. This writes such a file with the same
content: root attributes, /script, every tensor with its attributes, and
/optim/master as hard links to /model. h5py cannot copy objects down to
older message versions, so every dataset is created anew.
"""
import sys

import h5py


def put(dst, name, ds):
    d = dst.create_dataset(name, data=ds[...], dtype=ds.dtype)
    for k, v in ds.attrs.items():
        d.attrs.create(k, v, dtype=ds.attrs.get_id(k).dtype)


def main(src_path, dst_path):
    with h5py.File(src_path, "r") as src, \
            h5py.File(dst_path, "w", libver=("earliest", "v108")) as dst:
        for k, v in src.attrs.items():
            dst.attrs.create(k, v, dtype=src.attrs.get_id(k).dtype)
        put(dst, "script", src["script"])
        for g in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            grp = dst.create_group(g)
            for k in src[g]:
                put(grp, k, src[g][k])
        master = dst.create_group("optim/master")
        for k in dst["model"]:
            master[k] = dst["model/" + k]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
