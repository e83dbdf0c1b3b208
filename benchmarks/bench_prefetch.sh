#!/bin/sh
# Prefetch overlap benchmark (not a test): how much of the all-gather time the FSDP
# prefetch hides. The comm backend is slowed on purpose (runtime.comm_delay_us: every
# collective completes no sooner than that after its issue, the way a slow network
# behaves), and jobs/tiny.ini trains a few steps with fsdp.prefetch=false and true.
#
#   SHLM=./shardlm sh benchmarks/bench_prefetch.sh [-n "2 4"] [-d "2000 20000"] [-s 10]
#       [-t "FULL_SHARD"] [-m 1.0]
#     -n  world sizes              -d  comm delays, in us (the largest one is judged)
#     -s  steps per run            -t  strategies (HYBRID_SHARD: 2 ranks per node)
#     -m  least speed-up (step_ms without prefetch / with) at the largest delay
#
# Prints an nccl-tests-style table: step_ms and comm_exposed_ms are means over the steps
# after the first 2 (metrics.jsonl; comm_exposed_ms is the time spent blocked
# in collectives, the maximum over ranks), speedup = step_ms(prefetch off) /
# step_ms(prefetch on) at the same world size, strategy and delay, and #wrong counts
# the steps whose loss differs (as printed, %.9g) from that of the reference run (the
# earliest of the same world size and strategy): prefetch and delay change the schedule,
# never the numbers. Exit status: 0; 1 when a run fails, a loss differs, or prefetch does not
# lower the step time by the -m factor at the largest delay; 77 with no MPI launcher.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
if [ -z "${SHLM:-}" ]; then
    if [ -x ./shardlm ]; then SHLM=./shardlm; else SHLM=shardlm; fi
fi
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/jobs/tiny.ini"
ranks="2 4"
delays="2000 20000"
steps=10
strategies="FULL_SHARD"
min_speedup=1.0
while getopts n:d:s:t:m: opt; do
    case $opt in
    n) ranks=$OPTARG ;;
    d) delays=$OPTARG ;;
    s) steps=$OPTARG ;;
    t) strategies=$OPTARG ;;
    m) min_speedup=$OPTARG ;;
    *)
        sed -n '7,12p' "$0" >&2
        exit 2
        ;;
    esac
done
if [ "$steps" -lt 3 ]; then
    echo "bench_prefetch: -s must be at least 3 (the first 2 steps are not timed)" >&2
    exit 2
fi
big=0
for d in $delays; do [ "$d" -gt "$big" ] && big=$d; done

work=$(mktemp -d "${TMPDIR:-/tmp}/shlm-bench-prefetch.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
if ! "$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" \
    "$work/train.bin" >"$work/prepare.log" 2>&1; then
    cat "$work/prepare.log" >&2
    echo "bench_prefetch: cannot prepare the data with $SHLM" >&2
    exit 1
fi

# field KEY FILE: the values of KEY in a metrics.jsonl, one a line, as printed
field() {
    sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p" "$2"
}

# mean KEY FILE: the mean of KEY over the steps after the first 2
mean() {
    field "$1" "$2" | awk 'NR > 2 { s += $1; n++ } END { if (n) printf "%.2f", s / n; else print "nan" }'
}

echo "# bench_prefetch: $SHLM train $job, $steps steps (timed: steps 3..$steps)"
echo "# comm slowed by runtime.comm_delay_us; host $(hostname), $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?') cores"
echo "# command of each run:"
echo "#   sh $mpi RANKS $SHLM train $job --set data.train=TRAIN.bin --set data.val= \\"
echo "#     --set train.sample_tokens=0 --set train.warmup_steps=0 --set train.steps=$steps \\"
echo "#     --set log.every=1 --set log.run_dir=DIR --set fsdp.strategy=STRATEGY \\"
echo "#     --set runtime.comm_delay_us=DELAY --set fsdp.prefetch=PREFETCH [--set runtime.ranks_per_node=2]"
echo "#"
printf '# %5s %14s %9s %9s %10s %16s %8s %7s\n' ranks strategy delay_us prefetch step_ms \
    comm_exposed_ms speedup '#wrong'

status=0
out_of_bounds=0
verdicts=""
for np in $ranks; do
    for st in $strategies; do
        extra=""
        [ "$st" = HYBRID_SHARD ] && extra="--set runtime.ranks_per_node=2"
        first=""
        for d in $delays; do
            off_ms=""
            for p in false true; do
                name="r${np}_${st}_${d}_$p"
                # shellcheck disable=SC2086 # $extra: zero or two words
                sh "$mpi" "$np" "$SHLM" train "$job" --set "data.train=$work/train.bin" \
                    --set data.val= --set train.sample_tokens=0 --set train.warmup_steps=0 \
                    --set "train.steps=$steps" --set log.every=1 \
                    --set "log.run_dir=$work/$name" --set "fsdp.strategy=$st" \
                    --set "runtime.comm_delay_us=$d" --set "fsdp.prefetch=$p" $extra \
                    >"$work/$name.log" 2>&1 </dev/null
                rc=$?
                if [ $rc -eq 77 ]; then
                    echo "# SKIP: no MPI launcher"
                    exit 77
                fi
                m="$work/$name/metrics.jsonl"
                if [ $rc -ne 0 ] || [ "$(field step "$m" 2>/dev/null | wc -l)" -ne "$steps" ]; then
                    tail -n 15 "$work/$name.log" | sed 's/^/# | /'
                    printf '  %5s %14s %9s %9s %10s %16s %8s %7s\n' "$np" "$st" "$d" "$p" \
                        failed - - -
                    status=1
                    continue
                fi
                step_ms=$(mean step_ms "$m")
                exposed=$(mean comm_exposed_ms "$m")
                field loss "$m" >"$work/$name.loss"
                [ -n "$first" ] || first="$work/$name.loss"
                wrong=$(paste "$first" "$work/$name.loss" | awk '$1 != $2 { n++ } END { print n + 0 }')
                [ "$wrong" -eq 0 ] || status=1
                speedup=-
                if [ "$p" = false ]; then
                    off_ms=$step_ms
                elif [ -n "$off_ms" ]; then
                    speedup=$(awk -v a="$off_ms" -v b="$step_ms" 'BEGIN { printf "%.2f", a / b }')
                    if [ "$d" -eq "$big" ]; then
                        verdicts="$verdicts $np:$st:$speedup"
                        if awk -v s="$speedup" -v m="$min_speedup" 'BEGIN { exit !(s <= m) }'; then
                            out_of_bounds=$((out_of_bounds + 1))
                            status=1
                        fi
                    fi
                fi
                printf '  %5s %14s %9s %9s %10s %16s %8s %7s\n' "$np" "$st" "$d" "$p" \
                    "$step_ms" "$exposed" "$speedup" "$wrong"
            done
        done
    done
done

echo "#"
echo "# speed-up from prefetch at the largest delay ($big us):$(echo "$verdicts" |
    sed 's/ \([0-9]*\):\([A-Z_]*\):\([0-9.]*\)/ \1 ranks \2 x\3,/g; s/,$//')"
echo "# Out of bounds values : $out_of_bounds (speed-up at $big us not above $min_speedup)"
if [ $status -ne 0 ]; then
    echo "# FAIL: a run failed, a loss differed (#wrong), or prefetch did not lower the step time"
    exit 1
fi
echo "# PASS: prefetch lowers the step time at $big us on every configuration; losses identical"
exit 0
