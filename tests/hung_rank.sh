#!/bin/sh
# A rank that hangs instead of dying (kernels/comm/comm_watchdog.h): with runtime.comm_timeout_s=T
# the other ranks must end the job within T + the roll call's grace (at most 5 s) + a few
# seconds, with exactly one line "shardlm: error: ..." naming the operation and the rank
# that did not arrive, a non-zero exit, and no process of the job left behind (the
# stopped one included).
#
#  train2:    2 ranks FULL_SHARD; rank 1 stops itself (SIGSTOP) at step 3
#             (SHLM_TEST_STOP_AT=1:3): rank 0 waits in an all_gather of the shard group
#  hybrid4:   4 ranks HYBRID_SHARD as 2 nodes x 2, rank 2 stops: the replica all_reduce
#  noshard4:  4 ranks NO_SHARD, rank 0 stops: ranks 1-3 wait in the replica all_reduce
#  allreduce: tests/test_watchdog on 3 ranks, rank 1 stopped before a shlm_timed_allreduce
#             (the step's host reductions): "MPI_Allreduce (main)", rank 1
#  order:     tests/test_watchdog on 3 ranks waiting in reductions over two different
#             communicators: nobody is missing, every rank answers, the line says so
#  ok:        shlm_timed_allreduce gives MPI_Allreduce's results
#  badkey:    runtime.comm_timeout_s=abc is refused at start-up with one line
#  save2:     2 ranks saving every step synchronously (checkpoint.async=false); rank 1
#             stops itself once the file of step 3's save exists
#             (SHLM_TEST_STOP_IN_SAVE=1:3): rank 0 waits inside HDF5's collectives (no
#             timed wait of ours); the line names the save, its phase and rank 1, and
#             `latest` still names step_2.h5, which ckpt verify accepts
#  save2_async: the same with the saves in the background (checkpoint.async=true): rank 1
#             stops (its training and its writer) while step 3's save is in flight and
#             rank 0 trains on: one line naming rank 1 (rank 0's writer waits in the
#             save, its training in step 4's collectives: either may raise it), `latest`
#             still names step_2.h5, which ckpt verify accepts
#  load2:     the directory of save2 resumed, rank 1 stopped once the load has opened the
#             file (SHLM_TEST_STOP_IN_LOAD=1): the line names the load and rank 1
#  slow2:     rank 1 takes twice the timeout more to write its data in step 2's save
#             (SHLM_TEST_SLOW_SAVE=1:2), alive all the while: the run must finish, every
#             checkpoint saved (a slow disk is not a hang); synchronous saves
#  slow2_async: the same in the background: step 3's save waits for step 2's, rank 0
#             saying so, and the run finishes with every checkpoint saved
#
# `hung_rank.sh cuda` (tests/gpu/hung_rank.sh, `make check-gpu`, 2 GPUs) runs the NCCL
# backend's cases instead, with a timeout of 10 s: a stuck NCCL collective leaves the
# host free, so the watchdog runs from progress() and from the cuda backend's host waits
# (kernels/cuda/cuda.h shlm_cuda_set_host_wait_hook):
#  cuda2:        2 ranks FULL_SHARD, rank 1 stops at step 3: the all_gather (copy engines)
#  cuda2_smgath: the same with nccl.copy_engine_allgather=false (NCCL's SM kernels)
#  cuda2_hybrid: HYBRID_SHARD with one rank per node: the replica all_reduce
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, SHLM_BUILDDIR, MPIRUN), or by hand from a
# build directory:
#   SHLM=./shardlm SHLM_BUILDDIR=. SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/hung_rank.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
SHLM_BUILDDIR=${SHLM_BUILDDIR:-.}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
backend=${1:-cpu}
case $backend in
cpu) T=3 ;;
cuda) T=10 ;; # CUDA and NCCL start-up and the first step's plans take seconds
*) echo "usage: hung_rank.sh [cpu|cuda]" >&2; exit 99 ;;
esac
# the bound on one case: the timeout, the grace, start-up and the abort, with margin
SHLM_TEST_TIMEOUT=${SHLM_TEST_TIMEOUT:-120}
export SHLM_TEST_TIMEOUT

. "$SHLM_SRCDIR/tests/lib.sh"
skip_unless_launcher
test_begin hung_rank shlm-hung-rank

prepare_corpus "$work/train.bin"

# pids of processes whose command line holds the fixed string $1
procs_with() {
    for f in /proc/[0-9]*/cmdline; do
        { tr '\0' ' ' <"$f"; } 2>/dev/null | grep -q -F -e "$1" && { p=${f#/proc/}; echo "${p%/cmdline}"; }
    done
}

# expect_hang NAME NP STOP-ENV PATTERN... -- CMD...: runs CMD on NP ranks with
# SHLM_TEST_COMM_TIMEOUT_S=$T (and SHLM_TEST_STOP_AT=STOP-ENV unless it is "-", or
# STOP-ENV itself when it is VAR=VALUE), and checks
# the end: non-zero exit within the bound, one error line holding every PATTERN, no
# process left (matched by the case's own tag in the command line)
expect_hang() {
    name=$1 np=$2 stop=$3
    shift 3
    n_pat=0
    while [ "$1" != "--" ]; do
        n_pat=$((n_pat + 1))
        eval "pat_$n_pat=\$1"
        shift
    done
    shift
    envs="SHLM_TEST_COMM_TIMEOUT_S=$T" # test_watchdog's; shardlm takes --set runtime.comm_timeout_s
    case $stop in
    -) ;;
    *=*) envs="$envs $stop" ;;
    *) envs="$envs SHLM_TEST_STOP_AT=$stop" ;;
    esac
    echo "+ env $envs sh $mpi $np $*"
    t0=$(date +%s)
    # shellcheck disable=SC2086 # the env words
    env $envs sh "$mpi" "$np" "$@" >"$work/$name.out" 2>"$work/$name.err" </dev/null
    rc=$?
    secs=$(($(date +%s) - t0))
    i=0 # the launcher's kill reaches every rank
    while left=$(procs_with "$work/$name-tag" | tr '\n' ' ') && [ -n "$left" ] && [ $i -lt 30 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    for p in $left; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
    n=$(grep -c '^shardlm: error: ' "$work/$name.err")
    line=$(grep '^shardlm: error: ' "$work/$name.err")
    why=""
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        why="exit status $rc, want non-zero (124, 137: timed out)"
    elif [ "$secs" -gt $((T + 5 + 25)) ]; then
        why="took $secs s, want at most T + grace + 25 = $((T + 30)) s"
    elif [ -n "$left" ]; then
        why="processes left behind: $left"
    elif [ "$n" -ne 1 ]; then
        why="$n 'shardlm: error:' lines, want 1"
    else
        i=1
        while [ $i -le $n_pat ]; do
            eval "p=\$pat_$i"
            printf '%s\n' "$line" | grep -q -F -e "$p" || { why="the line does not say '$p'"; break; }
            i=$((i + 1))
        done
    fi
    if [ -n "$why" ]; then
        fail "$name: $why"
        sed 's/^/    stderr: /' "$work/$name.err" | head -n 20
    else
        echo "$name: exit $rc after $secs s:"
        echo "    $line"
    fi
}

# train NAME: the training command of case NAME (its run directory is its tag); on the
# cuda backend the shape of tests/gpu/model_steps.sh, which its kernels are tested at
train() {
    echo "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/$1-tag" \
        --set "runtime.backend=$backend" --set "runtime.comm_timeout_s=$T"
    [ "$backend" = cpu ] || echo --set model.dim=256 --set model.ffn_dim=688 \
        --set train.seq_len=128 --set fsdp.param_dtype=bf16
}

if [ "$backend" = cuda ]; then
    # shellcheck disable=SC2046 # train's words
    expect_hang cuda2 2 1:3 "all_gather #" "on shard group (ranks 0,1)" "within $T s" \
        "rank 1 did not arrive" -- $(train cuda2)
    # shellcheck disable=SC2046
    expect_hang cuda2_smgath 2 1:3 "all_gather #" "rank 1 did not arrive" -- $(train cuda2_smgath) \
        --set nccl.copy_engine_allgather=false
    # shellcheck disable=SC2046
    expect_hang cuda2_hybrid 2 1:3 "all_reduce #" "on replica group (ranks 0,1)" \
        "rank 1 did not arrive" -- $(train cuda2_hybrid) --set fsdp.strategy=HYBRID_SHARD \
        --set runtime.ranks_per_node=1
    echo "hung_rank (cuda): $(($(date +%s) - t_start)) s"
    [ $fails -eq 0 ] || { echo "hung_rank: $fails failure(s); work directory kept: $work"; exit 1; }
    rm -rf "$work"
    exit 0
fi

# shellcheck disable=SC2046 # train's words
expect_hang train2 2 1:3 "all_gather #" "on shard group (ranks 0,1)" "within $T s" \
    "rank 1 did not arrive" "runtime.comm_timeout_s" -- $(train train2)
# shellcheck disable=SC2046
expect_hang hybrid4 4 2:3 "rank 2 did not arrive" "all_reduce #" "on replica group (ranks 0,2)" -- \
    $(train hybrid4) --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2
# shellcheck disable=SC2046
expect_hang noshard4 4 0:3 "rank 0 did not arrive" "waiting in it: ranks 1-3" -- \
    $(train noshard4) --set fsdp.strategy=NO_SHARD

wd="$SHLM_BUILDDIR/tests/test_watchdog"
expect_hang allreduce 3 - "MPI_Allreduce (main) #7 on MPI_COMM_WORLD (ranks 0-2)" \
    "rank 1 did not arrive" -- "$wd" stop 1 "$work/allreduce-tag"
expect_hang order 3 - "every rank answers" "MPI_Allreduce (main) #1 on first (ranks 0-2)" \
    "MPI_Allreduce (main) #1 on second (ranks 0-2)" -- "$wd" order "$work/order-tag"

echo "+ sh $mpi 3 $wd ok"
if sh "$mpi" 3 "$wd" ok >"$work/ok.out" 2>&1 </dev/null && grep -q "as MPI_Allreduce's" "$work/ok.out"; then
    echo "ok: $(grep '^test_watchdog ok' "$work/ok.out")"
else
    fail "ok: shlm_timed_allreduce's results differ from MPI_Allreduce's"
    sed 's/^/    /' "$work/ok.out"
fi

echo "+ $SHLM train $job --set data.train=$work/train.bin --set runtime.comm_timeout_s=abc"
"$SHLM" train "$job" --set "data.train=$work/train.bin" --set "runtime.comm_timeout_s=abc" \
    --set "log.run_dir=$work/badkey" >"$work/badkey.out" 2>"$work/badkey.err" </dev/null
rc=$?
why=$(error_line_problem "$work/badkey.err" "--set runtime.comm_timeout_s" "not a number")
if [ $rc -eq 0 ] || [ -n "$why" ]; then
    fail "badkey: exit $rc; $why"
else
    echo "badkey: $(cat "$work/badkey.err")"
fi

# the checkpoint cases: a save and a load, whose collectives HDF5 makes
ck="$work/ck"
# shellcheck disable=SC2046 # train's words
expect_hang save2 2 SHLM_TEST_STOP_IN_SAVE=1:3 "checkpoint save of step 3 (writing the metadata)" \
    "did not complete within $T s" "rank 1 did not arrive" "runtime.comm_timeout_s" -- \
    $(train save2) --set "checkpoint.dir=$ck" --set checkpoint.every=1 --set checkpoint.async=false
# latest_step2 NAME DIR: DIR's `latest` names step_2.h5 (the last save that completed),
# which ckpt verify accepts
latest_step2() {
    latest=$(cat "$2/latest" 2>/dev/null)
    if [ "$latest" != "step_2.h5" ]; then
        fail "$1: latest names '$latest', want step_2.h5 (the last save that completed)"
    elif ! "$SHLM" ckpt verify "$2/step_2.h5" >"$work/verify.out" 2>&1; then
        fail "$1: ckpt verify refuses $2/step_2.h5"
        sed 's/^/    /' "$work/verify.out"
    else
        echo "$1: latest still names step_2.h5, which ckpt verify accepts"
    fi
}
latest_step2 save2 "$ck"
# shellcheck disable=SC2046
expect_hang save2_async 2 SHLM_TEST_STOP_IN_SAVE=1:3 "did not complete within $T s" \
    "rank 1 did not arrive" "runtime.comm_timeout_s" -- \
    $(train save2_async) --set "checkpoint.dir=$work/async-ck" --set checkpoint.every=1 \
    --set checkpoint.async=true
grep -q "^checkpoint: saved step 2 to .* in the background" "$work/save2_async.out" ||
    fail "save2_async: step 2 was not saved in the background"
latest_step2 save2_async "$work/async-ck"
# shellcheck disable=SC2046
expect_hang load2 2 SHLM_TEST_STOP_IN_LOAD=1 "checkpoint load of step_2.h5 (reading the data)" \
    "rank 1 did not arrive" -- $(train load2) --set "checkpoint.dir=$ck" --set checkpoint.every=1

# slow NAME ASYNC: the slow2 case with checkpoint.async=ASYNC
slow() {
    # shellcheck disable=SC2046 # train's words
    set -- "$1" "$2" $(train "$1") --set "checkpoint.dir=$work/$1-ck" --set checkpoint.every=1 \
        --set train.steps=6 --set "checkpoint.async=$2"
    name=$1 async=$2
    shift 2
    echo "+ env SHLM_TEST_SLOW_SAVE=1:2 sh $mpi 2 $*"
    SHLM_TEST_SLOW_SAVE=1:2 sh "$mpi" 2 "$@" >"$work/$name.out" 2>"$work/$name.err" </dev/null
    rc=$?
    latest=$(cat "$work/$name-ck/latest" 2>/dev/null)
    if [ $rc -ne 0 ] || [ "$latest" != "step_6.h5" ] || grep -q '^shardlm: error' "$work/$name.err"; then
        fail "$name: exit $rc, latest '$latest' (want 0 and step_6.h5)"
        sed 's/^/    stderr: /' "$work/$name.err" | head -n 20
        return
    fi
    saved=$(grep -c '^checkpoint: saved step [1-6] ' "$work/$name.out")
    [ "$saved" -eq 6 ] || fail "$name: $saved saves reported, want 6"
    if [ "$async" = true ]; then
        grep -q '^checkpoint: step 3 waited .* for the save of step 2 in flight' "$work/$name.out" ||
            fail "$name: step 3's save did not wait for the slow save of step 2"
    fi
    echo "$name: $(grep 'saved step 2 ' "$work/$name.out" | sed 's/.*: 1/1/')"
}
slow slow2 false
slow slow2_async true

echo "hung_rank: $(($(date +%s) - t_start)) s"
if [ $fails -ne 0 ]; then
    echo "hung_rank: $fails failure(s); work directory kept: $work"
    exit 1
fi
rm -rf "$work"
