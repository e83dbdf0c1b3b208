#!/bin/sh
# The FSDP schedule (DESIGN.md "Strategies", prefetch): trains tests/jobs/equiv.ini a few
# steps with fsdp.trace=true, so each rank writes <run_dir>/trace.rank<R>.jsonl, and
# checks the traces with tests/check_trace (its header lists the rules):
#   FULL_SHARD, 2 ranks, prefetch on       every rule, at most two units gathered
#   HYBRID_SHARD, 2 nodes x 2 ranks        the same inside each node's shard group
#   SHARD_GRAD_OP, 2 ranks                 blocks kept gathered from forward to backward;
#                                          and the FULL_SHARD rules must reject it
#   FULL_SHARD, 2 ranks, prefetch off      each gather issued only after the previous
#                                          unit computed; and the prefetch rule must
#                                          reject it (so the check can fail)
#   tied embeddings: FULL_SHARD 2 ranks,   the head is unit 0 again (gathered twice a
#   HYBRID_SHARD 2 x 2, SHARD_GRAD_OP 2    pass, kept by SHARD_GRAD_OP), still at most two
#                                          units gathered, unit 0 reduced twice per
#                                          backward; read as untied, the structure rule
#                                          must reject it
# Every run uses 2 micro-batches a step, so reductions are checked at step boundaries.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, SHLM_BUILDDIR, MPIRUN), or by hand from a
# build directory:
#   SHLM=./shardlm SHLM_BUILDDIR=. SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/fsdp_trace.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM_BUILDDIR=${SHLM_BUILDDIR:-.}
SHLM=${SHLM:-$SHLM_BUILDDIR/shardlm}
check="$SHLM_BUILDDIR/tests/check_trace"
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/equiv.ini"
steps=3
micro=2  # micro-batches per step: global_batch = ranks x micro_batch 1 x micro
layers=4 # six units: a steady state between the embedding and the head

if [ ! -x "$check" ]; then
    echo "fsdp_trace: FAIL: $check not built (make check builds it)"
    exit 1
fi
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin fsdp_trace shlm-trace
prepare_corpus "$work/train.bin"

status=0
fail() {
    echo "fsdp_trace: FAIL: $*"
    status=1
}

# trace NAME NP [--set k=v ...]: trains with the trace on into $work/NAME and checks
# that every rank wrote its trace; returns non-zero (77: no launcher) on failure
trace() {
    name=$1
    np=$2
    shift 2
    echo "+ sh $mpi $np $SHLM train $job --set data.train=$work/train.bin" \
        "--set log.run_dir=$work/$name --set train.steps=$steps --set train.warmup_steps=0" \
        "--set train.micro_batch=1 --set train.global_batch=$((np * micro))" \
        "--set model.n_layers=$layers --set fsdp.trace=true $*"
    sh "$mpi" "$np" "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$name" --set "train.steps=$steps" --set train.warmup_steps=0 \
        --set train.micro_batch=1 --set "train.global_batch=$((np * micro))" \
        --set model.n_layers=$layers --set fsdp.trace=true "$@" >"$work/$name.log" 2>&1 </dev/null
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 15 "$work/$name.log"
        fail "$name: training exited with $rc (log $work/$name.log)"
        return 1
    fi
    r=0
    while [ $r -lt "$np" ]; do
        if [ ! -s "$work/$name/trace.rank$r.jsonl" ]; then
            fail "$name: rank $r wrote no $work/$name/trace.rank$r.jsonl"
            return 1
        fi
        r=$((r + 1))
    done
    return 0
}

# expect WANT NAME BROKEN CHECK-ARGS...: runs check_trace on NAME's traces; WANT 0: every
# rule holds; WANT 1: the rules named in BROKEN (comma-separated) are broken, and the
# check says so with status 1 (anything else, a parse error included, fails the test)
expect() {
    want=$1
    name=$2
    broken=$3
    shift 3
    echo "+ $check $* --micro-per-step $micro $work/$name/trace.rank*.jsonl"
    "$check" "$@" --micro-per-step $micro "$work/$name"/trace.rank*.jsonl >"$work/check.out" 2>&1
    rc=$?
    if [ $rc -ne "$want" ]; then
        cat "$work/check.out"
        if [ "$want" -eq 0 ]; then
            fail "$name: check_trace $* exited $rc: the schedule breaks a rule (above)"
        else
            fail "$name: check_trace $* exited $rc, expected $want (a broken rule)"
        fi
        return
    fi
    for rule in $(echo "$broken" | tr , ' '); do
        # the summary row: rule, checked, broken
        if ! awk -v r="$rule" '$1 == r && $3 > 0 { found = 1 } END { exit !found }' \
            "$work/check.out"; then
            cat "$work/check.out"
            fail "$name: check_trace $* did not report rule '$rule' broken"
            return
        fi
    done
    # as expected: the summary, without the (expected) violations
    grep -v "^  VIOLATION" "$work/check.out"
    echo "ok: $name: check_trace $* exited $rc as expected${broken:+ (broken: $broken)}"
}

if trace full_2r 2 --set fsdp.strategy=FULL_SHARD --set fsdp.prefetch=true; then
    expect 0 full_2r "" --strategy FULL_SHARD
fi
if trace hybrid_2x2 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
    --set fsdp.prefetch=true; then
    expect 0 hybrid_2x2 "" --strategy HYBRID_SHARD
fi
if trace sgo_2r 2 --set fsdp.strategy=SHARD_GRAD_OP --set fsdp.prefetch=true; then
    expect 0 sgo_2r "" --strategy SHARD_GRAD_OP
    echo "(negative: SHARD_GRAD_OP's schedule must break FULL_SHARD's rules)"
    expect 1 sgo_2r in_flight,reshard --strategy FULL_SHARD
fi
if trace full_2r_noprefetch 2 --set fsdp.strategy=FULL_SHARD --set fsdp.prefetch=false; then
    expect 0 full_2r_noprefetch "" --strategy FULL_SHARD --no-prefetch
    echo "(negative: without prefetch the prefetch rule must fail)"
    expect 1 full_2r_noprefetch prefetch --strategy FULL_SHARD
fi

tie="--set model.tie_word_embeddings=true"
# shellcheck disable=SC2086 # one --set, two words
if trace tied_full_2r 2 --set fsdp.strategy=FULL_SHARD $tie; then
    expect 0 tied_full_2r "" --strategy FULL_SHARD --tied
    echo "(negative: a tied schedule read as untied must break the structure rule)"
    expect 1 tied_full_2r structure --strategy FULL_SHARD
fi
# shellcheck disable=SC2086
if trace tied_hybrid_2x2 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 $tie; then
    expect 0 tied_hybrid_2x2 "" --strategy HYBRID_SHARD --tied
fi
# shellcheck disable=SC2086
if trace tied_sgo_2r 2 --set fsdp.strategy=SHARD_GRAD_OP $tie; then
    expect 0 tied_sgo_2r "" --strategy SHARD_GRAD_OP --tied
fi

t_end=$(date +%s)
if [ $status -ne 0 ]; then
    echo "fsdp_trace: FAIL ($((t_end - t_start)) s); traces and logs kept in $work"
    exit 1
fi
echo "fsdp_trace: PASS ($((t_end - t_start)) s)"
rm -rf "$work"
exit 0
