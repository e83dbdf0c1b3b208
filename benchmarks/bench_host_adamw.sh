#!/bin/sh
# The host AdamW of fsdp.offload = optimizer (kernels/host_adamw.h) against this machine's
# memory: benchmarks/bench_host_adamw (built by make) times it per instruction set on all
# cores beside a STREAM-style copy, and this script prints its table and the verdict: the
# widest instruction set's memory traffic (28 bytes an element) at least TARGET (default
# 0.60) of the copy's. Exits 1 when the instruction sets' results differ or the target is
# missed (a wrong or slow benchmark fails), 0 otherwise.
#   [TARGET=0.60] benchmarks/bench_host_adamw.sh [MIB_PER_ARRAY (256)] [REPS (5)] [BUILD_DIR]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${3:-$here}/benchmarks/bench_host_adamw
target=${TARGET:-0.60}
[ -x "$bin" ] || { echo "no $bin: run make first"; exit 2; }
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
out=$("$bin" "${1:-256}" "${2:-5}")
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "# FAIL: the instruction sets' results differ"; exit 1; }
ratio=$(echo "$out" | awk '$1 == "host_adamw" { print $NF }')
if awk -v r="$ratio" -v t="$target" 'BEGIN { exit !(r + 0 >= t + 0) }'; then
    echo "# PASS: host_adamw moves $ratio of the copy's bytes per second (target $target)"
else
    echo "# FAIL: host_adamw moves $ratio of the copy's bytes per second (target $target)"
    exit 1
fi
