#!/usr/bin/env python3
"""The reference side of tests/qlora_peft_ref.sh (transformers, PEFT and bitsandbytes:
references nobody here wrote).

  qlora_peft_ref.py WORK VAL.bin

Saves a tiny random LlamaForCausalLM with transformers' save_pretrained into WORK/base (fp32;
hidden 40 and intermediate 100, so that k_proj (20 x 40) and the MLP's matrices (100 x 40)
end in a partial block of 64 values), and a PEFT adapter of it (get_peft_model, r 4 / alpha 8
on all seven projections, A and B random non-zero) into WORK/peft. Then prints the fp32 loss
of base + adapter over VAL's windows of 256 tokens (window w: tokens 256w .. 256w + 256, as
shardlm cuts them), one line each:
  loss fp32 L      the base as saved
  loss plain L     every projection weight W replaced by bitsandbytes'
                   dequantize_4bit(quantize_4bit(W, blocksize=64, quant_type="nf4"))
  loss dq L        the same with compress_statistics=True (double quant)
  ids dq I...      and its 8 greedy tokens after the prompt 5 6 ... 12 (generate)
"""
import os
import struct
import sys

import torch
import torch.nn.functional as F
import bitsandbytes.functional as bnb
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
T = 256
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def read_ids(path):
    raw = open(path, "rb").read()
    width, n = struct.unpack("<I", raw[12:16])[0], struct.unpack("<Q", raw[16:24])[0]
    return struct.unpack(f"<{n}{'I' if width == 4 else 'H'}", raw[96:96 + n * width])


def loss(model, ids):
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range((len(ids) - 1) // T):
            x = torch.tensor(ids[w * T:w * T + T + 1])[None]
            logits = model(x[:, :-1]).logits[0].double()
            total += F.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += T
    return total / count


def main(work, val):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=40, intermediate_size=100, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.6,
                      bos_token_id=1, eos_token_id=2)
    base = os.path.join(work, "base")
    LlamaForCausalLM(cfg).float().save_pretrained(base)
    peft_dir = os.path.join(work, "peft")
    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=PROJ,
                                            lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    peft.save_pretrained(peft_dir)

    ids = read_ids(val)
    for case, dq in (("fp32", None), ("plain", False), ("dq", True)):
        m = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
        if dq is not None:
            with torch.no_grad():
                for name, mod in m.named_modules():
                    if name.split(".")[-1] in PROJ:
                        w = mod.weight.data.contiguous()
                        q, state = bnb.quantize_4bit(w, blocksize=64, quant_type="nf4",
                                                     compress_statistics=dq)
                        mod.weight.copy_(bnb.dequantize_4bit(q, state).reshape(w.shape))
        m = PeftModel.from_pretrained(m, peft_dir).eval()
        print(f"loss {case} {loss(m, ids):.9g}", flush=True)
        if case == "dq":
            with torch.no_grad():
                out = m.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=8,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            print(f"ids {case}", *(int(v) for v in out[0, len(PROMPT):]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
