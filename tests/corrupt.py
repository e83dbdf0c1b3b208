#!/usr/bin/env python3
"""Edits a shardlm checkpoint (h5py) or a safetensors file (plain Python) the way a careless
user, a bad disk or a hostile file would, for the tests of what shardlm refuses
(tests/ckpt_metadata.sh, tests/train_nonfinite.sh, tests/ckpt_hf.sh). Each command edits
FILE in place. "restamp" recomputes the state checksum (tests/ckpt_h5py.py's formula), so
that a range check, not the checksum, is what has to catch an edit.

  corrupt.py attr FILE NAME VALUE [restamp]    set a root attribute, keeping its type
                                               (VALUE: an integer, a float, nan, or text)
  corrupt.py attr-float FILE NAME VALUE        replace it by a float attribute
  corrupt.py attr-int FILE NAME VALUE          replace it by an int64 attribute
  corrupt.py v1 FILE                           make it a format-1 file (no state checksum)
  corrupt.py v2 FILE                           make it a format-2 file (untied, no
                                               model.tie_word_embeddings), restamped
  corrupt.py v3 FILE                           make it a format-3 file (no data.train
                                               attributes, no model.family nor a [model]
                                               key added since), restamped
  corrupt.py v4 FILE                           make it a format-4 file (no RoPE scaling
                                               keys: model.rope_type and its parameters;
                                               no data.train_sources; no lora.*
                                               attributes), restamped
  corrupt.py v5 FILE                           make it a format-5 file (no lora.alpha,
                                               lora.rslora, lora.dropout), restamped
  corrupt.py restamp FILE                      recompute the state checksum
  corrupt.py poison FILE DATASET               element 0 = NaN, checksums recomputed
  corrupt.py reshape FILE DATASET N            a 1-D dataset of N zeros instead, checksums ok
  corrupt.py soft|hard FILE DATASET TARGET     DATASET becomes a soft / hard link to TARGET
  corrupt.py external FILE DATASET OTHER PATH  DATASET becomes a link to PATH in file OTHER
  corrupt.py swap FILE A B                     datasets A and B exchange names
  corrupt.py st-poison FILE TENSOR             safetensors: element 0 of TENSOR = NaN
  corrupt.py st-add FILE TENSOR N              safetensors: an extra F32 tensor [N] of zeros
  corrupt.py st-reshape FILE TENSOR N          safetensors: TENSOR becomes F32 [N] zeros
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def h5():
    import h5py  # only the checkpoint commands need it
    import numpy as np
    return h5py, np


# the state attributes of format 4 (the training file)
DATA_ATTRS = ("data.train", "data.train_bytes", "data.train_fingerprint", "data.train_sources")
# the state attributes of LoRA's scale and dropout (format 6)
FORMAT6_ATTRS = ("lora.alpha", "lora.rslora", "lora.dropout")
# the state attributes of LoRA's adapters and base (format 5), and format 6's
LORA_ATTRS = ("lora.rank", "lora.targets", "lora.dora", "lora.base",
              "lora.base_fingerprint") + FORMAT6_ATTRS
# what format 5 added: a data.train mixture's sources, LoRA's attributes
FORMAT5_ATTRS = ("data.train_sources",) + LORA_ATTRS
# the [model] keys a format-3 file holds (the Llama shape; format 2 without the last)
FORMAT3_MODEL_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                      "vocab_size", "max_seq_len", "norm_eps", "rope_theta", "init_std",
                      "tie_word_embeddings")
# the [model] keys added in format 5 (RoPE scaling)
FORMAT5_MODEL_KEYS = ("rope_type", "rope_factor", "rope_low_freq_factor",
                      "rope_high_freq_factor", "rope_original_max_position_embeddings")


def model_attrs_after(f, version):
    """The model.* attributes of f that a file of format `version` (1 to 3) did not hold:
    model.family and every [model] key added since."""
    keys = FORMAT3_MODEL_KEYS if version == 3 else FORMAT3_MODEL_KEYS[:-1]
    return tuple(n for n in f.attrs if n.startswith("model.") and n[6:] not in keys)


def restamp(f):
    from ckpt_h5py import state_checksum
    f.attrs.modify("state_checksum", __import__("numpy").uint64(state_checksum(f)))


def parse(value):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def st_read(path):
    with open(path, "rb") as fp:
        raw = fp.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
               for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])}
    return tensors, meta


def st_write(path, tensors, meta):
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fp:
        fp.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(argv):
    cmd, path, args = argv[1], argv[2], argv[3:]
    if cmd.startswith("st-"):
        tensors, meta = st_read(path)
        name = args[0]
        if cmd == "st-poison":
            dtype, shape, blob = tensors[name]
            assert dtype == "F32", dtype
            tensors[name] = (dtype, shape, struct.pack("<f", float("nan")) + blob[4:])
        elif cmd in ("st-add", "st-reshape"):
            n = int(args[1])
            tensors[name] = ("F32", [n], b"\0" * (4 * n))
        st_write(path, tensors, meta)
        return 0
    h5py, np = h5()
    from ckpt_h5py import checksum
    with h5py.File(path, "r+") as f:
        if cmd == "attr":
            value = parse(args[1])
            old = f.attrs[args[0]]
            f.attrs.modify(args[0], np.array(value).astype(np.asarray(old).dtype)
                           if not isinstance(value, str) else np.bytes_(value))
            if args[2:] == ["restamp"]:
                restamp(f)
        elif cmd in ("attr-float", "attr-int"):
            del f.attrs[args[0]]
            f.attrs[args[0]] = np.float64(args[1]) if cmd == "attr-float" else np.int64(args[1])
        elif cmd == "v1":
            for name in ("state_checksum", "state_checksum_text", "state_attributes",
                         "skipped_in_a_row", "lr_decay_from", "lr_decay_lr") + DATA_ATTRS + LORA_ATTRS + \
                    model_attrs_after(f, 1):
                del f.attrs[name]
            f.attrs.modify("format_version", np.int64(1))
        elif cmd in ("v2", "v3", "v4", "v5"):
            gone = (FORMAT6_ATTRS if cmd == "v5"
                    else FORMAT5_ATTRS + tuple("model." + k for k in FORMAT5_MODEL_KEYS) if cmd == "v4"
                    else DATA_ATTRS + LORA_ATTRS + model_attrs_after(f, int(cmd[1])))
            for name in gone:
                del f.attrs[name]
            names = f.attrs["state_attributes"].decode().split()
            f.attrs["state_attributes"] = np.bytes_(" ".join(n for n in names if n not in gone))
            f.attrs.modify("format_version", np.int64(int(cmd[1])))
            restamp(f)
        elif cmd == "restamp":
            restamp(f)
        elif cmd == "poison":
            d = f[args[0]]
            x = d[...]
            x.reshape(-1)[0] = np.nan
            d[...] = x
            d.attrs.modify("checksum", np.uint64(checksum(x)))
            restamp(f)
        elif cmd == "reshape":
            del f[args[0]]
            x = np.zeros(int(args[1]), dtype="<f4")
            d = f.create_dataset(args[0], data=x)
            d.attrs["checksum"] = np.uint64(checksum(x))
            restamp(f)
        elif cmd == "soft":
            del f[args[0]]
            f[args[0]] = h5py.SoftLink(args[1])
        elif cmd == "hard":
            del f[args[0]]
            f[args[0]] = f[args[1]]
        elif cmd == "external":
            del f[args[0]]
            f[args[0]] = h5py.ExternalLink(args[1], args[2])
        elif cmd == "swap":
            f.move(args[0], args[0] + ".swap")
            f.move(args[1], args[0])
            f.move(args[0] + ".swap", args[1])
        else:
            print(__doc__)
            return 2
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv))
