#!/bin/sh
# FSDP set-up errors that only show with a world size: each must end, on every rank, with
# a non-zero exit below 128, exactly one "shardlm: error: ..." line on stderr naming the
# job file and the keys involved, and no hang. Every case runs under mpirun.
#   env SHLM=./shardlm SHLM_SRCDIR=. sh tests/fsdp_errors.sh
set -u
: "${SHLM:?set SHLM to the shardlm binary}" "${SHLM_SRCDIR:?set SHLM_SRCDIR to the source tree}"

T=$(mktemp -d "${TMPDIR:-/tmp}/shlm-fsdp.XXXXXX") || exit 99
# SHLM_KEEP_TMP=1 keeps the job and token files, so a printed command can be rerun
trap '[ -n "${SHLM_KEEP_TMP:-}" ] || rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
limit=${SHLM_TEST_TIMEOUT:-30}
n_fail=0
n_ok=0
. "$SHLM_SRCDIR/tests/lib.sh"
fail() { echo "FAIL: $*"; n_fail=$((n_fail + 1)); }

echo "+ $SHLM data prepare --tokenizer bytes $SHLM_SRCDIR/jobs/data/shakespeare-train.txt $T/train.bin"
if ! "$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" \
    "$T/train.bin"; then
    echo "FAIL: cannot prepare the corpus"
    exit 1
fi

# job NAME [SECTION-LINES...]: writes $T/NAME.ini, the small model, with extra lines
# appended (each a "[section]" or "key = value" line)
job() {
    name=$1
    shift
    {
        cat "$SHLM_SRCDIR/tests/jobs/small.ini"
        printf '\n[log]\nrun_dir = run\n'
        for l in "$@"; do printf '%s\n' "$l"; done
    } >"$T/$name.ini"
}

# Each rank runs under a wrapper that records its own exit status, and Open MPI is told
# not to kill the other ranks when the first exits non-zero, so each status is real.
cat >"$T/rankrc.sh" <<'EOF'
#!/bin/sh
# rankrc.sh DIR CMD...: runs CMD, writes its exit status to DIR/rc.<pid>
d=$1
shift
"$@"
s=$?
echo $s >"$d/rc.$$"
exit $s
EOF

# mpi NP LAUNCHER-ARGS...: runs tests/mpi_test.sh NP LAUNCHER-ARGS; sets $rc, $secs
mpi() {
    rm -rf "$T/rcs"
    mkdir "$T/rcs"
    t0=$(date +%s)
    echo "+ OMPI_MCA_orte_abort_on_non_zero_status=0 sh $SHLM_SRCDIR/tests/mpi_test.sh $*"
    OMPI_MCA_orte_abort_on_non_zero_status=0 SHLM_TEST_TIMEOUT=$limit \
        sh "$SHLM_SRCDIR/tests/mpi_test.sh" "$@" >"$T/out" 2>"$T/err" </dev/null
    rc=$?
    secs=$(($(date +%s) - t0))
    grep '^+ ' "$T/out"
    skip_without_launcher $rc
}
# train_on NP JOB [ARGS...]: shardlm train JOB ARGS on NP ranks, each under rankrc.sh
train_on() {
    np=$1
    shift
    mpi "$np" sh "$T/rankrc.sh" "$T/rcs" "$SHLM" train "$@"
}

# expect NAME NP PATTERN...: every one of NP ranks exited non-zero (< 128) by itself, in
# time, with exactly one stderr line "shardlm: error: ..." holding every PATTERN
expect() {
    name=$1 np=$2
    shift 2
    sed 's/^/    stderr: /' "$T/err"
    statuses=$(cat "$T"/rcs/rc.* 2>/dev/null | tr '\n' ' ')
    n=$(find "$T/rcs" -type f -name "rc.*" | wc -l | tr -d ' ')
    echo "    rank exit statuses: $statuses(${secs}s)"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        fail "$name: timed out after $limit s"
        return
    fi
    if grep -q -i -e segmentation -e 'core dumped' -e MPI_ABORT -e 'signal [0-9]' \
        "$T/out" "$T/err"; then
        fail "$name: crash report in the output"
        return
    fi
    if [ "$n" -ne "$np" ]; then
        fail "$name: only $n of $np ranks exited by themselves"
        return
    fi
    for s in $statuses; do
        if [ "$s" -eq 0 ] || [ "$s" -ge 128 ]; then
            fail "$name: a rank exited with status $s"
            return
        fi
    done
    why=$(error_line_problem "$T/err" "$@")
    if [ -n "$why" ]; then
        fail "$name: $why"
        return
    fi
    echo "ok: $name"
    n_ok=$((n_ok + 1))
}

# the baseline: the job runs on 2 ranks, so each case below fails for its one reason
job base
train_on 2 "$T/base.ini" --set train.steps=1
if [ $rc -ne 0 ] || [ "$(cat "$T"/rcs/rc.* | tr -d '\n')" != "00" ]; then
    cat "$T/err"
    echo "FAIL: the baseline job does not train on 2 ranks; the cases below would prove nothing"
    exit 1
fi
echo "ok: baseline job trains on 2 ranks"

# the topology keys come from the job file, so the message can say which file
job rpn2 "[runtime]" "ranks_per_node = 2"
train_on 3 "$T/rpn2.ini"
expect "world 3 not divisible by runtime.ranks_per_node 2" 3 rpn2.ini ranks_per_node \
    "world size 3"

job sgs3 "[fsdp]" "shard_group_size = 3"
train_on 4 "$T/sgs3.ini"
expect "world 4 not divisible by fsdp.shard_group_size 3" 4 sgs3.ini shard_group_size \
    "world size 4"

job sgs4 "[fsdp]" "shard_group_size = 4"
train_on 2 "$T/sgs4.ini"
expect "fsdp.shard_group_size 4 larger than world 2" 2 sgs4.ini shard_group_size \
    "world size 2"

job noshard "[fsdp]" "strategy = NO_SHARD" "shard_group_size = 2"
train_on 2 "$T/noshard.ini"
expect "NO_SHARD with fsdp.shard_group_size 2" 2 noshard.ini NO_SHARD shard_group_size

job zero3 "[fsdp]" "strategy = ZERO3"
ln=$(grep -n '^strategy' "$T/zero3.ini" | cut -d: -f1)
train_on 2 "$T/zero3.ini"
expect "unknown fsdp.strategy lists the valid ones" 2 "zero3.ini:$ln" "'ZERO3'" FULL_SHARD \
    SHARD_GRAD_OP NO_SHARD HYBRID_SHARD

train_on 2 "$T/base.ini" --set train.global_batch=3
expect "global_batch 3 not a multiple of micro_batch 1 x 2 ranks" 2 base.ini global_batch \
    micro_batch "(3)" "(2)"

train_on 4 "$T/base.ini" --set train.micro_batch=2 --set train.global_batch=6
expect "global_batch 6 not a multiple of micro_batch 2 x 4 ranks" 4 base.ini global_batch \
    micro_batch "(6)" "(4)"

# ---- different jobs on different ranks: MPMD ("A : B"), which tests/mpi_test.sh hands
# through to mpirun/mpiexec untouched; srun spells MPMD differently ----
case ${MPIRUN:-mpirun} in
*srun*)
    echo "fsdp_errors: SKIP: the MPMD cases: the launcher is srun"
    mpmd_skipped=1
    ;;
*)
    job a
    job b
    sed -i 's/^steps = 2$/steps = 3/' "$T/b.ini"
    mpi 1 sh "$T/rankrc.sh" "$T/rcs" "$SHLM" train "$T/a.ini" \
        : -np 1 sh "$T/rankrc.sh" "$T/rcs" "$SHLM" train "$T/b.ini"
    expect "different job files on different ranks" 2 b.ini differs "rank 1"

    mpi 1 sh "$T/rankrc.sh" "$T/rcs" "$SHLM" train "$T/a.ini" \
        : -np 1 sh "$T/rankrc.sh" "$T/rcs" "$SHLM" train "$T/a.ini" --set train.steps=3
    expect "the same job file with different --set on different ranks" 2 a.ini differs \
        "rank 1"

    mpi 1 sh "$T/rankrc.sh" "$T/rcs" "$SHLM" train "$T/a.ini" \
        : -np 1 sh "$T/rankrc.sh" "$T/rcs" "$SHLM" train "$T/nothere.ini"
    expect "a job file missing on one rank" 2 nothere.ini "cannot open" "rank 1"
    ;;
esac

echo "fsdp_errors: $n_ok passed, $n_fail failed"
[ $n_fail -ne 0 ] || [ -z "${mpmd_skipped:-}" ] || skip_test "the MPMD cases: the launcher is srun"
[ $n_fail -eq 0 ]
