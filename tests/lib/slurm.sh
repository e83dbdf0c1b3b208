# A private Slurm for the tests that run slurm/ under a real scheduler (sourced, not run;
# needs tests/lib.sh's test_begin first): tests/slurm_chain.sh (one node, localhost) and
# tests/nodes_slurm.sh (the nodes of tests/lib/nodes.sh). Debian's slurm-wlm 22.05 and
# munge, as root, no systemd or cgroups (FIELD-NOTES "Ranks, launchers, Slurm").
#
#   slurm_skip_unless_usable   ends the test as skipped (skip_test) without the daemons,
#                              the clients, munged, root or an MPI launcher
#   slurm_conf FILE NAME CTL NODES... writes a slurm.conf: cluster NAME, controller CTL
#                              (host[(address)]), one "NodeName=..." line per NODES word
#                              (name:cpus), one partition "test" of all of them; reads
#                              $slurm_ports ("ctlport slurmdport", or empty: Slurm's),
#                              $slurm_state, $slurm_spool, $slurm_run, $slurm_log (the
#                              directories of state, spool, pid files and logs) and
#                              $slurm_extra (more lines, or empty)
#   munge_up [PREFIX...]       makes sure a munged answers where PREFIX runs commands
#                              (e.g. node_exec node1; nothing: this machine), starting
#                              one (socket, pid, seed and log under /run/munge) if none
#                              does ($munge_started is then 1); the key
#                              /etc/munge/munge.key is made if missing
#   slurm_jobs_env             exports what every job gets from this environment, and
#                              lets its ranks dump core
#   job_tail OUT               the last 20 lines of a job's output OUT, then the stack
#                              of every thread of each core file beside it (gdb)
#   wait_jobs ID...            until none of them is queued or running (120 s at most)
#   job_field ID FIELD         JobState, ExitCode, ... from scontrol
#   warn_after LABEL DIR N ID  once DIR/metrics.jsonl has N lines (60 s at most), job ID's
#                              batch shell gets SIGUSR1, as from --signal=B:USR1@...
#   chain_verdict LABEL PREFIX ID...  checks the jobs of a resume chain, see there
# $SLURM_ON (empty, or e.g. "node_exec ctl") prefixes every Slurm client command these
# functions run.

slurm_skip_unless_usable() {
    for su_c in slurmctld slurmd sbatch squeue scancel scontrol sinfo munge runuser; do
        command -v "$su_c" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin
        command -v "$su_c" >/dev/null 2>&1 || {
            skip_test "no $su_c (Debian: apt-get install slurmctld slurmd slurm-client munge)"
        }
    done
    [ -x /usr/sbin/munged ] || skip_test "no /usr/sbin/munged"
    [ "$(id -u)" = 0 ] || skip_test "the private Slurm needs root"
    skip_unless_launcher
}

slurm_conf() {
    sc_file=$1 sc_name=$2 sc_ctl=$3
    shift 3
    sc_nodes=""
    for sc_n in "$@"; do sc_nodes="$sc_nodes${sc_nodes:+,}${sc_n%%:*}"; done
    {
        echo "# a private Slurm for $test_name: root, no systemd, no cgroups"
        echo "ClusterName=$sc_name"
        echo "SlurmctldHost=$sc_ctl"
        if [ -n "${slurm_ports:-}" ]; then
            echo "SlurmctldPort=${slurm_ports% *}"
            echo "SlurmdPort=${slurm_ports#* }"
        fi
        cat <<EOF
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$slurm_state
SlurmdSpoolDir=$slurm_spool
SlurmctldPidFile=$slurm_run/slurmctld.pid
SlurmdPidFile=$slurm_run/slurmd.pid
SlurmctldLogFile=$slurm_log/slurmctld.log
SlurmdLogFile=$slurm_log/slurmd-%n.log
EOF
        [ -z "${slurm_extra:-}" ] || echo "$slurm_extra"
        for sc_n in "$@"; do
            echo "NodeName=${sc_n%%:*} CPUs=${sc_n#*:} RealMemory=4000 State=UNKNOWN"
        done
        echo "PartitionName=test Nodes=$sc_nodes Default=YES MaxTime=INFINITE State=UP"
    } >"$sc_file"
}

munge_up() {
    munge_started=""
    "$@" sh -c 'munge -n 2>/dev/null | unmunge >/dev/null 2>&1' && return 0
    if [ ! -s /etc/munge/munge.key ]; then
        echo "+ mungekey --create"
        mungekey --create >/dev/null 2>&1 || { fail "cannot create /etc/munge/munge.key"; return 1; }
        chown munge:munge /etc/munge/munge.key
        chmod 600 /etc/munge/munge.key
    fi
    echo "+ $* runuser -u munge -- /usr/sbin/munged"
    "$@" sh -c 'mkdir -p /run/munge && chown munge:munge /run/munge &&
        runuser -u munge -- /usr/sbin/munged --seed-file=/run/munge/munged.seed \
            --log-file=/run/munge/munged.log' || { fail "munged did not start"; return 1; }
    mu_i=0
    until "$@" sh -c 'munge -n 2>/dev/null | unmunge >/dev/null 2>&1'; do
        mu_i=$((mu_i + 1))
        [ $mu_i -lt 50 ] || { fail "munged does not answer"; return 1; }
        sleep 0.1
    done
    munge_started=1
}

slurm_jobs_env() {
    SHARDLM=$SHLM
    OMP_NUM_THREADS=1
    OPENBLAS_NUM_THREADS=1
    export SHARDLM OMP_NUM_THREADS OPENBLAS_NUM_THREADS
    # this machine only, never in the scripts: Open MPI refuses root without these, and
    # containers often forbid cross-memory attach (as tests/mpi_test.sh)
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
    # a rank that crashes leaves a core in its job's directory for job_tail (Slurm gives
    # the ranks the submitting shell's limits; a kernel.core_pattern that is a plain name,
    # Debian's "core", writes it there): Open MPI's own report of a call through a NULL
    # pointer shows no frame of the caller
    # shellcheck disable=SC3045 # dash's and bash's ulimit both take -c
    ulimit -c unlimited 2>/dev/null || :
    if [ -z "${OMPI_MCA_btl_vader_single_copy_mechanism:-}" ] && command -v ompi_info >/dev/null 2>&1 &&
        ompi_info --param btl vader --level 9 2>/dev/null | grep -q single_copy_mechanism; then
        OMPI_MCA_btl_vader_single_copy_mechanism=none
        export OMPI_MCA_btl_vader_single_copy_mechanism
    fi
}

job_tail() {
    tail -n 20 "$1"
    for jt_core in "$(dirname "$1")"/core "$(dirname "$1")"/core.[0-9]*; do
        [ -f "$jt_core" ] || continue
        if command -v gdb >/dev/null 2>&1; then
            echo "+ gdb -batch -nx -ex 'thread apply all bt 30' $SHLM $jt_core"
            gdb -batch -nx -ex 'thread apply all bt 30' "$SHLM" "$jt_core" 2>&1 |
                grep -v -e '^\[New LWP' -e '^warning: ' -e '^$'
        else
            echo "$jt_core: a rank dumped core; no gdb here to show its stack (Debian: gdb)"
        fi
    done
}

wait_jobs() {
    wj_i=0
    while [ -n "$(${SLURM_ON:-} squeue -h -j "$(echo "$@" | tr ' ' ',')" -t PD,R,CG,CF,S 2>/dev/null)" ]; do
        wj_i=$((wj_i + 1))
        [ $wj_i -lt 600 ] || { fail "jobs $* still queued or running after 120 s"; ${SLURM_ON:-} squeue; return 1; }
        sleep 0.2
    done
}

job_field() {
    ${SLURM_ON:-} scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

warn_after() {
    wa_i=0
    while [ "$(lines "$2")" -lt "$3" ] && [ $wa_i -lt 600 ]; do
        wa_i=$((wa_i + 1))
        sleep 0.1
    done
    echo "+ scancel --signal=USR1 --batch $4   # after step $(lines "$2")"
    ${SLURM_ON:-} scancel --signal=USR1 --batch "$4" || fail "$1: scancel --signal=USR1 --batch failed"
}

# chain_verdict LABEL PREFIX ID...: the jobs of a resume chain (outputs PREFIX-ID.out),
# each in turn stopped by the warning signal (exit 0, saved step n; the next resumes
# from step n), or finished step 40 and cancelled every later job, which never started.
# Sets $chain_stop (the step the first job stopped at) and $chain_finished (which job
# finished: 1, 2, ...; empty if none); counts a failure (LABEL: ...) otherwise.
chain_verdict() {
    cv_label=$1 cv_prefix=$2
    shift 2
    cv_k=0 cv_prev="" chain_stop="" chain_finished=""
    for cv_j in "$@"; do
        cv_k=$((cv_k + 1))
        cv_state=$(job_field "$cv_j" JobState) cv_code=$(job_field "$cv_j" ExitCode)
        cv_o=$cv_prefix-$cv_j.out
        echo "$cv_label: job $cv_k ($cv_j): $cv_state, exit $cv_code"
        if [ -n "$chain_finished" ]; then
            [ "$cv_state" = CANCELLED ] && [ ! -f "$cv_o" ] ||
                fail "$cv_label: job $cv_k ($cv_j) ran after job $chain_finished finished"
            continue
        fi
        [ "$cv_state" = COMPLETED ] && [ "$cv_code" = 0:0 ] ||
            { job_tail "$cv_o"; fail "$cv_label: job $cv_k ($cv_j) did not exit 0"; break; }
        if [ -n "$cv_prev" ]; then
            grep "^checkpoint: loaded .*step_$cv_prev.h5" "$cv_o" ||
                fail "$cv_label: job $cv_k did not resume from step_$cv_prev.h5"
        fi
        cv_msg=$(grep "^shardlm: caught SIGUSR1 at step" "$cv_o")
        if [ -n "$cv_msg" ]; then
            grep "SIGUSR1 (the time limit is near" "$cv_o" ||
                fail "$cv_label: job $cv_k's batch shell did not get the signal"
            echo "$cv_msg"
            cv_prev=$(echo "$cv_msg" | sed -n 's/.* at step \([0-9]*\): saved .*/\1/p')
            [ -n "$chain_stop" ] || chain_stop=$cv_prev
        elif grep -q "^ *40/[0-9]* |" "$cv_o"; then
            chain_finished=$cv_k
            if [ $cv_k -lt $# ]; then
                grep "cancelling the chain's later jobs" "$cv_o" ||
                    fail "$cv_label: job $cv_k did not cancel the later jobs"
            fi
        else
            job_tail "$cv_o"
            fail "$cv_label: job $cv_k neither stopped on the signal nor reached step 40"
            break
        fi
    done
}
