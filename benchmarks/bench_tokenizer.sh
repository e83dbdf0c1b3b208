#!/bin/sh
# Tokenizer speed on one core: `shardlm data encode` against the reference libraries in the
# same run, on the same input (the bundled Shakespeare corpus repeated REPEAT times, default
# 4: about 4.6 MB; shardlm memoises words, so REPEAT=1 shows the cost of first sightings).
#   SentencePiece: Mistral's tokenizer.model.v1 against python sentencepiece, EncodeAsIds of
#                  the whole text and of its lines (a list, num_threads=1)
#   tokenizer.json: SmolLM2's against Hugging Face tokenizers, encode of the whole text and
#                  encode_batch of its lines (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false)
# Everything runs under `taskset -c CPU` (default 0). shardlm is timed as a whole command
# (start, loading the tokenizer, reading stdin, encoding, writing the ids); the libraries
# only around their encode call. Exits non-zero when shardlm's ids differ from the
# library's for the whole text (a benchmark that is wrong fails).
#   [CPU=N] [REPEAT=R] benchmarks/bench_tokenizer.sh [SHARDLM]
#   (SHLM_SMOLLM2_DIR: SmolLM2's HF directory, default $SHLM_CACHE/smollm2)
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/tests/pyenv.sh"
shlm=${1:-$here/shardlm}
cpu=${CPU:-0}
shlm_python sentencepiece tokenizers >/dev/null || { shlm_python sentencepiece tokenizers; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/benchtok.XXXXXX")
trap 'rm -rf "$work"' EXIT
for i in $(seq "${REPEAT:-4}"); do cat "$here/jobs/data/shakespeare-train.txt" "$here/jobs/data/shakespeare-val.txt"; done \
    >"$work/input.txt"
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
status=0
echo "# tokenizer encode, one core (taskset -c $cpu), input $(wc -c <"$work/input.txt") bytes"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
printf '# %-14s %-44s %10s %9s %12s %7s\n' tokenizer what tokens seconds tokens/s ratio

# bench NAME KIND TOKENIZER: shardlm's command, then the library's two ways
bench() {
    name=$1 kind=$2 tok=$3
    t0=$(date +%s.%N)
    taskset -c "$cpu" "$shlm" data encode --tokenizer "$tok" <"$work/input.txt" >"$work/ours.ids" ||
        { echo "# $name: shardlm failed"; status=1; return; }
    t1=$(date +%s.%N)
    ours_n=$(wc -w <"$work/ours.ids")
    ours_s=$(echo "$t1 - $t0" | bc -l)
    ours_tps=$(echo "$ours_n / $ours_s" | bc -l)
    taskset -c "$cpu" "$SHLM_PY" - "$kind" "$tok" "$work/input.txt" "$work/ref.ids" >"$work/ref.txt" <<'EOF' ||
import os, sys, time
kind, tok, path, ids_out = sys.argv[1:]
text = open(path, encoding="utf-8").read()
lines = text.split("\n")
if kind == "sp":
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=tok)
    whole = lambda: sp.encode(text)
    batch = lambda: sp.encode(lines, num_threads=1)
    names = ("sentencepiece EncodeAsIds(whole text)", "sentencepiece EncodeAsIds(lines)")
else:
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(tok, "tokenizer.json") if os.path.isdir(tok) else tok)
    whole = lambda: t.encode(text, add_special_tokens=False).ids
    batch = lambda: [e.ids for e in t.encode_batch(lines, add_special_tokens=False)]
    names = ("tokenizers encode(whole text)", "tokenizers encode_batch(lines)")
for name, f in zip(names, (whole, batch)):
    t0 = time.perf_counter()
    r = f()
    s = time.perf_counter() - t0
    n = len(r) if name == names[0] else sum(map(len, r))
    if name == names[0]:
        open(ids_out, "w").write(" ".join(map(str, r)) + "\n")
    print(f"{name}\t{n}\t{s:.3f}\t{n / s:.0f}")
EOF
        { echo "# $name: the reference failed"; status=1; return; }
    best=0
    while IFS="$(printf '\t')" read -r what n s tps; do
        printf '  %-14s %-44s %10s %9s %12.0f %7s\n' "$name" "$what" "$n" "$s" "$tps" "1.00"
        [ "$(echo "$tps > $best" | bc -l)" = 1 ] && best=$tps
    done <"$work/ref.txt"
    printf '  %-14s %-44s %10s %9.3f %12.0f %7.2f\n' "$name" "shardlm data encode (whole command)" \
        "$ours_n" "$ours_s" "$ours_tps" "$(echo "$ours_tps / $best" | bc -l)"
    if ! cmp -s "$work/ours.ids" "$work/ref.ids"; then
        echo "# $name: WRONG: shardlm's ids differ from the library's"
        status=1
    fi
    [ "$(echo "$ours_tps >= $best" | bc -l)" = 1 ] ||
        echo "# $name: shardlm is slower than the library's best (ratio < 1)"
}

if sp=$(shlm_wheel_file mistral-common mistral_common/data/tokenizer.model.v1); then
    bench mistral-v1 sp "$sp"
else
    echo "# mistral-v1: skipped: $sp"
fi
smol=${SHLM_SMOLLM2_DIR:-$SHLM_CACHE/smollm2}
if [ -f "$smol/tokenizer.json" ]; then
    bench smollm2 hf "$smol"
else
    echo "# smollm2: skipped: no $smol/tokenizer.json (examples/smollm2/get-model.sh $smol)"
fi
echo "# ratio: tokens/s over the library's faster way (the 1.00 rows are the library's own)"
exit $status
