#!/bin/sh
# slurm/ on a 2-node Slurm (tests/lib/nodes.sh makes the nodes; tests/lib/slurm.sh the
# configuration): slurmctld and the clients on the head node "ctl", one slurmd -N nodeK
# and one munged in each node's namespaces (each has its own /run: its spool, pid file
# and socket, as on its own host), 2 CPUs per node, jobs on the CPU backend, 2 x 2 ranks,
# tests/jobs/ckpt.ini (40 steps) with HYBRID_SHARD:
#
#  a. readme:  the 2 x 8 HYBRID_SHARD example of slurm/README.md, run as it is written
#              but at 2 x 2 ranks on CPUs (ntasks 8 -> 2, gpus 8 -> 0, the job file and
#              checkpoint.dir replaced, NET_IF ib0 -> eth0): srun --mpi=pmix, 2 nodes
#              found (host node1, node2; shard 2 x replica 2), 40 steps: the reference;
#  b. mpirun:  the same with LAUNCHER=mpirun, SHARDLM unset, submitted from a directory
#              with no shardlm, SHLM_SETUP putting a directory holding it on PATH (what
#              `module load` does) and SHLM_WRAP a script that records where each rank
#              runs (what a container's exec is): 2 ranks on each node, and the 40
#              losses, gradient norms and final checksums equal a's bit for bit;
#  c. chain:   slurm/resume-chain.sh -n 3 of 2-node jobs: job 1 gets the warning signal
#              mid-run (scancel --signal=USR1 --batch, what --signal=B:USR1@300 sends),
#              saves and exits 0, job 2 resumes and finishes, job 3 is cancelled; ends
#              with a's final loss, every step and checksum equal;
#  d. sweep:   slurm/strong-scaling-submit.sh --nodes 1,2: the report has a row for 2
#              and for 4 ranks, and scaling.png is a PNG (where gnuplot is installed);
#  e. down:    a chain of 2-node jobs with a synchronous checkpoint every 10 steps
#              (checkpoint.async=false: the save of step 10 is complete; a node lost
#              while a background save is in flight: tests/nodes_lost.sh); at step 12 node2
#              goes down (every process in it killed: slurmd, the job's step daemon, its
#              ranks, munged). node1's ranks end within runtime.comm_timeout_s + 15 s,
#              naming ranks 2,3, and job 1 within that + KillWait, not COMPLETED, while
#              node2 is still down; `latest` verifies; node2 boots again (munged,
#              slurmd), job 2 resumes from `latest` and finishes: every step and
#              checksum equal a's, job 3 is cancelled (8 steps before the next save,
#              as in tests/nodes_lost.sh);
#  f. install: make install into $work/prefix; the installed train.sbatch, with SHARDLM
#              unset and no shardlm on the job's PATH, trains the installed demo job
#              (<prefix>/share/shardlm/jobs/tiny.ini, 20 steps, a short sample) on the 2
#              nodes with the installed binary, no data prepared first;
#  g. fences:  train.sbatch's srun runs tests/pmix_fence_probe in place of shardlm: the
#              PMIx fence without data that ends MPI_Init holds every rank until the last
#              (rank 0, 2 s late) has reached it; where one node's ranks left it early,
#              their first message found rank 0 still in MPI_Init, with no handler for it,
#              and killed it (SIGSEGV at address 0). Skipped where the probe is not built
#              (no PMIx headers: Debian libpmix-dev).
#
# Skipped (77) where the nodes cannot be made (not root, no unshare, nsenter or ip), or
# without slurmctld, slurmd, the clients, munged or an MPI launcher. Every daemon and
# process of the nodes is gone when it ends; the work directory is kept when it fails.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, SHLM_BUILDDIR), or by hand from a build
# directory:
#   SHLM=./shardlm SHLM_BUILDDIR=. SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/nodes_slurm.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
case $SHLM in /*) ;; *) SHLM=$(pwd)/$SHLM ;; esac
SHLM_BUILDDIR=${SHLM_BUILDDIR:-$(dirname "$SHLM")}
src=$SHLM_SRCDIR
job=$src/tests/jobs/ckpt.ini
T=4

. "$src/tests/lib.sh"
. "$src/tests/lib/nodes.sh"
. "$src/tests/lib/slurm.sh"
test_begin nodes_slurm shlm-nodes-slurm
slurm_skip_unless_usable
nodes_traps
nodes_up 2 || exit $?
chmod 755 "$work" # the job steps read below it
cd "$work" || exit 99

# ---- the cluster: the same slurm.conf everywhere, the state and logs on the shared file
# system, spool and pid files in each host's own /run ----
mkdir -p "$work/slurm/state"
SLURM_CONF=$work/slurm/slurm.conf
export SLURM_CONF
# KillWait: how long srun waits for the steps of a node that is gone after the others
# ended (default 30 s); also the time between SIGTERM and SIGKILL, which no part uses
kill_wait=5
slurm_ports="" slurm_state=$work/slurm/state slurm_spool=/run/slurmd slurm_run=/run \
    slurm_log=$work/slurm slurm_extra="KillWait=$kill_wait" \
    slurm_conf "$SLURM_CONF" shlmnodes ctl node1:2 node2:2
SLURM_ON="node_exec ctl"
# node_boot HOST: munged and slurmd on HOST, as its start-up scripts would
node_boot() {
    munge_up node_exec "$1" || return 1
    echo "+ node_exec $1 slurmd -f $SLURM_CONF -N $1"
    node_exec "$1" slurmd -f "$SLURM_CONF" -N "$1" || { tail -n 5 "$work/slurm/slurmd-$1.log"; return 1; }
}
# nodes_idle N: until N nodes are idle (30 s at most)
nodes_idle() {
    i=0
    until [ "$($SLURM_ON sinfo -h -o '%D %T' 2>/dev/null)" = "$1 idle" ]; do
        i=$((i + 1))
        [ $i -lt 150 ] || { $SLURM_ON sinfo; fail "$1 nodes not idle after 30 s"; return 1; }
        sleep 0.2
    done
}
munge_up node_exec ctl || exit 1
echo "+ node_exec ctl slurmctld -f $SLURM_CONF"
node_exec ctl slurmctld -f "$SLURM_CONF" || { fail "slurmctld did not start"; exit 1; }
node_boot node1 && node_boot node2 || { fail "a node did not boot"; exit 1; }
nodes_idle 2 || exit 1
echo "nodes_slurm: Slurm up on ctl, node1, node2 in $(($(date +%s) - t_start)) s"

# ---- what every job gets from this environment (sbatch exports it) ----
slurm_jobs_env
# this machine only: both nodes' ranks share its cores (as tests/lib/nodes.sh says)
OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_mpi_yield_when_idle
res="--ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=30"
prepare_corpus "$work/train.bin"
data="--set data.train=$work/train.bin"

# submit NAME sbatch ARGS...: sbatch --parsable ARGS on ctl (from the current
# directory), the job id in $id
submit() {
    sn_name=$1
    shift 2
    echo "+ sbatch $*"
    id=$($SLURM_ON sbatch --parsable "$@") || { fail "$sn_name: sbatch refused it"; return 1; }
    id=${id%%;*}
}
# done_ok NAME ID OUT: job ID COMPLETED with exit 0, its output OUT
done_ok() {
    wait_jobs "$2"
    echo "$1: job $2: $(job_field "$2" JobState), exit $(job_field "$2" ExitCode)"
    [ "$(job_field "$2" JobState)" = COMPLETED ] && [ "$(job_field "$2" ExitCode)" = 0:0 ] ||
        { job_tail "$3"; fail "$1: the job did not complete"; return 1; }
}
# two_nodes NAME OUT: OUT's rank lines are 4 ranks on node1, node2 with shard 2 x replica 2
two_nodes() {
    want="rank 0 node1 0/2 0/2 0/2 rank 1 node1 0/2 1/2 0/2 rank 2 node2 1/2 0/2 1/2 rank 3 node2 1/2 1/2 1/2"
    got=$(sed -n 's/^rank \([0-3]\)\/4 host=\([^ ]*\) node=\([^ ]*\) local=[^ ]* shard=\([^ ]*\) replica=\([^ ]*\) .*/rank \1 \2 \3 \4 \5/p' "$2" | tr '\n' ' ')
    [ "$got" = "$want " ] || fail "$1: rank lines '$got', want '$want'"
}

# ---- a. the README's example at 2 x 2 ----
t0=$(date +%s)
example=$(sed -n '/^NET_IF=ib0 sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 /p' "$src/slurm/README.md")
[ -n "$example" ] || { fail "a: slurm/README.md has no 2 x 8 example line"; exit 1; }
ran=$(echo "$example" | sed -e 's/^NET_IF=ib0 /NET_IF=eth0 /' -e 's/--ntasks-per-node=8/--ntasks-per-node=2/' \
    -e 's/--gpus-per-node=8/--gpus-per-node=0 --cpus-per-task=1 --time=30/' \
    -e "s| slurm/train.sbatch jobs/llama2-7b.ini | $src/slurm/train.sbatch $job |" \
    -e "s|checkpoint.dir=/scratch/ckpt-7b|checkpoint.dir=$work/ref/ckpt $data --set log.run_dir=$work/ref|")
for w in NET_IF=eth0 --ntasks-per-node=2 --gpus-per-node=0 "$job" "checkpoint.dir=$work/ref/ckpt"; do
    case " $ran " in *" $w "* | *"=$w "*) ;; *) fail "a: the README's example changed: no '$w' after the substitutions in: $ran" ;; esac
done
# shellcheck disable=SC2086 # the example's words
set -- $ran
NET_IF=${1#NET_IF=}
shift
export NET_IF
submit a "$@" && done_ok a "$id" "$work/shardlm-$id.out"
unset NET_IF
ref_out=$work/shardlm-$id.out
two_nodes a "$ref_out"
grep -q "^+ srun --mpi=pmix " "$ref_out" || fail "a: the job did not launch with srun --mpi=pmix"
[ "$(steps "$work/ref/metrics.jsonl" loss | wc -l)" -eq 40 ] || fail "a: want 40 logged steps"
echo "a: $(grep '^train.sbatch: job' "$ref_out"); final loss $(steps "$work/ref/metrics.jsonl" loss | tail -n 1 | cut -d' ' -f2); $(($(date +%s) - t0)) s"

# ---- b. LAUNCHER=mpirun, the binary found through SHLM_SETUP, every rank under SHLM_WRAP ----
t0=$(date +%s)
mkdir -p "$work/b" "$work/bin"
ln -s "$SHLM" "$work/bin/shardlm"
cat >"$work/wrap.sh" <<EOF2
#!/bin/sh
echo "\$(hostname) rank \${OMPI_COMM_WORLD_RANK:-?}" >>"$work/wrap.log"
exec "\$@"
EOF2
chmod 755 "$work/wrap.sh"
cd "$work/b" || exit 99
echo "+ SHARDLM= LAUNCHER=mpirun NET_IF=eth0 SHLM_SETUP='PATH=$work/bin:\$PATH' SHLM_WRAP=$work/wrap.sh"
SHARDLM="" LAUNCHER=mpirun NET_IF=eth0 SHLM_SETUP="PATH=$work/bin:\$PATH" SHLM_WRAP=$work/wrap.sh \
    submit b sbatch --nodes=2 $res "$src/slurm/train.sbatch" "$job" --set fsdp.strategy=HYBRID_SHARD \
    --set "checkpoint.dir=$work/b/ckpt" $data --set "log.run_dir=$work/b" && done_ok b "$id" "$work/b/shardlm-$id.out"
cd "$work" || exit 99
out=$work/b/shardlm-$id.out
two_nodes b "$out"
grep -q "^+ mpirun -np 4 .* $work/wrap.sh shardlm train " "$out" || fail "b: the job did not launch wrap.sh shardlm with mpirun -np 4"
where=$(sort "$work/wrap.log" 2>/dev/null | tr '\n' ' ')
[ "$where" = "node1 rank 0 node1 rank 1 node2 rank 2 node2 rank 3 " ] || fail "b: SHLM_WRAP ran on '$where'"
why=$(curves_problem ref b 40)$(sums_problem "$work/ref/ckpt" "$work/b/ckpt")
[ -z "$why" ] || fail "b: mpirun against srun: $why"
echo "b: wrapped ranks: $where; equal to a bit for bit; $(($(date +%s) - t0)) s"

# chain NAME N [--set k=v ...]: slurm/resume-chain.sh -n N of 2-node jobs into $work/NAME;
# the job ids in $ids
chain() {
    ch_name=$1 ch_n=$2
    shift 2
    set -- bash "$src/slurm/resume-chain.sh" -n "$ch_n" --dir "$work/$ch_name" --sbatch "--nodes=2 $res" \
        "$job" --set fsdp.strategy=HYBRID_SHARD $data --set runtime.comm_delay_us=20000 "$@"
    echo "+ NET_IF=eth0 $*"
    NET_IF=eth0 $SLURM_ON "$@" >"$work/$ch_name.out" 2>&1 || { cat "$work/$ch_name.out"; fail "$ch_name: resume-chain.sh failed"; return 1; }
    cat "$work/$ch_name.out"
    ids=$(sed -n 's/^resume-chain.sh: job [0-9]* of [0-9]*: \([0-9]*\).*/\1/p' "$work/$ch_name.out" | tr '\n' ' ')
    # shellcheck disable=SC2086 # job ids
    set -- $ids
    [ $# -eq "$ch_n" ] || { fail "$ch_name: want $ch_n job ids, got '$ids'"; return 1; }
}

# ---- c. the resume chain across 2-node jobs ----
t0=$(date +%s)
if chain c 3; then
    # shellcheck disable=SC2086 # job ids
    set -- $ids
    warn_after c "$work/c" 3 "$1"
    # shellcheck disable=SC2086
    wait_jobs $ids
    # shellcheck disable=SC2086
    chain_verdict c "$work/shardlm-ckpt" $ids
    [ -n "$chain_stop" ] && [ "$chain_stop" -lt 40 ] || fail "c: job 1 did not stop on the signal before step 40"
    [ "$chain_finished" = 2 ] || fail "c: job 2 did not finish the run"
    why=$(curves_problem ref c 40)$(sums_problem "$work/ref/ckpt" "$work/c/checkpoints")
    [ -z "$why" ] || fail "c: the chain against the uninterrupted run: $why"
    echo "c: final loss $(tail -n 1 "$work/c.loss" | cut -d' ' -f2), a's $(tail -n 1 "$work/ref.loss" | cut -d' ' -f2) (job 1 stopped at step $chain_stop); $(($(date +%s) - t0)) s"
fi

# ---- d. the strong-scaling sweep over 1 and 2 nodes ----
t0=$(date +%s)
set -- bash "$src/slurm/strong-scaling-submit.sh" --nodes 1,2 --gpus-per-node 0 --ranks-per-node 2 \
    --steps 3 --warmup 1 --out "$work/sweep" --sbatch "--cpus-per-task=1 --time=10" "$job" $data
echo "+ NET_IF=eth0 $*"
NET_IF=eth0 $SLURM_ON "$@" >"$work/sweep.out" 2>&1 || { cat "$work/sweep.out"; fail "d: strong-scaling-submit.sh failed"; }
cat "$work/sweep.out"
sids=$(sed -n 's/.*: job \([0-9]*\)$/\1/p; s/.*report job \([0-9]*\) .*/\1/p' "$work/sweep.out" | tr '\n' ' ')
# shellcheck disable=SC2086
[ -n "$sids" ] && wait_jobs $sids
if awk '$1 == 2 && $10 == "100.0" { one = 1 } $1 == 4 && $10 + 0 > 0 { two = 1 } END { exit !(one && two) }' \
    "$work/sweep/report.txt" 2>/dev/null; then
    grep -A2 -- '(N)' "$work/sweep/report.txt" | tail -n 2
else
    cat "$work"/sweep/report-*.out "$work"/shardlm-scaling-*.out 2>/dev/null | tail -n 20
    fail "d: no report rows for 2 and 4 ranks"
fi
if command -v gnuplot >/dev/null 2>&1; then
    [ "$(head -c 4 "$work/sweep/scaling.png" 2>/dev/null | od -An -c | tr -d ' ')" = '211PNG' ] ||
        fail "d: no PNG at $work/sweep/scaling.png"
else
    skip_part "d: the scaling report's PNG: no gnuplot (Debian: gnuplot-nox)"
fi
echo "d: $(($(date +%s) - t0)) s"

# ---- e. node2 goes down mid-job; the chain carries on from latest ----
t0=$(date +%s)
if chain e 3 --set checkpoint.every=10 --set checkpoint.async=false --set "runtime.comm_timeout_s=$T"; then
    # shellcheck disable=SC2086 # job ids
    set -- $ids
    j1=$1
    i=0
    while [ "$(lines "$work/e")" -lt 12 ] && [ $i -lt 600 ]; do
        i=$((i + 1))
        sleep 0.1
    done
    echo "+ node_kill node2   # after step $(lines "$work/e"): slurmd, slurmstepd, the ranks, munged"
    t1=$(date +%s)
    node_kill node2 || fail "e: node2's processes outlived SIGKILL"
    # the deadline, the roll call's grace (at most 5 s) and 10 s for the abort
    node_ranks_end e node1 "$t1" $((T + 5 + 10))
    latest=$(cat "$work/e/checkpoints/latest" 2>/dev/null)
    "$SHLM" ckpt verify "$work/e/checkpoints" >"$work/e.verify" 2>&1 || { cat "$work/e.verify"; fail "e: latest ($latest) does not verify"; }
    # the job fails while node2 is still down: srun waits KillWait for node2's tasks
    i=0
    while [ "$(job_field "$j1" JobState)" = RUNNING ] && [ $i -lt 600 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    ended=$(($(date +%s) - t1))
    [ $ended -le $((T + 5 + 10 + kill_wait)) ] ||
        fail "e: job 1 took $ended s to end, want at most $((T + 5 + 10 + kill_wait)) s (node1's bound + KillWait)"
    echo "e: node2 down: node1's ranks ended after $gone s, job 1 ($(job_field "$j1" JobState)) after $ended s; latest = $latest verifies"
    node_boot node2 || fail "e: node2 did not boot again"
    # shellcheck disable=SC2086
    wait_jobs $ids
    state=$(job_field "$j1" JobState)
    named=$(grep '^shardlm: error: .* did not complete within '"$T"' s .*ranks 2,3 did not arrive' "$work/shardlm-ckpt-$j1.out")
    echo "e: job 1 ($j1): $state, exit $(job_field "$j1" ExitCode):"
    echo "    $named" | cut -c 1-300
    [ "$state" != COMPLETED ] || fail "e: job 1 COMPLETED although node2 went down"
    [ -n "$named" ] || fail "e: job 1's output does not name ranks 2,3 as lost"
    o=$work/shardlm-ckpt-$2.out
    [ "$(job_field "$2" JobState)" = COMPLETED ] || { job_tail "$o"; fail "e: job 2 did not complete"; }
    grep "^checkpoint: loaded .*$latest" "$o" || fail "e: job 2 did not resume from $latest"
    [ "$(job_field "$3" JobState)" = CANCELLED ] || fail "e: job 3 was not cancelled"
    why=$(curves_problem ref e 40)$(sums_problem "$work/ref/ckpt" "$work/e/checkpoints")
    [ -z "$why" ] || fail "e: the chain against the uninterrupted run: $why"
    echo "e: job 2 resumed from $latest and finished equal to a; $(($(date +%s) - t0)) s"
fi

# ---- f. the installed scripts and demo job ----
t0=$(date +%s)
echo "+ make -C $SHLM_BUILDDIR install prefix=$work/prefix"
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$SHLM_BUILDDIR" install prefix="$work/prefix" \
    >"$work/install.log" 2>&1 || { tail -n 20 "$work/install.log"; fail "f: make install failed"; }
share=$work/prefix/share/shardlm
mkdir -p "$work/user"
cd "$work/user" || exit 99
# PATH without any directory that holds a shardlm: the scripts must find it themselves
bare_path=$(echo "$PATH" | tr ':' '\n' | while read -r d; do [ -x "$d/shardlm" ] || printf '%s:' "$d"; done)
PATH=${bare_path%:} SHARDLM="" NET_IF=eth0 submit f sbatch --nodes=2 $res "$share/slurm/train.sbatch" "$share/jobs/tiny.ini" \
    --set fsdp.strategy=HYBRID_SHARD --set train.steps=20 --set train.sample_tokens=32 &&
    done_ok f "$id" "$work/user/shardlm-$id.out"
cd "$work" || exit 99
out=$work/user/shardlm-$id.out
grep -q "^+ srun .* $work/prefix/bin/shardlm train " "$out" || fail "f: the installed train.sbatch did not run $work/prefix/bin/shardlm"
[ "$(lines "$work/user/runs/tiny")" -eq 2 ] || fail "f: want 2 logged steps (log.every 10) in $work/user/runs/tiny"
two_nodes f "$out"
echo "f: the installed demo job on 2 nodes: step 20 loss $(steps "$work/user/runs/tiny/metrics.jsonl" loss | tail -n 1 | cut -d' ' -f2); $(($(date +%s) - t0)) s"

# ---- g. MPI_Init's last PMIx fence holds, under train.sbatch's srun ----
t0=$(date +%s)
probe=$SHLM_BUILDDIR/tests/pmix_fence_probe
if [ -x "$probe" ]; then
    SHARDLM=$probe SHLM_PROBE_DELAY=2 NET_IF=eth0 submit g sbatch --nodes=2 $res "$src/slurm/train.sbatch" "$job" &&
        done_ok g "$id" "$work/shardlm-$id.out"
    out=$work/shardlm-$id.out
    grep '^pmix_fence_probe: ' "$out"
    # every rank left the fence after rank 0 entered it (one clock: the nodes share it)
    why=$(awk '$1 == "pmix_fence_probe:" { n++; entered[$3] = $5; left[$3] = $7 }
        END {
            if (n != 4) { printf "%d rank line(s), want 4", n; exit }
            for (r in left) if (left[r] < entered[0])
                printf "rank %s left %.3f s before rank 0 entered; ", r, entered[0] - left[r]
        }' "$out")
    if [ -n "$why" ]; then
        fail "g: the fence without data is no barrier: $why"
    else
        echo "g: the fence without data held every rank until rank 0 came; $(($(date +%s) - t0)) s"
    fi
else
    skip_part "g: the start-up fences: no $probe (configure found no PMIx headers; Debian: libpmix-dev)"
fi

echo "nodes_slurm: $(($(date +%s) - t_start)) s"
[ $fails -eq 0 ] || exit 1
[ $skips -eq 0 ] || skip_test "$skips part(s) not run: $skip_why"
echo "nodes_slurm: OK"
exit 0
