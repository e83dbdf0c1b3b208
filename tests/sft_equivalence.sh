#!/bin/sh
# The step's loss is a token-weighted mean whatever the ranks, accumulation and strategy:
# on SFT data (the bundled prompt-response pairs as bytes, loss on the responses only,
# several documents per window of 256 tokens, a few truncated at 200), 1 rank without
# accumulation is the reference; 1 rank accumulating over 4 micro-batches, 4 ranks
# FULL_SHARD accumulating over 2 and HYBRID_SHARD 2 x 2 (runtime.ranks_per_node = 2)
# accumulating over 2 must give the same training loss, validation loss (every step, on
# the held-out pairs) and gradient norm at every one of 20 steps, within 1e-6 relative in
# fp32; with data.doc_mask off and on. The doc_mask runs must differ from the plain ones
# (the mask is in effect), and the data must have windows with several documents and
# masked targets (data info).
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/sft_equivalence.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/equiv.ini"
data="$SHLM_SRCDIR/examples/smollm2/data"
steps=20
tol=1e-6

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin sft_equivalence shlm-sft-equiv

# ---- the data: prompt-response pairs as bytes, masks on the prompts ----
for split in train val; do
    echo "+ $SHLM data prepare --tokenizer bytes --format prompt-response --max-doc-len 200" \
        "$data/prompt-response-$split.jsonl $work/$split.bin"
    if ! "$SHLM" data prepare --tokenizer bytes --format prompt-response --max-doc-len 200 \
        "$data/prompt-response-$split.jsonl" "$work/$split.bin" >"$work/prepare.log" 2>&1; then
        cat "$work/prepare.log"
        echo "sft_equivalence: FAIL: could not prepare the data"
        exit 1
    fi
done
"$SHLM" data info "$work/train.bin" >"$work/info.txt"
cat "$work/info.txt"
# several documents per window, a minority of targets trained, some truncated
awk '$1 == "tokens" { n = $2 } $1 == "documents" { d = $2 } $1 == "trained" { t = $2 }
     $1 == "truncated" { c = $2 }
     END { exit !(n / d < 128 && t < 0.8 * n && t > 0.2 * n && c > 0) }' "$work/info.txt" ||
    fail "the data is not what the test needs: several documents per 256-token window," \
        "masked targets, truncated documents"

# run NAME NP [--set k=v ...]: trains the job into $work/NAME; the launcher's status
run() {
    name=$1
    np=$2
    shift 2
    set -- --set "data.train=$work/train.bin" --set "data.val=$work/val.bin" \
        --set "log.run_dir=$work/$name" --set "train.steps=$steps" --set train.seq_len=256 \
        --set train.eval_every=1 --set train.global_batch=8 --set fsdp.param_dtype=fp32 \
        --set fsdp.reduce_dtype=fp32 "$@"
    echo "+ sh $mpi $np $SHLM train $job $*"
    sh "$mpi" "$np" "$SHLM" train "$job" "$@" >"$work/$name.log" 2>&1 </dev/null
}

table="$work/table.txt"
: >"$table"
for dm in false true; do
    ref=ref_dm_$dm
    run $ref 1 --set train.micro_batch=8 --set data.doc_mask=$dm
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ] || [ "$(lines "$work/$ref")" -ne $steps ]; then
        tail -n 20 "$work/$ref.log"
        fail "the 1-rank reference $ref did not run $steps steps (log $work/$ref.log)"
        continue
    fi
    # name np settings
    for spec in "accum_1r 1 train.micro_batch=2" \
        "full_4r_accum 4 train.micro_batch=1 fsdp.strategy=FULL_SHARD" \
        "hybrid_2x2_accum 4 train.micro_batch=1 fsdp.strategy=HYBRID_SHARD runtime.ranks_per_node=2"; do
        set -- $spec
        name=${1}_dm_$dm np=$2
        shift 2
        args=""
        for s in "$@"; do args="$args --set $s"; done
        # shellcheck disable=SC2086 # one word per setting
        run "$name" "$np" --set data.doc_mask=$dm $args
        rc=$?
        verdict=PASS
        for key in loss val_loss grad_norm; do
            d=$(maxrel $key "$work/$ref/metrics.jsonl" "$work/$name/metrics.jsonl" $steps)
            eval "d_$key=\$d"
            if [ $rc -ne 0 ] || [ "$d" = missing ]; then
                verdict="FAIL (exit $rc, steps missing)"
            elif awk -v d="$d" -v t="$tol" 'BEGIN { exit !(d > t) }'; then
                verdict="FAIL ($key > $tol)"
            fi
        done
        case $verdict in FAIL*)
            fail "$name: $verdict; last lines of $work/$name.log:"
            tail -n 8 "$work/$name.log" | sed 's/^/    /'
            ;;
        esac
        printf '%-26s %3s  %-10s %-10s %-10s %s\n' "$name" "$np" "$d_loss" "$d_val_loss" \
            "$d_grad_norm" "$verdict" >>"$table"
    done
done
# doc_mask must change the losses: the attention and the targets differ
d=$(maxrel loss "$work/ref_dm_false/metrics.jsonl" "$work/ref_dm_true/metrics.jsonl" $steps)
echo "doc_mask off against on, 1 rank: max relative loss difference $d"
if [ "$d" = missing ] || awk -v d="$d" 'BEGIN { exit !(d < 1e-4) }'; then
    fail "doc_mask true gives the losses of doc_mask false ($d): the mask is not in effect"
fi

echo
echo "# every step against the 1-rank run without accumulation ($steps steps, fp32):"
echo "# max relative difference of the training loss, the validation loss and the gradient norm"
printf '# %-24s %3s  %-10s %-10s %-10s %s\n' run ranks loss val_loss grad_norm verdict
cat "$table"
test_end
