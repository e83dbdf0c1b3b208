#!/usr/bin/env python3
"""The transformers side of tests/smollm2_reference.sh (references nobody here wrote), in one
process so that torch and each model load once. Prints one "KEY VALUE..." line per result:
  loss_source N LOSS        fp32 CPU loss of the token file's ids as one sequence, SOURCE
  loss_export N LOSS        the same with the export directory
  export_tied BOOL          lm_head shares the embedding's storage in the loaded export
  prompt_ids ID...          apply_chat_template of one user turn PROMPT, generation opened
  generated_ids ID...       greedy generate(max_new_tokens=N) from them, SOURCE
  tokenizer_lines N SAME    lines of the corpus files (and edge cases) that the export's
                            tokenizer.json encodes like the source's (HF tokenizers), and of
                            those, how many AutoTokenizer of both also encode alike
  tokenizer_ids BOS EOS PAD same|differ   AutoTokenizer's special ids of the export vs source
    smollm2_reference.py SOURCE EXPORT TOKENS.bin PROMPT N CORPUS...
"""
import os
import sys

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sft_data  # noqa: E402

EDGE = ["", " ", "  x  ", "\t\n", "naïve café", "emoji 😀👍🏽", "<|im_start|>user\nhi<|im_end|>",
        "3.14159, 1,000,000", "日本語", "I'm sure they'll say it's fine"]


def token_file(path):
    """The ids of a shardlm token file (any version: tests/sft_data.py reads io/tokens.h's
    layout)."""
    return np.array(sft_data.read(path)[1], dtype=np.int64)


def load(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    return model


def loss_of(model, ids):
    x = torch.tensor(ids.astype(np.int64))[None]
    with torch.no_grad():
        return model(input_ids=x, labels=x).loss.item()


def main(source, export, tokens, prompt, n_new, corpus):
    ids = token_file(tokens)
    src = load(source)
    print(f"loss_source {len(ids) - 1} {loss_of(src, ids):.9g}", flush=True)
    tok = AutoTokenizer.from_pretrained(source)
    p = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                return_tensors="pt")
    p = p if torch.is_tensor(p) else p["input_ids"]
    with torch.no_grad():
        out = src.generate(p, max_new_tokens=n_new, do_sample=False)
    print("prompt_ids " + " ".join(str(i) for i in p[0].tolist()))
    print("generated_ids " + " ".join(str(i) for i in out[0, p.shape[1]:].tolist()), flush=True)
    del src
    exp = load(export)
    print(f"loss_export {len(ids) - 1} {loss_of(exp, ids):.9g}")
    print(f"export_tied {exp.lm_head.weight.data_ptr() == exp.model.embed_tokens.weight.data_ptr()}")
    # the tokenizer: HF tokenizers on both tokenizer.json files, then AutoTokenizer of both
    a, b = Tokenizer.from_file(f"{source}/tokenizer.json"), Tokenizer.from_file(f"{export}/tokenizer.json")
    ta, tb = tok, AutoTokenizer.from_pretrained(export)
    lines = [line for f in corpus for line in open(f, encoding="utf-8").read().split("\n")] + EDGE
    same = sum(a.encode(t).ids == b.encode(t).ids for t in lines)
    auto = sum(ta(t).input_ids == tb(t).input_ids for t in lines)
    print(f"tokenizer_lines {len(lines)} {same} {auto}")
    special = (tb.bos_token_id, tb.eos_token_id, tb.pad_token_id)
    alike = special == (ta.bos_token_id, ta.eos_token_id, ta.pad_token_id)
    alike = alike and tb.chat_template == ta.chat_template
    print("tokenizer_ids " + " ".join(str(i) for i in special) + (" same" if alike else " differ"))


if __name__ == "__main__":
    if len(sys.argv) < 7:
        print(__doc__)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6:])
