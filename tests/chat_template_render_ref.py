#!/usr/bin/env python3
"""tests/chat_template.sh's reference: transformers' apply_chat_template(tokenize=False) of
each conversation of CONVERSATIONS.json under a template, against what shardlm rendered
(RENDERED.json: test_chat_template render; null where it refused). A conversation the
template raises on must be one shardlm refuses.
    chat_template_ref.py MODEL_DIR TEMPLATE.txt|- BOS EOS CONVERSATIONS.json RENDERED.json
MODEL_DIR's tokenizer renders; TEMPLATE.txt replaces its template ('-': its own)."""
import json
import sys

from transformers import AutoTokenizer


def main(model, template, bos, eos, conversations, rendered):
    tok = AutoTokenizer.from_pretrained(model)
    kw = {} if template == "-" else {"chat_template": open(template, encoding="utf-8").read(),
                                     "bos_token": bos, "eos_token": eos}
    convs = json.load(open(conversations, encoding="utf-8"))
    ours = json.load(open(rendered, encoding="utf-8"))
    bad = 0
    for i, (c, got) in enumerate(zip(convs, ours)):
        try:
            want = tok.apply_chat_template(c["messages"], tokenize=False,
                                           add_generation_prompt=c["add_generation_prompt"], **kw)
        except Exception as e:  # the template's raise_exception
            want = None
            why = str(e)
        if got != want:
            bad += 1
            print(f"chat_template_ref: FAIL: conversation {i}: shardlm {got!r}, transformers "
                  f"{want!r}{'' if want is not None else ' (' + why + ')'}")
    print(f"chat_template_ref: {len(convs) - bad} of {len(convs)} conversations rendered as "
          f"transformers renders them ({'its own template' if template == '-' else template})")
    return 1 if bad or len(convs) != len(ours) else 0


if __name__ == "__main__":
    if len(sys.argv) != 7:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
