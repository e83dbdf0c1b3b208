#!/bin/sh
# Strong- (or weak-) scaling driver: trains the same job over a list of world sizes and
# collects each run's metrics.jsonl into one CSV, then prints the report (report.sh).
#
#   benchmarks/strong_scaling.sh [options] JOB.ini [--set section.key=value ...]
#     --ranks LIST        world sizes, comma-separated (default 1,2,4)
#     --strategies LIST   FSDP strategies to sweep (default: the job's fsdp.strategy)
#     --global-batch G    sequences per optimizer step, the same at every world size
#                         (default: the job's train.global_batch, else micro_batch x the
#                         largest world size); with --weak, per rank: G x N at N ranks
#     --weak              weak scaling: the global batch grows with the ranks
#     --steps N           training steps per run (default 6)
#     --warmup N          first steps left out of the means (default 2)
#     --repeat K          run each point K times, keep the median run (default 1)
#     --threads N         runtime.threads of every rank (default: the job's)
#     --launcher CMD      $MPIRUN, else mpirun (with what this machine needs, through
#                         tests/mpi_test.sh), srun, or a command with its options
#     --shardlm PATH      the binary (default: $SHLM, else ./shardlm, else on PATH)
#     --out DIR           runs, logs, scaling.csv, report.txt (default: a new directory
#                         scaling-MODE-JOB-DATE in the current one)
#     --timeout S         a run that takes longer fails (default 3600)
#     --png FILE          also draw the plot (report.sh --png; needs gnuplot)
#     --gpus-per-node G   report the x axis in nodes of G ranks
# Exit status: 0 when every run finished and left metrics; 1 otherwise; 2 bad usage.
set -u

here=$(cd "$(dirname "$0")" && pwd)
srcdir=$(dirname "$here")
die() { echo "strong_scaling.sh: error: $*" >&2; exit 2; }

ranks_list=1,2,4 strategies="" global="" weak=0 steps=6 warmup=2 threads="" launcher=${MPIRUN:-} repeat=1
shardlm=${SHLM:-} out="" timeout=3600 png="" gpn=""
while [ $# -gt 0 ]; do
    case $1 in
    --ranks) ranks_list=${2:?}; shift 2 ;;
    --strategies) strategies=${2:?}; shift 2 ;;
    --global-batch) global=${2:?}; shift 2 ;;
    --weak) weak=1; shift ;;
    --steps) steps=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    --launcher) launcher=${2:?}; shift 2 ;;
    --shardlm) shardlm=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --timeout) timeout=${2:?}; shift 2 ;;
    --png) png=${2:?}; shift 2 ;;
    --gpus-per-node) gpn=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || die "no job file given (usage: $0 [options] JOB.ini [--set k=v ...])"
job=$1
shift
[ -f "$job" ] || die "no such job file: $job"
job=$(cd "$(dirname "$job")" && pwd)/$(basename "$job")

# the user's overrides, kept as words: they go into the CSV, so no commas or quotes
sets=""
while [ $# -gt 0 ]; do
    case $1 in
    --set) [ $# -ge 2 ] || die "--set needs section.key=value"; kv=$2; shift 2 ;;
    --set=*) kv=${1#--set=}; shift ;;
    *) die "after the job file only --set section.key=value may follow, not '$1'" ;;
    esac
    case $kv in *[,\"\'\ ]*) die "--set $kv: commas, quotes and spaces are not supported here" ;; esac
    # the driver sets these itself: take the user's value as the option it stands for
    case $kv in
    train.global_batch=*) [ -n "$global" ] || global=${kv#*=} ;;
    train.steps=*) steps=${kv#*=} ;;
    fsdp.strategy=*) [ -n "$strategies" ] || strategies=${kv#*=} ;;
    runtime.threads=*) [ -n "$threads" ] || threads=${kv#*=} ;;
    log.every=* | log.run_dir=*) ;;
    *) sets="$sets $kv" ;;
    esac
done
for n in $(echo "$ranks_list" | tr ',' ' ') $steps $warmup $repeat $timeout ${global:-1} ${threads:-0} ${gpn:-1}; do
    case $n in '' | *[!0-9]*) die "not a whole number: '$n'" ;; esac
done
[ "$warmup" -lt "$steps" ] || die "--warmup ($warmup) must be less than --steps ($steps)"
[ "$repeat" -ge 1 ] || die "--repeat needs K >= 1"

if [ -z "$shardlm" ]; then
    if [ -x ./shardlm ]; then shardlm=./shardlm; else shardlm=$(command -v shardlm || true); fi
fi
[ -n "$shardlm" ] && [ -x "$shardlm" ] || die "no shardlm binary (use --shardlm PATH or set SHLM)"
case $shardlm in /*) ;; *) shardlm=$(pwd)/$shardlm ;; esac

set_args() { # prints "--set a --set b ..." for the words given
    for kv in "$@"; do printf ' --set %s' "$kv"; done
}

# Batch shape from `shardlm plan` at the largest world size: it also checks, before
# anything runs, that the job loads and the batch divides.
max_n=0
for n in $(echo "$ranks_list" | tr ',' ' '); do [ "$n" -gt "$max_n" ] && max_n=$n; done
[ "$max_n" -ge 1 ] || die "--ranks needs world sizes >= 1"
# shellcheck disable=SC2046 # set_args prints words on purpose
plan=$("$shardlm" plan "$job" --ranks 1 $(set_args $sets) 2>&1) || die "shardlm plan failed: $plan"
mb=$(echo "$plan" | sed -n 's/^# micro_batch \([0-9]*\) x seq_len \([0-9]*\),.*/\1/p')
seq=$(echo "$plan" | sed -n 's/^# micro_batch \([0-9]*\) x seq_len \([0-9]*\),.*/\2/p')
job_global=$(echo "$plan" | sed -n 's/.* global batch \([0-9]*\),.*/\1/p')
[ -n "$mb" ] && [ -n "$seq" ] && [ -n "$job_global" ] || die "cannot read the batch from: $plan"
if [ -z "$global" ]; then
    global=$job_global
    # a job without train.global_batch means micro_batch x ranks: fix it at the largest
    [ "$weak" = 0 ] && [ $((global % (mb * max_n))) -ne 0 ] && global=$((mb * max_n))
fi
mode=strong
[ "$weak" = 1 ] && mode=weak

[ -n "$out" ] || out=scaling-$mode-$(basename "$job" .ini)-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
csv=$out/scaling.csv
printf '%s\n' "world_size,strategy,tokens_per_s,tokens_per_s_per_gpu,step_ms,comm_exposed_ms,mem_peak_bytes,mfu,mode,global_batch,micro_batch,seq_len,steps_measured,step_ms_min,step_ms_max,repeats,repeat_spread_pct,threads,host_cores,backend,job,overrides" >"$csv"
: >"$out/commands.sh"
# getconf, not nproc: nproc follows OMP_NUM_THREADS, which make check sets to 1
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc --all 2>/dev/null || echo 0)

# The launcher: tests/mpi_test.sh knows what Open MPI needs here (root, more ranks
# than cores, no cross-memory attach) and srun's -n; MPIRUN picks the command.
run_ranks() { # NP ARGS...
    np=$1
    shift
    SHLM_TEST_TIMEOUT=$timeout MPIRUN=$launcher sh "$srcdir/tests/mpi_test.sh" "$np" "$@"
}

# One run: trains, then appends its CSV row (without the repeat columns) to $rows.
one_run() { # N STRATEGY GLOBAL DIR
    n=$1 s=$2 g=$3 dir=$4
    rm -rf "$dir"
    mkdir -p "$dir"
    # driver settings last so they win; the user's first so they can change the rest
    extra="train.steps=$steps log.every=1 log.run_dir=$dir train.global_batch=$g"
    [ "$s" = job ] || extra="$extra fsdp.strategy=$s"
    [ -n "$threads" ] && extra="$extra runtime.threads=$threads"
    # quiet runs (no validation, no sample, no LR warm-up longer than the run) unless
    # the user set those keys; shardlm refuses a key given twice
    defaults=""
    for kv in train.warmup_steps=0 train.eval_every=0 train.sample_tokens=0 data.val=; do
        case " $sets" in *" ${kv%%=*}="*) ;; *) defaults="$defaults $kv" ;; esac
    done
    # shellcheck disable=SC2046
    set -- "$shardlm" train "$job" $(set_args $defaults $sets $extra)
    echo "MPIRUN='$launcher' sh $srcdir/tests/mpi_test.sh $n $*" >>"$out/commands.sh"
    echo "== $n ranks, strategy $s, global batch $g: log $dir/run.log"
    run_ranks "$n" "$@" >"$dir/run.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] || [ ! -s "$dir/metrics.jsonl" ]; then
        echo "strong_scaling.sh: run on $n ranks failed (exit $rc); from $dir/run.log:" >&2
        { grep -m 3 -i 'error' "$dir/run.log" || tail -n 5 "$dir/run.log"; } >&2
        return 1
    fi
    strategy=$(sed -n 's/^ *fsdp\.strategy *= *\([A-Z_]*\).*/\1/p' "$dir/run.log" | head -n 1)
    backend=$(sed -n 's/.* device=\([a-z]*\).*/\1/p' "$dir/run.log" | head -n 1)
    th=$(sed -n 's/^ *runtime\.threads *= *\([0-9]*\).*/\1/p' "$dir/run.log" | head -n 1)
    # means over the steps after the warm-up; peak memory is the largest
    awk -v warm="$warmup" -v n="$n" -v strat="${strategy:-?}" -v mode="$mode" -v g="$g" \
        -v mb="$mb" -v seq="$seq" '
        function num(key,   m) {
            if (match($0, "\"" key "\": *[-+0-9.eE]+")) {
                m = substr($0, RSTART, RLENGTH); sub(/^[^:]*: */, "", m); return m + 0
            }
            return "nan"
        }
        { step = num("step") }
        step > warm {
            k++; tps += num("tokens_per_s"); ms = num("step_ms"); sms += ms
            ex += num("comm_exposed_ms"); mfu += num("mfu")
            mem = num("mem_peak_bytes"); if (mem > peak) peak = mem
            if (k == 1 || ms < lo) lo = ms
            if (k == 1 || ms > hi) hi = ms
        }
        END {
            if (k == 0) exit 1
            printf "%d,%s,%.1f,%.1f,%.3f,%.3f,%.0f,%.6f,%s,%d,%d,%d,%d,%.3f,%.3f\n",
                n, strat, tps / k, tps / k / n, sms / k, ex / k, peak, mfu / k, mode, g,
                mb, seq, k, lo, hi
        }' "$dir/metrics.jsonl" >>"$rows" || {
        echo "strong_scaling.sh: $dir/metrics.jsonl has no step after the warm-up" >&2
        return 1
    }
    tail_cols="${th:-0},$cores,${backend:-?},$job,$(echo $sets)"
}

failed=0
rows=$out/.rows
for s in $(echo "${strategies:-job}" | tr ',' ' '); do
    for n in $(echo "$ranks_list" | tr ',' ' '); do
        g=$global
        [ "$weak" = 1 ] && g=$((global * n))
        if [ $((g % (mb * n))) -ne 0 ]; then
            echo "strong_scaling.sh: skip $n ranks: global batch $g is not a multiple of micro_batch $mb x $n" >&2
            failed=1
            continue
        fi
        : >"$rows"
        r=1
        while [ $r -le "$repeat" ]; do
            dir=$out/ws$n-$s
            [ "$repeat" -gt 1 ] && dir=$dir-r$r
            one_run "$n" "$s" "$g" "$dir" || failed=1
            r=$((r + 1))
        done
        [ -s "$rows" ] || continue
        # with --repeat: the run whose mean step time is the median, and how far apart
        # the runs were (a busy host shows here first)
        k=$(wc -l <"$rows")
        sort -t, -k5,5g "$rows" | awk -F, -v k="$k" -v tail="$tail_cols" '
            NR == 1 { lo = $5 } { hi = $5 } NR == int((k + 1) / 2) { med = $0; m = $5 }
            END { printf "%s,%d,%.1f,%s\n", med, k, (m > 0 ? 100 * (hi - lo) / m : 0), tail }' >>"$csv"
    done
done
rm -f "$rows"

echo "wrote $csv"
report_args=""
[ -n "$png" ] && report_args="--png $png"
[ -n "$gpn" ] && report_args="$report_args --gpus-per-node $gpn"
# shellcheck disable=SC2086
sh "$here/report.sh" $report_args "$csv" | tee "$out/report.txt"
exit $failed
