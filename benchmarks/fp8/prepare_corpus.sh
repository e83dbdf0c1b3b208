#!/bin/sh
# Makes the token files of the FP8 loss-parity runs (benchmarks/fp8/parity.sh) from a real
# corpus: the English reStructuredText of the Linux kernel's Documentation/ as Debian 12
# ships it (benchmarks/fp8/SOURCE.md: source, licence, checksums), tokenized with
# SmolLM2's tokenizer, one document per file.
#   sh benchmarks/fp8/prepare_corpus.sh [--out DIR] [--tokenizer DIR] [--deb FILE]
#     --out DIR        where train.bin, val.bin and MANIFEST go (default $SHLM_CACHE/fp8data;
#                      for the GPU machine: .gpu/fp8data, which the run carries)
#     --tokenizer DIR  SmolLM2's model directory (default $SHLM_CACHE/smollm2, which
#                      examples/smollm2/get-model.sh makes)
#     --deb FILE       a local copy of the package instead of apt-get download (its
#                      sha256 is checked all the same)
# Steps, one line each:
#   deb     apt-get download linux-doc-6.1 (pinned version) into $SHLM_CACHE/fp8-corpus/,
#           checked by sha256; a cached copy is reused
#   jsonl   every Documentation/**/*.rst.gz outside Documentation/translations/ (the
#           English text), in C-locale path order, one {"text"} line per file; every
#           50th file (the 50th, 100th, ...) goes to val.jsonl, the rest to train.jsonl
#   tokens  shardlm data prepare --format jsonl-text for each, then the files' sha256
# Deterministic: the same package and tokenizer give the same bytes (SOURCE.md lists
# them). The network is needed only for the package when it is not cached. Every failure
# is one line "prepare_corpus: error: ..." on stderr and exit status 1 (2: bad usage).
# Environment: SHLM (default: the shardlm of this tree), SHLM_CACHE (default ~/.cache/shardlm).
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
SHLM_CACHE=${SHLM_CACHE:-${HOME:-/root}/.cache/shardlm}
SHLM=${SHLM:-$src/shardlm}

DEB_NAME=linux-doc-6.1
DEB_VERSION=6.1.192-3
DEB_FILE=${DEB_NAME}_${DEB_VERSION}_all.deb
DEB_SHA256=f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f
DOC_ROOT=usr/share/doc/$DEB_NAME/Documentation
VAL_EVERY=50

die() {
    echo "prepare_corpus: error: $*" >&2
    exit 1
}
usage() {
    echo "prepare_corpus: error: $*" >&2
    exit 2
}

out=$SHLM_CACHE/fp8data tok=$SHLM_CACHE/smollm2 deb=""
while [ $# -gt 0 ]; do
    case $1 in
    --out) [ $# -ge 2 ] || usage "--out needs DIR"; out=$2; shift 2 ;;
    --tokenizer) [ $# -ge 2 ] || usage "--tokenizer needs DIR"; tok=$2; shift 2 ;;
    --deb) [ $# -ge 2 ] || usage "--deb needs FILE"; deb=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage "unknown argument '$1' (see --help)" ;;
    esac
done
[ -x "$SHLM" ] || die "no shardlm at $SHLM (build the tree, or set SHLM)"
[ -f "$tok/tokenizer.json" ] ||
    die "$tok holds no tokenizer.json: make it with examples/smollm2/get-model.sh $tok (or give --tokenizer DIR)"
command -v dpkg-deb > /dev/null || die "no dpkg-deb (Debian's dpkg) to unpack $DEB_FILE"
command -v python3 > /dev/null || die "no python3 to write the JSONL files"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# ---- deb
cache=$SHLM_CACHE/fp8-corpus
mkdir -p "$cache" || die "$cache: cannot make it"
if [ -n "$deb" ]; then
    [ -f "$deb" ] || die "--deb $deb: no such file"
    how="given"
else
    deb=$cache/$DEB_FILE
    how=cached
    if [ ! -f "$deb" ]; then
        dl=$(mktemp -d "$cache/.download.XXXXXX") || die "cannot write in $cache"
        # apt-get download writes into the current directory
        if ! (cd "$dl" && apt-get download "$DEB_NAME=$DEB_VERSION") > "$cache/download.log" 2>&1; then
            rm -rf "$dl"
            die "apt-get download $DEB_NAME=$DEB_VERSION failed (no network, no apt-get update, or the archive no longer has this version: see $cache/download.log; --deb FILE takes a copy)"
        fi
        mv "$dl/$DEB_FILE" "$deb" || die "$dl: apt-get left no $DEB_FILE"
        rm -rf "$dl" "$cache/download.log"
        how=downloaded
    fi
fi
[ "$(sha256_of "$deb")" = "$DEB_SHA256" ] ||
    die "$deb: not Debian's $DEB_FILE (sha256 differs from $DEB_SHA256)"
echo "prepare_corpus: deb: $deb ($how, sha256 ok)"

# ---- jsonl
work=$(mktemp -d "${TMPDIR:-/tmp}/prepare_corpus.XXXXXX") || die "cannot make a temporary directory"
trap 'rm -rf "$work"' EXIT
dpkg-deb -x "$deb" "$work/pkg" || die "dpkg-deb -x $deb failed"
python3 - "$work/pkg/$DOC_ROOT" "$work" "$VAL_EVERY" <<'EOF' || exit 1
import gzip, json, os, sys
root, work, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = []
for d, dirs, names in os.walk(root):
    if d == root:
        dirs[:] = [x for x in dirs if x != "translations"]
    files += [os.path.join(d, n) for n in names if n.endswith(".rst.gz")]
files.sort(key=lambda p: os.path.relpath(p, root).encode())
if not files:
    print(f"prepare_corpus: error: no .rst.gz files under {root}", file=sys.stderr)
    sys.exit(1)
counts = {"train": [0, 0], "val": [0, 0]}
with open(os.path.join(work, "train.jsonl"), "w") as tr, open(os.path.join(work, "val.jsonl"), "w") as va:
    for i, p in enumerate(files):
        try:
            text = gzip.open(p).read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            print(f"prepare_corpus: error: {os.path.relpath(p, root)}: {e}", file=sys.stderr)
            sys.exit(1)
        split = "val" if (i + 1) % every == 0 else "train"
        (va if split == "val" else tr).write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        counts[split][0] += 1
        counts[split][1] += len(text)
for split, (n, chars) in counts.items():
    print(f"prepare_corpus: jsonl: {split}: {n} files, {chars:,} characters")
EOF

# ---- tokens
mkdir -p "$out" || die "$out: cannot make it"
for split in train val; do
    "$SHLM" data prepare --tokenizer "$tok" --format jsonl-text "$work/$split.jsonl" "$out/$split.bin.partial" \
        > "$work/$split.log" 2>&1 || die "shardlm data prepare $split: $(tail -n 1 "$work/$split.log")"
    mv "$out/$split.bin.partial" "$out/$split.bin" || die "$out/$split.bin: cannot write it"
    echo "prepare_corpus: tokens: $out/$split.bin: $(sed -n 's/^wrote \([0-9]* tokens in [0-9]* documents\).*/\1/p' "$work/$split.log")"
done
{
    echo "source Debian 12 package $DEB_FILE (sha256 $DEB_SHA256), $DOC_ROOT/**/*.rst.gz outside translations/, every ${VAL_EVERY}th file to val"
    echo "tokenizer $tok/tokenizer.json (sha256 $(sha256_of "$tok/tokenizer.json"))"
    for split in train val; do echo "$split.bin sha256 $(sha256_of "$out/$split.bin") bytes $(wc -c < "$out/$split.bin")"; done
} > "$out/MANIFEST"
sed 's/^/prepare_corpus: /' "$out/MANIFEST"
