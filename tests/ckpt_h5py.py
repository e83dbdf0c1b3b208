#!/usr/bin/env python3
"""Reads a shardlm checkpoint with h5py alone (tests/ckpt_h5py.sh): every tensor under its
Hugging Face name and shape in /model, /optim/exp_avg and /optim/exp_avg_sq, as float32,
and every dataset's checksum recomputed from the documented formula (io/ckpt_hdf5.h).

usage: ckpt_h5py.py CHECKPOINT.h5    exit 0 ok, 1 wrong, 77 no h5py/numpy here
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # the test is skipped, not failed, where h5py is missing
    print(f"ckpt_h5py: SKIP: {e}")
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
    w = np.ascontiguousarray(a, dtype="<f4").reshape(-1).view("<u4").astype(np.uint64)
    with np.errstate(over="ignore"):
        s1 = int(w.sum(dtype=np.uint64))
        s2 = int((np.arange(w.size, dtype=np.uint64) * w).sum(dtype=np.uint64))
    return mix(s1 ^ mix((s2 + w.size) & M64))


def hf_names(L):
    names = {"model.embed_tokens.weight": ("V", "d"), "model.norm.weight": ("d",),
             "lm_head.weight": ("V", "d")}
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
        names = hf_names(int(a["model.n_layers"]))
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
        print(f"ckpt_h5py: read {n} datasets under their HF names and shapes; every checksum "
              f"recomputed from the documented formula {'matches' if not bad else 'FAILED'}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
