#!/usr/bin/env python3
"""Checks a model directory written by examples/smollm2/get-model.sh against transformers'
own GGUF loader on the same GGUF (references nobody here wrote):
  - config: every shape and id equals the config transformers derives from the GGUF;
  - weights and logits: AutoModelForCausalLM on DIR equals from_pretrained(..., gguf_file=)
    (which dequantizes and reverse-permutes q/k itself) to fp32 precision, on a few prompts;
  - tokenizer: AutoTokenizer on DIR encodes every line of the corpus files and an edge-case
    set like transformers' GGUF-derived tokenizer with llama.cpp's "smollm" pre-tokenizer
    (src/llama-vocab.cpp: the regex "\\p{N}", then GPT-2's regex, each splitting the pieces
    before it), which transformers' GGUF reader does not apply (it knows no "smollm" and
    keeps GPT-2's split alone): the lines where that plain reading differs are counted and
    must all hold a number; decode(encode(x)) == x; no bos added; the chat template renders
    the same text;
  - greedy generation from a ChatML prompt: the same tokens from both models, and the
    answer printed (its wording is not checked).
    smollm2_model.py DIR GGUF CORPUS.txt...
Exit status 1 on any mismatch, with a line per failed check."""
import sys
import time

import numpy as np
import torch
from tokenizers import Regex, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

# llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM (shared with STARCODER and others)
LLAMA_CPP_SMOLLM_REGEXES = [
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
]

EDGE_CASES = [
    "", " ", "  ", "\t", "\n", "\n\n", " \n ", "a\tb\t\tc", "trailing spaces   ",
    "   leading spaces", "one  two   three    four", "x  1", "x   1", "a ²", " ² ³ ¼", "½",
    "12345 678 9", "3.14159, 1,000,000 and -42", "Year 2024: 99%", "٣٤٥ ४५६ 一二三",
    "naïve café résumé", "e\u0301 a\u0308 n\u0303", "Ωμέγα Привет мир",
    "日本語のテキスト", "한국어 텍스트", "مرحبا بالعالم", "emoji 😀👍🏽🇺🇸 ❤️ 🧑‍🤝‍🧑",
    "I'm sure they'll say it's fine, don't you think? We've seen it.", "IT'S LOUD'S",
    "def f(x):\n    return x ** 2  # comment\n", "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>", "a<|im_end|>b", "<|im_start|><|im_start|>", "<|im_start", "<filename>x.py",
    "<jupyter_code>print(1)<jupyter_output>1", "zero\u200bwidth and\u00a0nbsp", "\r\nCRLF\r\n",
    "\u2581already marked", "ǅ ǈ ǋ titlecase", "tab\tthen digit\t7",
]

fails = 0


def check(ok, what):
    global fails
    if not ok:
        fails += 1
        print(f"smollm2_model: FAIL: {what}")
    return ok


def llama_cpp_smollm_reference(gguf_dir, gguf_file):
    """transformers' tokenizer read from the GGUF, splitting as llama.cpp's smollm does."""
    ref = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in LLAMA_CPP_SMOLLM_REGEXES]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return ref


def check_tokenizer(model_dir, gguf_dir, gguf_file, corpus_files):
    import regex
    mine = AutoTokenizer.from_pretrained(model_dir)
    plain = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    ref = llama_cpp_smollm_reference(gguf_dir, gguf_file)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        check(getattr(mine, name) == getattr(plain, name),
              f"{name}: {getattr(mine, name)} here, {getattr(plain, name)} from the GGUF")
    check(len(mine) == len(plain), f"{len(mine)} tokens here, {len(plain)} from the GGUF")
    number = regex.compile(r"\p{N}")
    sets = [(f, open(f, encoding="utf-8").read().split("\n")) for f in corpus_files]
    sets.append(("edge cases", EDGE_CASES))
    for label, lines in sets:
        same_ref = same_plain = round_trips = 0
        shown = shown_plain = 0
        for line in lines:
            ids = mine.encode(line, add_special_tokens=False)
            want = ref.encode(line, add_special_tokens=False)
            if ids == want:
                same_ref += 1
            elif shown < 3:
                shown += 1
                print(f"  differs from the llama.cpp split: {line!r}: {ids} != {want}")
            plain_ids = plain.encode(line, add_special_tokens=False)
            if ids == plain_ids:
                same_plain += 1
            elif not number.search(line):
                check(False, f"{label}: {line!r} differs from the GGUF tokenizer without holding "
                             f"a number")
            elif shown_plain < 4:
                shown_plain += 1
                print(f"  split by digits, unlike the plain GGUF reading: {line!r}: "
                      f"{mine.convert_ids_to_tokens(ids)} vs {plain.convert_ids_to_tokens(plain_ids)}")
            back = mine.decode(ids)
            if back == line:
                round_trips += 1
            else:
                check(ref.decode(want) != line,
                      f"{label}: {line!r} decodes back as {back!r} (the reference round-trips)")
        n = len(lines)
        print(f"smollm2_model: tokenizer, {label}: {same_ref}/{n} lines equal to the GGUF "
              f"tokenizer with llama.cpp's smollm split, {same_plain}/{n} to it with GPT-2's "
              f"split alone (transformers' GGUF reading), {round_trips}/{n} decode back")
        check(same_ref == n, f"{label}: {n - same_ref} lines encode otherwise than llama.cpp's "
                             f"smollm split")
    check(mine("hello")["input_ids"] == plain("hello")["input_ids"] == mine.encode(
        "hello", add_special_tokens=False), "add_special_tokens adds a token (the GGUF adds no bos)")
    chat = [{"role": "user", "content": "What is 2+2?"}]
    text = mine.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    check(text == plain.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
          "the chat template renders otherwise than the GGUF's")
    return mine


def check_config(mine, ref):
    keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size",
            "tie_word_embeddings", "max_position_embeddings", "bos_token_id", "eos_token_id",
            "pad_token_id", "hidden_act"]
    for k in keys:
        a, b = getattr(mine.config, k, None), getattr(ref.config, k, None)
        if k == "rms_norm_eps":  # the GGUF holds float32: 1e-05 there reads 9.99999974738e-06
            a, b = np.float32(a), np.float32(b)
        check(a == b, f"config {k}: {a} here, {b} from the GGUF")
    theta = [getattr(m.config, "rope_theta", None) or m.config.rope_parameters["rope_theta"]
             for m in (mine, ref)]
    check(np.float32(theta[0]) == np.float32(theta[1]),
          f"config rope_theta: {theta[0]} here, {theta[1]} from the GGUF")
    print(f"smollm2_model: config: {', '.join(f'{k} {getattr(mine.config, k)}' for k in keys[:6])}"
          f", rope_theta {theta[0]}")


def check_weights(mine, ref):
    a, b = mine.state_dict(), ref.state_dict()
    check(sorted(a) == sorted(b), f"tensor names differ: {sorted(set(a) ^ set(b))[:4]}")
    worst, worst_name = 0.0, ""
    for k in sorted(set(a) & set(b)):
        if a[k].shape != b[k].shape:
            check(False, f"{k}: shape {tuple(a[k].shape)} here, {tuple(b[k].shape)} from the GGUF")
            continue
        d = (a[k].float() - b[k].float()).abs().max().item()
        if d > worst:
            worst, worst_name = d, k
    print(f"smollm2_model: weights: {len(a)} tensors, max |difference| {worst:.3g}"
          f"{' (' + worst_name + ')' if worst_name else ''}")
    check(worst <= 1e-6, f"weights differ by up to {worst:.3g} ({worst_name})")
    check(mine.get_output_embeddings().weight.data_ptr() ==
          mine.get_input_embeddings().weight.data_ptr(), "the output head is not tied")


def check_logits(mine, ref, tok):
    prompts = ["The capital of France is", "ROMEO:\nBut, soft! what light through yonder window",
               "In 1603, 42 players and 7 kings", "<|im_start|>user\nName a colour.<|im_end|>\n"
               "<|im_start|>assistant\n"]
    worst = 0.0
    for p in prompts:
        ids = torch.tensor([tok.encode(p, add_special_tokens=False)])
        with torch.no_grad():
            la, lb = mine(ids).logits, ref(ids).logits
        d = (la - lb).abs().max().item()
        scale = lb.abs().max().item()
        worst = max(worst, d / scale)
        print(f"smollm2_model: logits, {ids.shape[1]} tokens of {p[:32]!r}: max |difference| "
              f"{d:.3g} (largest logit {scale:.3g})")
        check(d <= 1e-5 * scale, f"logits of {p!r} differ by {d:.3g} (largest {scale:.3g})")
    return worst


def check_generation(mine, ref, tok):
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=tok.eos_token_id,
              pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        a = mine.generate(ids, **kw)[0, ids.shape[1]:].tolist()
        b = ref.generate(ids, **kw)[0, ids.shape[1]:].tolist()
    print(f"smollm2_model: greedy answer to {chat[0]['content']!r}: "
          f"{tok.decode(a, skip_special_tokens=True)!r}")
    check(a == b, f"greedy tokens differ from the GGUF model's: {a} != {b}")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    model_dir, gguf = argv[0], argv[1]
    gguf_dir, gguf_file = gguf.rsplit("/", 1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    t0 = time.time()
    tok = check_tokenizer(model_dir, gguf_dir, gguf_file, argv[2:])
    mine = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file,
                                               dtype=torch.float32).eval()
    check_config(mine, ref)
    check_weights(mine, ref)
    check_logits(mine, ref, tok)
    check_generation(mine, ref, tok)
    print(f"smollm2_model: {'every check passed' if fails == 0 else f'{fails} checks FAILED'} "
          f"({time.time() - t0:.0f} s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
