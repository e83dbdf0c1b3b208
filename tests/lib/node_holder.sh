#!/bin/sh
# The process that holds one node's namespaces (tests/lib/nodes.sh, run by unshare in
# new network, UTS, mount and IPC namespaces):
#   node_holder.sh NAME SHARED READY HOSTS LIFETIME
# names the node NAME, gives it private /run, /tmp and /dev/shm, keeps the directory
# SHARED at its path (the test's work directory, which may lie under /tmp), puts HOSTS
# on /etc/hosts, brings lo up, writes its pid to READY once all that is done, then
# sleeps LIFETIME seconds at most (nodes_down kills it sooner).
set -u
name=$1 shared=$2 ready=$3 hosts=$4 lifetime=$5
hostname "$name" || exit 1
# the shared directory, held open as the working directory: after /tmp is covered it is
# still reachable as "." and is bound back at its path (-c: mount must not resolve "."
# to a path, which would name the new, empty directory)
cd "$shared" || exit 1
mount -t tmpfs -o mode=755 "$name-run" /run || exit 1
mount -t tmpfs -o mode=1777 "$name-tmp" /tmp || exit 1
mount -t tmpfs -o mode=1777 "$name-shm" /dev/shm || exit 1
mkdir -p "$shared" && mount -c --bind . "$shared" || exit 1
mount --bind "$hosts" /etc/hosts || exit 1
ip link set lo up || exit 1
echo $$ >"$ready.tmp" && mv "$ready.tmp" "$ready" || exit 1
exec sleep "$lifetime"
