#!/usr/bin/env bash
# One entry point on a fresh Debian 12 machine: installs the Debian packages shardlm
# needs (when missing), builds it, then runs the demo or the tests.
#   ./setup.sh          install + build
#   ./setup.sh demo     ... then train jobs/tiny.ini on 4 CPU ranks and print a sample
#   ./setup.sh check    ... then `make check`, closing with "N passed, N failed"
# It never downloads anything but Debian packages.
set -euo pipefail
cd "$(dirname "$0")"
what=${1:-build}
case "$what" in build|demo|check) ;; *) echo "usage: $0 [build|demo|check]" >&2; exit 2;; esac

packages=(build-essential autoconf automake pkg-config openmpi-bin libopenmpi-dev
          libhdf5-openmpi-dev hdf5-tools libopenblas-dev libinih-dev libcjson-dev
          libsentencepiece-dev libpcre2-dev libutf8proc-dev python3-h5py) # python3-h5py: tests/ckpt_h5py.sh reads a checkpoint without shardlm
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: missing Debian packages; install them with:" >&2
        echo "  sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

jobs=$(nproc 2>/dev/null || echo 2)
[ -x configure ] || ./autogen.sh >/dev/null
[ -f Makefile ] || ./configure --quiet
make -j"$jobs" --no-print-directory >/dev/null

# Launch flags for this machine only: root needs explicit permission from Open MPI,
# and a machine with fewer cores than ranks needs --oversubscribe.
mpirun_flags() {
    local np=$1 flags=()
    [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
    [ "$(nproc)" -lt "$np" ] && flags+=(--oversubscribe)
    echo "${flags[@]}"
}

case "$what" in
build)
    echo "setup: built ./shardlm" ;;
demo)
    for split in train val; do
        [ -f jobs/data/shakespeare-$split.bin ] ||
            ./shardlm data prepare --tokenizer bytes jobs/data/shakespeare-$split.txt \
                jobs/data/shakespeare-$split.bin
    done
    # 4 ranks acting as 2 nodes x 2: sharded inside a "node", replicated across them;
    # a fresh run every time (resume=none), its checkpoint saved at the end
    set -- --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
        --set checkpoint.dir=runs/tiny/checkpoints --set checkpoint.resume=none
    echo "+ mpirun -np 4 $(mpirun_flags 4) ./shardlm train jobs/tiny.ini $*"
    start=$(date +%s)
    # shellcheck disable=SC2046
    mpirun -np 4 $(mpirun_flags 4) ./shardlm train jobs/tiny.ini "$@"
    echo "demo: finished in $(( $(date +%s) - start )) s"
    # the saved checkpoint, loaded by 2 ranks with another strategy, samples text
    set -- --ckpt runs/tiny/checkpoints --prompt "ROMEO:" --tokens 200
    echo "+ mpirun -np 2 $(mpirun_flags 2) ./shardlm generate jobs/tiny.ini $*"
    # shellcheck disable=SC2046
    mpirun -np 2 $(mpirun_flags 2) ./shardlm generate jobs/tiny.ini "$@" | sed -n '/^checkpoint:/p; /^--- generate/,/^---$/p'
    ;;
check)
    set +e
    make -j"$jobs" check --no-print-directory >/tmp/shardlm-check.$$.log 2>&1
    rc=$?
    set -e
    grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' /tmp/shardlm-check.$$.log || true
    if [ $rc -ne 0 ]; then
        for f in $(grep -lE '^:test-result: (FAIL|ERROR|XPASS)' $(find tests -name '*.trs') 2>/dev/null); do
            echo "=== ${f%.trs}.log"; tail -n 40 "${f%.trs}.log"
        done
    fi
    count() { sed -n "s/^# $1: *\\([0-9]*\\)\$/\\1/p" /tmp/shardlm-check.$$.log | tail -n 1; }
    pass=$(count PASS); fail=$(count FAIL); err=$(count ERROR); xpass=$(count XPASS); skip=$(count SKIP)
    rm -f /tmp/shardlm-check.$$.log
    echo "${pass:-0} passed, $(( ${fail:-0} + ${err:-0} + ${xpass:-0} )) failed, ${skip:-0} skipped"
    exit $rc
    ;;
esac
