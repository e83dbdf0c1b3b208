#!/usr/bin/env python3
"""Whether two shardlm checkpoints hold the same bytes, read by h5py alone: the same groups
and datasets, every dataset's dtype, shape and bytes, every attribute of every object.
Two attributes may differ by what they are: `created_utc` (when the save ran) and
`job_text`, whose `--set KEY=...` lines for the keys given with --key may differ (the
two runs' jobs differ only there). Prints what differs and exits 1, else prints what it
compared and exits 0.
    ckpt_same.py A.h5 B.h5 [--key checkpoint.async]...
"""
import sys

import h5py
import numpy as np


def job_text(v, keys):
    lines = bytes(v).decode().split("\n")
    return [l for l in lines if not any(l.startswith("--set %s=" % k) for k in keys)]


def attrs_differ(path, a, b, keys, out):
    if sorted(a.attrs.keys()) != sorted(b.attrs.keys()):
        out.append("%s: attribute names %s vs %s" % (path, sorted(a.attrs), sorted(b.attrs)))
        return
    for name in a.attrs:
        if name == "created_utc":
            continue
        va, vb = a.attrs[name], b.attrs[name]
        if name == "job_text":
            same = job_text(va, keys) == job_text(vb, keys)
        else:
            na, nb = np.asarray(va), np.asarray(vb)
            same = na.dtype == nb.dtype and na.shape == nb.shape and na.tobytes() == nb.tobytes()
        if not same:
            out.append("%s: attribute %s differs: %r vs %r" % (path, name, va, vb))


def main():
    args = sys.argv[1:]
    keys = [args[i + 1] for i, a in enumerate(args) if a == "--key"]
    files = [a for i, a in enumerate(args) if a != "--key" and (i == 0 or args[i - 1] != "--key")]
    if len(files) != 2:
        sys.exit("usage: ckpt_same.py A.h5 B.h5 [--key KEY]...")
    fa, fb = h5py.File(files[0], "r"), h5py.File(files[1], "r")
    out = []
    names = {}
    for f, tag in ((fa, 0), (fb, 1)):
        seen = []
        f.visit(seen.append)
        names[tag] = sorted(seen)
    if names[0] != names[1]:
        out.append("objects differ: only in A %s, only in B %s" %
                   (sorted(set(names[0]) - set(names[1])), sorted(set(names[1]) - set(names[0]))))
    n_ds = n_bytes = 0
    attrs_differ("/", fa, fb, keys, out)
    for name in names[0]:
        if name not in names[1]:
            continue
        a, b = fa[name], fb[name]
        if isinstance(a, h5py.Dataset) != isinstance(b, h5py.Dataset):
            out.append("%s: a dataset in one file only" % name)
            continue
        attrs_differ(name, a, b, keys, out)
        if isinstance(a, h5py.Dataset):
            da, db = a[()], b[()]
            if a.dtype != b.dtype or a.shape != b.shape or da.tobytes() != db.tobytes():
                out.append("%s: data differ (%s %s vs %s %s)" % (name, a.dtype, a.shape, b.dtype, b.shape))
            n_ds += 1
            n_bytes += da.nbytes
    for line in out:
        print("ckpt_same: " + line)
    if out:
        return 1
    print("ckpt_same: %s and %s: %d datasets (%d bytes) and every attribute equal" %
          (files[0], files[1], n_ds, n_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
