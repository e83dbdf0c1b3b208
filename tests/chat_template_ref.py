#!/usr/bin/env python3
"""shardlm's chat rendering, ids and loss masks against the reference libraries.

  chat_template_ref.py --shardlm SHLM --work DIR --kind chatml|llama2|llama3 --tokenizer T
                       [--template-file F] FILE.jsonl...

For every record of every file (chat, or prompt-response as a user and an assistant turn):
  - text: `shardlm data render` equals transformers' apply_chat_template(tokenize=False) with
    the template (chatml, llama3: the tokenizer directory's own; llama2: --template-file's
    text, bos <s>, eos </s>)
  - trained ranges: `data render`'s equal the assistant turns found from transformers alone:
    turn i starts where the rendering of the messages before it (chatml, llama3: with the
    generation prompt) ends, and covers the content (llama2: " " + content.strip() + " ";
    llama3: content.strip()) and the end-of-turn token
  - ids: the document in `shardlm data prepare`'s token file equals the reference library
    encoding the whole rendered text: chatml and llama3, Hugging Face tokenizers
    (tokenizer.json, no added special tokens); llama2, python sentencepiece on each run of text between the
    <s> and </s> the template wrote, as Meta's chat_completion encodes a dialog
  - loss mask: a token is trained when it ends inside a trained range (so a token that
    spans the cut into a turn belongs to the turn), by the reference tokenizer's own offsets
Prints one line per file and the first few problems; exits 1 on any.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sft_data  # noqa: E402


def records(path):
    """(line, messages) of a chat or prompt-response JSONL file."""
    out = []
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if not line.strip():
            continue
        r = json.loads(line)
        if "messages" in r:
            out.append((n, r["messages"]))
        else:
            out.append((n, [{"role": "user", "content": r["prompt"]},
                            {"role": "assistant", "content": r["response"]}]))
    return out


def byte_index(text):
    """b[i]: the UTF-8 byte offset of character i (b[len(text)] = total)."""
    b, n = [0], 0
    for c in text:
        n += len(c.encode())
        b.append(n)
    return b


def trained_spans(render, msgs, kind, end_token):
    """The assistant turns' character ranges, from the reference renderer alone."""
    full = render(msgs, False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = render(msgs[:i], kind != "llama2") if i or kind == "llama3" else ""
        assert full.startswith(before), "rendering is not incremental at message %d" % i
        body = m["content"] + end_token if kind == "chatml" else \
            m["content"].strip() + end_token if kind == "llama3" else \
            " " + m["content"].strip() + " " + end_token
        assert full[len(before):len(before) + len(body)] == body, "turn %d not where expected" % i
        spans.append((len(before), len(before) + len(body)))
    return full, spans


def documents(path):
    """The documents of a token file: (ids, trained bits) each."""
    h, ids, trained, doc = sft_data.read(path)
    starts = [i for i, d in enumerate(doc) if d] + [len(ids)]
    return [(ids[a:b], trained[a:b]) for a, b in zip(starts, starts[1:])]


def reference_tokens(kind, tok, text):
    """(ids, byte end offset of each id) of the whole rendered text."""
    if kind != "llama2":
        enc = tok.encode(text, add_special_tokens=False)
        b = byte_index(text)
        return enc.ids, [b[e] for s, e in enc.offsets]
    sp, ids, ends, at = tok, [], [], 0
    raw = text.encode()
    while at < len(raw):
        for special, sid in ((b"<s>", sp.bos_id()), (b"</s>", sp.eos_id())):
            if raw.startswith(special, at):
                ids.append(sid)
                at += len(special)
                ends.append(at)
                break
        else:
            nxt = [p for p in (raw.find(b"<s>", at), raw.find(b"</s>", at)) if p >= 0]
            stop = min(nxt) if nxt else len(raw)
            chunk = raw[at:stop].decode()
            pieces = sp.encode(chunk, out_type=str)
            surface = b"".join(bytes([int(p[3:5], 16)]) if p.startswith("<0x") and len(p) == 6
                               else p.replace("\u2581", " ").encode() for p in pieces)
            assert surface == b" " + chunk.encode(), "pieces do not spell the chunk"
            n = at - 1  # the dummy prefix's space is not in the text
            for p, i in zip(pieces, sp.encode(chunk)):
                n += 1 if p.startswith("<0x") and len(p) == 6 else len(p.replace("\u2581", " ").encode())
                ids.append(i)
                ends.append(max(n, at))
            at = stop
    return ids, ends


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardlm", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--kind", choices=["chatml", "llama2", "llama3"], required=True)
    ap.add_argument("--tokenizer", required=True, help="the model directory given to shardlm")
    ap.add_argument("--template-file", help="llama2: the template's text")
    ap.add_argument("--skip-specials", action="store_true",
                    help="leave out records whose content holds <s> or </s> (llama2 over "
                         "SentencePiece keeps them text; transformers would split them)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    if a.kind != "llama2":
        cfg = json.load(open(os.path.join(a.tokenizer, "tokenizer_config.json")))
        template, end_token = cfg["chat_template"], "<|im_end|>"
        kwargs = {}
        if a.kind == "llama3":
            end_token, kwargs = "<|eot_id|>", {"bos_token": cfg["bos_token"]}
        tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    else:
        import sentencepiece as spm
        template, end_token = open(a.template_file).read(), "</s>"
        kwargs = {"bos_token": "<s>", "eos_token": "</s>"}
        tok = spm.SentencePieceProcessor(model_file=os.path.join(a.tokenizer, "tokenizer.model"))
    renderer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))

    def render(msgs, gen):
        return renderer.apply_chat_template(msgs, tokenize=False, chat_template=template,
                                            add_generation_prompt=gen, **kwargs)

    bad = 0
    for path in a.files:
        fmt = "chat" if "messages" in open(path, encoding="utf-8").readline() else "prompt-response"
        src = path
        recs = records(path)
        if a.skip_specials:
            recs = [(n, m) for n, m in recs
                    if not any("<s>" in x["content"] or "</s>" in x["content"] for x in m)]
            src = os.path.join(a.work, os.path.basename(path) + ".kept.jsonl")
            with open(src, "w", encoding="utf-8") as f:
                for n, m in recs:
                    f.write(json.dumps({"messages": m}) + "\n")
            fmt = "chat"
        bin_path = os.path.join(a.work, os.path.basename(path) + ".bin")
        base = [a.shardlm, "data"]
        opts = ["--tokenizer", a.tokenizer, "--format", fmt]
        rendered = subprocess.run(base + ["render"] + opts + [src], check=True,
                                  capture_output=True, text=True).stdout.split("\n")[:-1]
        subprocess.run(base + ["prepare"] + opts + [src, bin_path], check=True,
                       capture_output=True)
        docs = documents(bin_path)
        problems = []
        if len(rendered) != len(recs) or len(docs) != len(recs):
            problems.append("%d records, %d rendered, %d documents" % (len(recs), len(rendered), len(docs)))
        tokens = trained_tokens = 0
        for (line, msgs), out, (ids, trained) in zip(recs, rendered, docs):
            got = json.loads(out)
            want_text, spans = trained_spans(render, msgs, a.kind, end_token)
            b = byte_index(want_text)
            want_spans = [[b[s], b[e]] for s, e in spans]
            if got["text"] != want_text:
                problems.append("line %d: rendered %r, transformers %r" % (line, got["text"][:200], want_text[:200]))
                continue
            if got["trained"] != want_spans:
                problems.append("line %d: trained ranges %s, want %s" % (line, got["trained"], want_spans))
            ref_ids, ends = reference_tokens(a.kind, tok, want_text)
            if ids != ref_ids:
                k = next((i for i, (x, y) in enumerate(zip(ids, ref_ids)) if x != y), min(len(ids), len(ref_ids)))
                problems.append("line %d: ids differ from the reference at token %d (%s vs %s)"
                                % (line, k, ids[k:k + 5], ref_ids[k:k + 5]))
                continue
            want_mask = [int(any(s < e <= t for s, t in want_spans)) for e in ends]
            if trained != want_mask:
                k = next(i for i, (x, y) in enumerate(zip(trained, want_mask)) if x != y)
                problems.append("line %d: loss mask differs at token %d (%d, want %d)" % (line, k, trained[k], want_mask[k]))
            tokens += len(ids)
            trained_tokens += sum(trained)
        print("chat_template_ref: %s %s (%s): %d records, %d tokens, %d trained: %s"
              % (a.kind, os.path.basename(path), fmt, len(recs), tokens, trained_tokens,
                 "text, ranges, ids and mask equal the references" if not problems else
                 "%d problems" % len(problems)))
        for p in problems[:5]:
            print("    " + p)
        bad += len(problems)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
