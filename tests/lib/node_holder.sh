#!/bin/sh
# The process that holds one node's namespaces (tests/lib/nodes.sh, run by unshare in
# new network, UTS, mount and IPC namespaces):
#   node_holder.sh NAME SHARED READY HOSTS LIFETIME
# names the node NAME, gives it private /run, /tmp and /dev/shm, keeps each directory of
# SHARED (a colon-separated list: the test's work directory, the source tree, the build
# directory; any may lie under /tmp) at its path, puts HOSTS on /etc/hosts, brings lo up,
# writes its pid to READY once all that is done, then sleeps LIFETIME seconds at most
# (nodes_down kills it sooner).
set -u
name=$1 shared=$2 ready=$3 hosts=$4 lifetime=$5
hostname "$name" || exit 1
# each shared directory is bound to a staging point on a private /mnt before /run, /tmp
# and /dev/shm are covered, then bound back at its own path, and the staging is undone
mount -t tmpfs -o mode=700 "$name-stage" /mnt || exit 1
i=0
old_ifs=$IFS
IFS=:
for d in $shared; do
    i=$((i + 1))
    mkdir "/mnt/s$i" && mount --bind "$d" "/mnt/s$i" || exit 1
done
mount -t tmpfs -o mode=755 "$name-run" /run || exit 1
mount -t tmpfs -o mode=1777 "$name-tmp" /tmp || exit 1
mount -t tmpfs -o mode=1777 "$name-shm" /dev/shm || exit 1
i=0
for d in $shared; do
    i=$((i + 1))
    mkdir -p "$d" && mount --bind "/mnt/s$i" "$d" && umount "/mnt/s$i" || exit 1
done
IFS=$old_ifs
umount /mnt || exit 1
mount --bind "$hosts" /etc/hosts || exit 1
ip link set lo up || exit 1
echo $$ >"$ready.tmp" && mv "$ready.tmp" "$ready" || exit 1
exec sleep "$lifetime"
