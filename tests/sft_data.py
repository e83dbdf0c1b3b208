#!/usr/bin/env python3
"""Helpers of the SFT data tests, python's standard library only.

  read FILE.bin                  the token file as JSON: header, ids, trained and doc-start bits
  tokenizers DIR                 writes byte-level test tokenizers (tokenizer.json: id = byte
                                 value, plus special tokens) under DIR/chatml, DIR/llama2 and
                                 DIR/other, each with a tokenizer_config.json whose chat
                                 template is SmolLM2-style ChatML, Meta's Llama-2 template, or
                                 one shardlm does not know
  prompt-response JSONL FILE.bin [MAX]
                                 FILE.bin is what `data prepare --tokenizer bytes --format
                                 prompt-response` must make of JSONL, worked out here from the
                                 format's definition (docs/ARCHITECTURE.md): per record bytes
                                 of the prompt (Alpaca's prompt for instruction records), then
                                 of the response, trained; documents longer than MAX cut
The token file layout is read from io/tokens.h's description alone.
"""
import json
import struct
import sys

HEADER_V2 = 96


def read(path):
    data = open(path, "rb").read()
    magic, version, width, count, vocab = struct.unpack_from("<8sIIQI", data, 0)
    assert magic == b"SHLMTOK\0", "bad magic"
    h = {"version": version, "width": width, "count": count, "vocab": vocab}
    if version == 1:
        ids = list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), data, 32))
        assert 32 + count * width == len(data), "v1 size"
        return h, ids, [1] * count, [1] + [0] * (count - 1) if count else []
    assert version == 2, "version %d" % version
    (h["documents"], h["trained"], h["longest"], h["truncated"], h["dropped"],
     h["max_doc_len"], h["format"], h["chat_template"]) = struct.unpack_from("<6QII", data, 32)
    ids = list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), data, HEADER_V2))
    at = HEADER_V2 + (count * width + 7) // 8 * 8
    groups = (count + 63) // 64
    assert at + 16 * groups == len(data), "v2 size"
    trained, doc = [], []
    for g in range(groups):
        mask, starts = struct.unpack_from("<QQ", data, at + 16 * g)
        for b in range(min(64, count - 64 * g)):
            trained.append(mask >> b & 1)
            doc.append(starts >> b & 1)
    return h, ids, trained, doc


def byte_vocab():
    """GPT-2's byte-to-unicode alphabet, id = byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a test assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# as meta-llama/Llama-2-*-chat-hf's tokenizer_config.json holds it (\\n: Jinja escapes)
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")
ZEPHYR_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + "
    "eos_token }}{% endfor %}")


def tokenizer_json(specials):
    vocab = byte_vocab()
    added = []
    for i, s in enumerate(specials):
        vocab[s] = 256 + i
        added.append({"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}


def tokenizers(out):
    import os
    dirs = {
        "chatml": (["<|im_start|>", "<|im_end|>"], {"eos_token": "<|im_end|>",
                                                    "chat_template": SMOL_TEMPLATE}),
        "llama2": (["<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>",
                                     "add_bos_token": True, "chat_template": LLAMA2_TEMPLATE}),
        "other": (["<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>",
                                    "chat_template": ZEPHYR_TEMPLATE}),
    }
    for name, (specials, config) in dirs.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tokenizer_json(specials), f)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)


ALPACA_INPUT = ("Below is an instruction that describes a task, paired with an input that "
                "provides further context. Write a response that appropriately completes the "
                "request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n"
                "### Response:\n")
ALPACA = ("Below is an instruction that describes a task. Write a response that appropriately "
          "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


def prompt_response(jsonl, path, max_len=0):
    want_ids, want_trained, want_doc = [], [], []
    truncated = 0
    for line in open(jsonl, encoding="utf-8"):
        if not line.strip():
            continue
        r = json.loads(line)
        if "instruction" in r:
            tmpl = ALPACA_INPUT if r.get("input") else ALPACA
            prompt, response = tmpl.format(**r), r["output"]
        else:
            prompt, response = r["prompt"], r["response"]
        p, q = prompt.encode(), response.encode()
        ids, trained = list(p + q), [0] * len(p) + [1] * len(q)
        if max_len and len(ids) > max_len:
            ids, trained, truncated = ids[:max_len], trained[:max_len], truncated + 1
        want_ids += ids
        want_trained += trained
        want_doc += [1] + [0] * (len(ids) - 1)
    h, ids, trained, doc = read(path)
    problems = []
    if ids != want_ids:
        i = next((k for k, (a, b) in enumerate(zip(ids, want_ids)) if a != b), min(len(ids), len(want_ids)))
        problems.append("ids differ first at token %d (%d tokens, want %d)" % (i, len(ids), len(want_ids)))
    if trained != want_trained:
        problems.append("loss-mask bits differ first at token %d" % next(
            (k for k, (a, b) in enumerate(zip(trained, want_trained)) if a != b), 0))
    if doc != want_doc:
        problems.append("document-start bits differ")
    counts = (h.get("documents"), h.get("trained"), h.get("truncated"))
    want = (sum(want_doc), sum(want_trained), truncated)
    if counts != want:
        problems.append("header documents/trained/truncated %s, want %s" % (counts, want))
    for p in problems:
        print("sft_data.py: %s: %s" % (path, p))
    if not problems:
        print("sft_data.py: %s: %d documents, %d tokens, %d trained, as worked out from %s"
              % (path, want[0], len(want_ids), want[1], jsonl))
    return 1 if problems else 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "read" and len(sys.argv) == 3:
        h, ids, trained, doc = read(sys.argv[2])
        print(json.dumps({"header": h, "ids": ids, "trained": trained, "doc_start": doc}))
    elif cmd == "tokenizers" and len(sys.argv) == 3:
        tokenizers(sys.argv[2])
    elif cmd == "prompt-response" and len(sys.argv) in (4, 5):
        sys.exit(prompt_response(sys.argv[2], sys.argv[3],
                                 int(sys.argv[4]) if len(sys.argv) == 5 else 0))
    else:
        print(__doc__)
        sys.exit(2)
