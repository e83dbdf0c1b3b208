#!/usr/bin/env python3
"""The prompt-response eval loss against transformers.

  sft_eval_ref.py make HF_DIR            a random untied Llama (vocab 256, fp32) saved there
  sft_eval_ref.py loss HF_DIR FILE.bin T WINDOWS
                                         transformers' token-weighted loss over the first
                                         WINDOWS windows of seq_len T of the token file, with
                                         labels -100 where the loss-mask bit is 0: what
                                         `shardlm eval` must print for that file
A window is tokens [wT, wT + T] (T + 1 of them, io/tokens.h and src/data/data_loader.h); the
model reads its first T + 1 tokens and labels j = 1..T are token j or -100, so the loss
covers exactly the targets shardlm trains (the last input only predicts what nobody scores).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sft_data  # noqa: E402


def make(d):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      initializer_range=0.2)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(d, safe_serialization=True)


def loss(d, path, T, windows):
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    h, ids, trained, doc = sft_data.read(path)
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(windows):
            x = ids[w * T:w * T + T + 1]
            labels = [-100] + [x[j] if trained[w * T + j] else -100 for j in range(1, T + 1)]
            out = model(torch.tensor([x]), labels=torch.tensor([labels]))
            n = sum(1 for v in labels[1:] if v >= 0)
            if n:
                total += out.loss.item() * n
                count += n
    print("%.6f %d" % (total / count, count))


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"] and len(sys.argv) == 3:
        make(sys.argv[2])
    elif sys.argv[1:2] == ["loss"] and len(sys.argv) == 6:
        loss(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        print(__doc__)
        sys.exit(2)
