# A private Slurm for the tests that run slurm/ under a real scheduler (sourced, not run;
# needs tests/lib.sh's test_begin first): tests/slurm_chain.sh (one node, localhost) and
# tests/nodes_slurm.sh (the nodes of tests/lib/nodes.sh). Debian's slurm-wlm 22.05 and
# munge, as root, no systemd or cgroups (FIELD-NOTES "Ranks, launchers, Slurm").
#
#   slurm_skip_unless_usable   returns 77 after "SKIP: why" without the daemons, the
#                              clients, munged, root or an MPI launcher
#   slurm_conf FILE NAME CTL NODES... writes a slurm.conf: cluster NAME, controller CTL
#                              (host[(address)]), one "NodeName=..." line per NODES word
#                              (name:cpus), one partition "test" of all of them; reads
#                              $slurm_ports ("ctlport slurmdport", or empty: Slurm's),
#                              $slurm_state, $slurm_spool, $slurm_run, $slurm_log (the
#                              directories of state, spool, pid files and logs)
#   munge_up [PREFIX...]       makes sure a munged answers where PREFIX runs commands
#                              (e.g. node_exec node1; nothing: this machine), starting
#                              one (socket, pid, seed and log under /run/munge) if none
#                              does ($munge_started is then 1); the key
#                              /etc/munge/munge.key is made if missing
#   slurm_jobs_env             exports what every job gets from this environment
#   wait_jobs ID...            until none of them is queued or running (120 s at most)
#   job_field ID FIELD         JobState, ExitCode, ... from scontrol
# $SLURM_ON (empty, or e.g. "node_exec ctl") prefixes every Slurm client command these
# functions run.

slurm_skip_unless_usable() {
    for su_c in slurmctld slurmd sbatch squeue scancel scontrol sinfo munge runuser; do
        command -v "$su_c" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin
        command -v "$su_c" >/dev/null 2>&1 || {
            echo "$test_name: SKIP: no $su_c (Debian: apt-get install slurmctld slurmd slurm-client munge)"
            return 77
        }
    done
    [ -x /usr/sbin/munged ] || { echo "$test_name: SKIP: no /usr/sbin/munged"; return 77; }
    [ "$(id -u)" = 0 ] || { echo "$test_name: SKIP: the private Slurm needs root"; return 77; }
    sh "$SHLM_SRCDIR/tests/mpi_test.sh" 1 true >/dev/null 2>&1
    [ $? -ne 77 ] || { echo "$test_name: SKIP: no MPI launcher"; return 77; }
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
    if [ -z "${OMPI_MCA_btl_vader_single_copy_mechanism:-}" ] && command -v ompi_info >/dev/null 2>&1 &&
        ompi_info --param btl vader --level 9 2>/dev/null | grep -q single_copy_mechanism; then
        OMPI_MCA_btl_vader_single_copy_mechanism=none
        export OMPI_MCA_btl_vader_single_copy_mechanism
    fi
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
