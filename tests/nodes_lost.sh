#!/bin/sh
# A node lost in the middle of a run (tests/lib/nodes.sh: 2 nodes x 2 ranks under mpirun,
# HYBRID_SHARD, tests/jobs/ckpt.ini with a checkpoint every 10 steps, each collective
# slowed to 20 ms so the loss lands mid-run, runtime.comm_timeout_s=T):
#
#  kill:  at step 12 node2's ranks are SIGKILLed. node1's ranks (the survivors) are gone
#         within T + the roll call's grace + 10 s, mpirun exits non-zero naming the lost
#         rank and its node ("process rank 2 ... on node node2 exited on signal 9");
#  link:  at step 12 node2's link goes down (nothing answers, nothing is refused: a node
#         that hangs or loses power). node1's ranks end on their own deadline with
#         shardlm's one line naming "ranks 2,3 did not arrive", within the same bound;
#         mpirun, which waits for node2's daemon until TCP gives up, exits non-zero too
#         (node1's net.ipv4.tcp_retries2 is 3 here, seconds; the default 15 is ~15 min);
#         then node2 "crashes" (its processes are killed) and its link comes back.
# Both with synchronous saves (checkpoint.async=false): the loss lands 8 steps after the
# save of step 10 completed and before the next. Then both again with the saves in the
# background (kill_async, link_async): the save of step 20 is in flight when node2 is
# lost at step 22 (rank 0's writer takes 2 T more over its data, SHLM_TEST_SLOW_SAVE=0:20),
# the survivors end within the same bound (link: with one shardlm line naming ranks 2,3),
# and `latest` still names step_10.h5.
# After each: `latest` names a checkpoint that `shardlm ckpt verify` accepts (step_10.h5),
# and the run resumes from it on the 2 nodes to step 40; every step's loss and gradient
# norm (the resumed run's where steps were run twice) and the step-40 checksums equal an
# uninterrupted run's bit for bit.
#
# Skipped (77) where the nodes cannot be made or without an MPI launcher. Run by
# `make check` (env SHLM, SHLM_SRCDIR), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/nodes_lost.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
case $SHLM in /*) ;; *) SHLM=$(pwd)/$SHLM ;; esac
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
T=4
SHLM_TEST_TIMEOUT=${SHLM_TEST_TIMEOUT:-120}
export SHLM_TEST_TIMEOUT

. "$SHLM_SRCDIR/tests/lib.sh"
skip_unless_launcher
. "$SHLM_SRCDIR/tests/lib/nodes.sh"
test_begin nodes_lost shlm-nodes-lost
nodes_traps
nodes_up 2 || exit $?
cd "$work" || exit 99
prepare_corpus "$work/train.bin"
# mpirun's daemon on node1 gives up on an unreachable node2 after a few retransmissions
node_exec node1 sh -c 'echo 3 >/proc/sys/net/ipv4/tcp_retries2' || fail "cannot set node1's tcp_retries2"

# train NAME [--set k=v ...]: the job on the 2 nodes into $work/NAME (checkpoints in
# $work/NAME/ckpt), in the background ($pid); log $work/NAME.out and .err
train() {
    name=$1
    shift
    set -- "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/$name" \
        --set "checkpoint.dir=$work/$name/ckpt" --set checkpoint.every=10 --set fsdp.strategy=HYBRID_SHARD \
        --set "runtime.comm_timeout_s=$T" "$@"
    echo "+ nodes_mpirun 4 $*"
    nodes_mpirun 4 "$@" >>"$work/$name.out" 2>>"$work/$name.err" </dev/null &
    pid=$!
}

echo "ref: the uninterrupted run"
train ref
wait $pid || { tail -n 15 "$work/ref.err"; fail "ref: exit $?"; exit 1; }

# lose CASE ASYNC: runs CASE (kill or link) as the header says, with checkpoint.async=ASYNC,
# in $work/CASE (sync) or $work/CASE_async
lose() {
    case=$1 async=$2
    name=$case
    at=12
    t0=$(date +%s)
    if [ "$async" = true ]; then
        name=${case}_async at=22
        SHLM_TEST_SLOW_SAVE=0:20 NODES_FORWARD=SHLM_TEST_SLOW_SAVE
        export SHLM_TEST_SLOW_SAVE NODES_FORWARD
    fi
    train "$name" --set runtime.comm_delay_us=20000 --set "checkpoint.async=$async"
    unset SHLM_TEST_SLOW_SAVE NODES_FORWARD
    n=$(wait_step "$work/$name" $at $pid)
    [ "$n" -ge $at ] || { fail "$name: the run did not reach step $at"; cat "$work/$name.err"; return; }
    t1=$(date +%s)
    if [ "$async" = true ] && grep -q "^checkpoint: saved step 20 " "$work/$name.out"; then
        fail "$name: the save of step 20 ended before node2 was lost (no save in flight to test)"
    fi
    if [ "$case" = kill ]; then
        echo "+ node_kill node2 shardlm   # after step $n"
        node_kill node2 shardlm || fail "$name: node2's ranks outlived SIGKILL"
    else
        echo "+ node_link node2 down   # after step $n"
        node_link node2 down || fail "$name: cannot take node2's link down"
    fi
    # the deadline, the roll call's grace (at most 5 s) and 10 s for the abort
    node_ranks_end "$name" node1 "$t1" $((T + 5 + 10))
    wait $pid
    rc=$?
    ended=$(($(date +%s) - t1))
    [ $rc -ne 0 ] || fail "$name: mpirun exited 0"
    if [ "$case" = kill ]; then
        named=$(grep -E 'process rank [23] with PID [0-9]+ on node node2 exited on signal 9' "$work/$name.err")
    else
        named=$(grep '^shardlm: error: .* did not complete within '"$T"' s .*ranks 2,3 did not arrive' "$work/$name.err")
        lines=$(grep -c '^shardlm: error: ' "$work/$name.err")
        [ "$lines" -eq 1 ] || fail "$name: $lines 'shardlm: error:' lines, want 1"
        node_kill node2 || fail "$name: node2's processes outlived SIGKILL"
        node_link node2 up || fail "$name: cannot bring node2's link up"
    fi
    if [ -z "$named" ]; then
        sed 's/^/    stderr: /' "$work/$name.err" | head -n 20
        fail "$name: nothing names the lost ranks of node2"
    fi
    echo "$name: node1's ranks ended $gone s after node2 was lost, mpirun exited $rc after $ended s:"
    echo "    $named" | cut -c 1-300
    latest=$(cat "$work/$name/ckpt/latest" 2>/dev/null)
    [ "$latest" = step_10.h5 ] || fail "$name: latest names '$latest', want step_10.h5"
    if ! "$SHLM" ckpt verify "$work/$name/ckpt" >"$work/$name.verify" 2>&1; then
        cat "$work/$name.verify"
        fail "$name: latest ($latest) does not verify"
    fi
    train "$name" --set "checkpoint.async=$async"
    wait $pid || { tail -n 15 "$work/$name.err"; fail "$name: the resume exited $?"; return; }
    grep "^checkpoint: loaded .*$latest" "$work/$name.out" >/dev/null || fail "$name: the resume did not load $latest"
    why=$(curves_problem ref "$name" 40)$(sums_problem "$work/ref/ckpt" "$work/$name/ckpt")
    [ -z "$why" ] || fail "$name: $why"
    echo "$name: resumed from $latest to step 40, equal to the uninterrupted run; $(($(date +%s) - t0)) s"
}

lose kill false
lose link false
lose kill true
lose link true

echo "nodes_lost: $(($(date +%s) - t_start)) s"
[ $fails -eq 0 ] || exit 1
echo "nodes_lost: OK"
exit 0
