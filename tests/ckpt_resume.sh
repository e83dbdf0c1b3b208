#!/bin/sh
# Exact resume and resharding through HDF5 checkpoints (CPU backend):
#
#  exact: for each strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD on 2 ranks;
#  HYBRID_SHARD on 4 ranks as 2 nodes x 2), run A trains 40 steps straight; run B trains
#  the same job but stops after step 20 (train.stop_after, the schedule still spans 40
#  steps) and saves; run C resumes from B's directory (checkpoint.resume = auto) to step
#  40. The loss and gradient-norm strings of steps 21-40 (metrics.jsonl, %.9g) of C must
#  equal A's, and so must the whole state at step 40: every dataset's checksum of A's and
#  C's final checkpoints (`shardlm ckpt info`), i.e. master weights and both AdamW moments
#  bit for bit.
#
#  resharding: HYBRID_SHARD's step-20 checkpoint (4 ranks, shard groups of 2, replicas
#  of 2) is resumed on 2 ranks FULL_SHARD and on 1 rank NO_SHARD; their losses of steps
#  21-40 must stay within 1e-5 (relative) of the 4-rank run A (only the order of fp32
#  sums differs).
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/ckpt_resume.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). Each command is printed; the work
# directory is kept when the test fails.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
tol=1e-5

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin ckpt_resume shlm-ckpt-resume

prepare_corpus "$work/train.bin"

# run NAME NP [--set k=v ...]: trains the job into $work/NAME (log $work/NAME.log)
run() {
    name=$1
    np=$2
    shift 2
    echo "+ sh $mpi $np $SHLM train $job --set data.train=$work/train.bin" \
        "--set log.run_dir=$work/$name $*"
    sh "$mpi" "$np" "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$name" "$@" >"$work/$name.log" 2>&1 </dev/null
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 20 "$work/$name.log"
        fail "$name exited with $rc"
    fi
    return $rc
}

# steps FILE FIRST LAST KEY: "step value" lines of metrics.jsonl, value as printed
steps() {
    sed -n "s/.*\"step\": \([0-9]*\),.*\"$4\": \([^,}]*\).*/\1 \2/p" "$1" |
        awk -v a="$2" -v b="$3" '$1 >= a && $1 <= b'
}

# checksums DIR: every dataset's checksum line of DIR's latest checkpoint
checksums() {
    "$SHLM" ckpt info "$1" | grep ' 0x'
}

for s in FULL_SHARD SHARD_GRAD_OP NO_SHARD HYBRID_SHARD; do
    np=2
    extra=""
    if [ $s = HYBRID_SHARD ]; then
        np=4
        extra="--set runtime.ranks_per_node=2"
    fi
    # shellcheck disable=SC2086
    run "$s-A" $np --set fsdp.strategy=$s $extra --set "checkpoint.dir=$work/$s-A/ck" || continue
    # shellcheck disable=SC2086
    run "$s-B" $np --set fsdp.strategy=$s $extra --set "checkpoint.dir=$work/$s-B/ck" \
        --set train.stop_after=20 || continue
    # shellcheck disable=SC2086
    run "$s-C" $np --set fsdp.strategy=$s $extra --set "checkpoint.dir=$work/$s-B/ck" || continue
    grep -q "loaded weights and optimizer of $work/$s-B/ck/step_20.h5" "$work/$s-C.log" ||
        fail "$s: C did not resume from step_20.h5"
    first=$(sed -n 's/.*"step": \([0-9]*\),.*/\1/p' "$work/$s-C/metrics.jsonl" | head -n 1)
    [ "$first" = 21 ] || fail "$s: the resumed run's first step is '$first', not 21"
    for key in loss grad_norm; do
        steps "$work/$s-A/metrics.jsonl" 21 40 $key >"$work/$s-A.$key"
        steps "$work/$s-C/metrics.jsonl" 21 40 $key >"$work/$s-C.$key"
        n=$(wc -l <"$work/$s-A.$key")
        if [ "$n" -ne 20 ] || ! cmp -s "$work/$s-A.$key" "$work/$s-C.$key"; then
            diff "$work/$s-A.$key" "$work/$s-C.$key" | head -n 6
            fail "$s: $key of steps 21-40 differ after resume"
        fi
    done
    checksums "$work/$s-A/ck" >"$work/$s-A.sums" 2>&1
    checksums "$work/$s-B/ck" >"$work/$s-C.sums" 2>&1
    if [ "$(wc -l <"$work/$s-A.sums")" -ne 63 ] || ! cmp -s "$work/$s-A.sums" "$work/$s-C.sums"; then
        diff "$work/$s-A.sums" "$work/$s-C.sums" | head -n 6
        fail "$s: the state at step 40 differs (dataset checksums)"
    fi
    echo "ckpt_resume: $s on $np ranks: steps 21-40 loss and grad_norm identical, step-40" \
        "state identical (63 dataset checksums)"
done

# ---- resharding: HYBRID_SHARD 2x2 on 4 ranks -> FULL_SHARD on 2, NO_SHARD on 1 ----
ck20="$work/HYBRID_SHARD-B/ck/step_20.h5"
for target in "2 FULL_SHARD" "1 NO_SHARD"; do
    set -- $target
    name="reshard-$1-$2"
    run "$name" "$1" --set "fsdp.strategy=$2" --set "checkpoint.resume=$ck20" || continue
    grep -q "saved by 4 ranks HYBRID_SHARD" "$work/$name.log" || fail "$name: no load line"
    steps "$work/$name/metrics.jsonl" 21 40 loss >"$work/$name.loss"
    rel=$(awk '
        FNR == NR { ref[$1] = $2; next }
        { n++; a = ref[$1] + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d
          if (a < 0) a = -a; r = d / a; if (r > m) m = r }
        END { if (n != 20) print "missing"; else printf "%.3e\n", m }' \
        "$work/HYBRID_SHARD-A.loss" "$work/$name.loss")
    if [ "$rel" = missing ] || awk -v r="$rel" -v t="$tol" 'BEGIN { exit !(r > t) }'; then
        fail "$name: losses of steps 21-40 vs the 4-rank run: max rel diff $rel (tolerance $tol)"
    else
        echo "ckpt_resume: 4 ranks HYBRID_SHARD -> $1 rank(s) $2: steps 21-40 within $rel" \
            "relative of the uninterrupted 4-rank run"
    fi
done

echo "ckpt_resume: $(($(date +%s) - t_start)) s"
if [ $fails -ne 0 ]; then
    echo "ckpt_resume: FAIL ($fails problems); work directory kept: $work"
    exit 1
fi
rm -rf "$work"
echo "ckpt_resume: PASS"
exit 0
