#!/usr/bin/env python3
"""Reads a shardlm checkpoint with h5py alone (tests/ckpt_h5py.sh): every tensor under its
Hugging Face name and shape in /model, /optim/exp_avg and /optim/exp_avg_sq, as float32,
every dataset's checksum recomputed from the documented formula (io/ckpt_hdf5.h), and the
state checksum from the text of the attribute state_checksum_text (src/ckpt/state.c).

usage: ckpt_h5py.py CHECKPOINT.h5    exit 0 ok, 1 wrong, 77 no h5py/numpy here
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # the test is skipped, not failed, where h5py is missing
    print(f"SKIP: {e}")
    sys.exit(77)

M64 = (1 << 64) - 1


def mix(x):
    """splitmix64's finaliser, as io/ckpt_hdf5.c's ckpt_h5_mix."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def checksum(a):
    """sum64-pos of a float32 array in row-major order."""
    return words_checksum(np.ascontiguousarray(a, dtype="<f4").reshape(-1).view("<u4"))


def words_checksum(w):
    """sum64-pos of an array of 32-bit words (the datasets' checksum, before the view)."""
    w = w.astype(np.uint64)
    with np.errstate(over="ignore"):
        s1 = int(w.sum(dtype=np.uint64))
        s2 = int((np.arange(w.size, dtype=np.uint64) * w).sum(dtype=np.uint64))
    return mix(s1 ^ mix((s2 + w.size) & M64))


def state_checksum(f):
    """The state checksum from its documentation (attribute state_checksum_text): a line
    NAME=VALUE per attribute listed in state_attributes, then 'PATH SHAPE CHECKSUM' per
    dataset in byte order of the paths, as 32-bit little-endian words, zero-padded."""
    lines = []
    for name in f.attrs["state_attributes"].decode().split():
        v = f.attrs[name]
        if isinstance(v, bytes):
            text = v.decode()
        elif np.issubdtype(np.asarray(v).dtype, np.floating):
            text = "%016x" % int(np.array(v, dtype="<f8").view("<u8"))
        else:
            text = str(int(v))
        lines.append(f"{name}={text}\n")
    groups = ("model", "optim/exp_avg", "optim/exp_avg_sq") + (("hf",) if "hf" in f else ())
    paths = [f"/{g}/{n}" for g in groups for n in f[g]]
    for p in sorted(paths):
        d = f[p]
        lines.append(f"{p} {'x'.join(str(n) for n in d.shape)} {int(d.attrs['checksum']):016x}\n")
    raw = "".join(lines).encode()
    raw += b"\0" * (-len(raw) % 4)
    return words_checksum(np.frombuffer(raw, dtype="<u4"))


def bytes_checksum(raw):
    """A byte dataset's checksum: its bytes zero-padded to 32-bit little-endian words."""
    raw = bytes(raw) + b"\0" * (-len(raw) % 4)
    return words_checksum(np.frombuffer(raw, dtype="<u4"))


def hf_names(L, tied):
    names = {"model.embed_tokens.weight": ("V", "d"), "model.norm.weight": ("d",)}
    if not tied:  # tied embeddings: the output projection is the embedding, stored once
        names["lm_head.weight"] = ("V", "d")
    for l in range(L):
        p = f"model.layers.{l}."
        names[p + "input_layernorm.weight"] = ("d",)
        names[p + "post_attention_layernorm.weight"] = ("d",)
        names[p + "self_attn.q_proj.weight"] = ("q", "d")
        names[p + "self_attn.k_proj.weight"] = ("kv", "d")
        names[p + "self_attn.v_proj.weight"] = ("kv", "d")
        names[p + "self_attn.o_proj.weight"] = ("d", "q")
        names[p + "mlp.gate_proj.weight"] = ("F", "d")
        names[p + "mlp.up_proj.weight"] = ("F", "d")
        names[p + "mlp.down_proj.weight"] = ("d", "F")
    return names


def main(path):
    bad = 0
    with h5py.File(path, "r") as f:
        a = f.attrs
        dims = {"d": int(a["model.dim"]), "V": int(a["model.vocab_size"]),
                "F": int(a["model.ffn_dim"]),
                "q": int(a["model.n_heads"]) * int(a["model.head_dim"]),
                "kv": int(a["model.n_kv_heads"]) * int(a["model.head_dim"])}
        names = hf_names(int(a["model.n_layers"]), int(a.get("model.tie_word_embeddings", 0)))
        print(f"ckpt_h5py: {path}: step {int(a['step'])}, tokens {int(a['tokens_seen'])}, "
              f"saved by {int(a['world_size'])} ranks {a['fsdp.strategy'].decode()}, "
              f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version})")
        n = 0
        for group in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            g = f[group]
            if set(g.keys()) != set(names):
                print(f"ckpt_h5py: FAIL: /{group} holds {sorted(set(g.keys()) ^ set(names))} "
                      "beyond or short of the HF names")
                bad += 1
            for name, shape in names.items():
                d = g.get(name)
                want = tuple(dims[s] for s in shape)
                if d is None or d.shape != want or d.dtype != np.float32:
                    print(f"ckpt_h5py: FAIL: /{group}/{name}: "
                          f"{None if d is None else (d.shape, d.dtype)}, want {want} float32")
                    bad += 1
                    continue
                x = d[...]
                if checksum(x) != int(d.attrs["checksum"]):
                    print(f"ckpt_h5py: FAIL: /{group}/{name}: checksum {checksum(x):#018x} "
                          f"!= stored {int(d.attrs['checksum']):#018x}")
                    bad += 1
                if not np.isfinite(x).all():
                    print(f"ckpt_h5py: FAIL: /{group}/{name} holds non-finite values")
                    bad += 1
                n += 1
        for name in (f["hf"] if "hf" in f else ()):  # Hugging Face files kept for export
            d = f["hf"][name]
            if d.dtype != np.uint8 or bytes_checksum(d[...].tobytes()) != int(d.attrs["checksum"]):
                print(f"ckpt_h5py: FAIL: /hf/{name}: {d.dtype}, checksum does not match")
                bad += 1
            n += 1
        got, stored = state_checksum(f), int(a["state_checksum"])
        if got != stored:
            print(f"ckpt_h5py: FAIL: state checksum {got:#018x} != stored {stored:#018x}")
            bad += 1
        print(f"ckpt_h5py: read {n} datasets under their HF names and shapes; every checksum "
              f"and the state checksum recomputed from the documented formulas "
              f"{'match' if not bad else 'FAILED'}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
