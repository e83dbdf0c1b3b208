# Nodes on one machine for the multi-node tests (sourced, not run; needs tests/lib.sh's
# test_begin first: everything lives under $work).
#
# nodes_up N makes N "nodes", node1..nodeN, each a set of namespaces held by one process
# (tests/lib/node_holder.sh):
#   network  eth0 = 192.168.77.K/24 and lo; nothing else, no route out;
#   UTS      hostname nodeK;
#   mount    private tmpfs on /run, /tmp and /dev/shm (its own runtime directories: Open
#            MPI's session directory and shared-memory segments, munged's socket, slurmd's
#            spool), /etc/hosts naming every node; the rest of the file system is the
#            machine's, shared as a cluster's parallel file system is, and $work keeps its
#            path even where it lies under /tmp;
#   IPC      its own System V objects.
# A further set, "ctl" (192.168.77.254, the head node: slurmctld and the Slurm clients
# run there), holds the bridge br0 that every node's eth0 is wired to by a veth pair. No
# address, link or mount is made in the machine's own namespaces, and every namespace
# lives only as long as its processes: nodes_down kills them all, so nothing is left.
# Each holder sleeps at most $NODES_LIFETIME seconds (default 900), which bounds what a
# killed test could leave.
#
#   nodes_up N             ends the test as skipped (skip_test) where namespaces, veth
#                          pairs or bridges cannot be made (not root, no unshare/nsenter/ip)
#   node_exec HOST CMD...  runs CMD inside HOST's namespaces (HOST: nodeK or ctl), with
#                          the caller's environment and working directory (which must
#                          lie on the shared file system)
#   node_pids HOST [NAME]  every process inside HOST's network namespace but its holder
#                          (only those whose command name is NAME)
#   node_kill HOST [NAME]  SIGKILLs them (without NAME: a node that crashes; its
#                          namespaces stay, so it can "boot" again)
#   node_link HOST up|down its cable: the switch's end of HOST's veth pair
#   node_ranks_end LABEL HOST SINCE BOUND  waits (30 s at most) until HOST runs no shardlm,
#                          sets $gone (seconds since the epoch time SINCE) and counts a
#                          failure (LABEL: ...) if that took more than BOUND seconds
#   nodes_mpirun NP ARGS.. mpirun from node1 over the nodes (hostfile, launch agent),
#                          through tests/mpi_test.sh; see the function
#   nodes_down             kills everything in the namespaces, then the holders; checks
#                          that no process of them is left
#   nodes_traps            on exit, pass or fail: nodes_down, then the work directory is
#                          removed (kept when the test failed); call it before nodes_up
#
# Open MPI reaches the other nodes through $nodes_dir/agent (its plm_rsh_agent: called
# as `agent HOST COMMAND...` where ssh would be, it runs COMMAND with /bin/sh inside
# HOST's namespaces with a fresh environment, as sshd would), over TCP on eth0 only
# (btl_tcp_if_include and oob_tcp_if_include: the interface a cluster's NET_IF names);
# ranks of one node share memory (vader) as on a real node.

NODES_SUBNET=192.168.77
NODES_LIFETIME=${NODES_LIFETIME:-900}
NODES_IF=eth0
nodes_dir=""
nodes_n=0

# nodes_skip WHY: the harness cannot run here: the test ends skipped
nodes_skip() {
    skip_test "$*"
}

# node_pid HOST: the holder's pid
node_pid() { cat "$nodes_dir/$1.pid" 2>/dev/null; }

node_exec() {
    ne_pid=$(node_pid "$1") || { echo "node_exec: no node $1" >&2; return 99; }
    shift
    nsenter -t "$ne_pid" -n -u -m -i --wd="$(pwd)" -- "$@"
}

# nodes_ns_pids HOST: every process in HOST's network namespace, its holder included
# (one find over /proc, so that a node is killed within a fraction of a second)
nodes_ns_pids() {
    np_ns=$(cat "$nodes_dir/$1.netns" 2>/dev/null) || return 0
    # the link's text, net:[INODE], as a find pattern
    np_pat=$(printf '%s' "$np_ns" | sed 's/[][*?\\]/\\&/g')
    find /proc/[0-9]*/ns/net -maxdepth 0 -lname "$np_pat" 2>/dev/null | sed 's|^/proc/||; s|/ns/net$||'
}

node_pids() {
    np_holder=$(node_pid "$1")
    for np_p in $(nodes_ns_pids "$1"); do
        [ "$np_p" != "$np_holder" ] || continue
        [ -z "${2:-}" ] || [ "$(cat "/proc/$np_p/comm" 2>/dev/null)" = "$2" ] || continue
        echo "$np_p"
    done
}

node_kill() {
    # twice: a process may fork while the first round is under way
    for nk_round in 1 2; do
        nk_pids=$(node_pids "$1" "${2:-}")
        [ -n "$nk_pids" ] || return 0
        # shellcheck disable=SC2086 # pids, one word each
        kill -KILL $nk_pids 2>/dev/null
        sleep 0.1
    done
    [ -z "$(node_pids "$1" "${2:-}")" ]
}

node_ranks_end() {
    nr_i=0
    while [ -n "$(node_pids "$2" shardlm)" ] && [ $nr_i -lt 300 ]; do
        sleep 0.1
        nr_i=$((nr_i + 1))
    done
    gone=$(($(date +%s) - $3))
    nr_left=$(node_pids "$2" shardlm | tr '\n' ' ')
    if [ -n "$nr_left" ]; then
        fail "$1: $2's ranks still running 30 s on: $nr_left"
    elif [ $gone -gt "$4" ]; then
        fail "$1: $2's ranks took $gone s to end, want at most $4 s"
    fi
}

node_link() {
    node_exec ctl ip link set "sw-$1" "$2"
}

# The directories every node sees at their own paths: the work directory, the source tree
# and the build directory, whichever lie under the directories a node covers (/run, /tmp,
# /dev/shm), colon-separated (absolute paths; the work directory always)
nodes_shared() {
    ns_list=$work
    for ns_d in "$SHLM_SRCDIR" "$(dirname "$SHLM")" "${SHLM_BUILDDIR:-}"; do
        [ -n "$ns_d" ] || continue
        ns_d=$(cd "$ns_d" 2>/dev/null && pwd -P) || continue
        case $ns_d in
        /tmp/* | /run/* | /dev/shm/*)
            case ":$ns_list:" in *":$ns_d:"*) ;; *) ns_list=$ns_list:$ns_d ;; esac ;;
        esac
    done
    echo "$ns_list"
}

# nodes_holder NAME: starts NAME's holder and waits until its namespaces are set
nodes_holder() {
    rm -f "$nodes_dir/$1.pid"
    unshare --net --uts --mount --ipc --propagation private \
        sh "$SHLM_SRCDIR/tests/lib/node_holder.sh" "$1" "$(nodes_shared)" "$nodes_dir/$1.pid" \
        "$nodes_dir/hosts" "$NODES_LIFETIME" </dev/null >"$nodes_dir/$1.holder.log" 2>&1 &
    nh_i=0
    while [ ! -s "$nodes_dir/$1.pid" ]; do
        nh_i=$((nh_i + 1))
        if [ $nh_i -gt 100 ] || ! kill -0 $! 2>/dev/null; then
            cat "$nodes_dir/$1.holder.log"
            return 1
        fi
        sleep 0.05
    done
    # the namespace's identity, for finding its processes even after the holder is gone
    readlink "/proc/$(node_pid "$1")/ns/net" >"$nodes_dir/$1.netns"
}

nodes_up() {
    nodes_n=$1
    [ "$(id -u)" = 0 ] || { nodes_skip "the node namespaces need root"; return; }
    for nu_c in unshare nsenter ip; do
        command -v "$nu_c" >/dev/null 2>&1 ||
            { nodes_skip "no $nu_c (Debian: apt-get install util-linux iproute2)"; return; }
    done
    if ! nu_why=$(unshare --net --uts --mount --ipc sh -c \
        'ip link add br0 type bridge && ip link add probe0 type veth peer name probe1' 2>&1); then
        nodes_skip "cannot make network namespaces with a bridge and a veth pair here:" \
            "${nu_why:-unshare --net --uts --mount --ipc failed}"
        return
    fi
    nodes_dir=$work/nodes
    mkdir -p "$nodes_dir" || return 99
    {
        echo "127.0.0.1 localhost"
        echo "$NODES_SUBNET.254 ctl"
        nu_k=1
        while [ $nu_k -le "$nodes_n" ]; do
            echo "$NODES_SUBNET.$nu_k node$nu_k"
            nu_k=$((nu_k + 1))
        done
    } >"$nodes_dir/hosts"
    nu_hosts=""
    nu_k=1
    while [ $nu_k -le "$nodes_n" ]; do
        echo "node$nu_k slots=2" >>"$nodes_dir/hostfile"
        nu_hosts="$nu_hosts node$nu_k"
        nu_k=$((nu_k + 1))
    done
    # the launch agent, with this harness's directory written in (Open MPI passes it no
    # environment of ours that sshd would not)
    cat >"$nodes_dir/agent" <<EOF
#!/bin/sh
# Open MPI's plm_rsh_agent for the nodes of $nodes_dir: agent HOST COMMAND...
host=\$1
shift
pid=\$(cat "$nodes_dir/\$host.pid" 2>/dev/null) || { echo "agent: no node \$host" >&2; exit 255; }
exec nsenter -t "\$pid" -n -u -m -i -- env -i PATH="\$PATH" HOME="\${HOME:-/root}" /bin/sh -c "\$*"
EOF
    chmod 755 "$nodes_dir/agent"

    nodes_holder ctl || { echo "nodes_up: the ctl namespaces did not come up"; return 1; }
    node_exec ctl sh -c "ip link add br0 type bridge && ip addr add $NODES_SUBNET.254/24 dev br0 &&
        ip link set br0 up" || { echo "nodes_up: no bridge in ctl"; return 1; }
    nu_k=1
    for nu_h in $nu_hosts; do
        nodes_holder "$nu_h" || { echo "nodes_up: $nu_h did not come up"; return 1; }
        node_exec ctl sh -c "ip link add sw-$nu_h type veth peer name $NODES_IF netns $(node_pid "$nu_h") &&
            ip link set sw-$nu_h master br0 up" || { echo "nodes_up: cannot wire $nu_h"; return 1; }
        node_exec "$nu_h" sh -c "ip addr add $NODES_SUBNET.$nu_k/24 dev $NODES_IF &&
            ip link set $NODES_IF up" || { echo "nodes_up: cannot address $nu_h"; return 1; }
        nu_k=$((nu_k + 1))
    done
    echo "${test_name:-nodes}: $nodes_n nodes up ($NODES_SUBNET.1-$nodes_n on br0 in ctl, $NODES_SUBNET.254):" \
        "$(for nu_h in ctl $nu_hosts; do printf '%s=pid %s ' "$nu_h" "$(node_pid "$nu_h")"; done)"
}

nodes_down() {
    [ -n "$nodes_dir" ] && [ -d "$nodes_dir" ] || return 0
    for nd_f in "$nodes_dir"/*.netns; do
        [ -f "$nd_f" ] || continue
        nd_h=$(basename "$nd_f" .netns)
        node_kill "$nd_h"
        nd_p=$(node_pid "$nd_h")
        # the holder is this shell's job (unshare execs it): reaped here, without the
        # shell's "Killed" notice
        kill -KILL "$nd_p" 2>/dev/null && wait "$nd_p" 2>/dev/null
    done
    # nothing may be left, the holders included (a killed process is gone at once, a
    # zombie once its parent has waited for it)
    nd_i=0
    while :; do
        nd_left=""
        for nd_f in "$nodes_dir"/*.netns; do
            nd_h=$(basename "$nd_f" .netns)
            nd_p=$(nodes_ns_pids "$nd_h" | tr '\n' ' ')
            [ -z "$nd_p" ] || nd_left="$nd_left $nd_h: $nd_p"
        done
        [ -n "$nd_left" ] && [ $nd_i -lt 50 ] || break
        nd_i=$((nd_i + 1))
        sleep 0.1
    done
    nodes_dir=""
    [ -z "$nd_left" ] || { echo "nodes_down: processes left in$nd_left"; return 1; }
}

nodes_traps() {
    work_removed_on_exit=1 # after nodes_down, which reads $work/nodes
    trap nodes_finish EXIT
    trap 'fail "interrupted"; exit 1' INT TERM
}
nodes_finish() {
    nf_rc=$?
    trap - EXIT INT TERM
    if ! nodes_down; then
        fail "nodes_down: processes left behind"
        nf_rc=1
    fi
    if [ "${fails:-1}" -eq 0 ] && { [ $nf_rc -eq 0 ] || [ $nf_rc -eq 77 ]; }; then
        rm -rf "$work"
    else
        echo "$test_name: work directory kept: $work"
        [ $nf_rc -ne 0 ] || nf_rc=1
    fi
    exit $nf_rc
}

# nodes_mpirun NP ARGS...: ARGS (a program and its arguments) on NP ranks, 2 per node,
# launched by mpirun in node1 through tests/mpi_test.sh (root, oversubscription, its
# timeout). OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and the variables named in
# $NODES_FORWARD (space-separated) reach every rank by -x where they are set, as a
# cluster user passes them.
# Each node's hostfile entry has 2 slots but all nodes share this machine's cores, so
# Open MPI does not know it is oversubscribed: mpi_yield_when_idle makes a waiting rank
# yield the core (without it tests/jobs/ckpt.ini's 40 steps on 2 x 2 took 12 s, with it
# 1.7 s).
nodes_mpirun() {
    nm_np=$1
    shift
    nm_x=""
    for nm_v in OMP_NUM_THREADS OPENBLAS_NUM_THREADS ${NODES_FORWARD:-}; do
        eval "[ -z \"\${$nm_v+set}\" ]" || nm_x="$nm_x -x $nm_v"
    done
    MPIRUN="mpirun --hostfile $nodes_dir/hostfile --map-by ppr:2:node $nm_x" \
        OMPI_MCA_plm_rsh_agent=$nodes_dir/agent \
        OMPI_MCA_btl_tcp_if_include=$NODES_IF OMPI_MCA_oob_tcp_if_include=$NODES_IF \
        OMPI_MCA_mpi_yield_when_idle=1 node_exec node1 sh "$SHLM_SRCDIR/tests/mpi_test.sh" "$nm_np" "$@"
}
