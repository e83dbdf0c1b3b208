#!/bin/sh
# slurm/ under a real Slurm: starts a private single-node Slurm on
# localhost (Debian's slurm-wlm + munge; config, state and logs in a temporary directory,
# its own ports), then on the CPU backend, 2 ranks (the node has 2 CPUs):
#
#  a. sbatch slurm/train.sbatch (LAUNCHER=mpirun) trains tests/jobs/ckpt.ini 40 steps to
#     the end: the uninterrupted reference;
#  b. slurm/resume-chain.sh -n 3 (LAUNCHER=srun): job 1 gets the warning signal mid-run
#     and saves and exits 0; job 2 (afterany) resumes from `latest` and finishes, and
#     cancels job 3, which never starts. The 40 losses and gradient norms of the chain's
#     metrics.jsonl and every checksum of its step-40 checkpoint equal the reference's;
#  c. slurm/strong-scaling-submit.sh --nodes 1: one point and the report job, which
#     merges the CSV and prints the table.
#
# The warning is delivered with `scancel --signal=USR1 --batch JOB` once job 1 has logged
# 3 steps: exactly what --signal=B:USR1@N does (the batch shell only, which forwards it),
# but at a known moment. Slurm's own timer is checked by slurmctld about every 30 s and
# fires up to a minute early, which would make the test slow and the stop step random;
# it is exercised by hand: SHLM_SLURM_TEST_TIMER=1 replaces the scancel with
# --time=5 --signal=B:USR1@300 on every job (due at once, sent at slurmctld's next check,
# 0-30 s after the start), slows the steps so job 1 is still running then, and chains 8
# jobs, since each is stopped in turn until one finishes (about 2 minutes).
#
# Skipped (77) without slurmctld, slurmd, sbatch, munged, without root (the daemons run
# as root, munged as munge), or without an MPI launcher. Everything it started is stopped
# on exit, pass or fail; the work directory is kept when it fails.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/slurm_chain.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
case $SHLM in /*) ;; *) SHLM=$(pwd)/$SHLM ;; esac
src=$SHLM_SRCDIR
job=$src/tests/jobs/ckpt.ini
timer=${SHLM_SLURM_TEST_TIMER:-0}

. "$src/tests/lib.sh"
. "$src/tests/lib/slurm.sh"
test_begin slurm_chain shlm-slurm
slurm_skip_unless_usable
chmod 755 "$work" # slurmd's job steps read the spool below it

# ---- a private Slurm: config, state, logs under $work; its own ports ----
port_busy() { # PORT: listening or connected on this host (IPv4 or IPv6)
    grep -qi ":$(printf '%04X' "$1") " /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
port=$((20000 + ($$ % 2000) * 10))
while port_busy $port || port_busy $((port + 1)); do port=$((port + 10)); done
conf=$work/slurm.conf
mkdir -p "$work/state" "$work/spool"
slurm_ports="$port $((port + 1))" slurm_state=$work/state slurm_spool=$work/spool slurm_run=$work \
    slurm_log=$work slurm_conf "$conf" shlmtest localhost localhost:2
SLURM_CONF=$conf
export SLURM_CONF

munged_pid=""
stop_all() {
    # our jobs first (their steps end with them), then the daemons we started
    ids=$(squeue -h -o %i 2>/dev/null)
    # shellcheck disable=SC2086
    [ -n "$ids" ] && scancel $ids 2>/dev/null
    pids=""
    for f in "$work/slurmd.pid" "$work/slurmctld.pid"; do
        [ -f "$f" ] && pids="$pids $(cat "$f")"
    done
    pids="$pids $munged_pid"
    for p in $pids; do kill "$p" 2>/dev/null; done
    for i in $(seq 1 50); do
        alive=""
        for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
        [ -z "$alive" ] && break
        sleep 0.2
    done
    for p in $alive; do kill -9 "$p" 2>/dev/null; done
}
finish() {
    rc=$?
    trap - EXIT INT TERM
    stop_all
    if [ $fails -eq 0 ] && [ $rc -eq 0 ]; then rm -rf "$work"; else echo "slurm_chain: work directory kept: $work"; fi
}
trap finish EXIT
trap 'fail "interrupted"; exit 1' INT TERM

munge_up || exit 1
[ -n "$munge_started" ] && munged_pid=$(cat /run/munge/munged.pid 2>/dev/null)
echo "+ slurmctld -f $conf && slurmd -f $conf -N localhost"
slurmctld -f "$conf" || { fail "slurmctld did not start"; exit 1; }
slurmd -f "$conf" -N localhost || { fail "slurmd did not start"; tail -n 5 "$work/slurmd-localhost.log"; exit 1; }
i=0
until [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; do
    i=$((i + 1))
    if [ $i -ge 150 ]; then
        sinfo
        tail -n 5 "$work/slurmctld.log" "$work/slurmd-localhost.log"
        fail "the node is not idle after 30 s"
        exit 1
    fi
    sleep 0.2
done
echo "slurm_chain: Slurm up on ports $port, $((port + 1)) in $(($(date +%s) - t_start)) s"

slurm_jobs_env
chain_launcher=srun
srun --mpi=list 2>&1 | grep -q pmix || chain_launcher=mpirun
# 2 ranks on the 2 CPUs, no GPUs; --time far beyond the run, so the #SBATCH warning
# (300 s before it) stays out of the way
res="--ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=30"

prepare_corpus "$work/train.bin"

cd "$work" || exit 99
# ---- a. one job to the end ----
t0=$(date +%s)
set -- sbatch --parsable $res "$src/slurm/train.sbatch" "$job" --set "data.train=$work/train.bin" \
    --set "log.run_dir=$work/ref" --set "checkpoint.dir=$work/ref/ckpt"
echo "+ LAUNCHER=mpirun $*"
ref=$(LAUNCHER=mpirun "$@") || { fail "sbatch refused train.sbatch"; exit 1; }
ref=${ref%%;*}
wait_jobs "$ref"
echo "a: job $ref: $(job_field "$ref" JobState), exit $(job_field "$ref" ExitCode), $(($(date +%s) - t0)) s"
out=$work/shardlm-$ref.out
[ "$(job_field "$ref" JobState)" = COMPLETED ] && [ "$(job_field "$ref" ExitCode)" = 0:0 ] ||
    { job_tail "$out"; fail "a: train.sbatch did not complete"; }
[ "$(steps "$work/ref/metrics.jsonl" loss | wc -l)" -eq 40 ] || fail "a: want 40 logged steps"
grep -q "^+ mpirun -np 2 " "$out" || fail "a: the job did not launch with mpirun -np 2"
grep -q "^checkpoint: saved step 40" "$out" || fail "a: no step-40 checkpoint"

# ---- b. the resume chain: job 1 stopped by the warning, job 2 resumes, job 3 cancelled ----
t0=$(date +%s)
delay=10000 # µs per collective: ~0.13 s a step, so the signal lands mid-run
sb=$res
njobs=3
if [ "$timer" = 1 ]; then
    # every job gets the warning at slurmctld's first check after its start (0-30 s):
    # ~2 s a step so job 1 is still running then; enough jobs to reach step 40
    delay=150000
    sb="--ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=5 --signal=B:USR1@300"
    njobs=8
fi
set -- bash "$src/slurm/resume-chain.sh" -n $njobs --dir "$work/chain" --sbatch "$sb" "$job" \
    --set "data.train=$work/train.bin" --set "runtime.comm_delay_us=$delay"
echo "+ LAUNCHER=$chain_launcher $*"
LAUNCHER=$chain_launcher "$@" >"$work/chain.out" 2>&1 || { cat "$work/chain.out"; fail "b: resume-chain.sh failed"; exit 1; }
cat "$work/chain.out"
ids=$(sed -n 's/^resume-chain.sh: job [0-9]* of [0-9]*: \([0-9]*\).*/\1/p' "$work/chain.out" | tr '\n' ' ')
set -- $ids
[ $# -eq $njobs ] || { fail "b: want $njobs job ids, got '$ids'"; exit 1; }
j1=$1
if [ "$timer" = 1 ]; then
    echo "b: waiting for Slurm's warning signals (--signal=B:USR1@300 on a 5-minute limit)"
else
    warn_after b "$work/chain" 3 "$j1"
fi
wait_jobs $ids
chain_verdict b "$work/shardlm-ckpt" $ids
n1=$chain_stop finished=$chain_finished
[ -n "$n1" ] && [ "$n1" -lt 40 ] || fail "b: job 1 did not stop on the signal before step 40"
[ -n "$finished" ] || fail "b: no job of the chain reached step 40"
[ "$timer" = 1 ] || [ "$finished" = 2 ] || fail "b: job 2 did not finish the run"
n=$n1
why=$(curves_problem ref chain 40)$(sums_problem "$work/ref/ckpt" "$work/chain/checkpoints")
[ -z "$why" ] || fail "b: the chain against the uninterrupted run: $why"
echo "b: final loss $(tail -n 1 "$work/ref.loss" | cut -d' ' -f2) (uninterrupted) and $(tail -n 1 "$work/chain.loss" | cut -d' ' -f2) (chain: job 1 stopped at step $n, job $finished finished); $(wc -l <"$work/ref-ckpt.sums") checksums equal; $(($(date +%s) - t0)) s"

# ---- c. the strong-scaling sweep: one point and the report job ----
t0=$(date +%s)
set -- bash "$src/slurm/strong-scaling-submit.sh" --nodes 1 --gpus-per-node 0 --ranks-per-node 2 \
    --steps 3 --warmup 1 --out "$work/sweep" --sbatch "--cpus-per-task=1 --time=10" "$job" \
    --set "data.train=$work/train.bin"
echo "+ $*"
"$@" >"$work/sweep.out" 2>&1 || { cat "$work/sweep.out"; fail "c: strong-scaling-submit.sh failed"; }
cat "$work/sweep.out"
sids=$(sed -n 's/.*: job \([0-9]*\)$/\1/p; s/.*report job \([0-9]*\) .*/\1/p' "$work/sweep.out" | tr '\n' ' ')
# shellcheck disable=SC2086
[ -n "$sids" ] && wait_jobs $sids
if awk '$1 == 2 && $2 == "FULL_SHARD" && $10 == "100.0" { ok = 1 } END { exit !ok }' "$work/sweep/report.txt" 2>/dev/null; then
    grep -A1 -- '(N)' "$work/sweep/report.txt" | tail -n 1
else
    cat "$work"/sweep/report-*.out "$work"/shardlm-scaling-*.out 2>/dev/null | tail -n 20
    fail "c: no report row for 2 ranks"
fi
echo "c: $(($(date +%s) - t0)) s"

echo "slurm_chain: $(($(date +%s) - t_start)) s"
[ $fails -eq 0 ] || exit 1
echo "slurm_chain: OK"
exit 0
