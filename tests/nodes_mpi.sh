#!/bin/sh
# Two real nodes under mpirun (tests/lib/nodes.sh makes them: network, UTS, mount and IPC
# namespaces on this machine, wired by veth pairs to one bridge; Open MPI reaches node2
# through a launch agent and TCP on eth0). 2 nodes x 2 ranks, runtime.ranks_per_node
# unset, tests/jobs/ckpt.ini (40 steps, 8 sequences per step), fp32:
#
#  detect:  every rank's topology line: host nodeK, node (K-1)/2, node-local rank r % 2,
#           and each strategy's shard x replica (FULL_SHARD and SHARD_GRAD_OP 4 x 1,
#           NO_SHARD 1 x 4, HYBRID_SHARD 2 x 2: sharded in a node, replicated across);
#  equal:   the loss and gradient norm of all 40 steps of each strategy within 1e-5 of
#           the 1-rank run's;
#  plan:    each run's memory and comm lines equal the rows of
#           `shardlm plan --ranks 4 --ranks-per-node 2` for its strategy;
#  2to1:    FULL_SHARD on the 2 nodes stops at step 20 (train.stop_after, saving), 4 ranks
#           on node1 alone resume from `latest`: the 40 losses and gradient norms and
#           every checksum of the step-40 checkpoint equal the 2-node run's bit for bit;
#  1to2:    HYBRID_SHARD on node1 alone as 2 nodes of 2 (runtime.ranks_per_node = 2)
#           stops at step 20, the 2 real nodes resume: bit for bit the 2-node HYBRID run
#           (blocks of ranks acting as nodes and real nodes give the same job).
#
# Skipped (77) where the nodes cannot be made (not root, no unshare, nsenter or ip, no
# veth or bridge) or without an MPI launcher. The namespaces and every process in them
# are gone when it ends; the work directory is kept when it fails.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/nodes_mpi.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
case $SHLM in /*) ;; *) SHLM=$(pwd)/$SHLM ;; esac
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
SHLM_TEST_TIMEOUT=${SHLM_TEST_TIMEOUT:-120}
export SHLM_TEST_TIMEOUT

. "$SHLM_SRCDIR/tests/lib.sh"
skip_unless_launcher
. "$SHLM_SRCDIR/tests/lib/nodes.sh"
test_begin nodes_mpi shlm-nodes-mpi
nodes_traps
nodes_up 2 || exit $?
cd "$work" || exit 99
prepare_corpus "$work/train.bin"

# on WHERE NAME NP [--set k=v ...]: trains the job on NP ranks, WHERE "nodes" (2 per
# node) or "node1" (that node alone); the log is $work/NAME.log, the run directory
# $work/NAME up to its first dot (NAME.resume continues NAME's run)
on() {
    where=$1 name=$2 np=$3
    shift 3
    set -- "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/${name%%.*}" "$@"
    if [ "$where" = nodes ]; then
        echo "+ nodes_mpirun $np $*"
        nodes_mpirun "$np" "$@" >"$work/$name.log" 2>&1 </dev/null
    else
        echo "+ node_exec $where sh $mpi $np $*"
        node_exec "$where" sh "$mpi" "$np" "$@" >"$work/$name.log" 2>&1 </dev/null
    fi
    rc=$?
    [ $rc -eq 0 ] || { tail -n 15 "$work/$name.log"; fail "$name: exit $rc"; }
}

# topo_problem NAME S R: says how NAME's rank lines differ from 4 ranks on 2 nodes of 2
# with shard groups of S and replica groups of R (world order), silent when they do not
topo_problem() {
    awk -v S="$2" -v R="$3" '
        /^rank [0-9]+\/4 / {
            split($2, w, "/"); r = w[1]; n++
            want = sprintf("host=node%d node=%d/2 local=%d/2 shard=%d/%d replica=%d/%d", \
                int(r / 2) + 1, int(r / 2), r % 2, r % S, S, int(r / S), R)
            got = $3 " " $4 " " $5 " " $6 " " $7
            if (got != want) { print "rank " r ": " got ", want " want; bad = 1 }
        }
        END { if (n != 4) print n + 0 " rank lines, want 4" }' "$work/$1.log"
}

# same NAME REF: NAME's 40 losses and gradient norms and its step-40 checksums equal REF's
same() {
    why=$(curves_problem "$2" "$1" 40)$(sums_problem "$work/$2/ckpt" "$work/$1/ckpt")
    if [ -n "$why" ]; then
        fail "$1: $why"
    else
        echo "$1: 40 losses, gradient norms and $(wc -l <"$work/$2-ckpt.sums") checksums equal $2's"
    fi
}

# row KEY: the bytes of plan's row KEY in $work/$name.plan
row() { awk -v k="$1" '$1 == k { print $2; exit }' "$work/$name.plan"; }

# ---- the 1-rank reference ----
t0=$(date +%s)
echo "+ sh $mpi 1 $SHLM train $job --set data.train=$work/train.bin --set log.run_dir=$work/ref"
sh "$mpi" 1 "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/ref" \
    >"$work/ref.log" 2>&1 </dev/null || { tail -n 15 "$work/ref.log"; fail "ref: the 1-rank run failed"; exit 1; }

# ---- detect, equal, plan: every strategy on the 2 nodes ----
for strategy in FULL_SHARD SHARD_GRAD_OP NO_SHARD HYBRID_SHARD; do
    case $strategy in
    NO_SHARD) sr="1 4" ;;
    HYBRID_SHARD) sr="2 2" ;;
    *) sr="4 1" ;;
    esac
    name=$(echo "$strategy" | tr 'A-Z_' 'a-z-')
    on nodes "$name" 4 --set fsdp.strategy=$strategy --set "checkpoint.dir=$work/$name/ckpt"
    # shellcheck disable=SC2086 # S and R
    why=$(topo_problem "$name" $sr)
    if [ -n "$why" ]; then
        fail "$name: topology: $why"
        grep '^rank ' "$work/$name.log"
    fi
    d=$(maxrel loss "$work/ref/metrics.jsonl" "$work/$name/metrics.jsonl" 40)
    g=$(maxrel grad_norm "$work/ref/metrics.jsonl" "$work/$name/metrics.jsonl" 40)
    if [ "$d" = missing ] || [ "$g" = missing ] ||
        awk -v d="$d" -v g="$g" 'BEGIN { exit !(d > 1e-5 || g > 1e-5) }'; then
        fail "$name: loss or grad_norm differs from the 1-rank run's: $d, $g (tolerance 1e-5)"
    fi
    "$SHLM" plan "$job" --ranks 4 --ranks-per-node 2 --set fsdp.strategy=$strategy >"$work/$name.plan" 2>&1 ||
        fail "$name: shardlm plan --ranks 4 --ranks-per-node 2 failed"
    gathered=$(row gathered_bytes) grad_buffers=$(row grad_buffer_bytes)
    planned="sharded_state_bytes=$(row sharded_state_bytes)"
    planned="$planned buffer_bytes=$((${gathered:-0} + ${grad_buffers:-0}))"
    planned="$planned activation_bytes=$(row activation_bytes)"
    planned="$planned shard_group_bytes=$(row shard_group_bytes) replica_group_bytes=$(row replica_group_bytes)"
    measured=$(sed -n 's/^memory per rank (allocated): //p; s/^comm per step (rank 0, sent): //p' \
        "$work/$name.log" | tr '\n' ' ' | sed 's/ $//')
    [ "$measured" = "$planned" ] || fail "$name: the run reports '$measured', plan says '$planned'"
    echo "$name: shard x replica $(echo "$sr" | tr ' ' x) on hosts" \
        "$(sed -n 's/^rank [0-9]*\/4 host=\([^ ]*\) .*/\1/p' "$work/$name.log" | tr '\n' ' ')loss/gnorm" \
        "vs 1 rank $d/$g; plan = run: $measured"
done
echo "detect, equal, plan: $(($(date +%s) - t0)) s"

# ---- 2to1: saved by 2 nodes, resumed on 1 ----
t0=$(date +%s)
set -- --set fsdp.strategy=FULL_SHARD --set "checkpoint.dir=$work/2to1/ckpt"
on nodes 2to1 4 "$@" --set train.stop_after=20
on node1 2to1.resume 4 "$@"
grep -q '^rank 0/4 host=node1 node=0/1 ' "$work/2to1.resume.log" || fail "2to1: the resume was not on one node"
grep "^checkpoint: loaded .*step_20.h5" "$work/2to1.resume.log" >/dev/null || fail "2to1: the resume did not load step_20.h5"
same 2to1 full-shard

# ---- 1to2: saved by 1 node (2 blocks of 2), resumed on 2 real nodes ----
set -- --set fsdp.strategy=HYBRID_SHARD --set "checkpoint.dir=$work/1to2/ckpt"
on node1 1to2 4 "$@" --set train.stop_after=20 --set runtime.ranks_per_node=2
grep -q '^rank 2/4 host=node1 node=1/2 ' "$work/1to2.log" || fail "1to2: the first half was not on node1 as 2 x 2"
on nodes 1to2.resume 4 "$@"
grep "^checkpoint: loaded .*step_20.h5" "$work/1to2.resume.log" >/dev/null || fail "1to2: the resume did not load step_20.h5"
same 1to2 hybrid-shard
echo "2to1, 1to2: $(($(date +%s) - t0)) s"

echo "nodes_mpi: $(($(date +%s) - t_start)) s"
[ $fails -eq 0 ] || exit 1
echo "nodes_mpi: OK"
exit 0
