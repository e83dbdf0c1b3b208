#!/bin/sh
# A weighted mixture of token files (data.train = a.bin:0.7, b.bin:0.2, c.bin:0.1;
# src/data/data_mix.h) with tests/jobs/ckpt.ini's model, from three files of different
# kinds: a.bin text as 2-byte tokens, b.bin prompt-response pairs whose loss covers the
# responses only (4-byte tokens, one document per pair, data.doc_mask on), c.bin a
# version-1 file (no loss-mask or document bits). Checked:
#   1. over 200 steps, the tokens per source in metrics.jsonl are within 2% of the
#      weights and sum to tokens_seen, and the closing summary gives each source's share
#      and epochs (b.bin and c.bin run through more than two, each on its own);
#   2. 40 steps on 1, 2 and 4 ranks: the same losses (the same windows; the sums'
#      order differs, so within 1e-5 relative);
#   3. the 2-rank run resumed from its step-20 checkpoint: steps 21-40 bit for bit; `ckpt
#      info` gives each file's weight and position;
#   4. a resume with other weights is refused, naming checkpoint.allow_mix_change; with it
#      the run continues and says so; a mixture's checkpoint under one file is refused;
#   5. bad input, one line each before step 1: a weight <= 0, a missing file, files of
#      two vocabularies.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/data_mix.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"

. "$SHLM_SRCDIR/tests/lib.sh"
skip_unless_launcher
test_begin data_mix shlm-data-mix

# the three sources
text="$SHLM_SRCDIR/jobs/data/shakespeare-train.txt"
head -c 200000 "$text" >"$work/a.txt"
i=1
while [ $i -le 100 ]; do
    printf '{"prompt": "Question %d: what is %d plus %d?", "response": "It is %d."}\n' \
        $i $i $i $((2 * i))
    i=$((i + 1))
done >"$work/b.jsonl"
"$SHLM" data prepare --tokenizer bytes "$work/a.txt" "$work/a.bin" >"$work/prep-a.log" 2>&1 &&
    "$SHLM" data prepare --tokenizer bytes --format prompt-response --chat-template none \
        --width 4 "$work/b.jsonl" "$work/b.bin" >"$work/prep-b.log" 2>&1 ||
    fail "could not prepare the data"
# c.bin: format version 1 (magic, version 1, width 2, count, vocab 256, reserved), 1500
# bytes of the text as its tokens
tail -c 1500 "$text" >"$work/c.txt"
{
    printf 'SHLMTOK\000\001\000\000\000\002\000\000\000'
    printf '\334\005\000\000\000\000\000\000\000\001\000\000\000\000\000\000' # 1500, 256
    od -An -v -tu1 "$work/c.txt" | tr -s ' ' '\n' | grep . |
        LC_ALL=C awk '{ printf "%c%c", $1, 0 }'
} >"$work/c.bin"
LC_ALL=C "$SHLM" data info "$work/c.bin" >"$work/info-c.log" 2>&1 &&
    grep -q "^version *1" "$work/info-c.log" || {
    cat "$work/info-c.log"
    fail "c.bin is not a version-1 token file"
}
mix="$work/a.bin:0.7, $work/b.bin:0.2, $work/c.bin:0.1"

# train NAME NP [--set ...]: trains the mixture on NP ranks into run_dir $work/NAME,
# output in $work/NAME.out and .err; sets $rc
train() {
    tn=$1 tnp=$2
    shift 2
    set -- "$SHLM" train "$job" --set "data.train=$mix" --set data.doc_mask=true \
        --set "log.run_dir=$work/$tn" "$@"
    echo "+ sh $mpi $tnp $*"
    sh "$mpi" "$tnp" "$@" >"$work/$tn.out" 2>"$work/$tn.err" </dev/null
    rc=$?
    skip_without_launcher $rc
}

# 1. the shares over 200 steps
train long 1 --set train.steps=200
[ $rc -eq 0 ] || { tail -n 5 "$work/long.err"; fail "long: exit $rc"; }
why=$(awk '
    END {
        if (!match($0, /"tokens_seen": [0-9]+/)) { print "no tokens_seen"; exit }
        total = substr($0, RSTART + 15, RLENGTH - 15) + 0
        if (!match($0, /"tokens_seen_by_source": \{[^}]*\}/)) { print "no tokens_seen_by_source"; exit }
        s = substr($0, RSTART, RLENGTH); sub(/^[^{]*\{/, "", s); sub(/\}$/, "", s)
        n = split(s, kv, ", "); sum = 0
        split("a.bin b.bin c.bin", name, " "); split("0.7 0.2 0.1", w, " ")
        if (n != 3) { print "sources: " s; exit }
        for (i = 1; i <= 3; i++) {
            split(kv[i], p, ": "); gsub(/"/, "", p[1]); sum += p[2]
            share = p[2] / total; d = share - w[i]; if (d < 0) d = -d
            if (p[1] != name[i] || d > 0.02 * w[i])
                printf "%s has %s tokens, share %.4f, weight %s; ", p[1], p[2], share, w[i]
        }
        if (sum != total) printf "the sources sum to %d, tokens_seen is %d", sum, total
    }' "$work/long/metrics.jsonl")
if [ -n "$why" ]; then
    fail "long: step 200: $why"
else
    echo "data_mix: ok: 200 steps: $(grep -o '"tokens_seen_by_source": {[^}]*}' \
        "$work/long/metrics.jsonl" | tail -n 1), each within 2% of its weight"
fi
for f in a b c; do
    grep -q "^  $work/$f.bin  *share .*(weight .*), [0-9]* tokens, [0-9.]* epochs$" \
        "$work/long.out" || fail "long: the closing summary has no line for $f.bin"
done
grep -A3 '^data mixture' "$work/long.out"
for f in b c; do
    grep "^  $work/$f.bin " "$work/long.out" | awk '{ exit !($(NF - 1) > 2) }' ||
        fail "long: $f.bin did not run through more than two epochs"
done

# 2. 1, 2 and 4 ranks; 3. the 2-rank run resumed from step 20
train one 1 --set checkpoint.dir="$work/one/ck" --set checkpoint.every=20
train two 2 --set checkpoint.dir="$work/two/ck" --set checkpoint.every=20
train four 4
for name in one four; do
    rel=$(maxrel loss "$work/two/metrics.jsonl" "$work/$name/metrics.jsonl" 40)
    if [ "$rel" = missing ] || awk -v r="$rel" 'BEGIN { exit !(r > 1e-5) }'; then
        fail "$name: losses of steps 1-40 vs 2 ranks: max rel diff $rel (tolerance 1e-5)"
    else
        echo "data_mix: ok: $name vs 2 ranks: steps 1-40 within $rel relative"
    fi
done
train resumed 2 --set checkpoint.dir="$work/resumed/ck" \
    --set "checkpoint.resume=$work/two/ck/step_20.h5"
[ $rc -eq 0 ] || { tail -n 5 "$work/resumed.err"; fail "resumed: exit $rc"; }
steps "$work/two/metrics.jsonl" loss | sed -n '21,40p' >"$work/two.tail"
steps "$work/resumed/metrics.jsonl" loss >"$work/resumed.tail"
if [ "$(wc -l <"$work/two.tail")" -ne 20 ] || ! cmp -s "$work/two.tail" "$work/resumed.tail"; then
    fail "resumed: steps 21-40 differ from the uninterrupted run's:" \
        "$(diff "$work/two.tail" "$work/resumed.tail" | head -n 4 | tr '\n' ' ')"
else
    echo "data_mix: ok: resumed from step 20 on 2 ranks: steps 21-40 bit for bit"
fi
sums=$(sums_problem "$work/two/ck" "$work/resumed/ck")
[ -z "$sums" ] || fail "resumed: $sums"
"$SHLM" ckpt info "$work/two/ck/step_20.h5" >"$work/info-two.log" 2>&1
grep -q "^  sources  *weight 0.7000, 112 windows taken (112 since the weights took effect), $work/a.bin (" \
    "$work/info-two.log" || fail "two: ckpt info does not give a.bin's weight and position at step 20"

# 4. what a resume may change
mix_saved=$mix
mix="$work/a.bin:0.5, $work/b.bin:0.3, $work/c.bin:0.2"
train reweighted 1 --set "checkpoint.resume=$work/one/ck/step_20.h5"
refused_on_ranks reweighted $rc "$work/one/ck/step_20.h5" "a.bin's weight is 0.7 there, 0.5 here" \
    "checkpoint.allow_mix_change"
train reweighted-ok 1 --set "checkpoint.resume=$work/one/ck/step_20.h5" \
    --set checkpoint.allow_mix_change=true
if [ $rc -ne 0 ]; then
    tail -n 5 "$work/reweighted-ok.err"
    fail "reweighted-ok: exit $rc"
elif ! grep -q "mixture changed (checkpoint.allow_mix_change)" "$work/reweighted-ok.out"; then
    fail "reweighted-ok: no line saying the mixture changed"
else
    echo "data_mix: ok: reweighted-ok: $(grep 'mixture changed' "$work/reweighted-ok.out")"
fi
mix="$work/a.bin"
train single 1 --set "checkpoint.resume=$work/one/ck/step_20.h5"
refused_on_ranks single $rc "saved training on the mixture" "this job's data.train is the file"
mix=$mix_saved

# 5. bad input
mix="$work/a.bin:0.7, $work/b.bin:0"
train weight0 1
refused_on_ranks weight0 $rc "--set data.train" "weight 0 of $work/b.bin: must be a number more than 0"
mix="$work/a.bin:0.7, $work/b.bin:-0.2"
train weightneg 1
refused_on_ranks weightneg $rc "weight -0.2 of $work/b.bin"
mix="$work/a.bin:0.7, $work/gone.bin:0.3"
train missing 1
refused_on_ranks missing $rc "$work/gone.bin does not exist"
"$SHLM" data random --vocab 200 --tokens 5000 "$work/v200.bin" >"$work/prep-v200.log" 2>&1 ||
    fail "could not make v200.bin"
mix="$work/a.bin:0.7, $work/v200.bin:0.3"
train vocab 1
refused_on_ranks vocab $rc "$work/a.bin has a vocabulary of 256 ids, $work/v200.bin of 200"

test_end
