#!/usr/bin/env python3
"""The PEFT side of tests/lora_peft_ref.sh (Hugging Face PEFT and transformers: references
nobody here wrote). Makes PEFT adapters of the model SOURCE with get_peft_model, their A, B
(and DoRA's magnitudes) set to random non-zero values, saves each with save_pretrained into
OUT/NAME, and prints its fp32 CPU loss on the token file's ids as one sequence:
  loss NAME N LOSS
    lora_peft_ref.py SOURCE TOKENS.bin OUT
"""
import os
import sys

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sft_data  # noqa: E402

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name: LoraConfig arguments
CASES = {
    "r8_all": dict(r=8, lora_alpha=16, target_modules=ALL),
    "r4_rslora_qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True),
    "dora_r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "o_proj", "down_proj"],
                    use_dora=True),
}


def load(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    return model


def main(source, tokens, out):
    ids = torch.tensor(np.array(sft_data.read(tokens)[1], dtype=np.int64))[None]
    for k, (name, args) in enumerate(CASES.items()):
        torch.manual_seed(1234 + k)
        peft = get_peft_model(load(source), LoraConfig(lora_dropout=0.0, task_type="CAUSAL_LM",
                                                        **args))
        with torch.no_grad():
            for pname, p in peft.named_parameters():
                # B zero and A kaiming would make a no-op adapter: every value random and
                # large enough to move the loss; DoRA's magnitudes near the row norms
                if "lora_A" in pname or "lora_B" in pname:
                    p.copy_(torch.randn_like(p) * 0.05)
                elif "lora_magnitude_vector" in pname:
                    p.mul_(1 + 0.1 * torch.randn_like(p))
        peft.eval()
        peft.save_pretrained(os.path.join(out, name))
        with torch.no_grad():
            loss = peft(input_ids=ids, labels=ids).loss.item()
        print(f"loss {name} {ids.shape[1] - 1} {loss:.9g}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
