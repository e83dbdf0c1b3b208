#!/bin/sh
# Checkpoint save bandwidth against a plain sequential write of the same bytes on the same
# file system, in the same run (the goal: a save at least 70% as fast as that write).
#
# The model is a 219.7M-parameter Llama shape (d 1024, 12 layers, 16 heads, F 2816, vocab
# 32000), so a checkpoint (fp32 weights + two AdamW moments, 12 bytes per parameter) is
# 2.64 GB. For each rank count, trials alternate: dd, save, dd, save, ..., dd. A save is
# a `shardlm train` of one step whose end-of-run checkpoint is timed by shardlm itself
# (create + data + close + fsync + rename + `latest`, as printed by rank 0); dd writes
# the checkpoint file's size from /dev/zero in 16 MiB blocks with conv=fsync, so both
# sides include the flush to the device; a second dd with oflag=direct shows what the
# device takes without the page cache (the save writes with O_DIRECT by default, see
# io/ckpt_hdf5.h). Reported: every trial, then the medians and the ratio save / plain dd
# (goal >= 0.70) and save / direct dd, then one load (resume) of the last checkpoint with the page
# cache dropped first when this machine allows it ("warm" otherwise). Every checkpoint is
# verified (`shardlm ckpt verify`); a wrong one fails the benchmark (exit 1), a ratio
# under the goal only with --strict.
#
# usage: benchmarks/bench_ckpt.sh [--shardlm PATH] [--dir DIR] [--ranks "2 4"]
#                                 [--trials N] [--strict] [--keep] [--set KEY=VALUE]...
#   --dir DIR    where the checkpoints and dd files go (the file system measured);
#                default ${TMPDIR:-/tmp}/shlm-bench-ckpt.XXXXXX
#   --set K=V    a job key for every save and load, e.g. checkpoint.direct_io=false
#                (H5Dwrite through MPI-IO instead of O_DIRECT), checkpoint.collective_io=true
#                (with it: collective buffering instead of each rank writing its own
#                bytes), checkpoint.alignment=BYTES (dataset alignment, default 1 MiB)
set -u

shardlm=./shardlm
dir=""
ranks="2 4"
trials=3
strict=0
keep=0
sets=""
while [ $# -gt 0 ]; do
    case $1 in
    --shardlm) shardlm=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --trials) trials=$2; shift 2 ;;
    --strict) strict=1; shift ;;
    --keep) keep=1; shift ;;
    --set) sets="$sets --set $2"; shift 2 ;;
    *) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
mpi="$here/../tests/mpi_test.sh"
[ -x "$shardlm" ] || { echo "bench_ckpt: no shardlm at $shardlm (use --shardlm)"; exit 2; }
if [ -z "$dir" ]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/shlm-bench-ckpt.XXXXXX") || exit 2
else
    mkdir -p "$dir" || exit 2
fi
log="$dir/log"
mkdir -p "$log"

"$shardlm" data random --vocab 32000 --tokens 200000 "$dir/train.bin" >/dev/null || exit 1
cat >"$dir/bench.ini" <<EOF
[model]
dim = 1024
n_layers = 12
n_heads = 16
n_kv_heads = 16
ffn_dim = 2816
vocab_size = 32000
max_seq_len = 32
[train]
seq_len = 32
micro_batch = 1
global_batch = 4
steps = 1
warmup_steps = 0
[data]
train = $dir/train.bin
[log]
run_dir = $dir/run
[runtime]
backend = cpu
threads = 1
EOF

# dd_once BYTES [FLAG]: prints "seconds GB/s" of a sequential write of BYTES with fsync
# (FLAG oflag=direct: the same through O_DIRECT)
dd_once() {
    mib=$((($1 + 1048575) / 1048576))
    start=$(date +%s.%N)
    dd if=/dev/zero of="$dir/dd.bin" bs=16M count=$(((mib + 15) / 16)) conv=fsync ${2:-} 2>/dev/null
    end=$(date +%s.%N)
    size=$(stat -c %s "$dir/dd.bin")
    rm -f "$dir/dd.bin"
    awk -v a="$start" -v b="$end" -v n="$size" 'BEGIN { printf "%.3f %.3f\n", b - a, n / 1e9 / (b - a) }'
}

# save_once NP TRIAL: one training step and its checkpoint; prints "seconds GB/s bytes"
save_once() {
    ck="$dir/ck$1"
    rm -rf "$ck"
    # shellcheck disable=SC2086 # the --set words
    sh "$mpi" "$1" "$shardlm" train "$dir/bench.ini" --set "checkpoint.dir=$ck" \
        --set "log.run_dir=$dir/run$1" $sets >"$log/save-$1-$2.log" 2>&1 </dev/null || {
        echo "bench_ckpt: the save on $1 ranks failed:" >&2
        tail -n 20 "$log/save-$1-$2.log" >&2
        return 1
    }
    line=$(grep '^checkpoint: saved' "$log/save-$1-$2.log")
    secs=$(echo "$line" | sed -n 's/.*B in \([0-9.]*\) s = .*/\1/p')
    size=$(stat -c %s "$ck/step_1.h5")
    awk -v s="$secs" -v n="$size" 'BEGIN { printf "%.3f %.3f %.0f\n", s, n / 1e9 / s, n }'
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# bench_ckpt: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores; $($shardlm --version)"
echo "# model: 219702272 parameters (d 1024, 12 layers, F 2816, vocab 32000); checkpoint = fp32"
echo "#   weights + 2 AdamW moments; file system of $dir: $(df -hT "$dir" | awk 'NR == 2 { print $1 " " $2 ", " $5 " free" }')"
echo "# I/O keys:${sets:- the defaults (checkpoint.direct_io = true, collective_io = false, alignment = 1048576)}"
printf "#%6s %6s %12s %10s %10s %8s %10s %12s\n" ranks trial file_bytes save_s save_GB/s dd_s dd_GB/s \
    ddirect_GB/s
summary=""
wrong=0
for np in $ranks; do
    : >"$dir/save.$np"
    : >"$dir/dd.$np"
    : >"$dir/ddd.$np"
    bytes=2640000000
    x=$(dd_once $bytes oflag=direct)
    echo "${x#* }" >>"$dir/ddd.$np"
    set -- $(dd_once $bytes)
    echo "$2" >>"$dir/dd.$np"
    printf "%7s %6s %12s %10s %10s %8s %10s %12s\n" "$np" 0 - - - "$1" "$2" "${x#* }"
    for t in $(seq 1 "$trials"); do
        r=$(save_once "$np" "$t") || exit 1
        set -- $r
        bytes=$3
        echo "$2" >>"$dir/save.$np"
        s_s=$1
        s_b=$2
        x=$(dd_once "$bytes" oflag=direct)
        echo "${x#* }" >>"$dir/ddd.$np"
        set -- $(dd_once "$bytes")
        echo "$2" >>"$dir/dd.$np"
        printf "%7s %6s %12s %10s %10s %8s %10s %12s\n" "$np" "$t" "$bytes" "$s_s" "$s_b" "$1" "$2" \
            "${x#* }"
    done
    sh "$mpi" 1 "$shardlm" ckpt verify "$dir/ck$np" >"$log/verify-$np.log" 2>&1 ||
        { cat "$log/verify-$np.log"; wrong=$((wrong + 1)); }
    # one load (resume) of the last checkpoint on the same ranks, cold cache if allowed
    cache=warm
    sync
    if [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cache=cold; fi
    # shellcheck disable=SC2086 # the --set words
    sh "$mpi" "$np" "$shardlm" train "$dir/bench.ini" --set "checkpoint.resume=$dir/ck$np" \
        --set "log.run_dir=$dir/load$np" $sets >"$log/load-$np.log" 2>&1 </dev/null
    load=$(sed -n 's/^checkpoint: loaded.* = \([0-9.]*\) GB\/s.*/\1/p' "$log/load-$np.log")
    ms=$(median <"$dir/save.$np")
    md=$(median <"$dir/dd.$np")
    mdd=$(median <"$dir/ddd.$np")
    ratio=$(awk -v a="$ms" -v b="$md" 'BEGIN { printf "%.2f", a / b }')
    ratio2=$(awk -v a="$ms" -v b="$mdd" 'BEGIN { printf "%.2f", a / b }')
    summary="$summary$(printf "%7s %16s %14s %7s %6s %19s %13s %14s" "$np" "$ms" "$md" "$ratio" \
        "$(awk -v r="$ratio" 'BEGIN { print (r >= 0.70 ? "met" : "MISSED") }')" "$mdd" "$ratio2" \
        "${load:-?} ($cache)")
"
done
echo "#"
printf "#%6s %16s %14s %7s %6s %19s %13s %14s\n" ranks median_save_GB/s median_dd_GB/s ratio goal \
    median_ddirect_GB/s ratio_direct load_GB/s
printf "%s" "$summary"
echo "# checkpoints verified: $([ $wrong -eq 0 ] && echo "all checksums match" || echo "$wrong WRONG")"
echo "# save lines (rank 0):"
grep -h '^checkpoint: saved' "$log"/save-*.log | sed 's/^/#   /'
if [ $keep -eq 0 ]; then rm -rf "$dir"; else echo "# kept $dir"; fi
[ $wrong -ne 0 ] && exit 1
if [ $strict -eq 1 ] && printf "%s" "$summary" | grep -q MISSED; then exit 1; fi
exit 0
