#!/usr/bin/env python3
"""The Hugging Face side of tests/lora_export.sh (transformers and PEFT: references nobody
here wrote).

  lora_export.py make BASE OTHER      two random tiny Llamas (vocab 256, fp32, untied) saved
                                      by transformers: the base and another one
  lora_export.py check BASE VAL T NAME:ADAPTER:MERGED...
                                      for each case, one line each:
    loss NAME peft L        PeftModel.from_pretrained(BASE, ADAPTER), fp32
    loss NAME merged L      AutoModelForCausalLM.from_pretrained(MERGED), fp32
    keys NAME ok|WHY        ADAPTER's tensors against what PEFT's own save_pretrained writes
                            for its adapter_config.json (names, shapes, fp32)
    merge NAME D TENSOR     MERGED's tensors against PEFT's merge_and_unload of ADAPTER into
                            BASE: D the largest |difference| over the tensor's largest
                            |value|, TENSOR the tensor where it is; and the largest change
                            the merge made to any adapted weight, the same way: "moved M T"
L is the mean loss over the windows of T tokens of the token file VAL as `shardlm eval`
cuts them (window w: tokens wT .. wT + T, the last one scored).
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F


def make(base, other):
    from transformers import LlamaConfig, LlamaForCausalLM
    for seed, d in ((7, base), (8, other)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                          tie_word_embeddings=False, initializer_range=0.2)
        LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(d, safe_serialization=True)


def token_ids(path):
    raw = open(path, "rb").read()
    width, n = struct.unpack("<I", raw[12:16])[0], struct.unpack("<Q", raw[16:24])[0]
    return struct.unpack(f"<{n}{'I' if width == 4 else 'H'}", raw[96:96 + n * width])


def mean_loss(model, ids, T):
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range((len(ids) - 1) // T):
            x = torch.tensor(ids[w * T:w * T + T + 1])[None]
            logits = model(x[:, :-1]).logits[0].double()
            total += F.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += T
    return total / count


def key_problem(base, adapter):
    """What differs between ADAPTER's tensors and PEFT's own save for its config, or None."""
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    conf = json.load(open(os.path.join(adapter, "adapter_config.json")))
    args = {k: conf[k] for k in ("r", "lora_alpha", "lora_dropout", "target_modules",
                                 "use_rslora", "use_dora")}
    ref_dir = adapter + ".peft-own"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **args)).save_pretrained(ref_dir)

    def tensors(d):
        with safe_open(os.path.join(d, "adapter_model.safetensors"), "pt") as f:
            return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                    for k in f.keys()}
    mine, ref = tensors(adapter), tensors(ref_dir)
    if mine != ref:
        extra = sorted(set(mine) - set(ref))[:2]
        missing = sorted(set(ref) - set(mine))[:2]
        shape = sorted(k for k in set(mine) & set(ref) if mine[k] != ref[k])[:1]
        return (f"not PEFT's tensors: extra {extra}, missing {missing}, differing " +
                ", ".join(f"{k} {mine[k]} vs PEFT's {ref[k]}" for k in shape))
    return None


def check(base, val, T, cases):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    ids = token_ids(val)

    def load(d):
        return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                    attn_implementation="eager").eval()
    for case in cases:
        name, adapter, merged = case.split(":")
        peft = PeftModel.from_pretrained(load(base), adapter).eval()
        print(f"loss {name} peft {mean_loss(peft, ids, T):.9g}", flush=True)
        print(f"loss {name} merged {mean_loss(load(merged), ids, T):.9g}", flush=True)
        why = key_problem(base, adapter)
        print(f"keys {name} {why or 'ok'}", flush=True)
        ref = peft.merge_and_unload().state_dict()
        orig = load(base).state_dict()
        mine = load(merged).state_dict()
        worst, moved = (0.0, ""), (0.0, "")
        for k, v in ref.items():
            scale = v.abs().max().item()
            d = (mine[k] - v).abs().max().item() / scale
            m = (orig[k] - v).abs().max().item() / scale
            worst, moved = max(worst, (d, k)), max(moved, (m, k))
        print(f"merge {name} {worst[0]:.3e} {worst[1]}", flush=True)
        print(f"moved {name} {moved[0]:.3e} {moved[1]}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"] and len(sys.argv) == 4:
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["check"] and len(sys.argv) >= 6:
        check(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    else:
        print(__doc__)
        sys.exit(2)
