#!/usr/bin/env python3
"""Builds the instruction and chat data of the SmolLM2 fine-tuning example from the English
dialogs of the PyPI package `chatterbot-corpus` 1.3.3 (BSD-3-Clause, see SOURCE.md):

    pip download --no-deps chatterbot-corpus==1.3.3 -d /tmp/cc && \\
        python3 examples/smollm2/data/make_data.py \\
            /tmp/cc/chatterbot_corpus-1.3.3-py2.py3-none-any.whl examples/smollm2/data

Each dialog (chatterbot_corpus/data/english/*.yml, `conversations:`) is a list of statements
that alternate between a person and the bot: here user and assistant turns, the last
statement dropped when a person's has no answer. Dialogs repeated within the corpus are kept
once. A dialog goes to the validation split when the first hex digit of the sha256 of its
JSON line is 0 (one in sixteen, stable under reordering), else to training. Writes
    chat-{train,val}.jsonl             {"messages": [{"role", "content"}, ...]}, every dialog
    prompt-response-{train,val}.jsonl  {"prompt", "response"}, the one-exchange dialogs
Needs PyYAML (Debian python3-yaml, or PyPI pyyaml)."""
import hashlib
import json
import sys
import zipfile

import yaml

PREFIX = "chatterbot_corpus/data/english/"
LIMIT = 2 << 20  # bytes, all four files together


def dialogs(wheel):
    """(file, [statement, ...]) for every dialog of the English corpus, in file order."""
    z = zipfile.ZipFile(wheel)
    names = sorted(n for n in z.namelist() if n.startswith(PREFIX) and n.endswith(".yml"))
    if not names:
        sys.exit(f"make_data: {wheel}: no {PREFIX}*.yml (not the chatterbot-corpus wheel?)")
    for name in names:
        # BaseLoader: every scalar a string, so a bare "No" or "42" stays text
        doc = yaml.load(z.read(name).decode("utf-8"), Loader=yaml.BaseLoader)
        for conv in doc.get("conversations") or []:
            yield name, [s.strip() for s in conv]


def main(wheel, outdir):
    seen = set()
    out = {f"{kind}-{split}": [] for kind in ("chat", "prompt-response") for split in ("train", "val")}
    dropped = 0
    for _, statements in dialogs(wheel):
        if len(statements) % 2:
            statements = statements[:-1]
        if not statements or any(not s for s in statements):
            dropped += 1
            continue
        key = tuple(statements)
        if key in seen:
            continue
        seen.add(key)
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": s}
                    for i, s in enumerate(statements)]
        line = json.dumps({"messages": messages}, ensure_ascii=False)
        split = "val" if hashlib.sha256(line.encode()).hexdigest()[0] == "0" else "train"
        out[f"chat-{split}"].append(line)
        if len(statements) == 2:
            out[f"prompt-response-{split}"].append(json.dumps(
                {"prompt": statements[0], "response": statements[1]}, ensure_ascii=False))
    total = 0
    for name, lines in out.items():
        text = "".join(l + "\n" for l in lines)
        total += len(text.encode())
        with open(f"{outdir}/{name}.jsonl", "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{name}.jsonl: {len(lines)} records, {len(text.encode())} bytes")
    print(f"{len(seen)} distinct dialogs; {dropped} without a complete exchange dropped")
    if total > LIMIT:
        sys.exit(f"make_data: {total} bytes in all, over the {LIMIT} bytes the example bundles")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
