#!/bin/sh
# What a checkpoint costs the training, saved synchronously and in the background
# (checkpoint.async): by default on the CPU backend, the tiny model (jobs/tiny.ini, preset
# tiny) on one rank with one thread, its steps made short (sequence 16, one sequence a step)
# so that a synchronous save costs several steps, saved every --every steps. --job and
# --set (after those defaults, so they win) run another shape: benchmarks/gpu_suite.sh's
# ckpt-async phase runs a 7B-wide model on a GPU this way.
#
# A step's time here is the wall time between two consecutive logged steps (elapsed_s of
# metrics.jsonl), which includes whatever the loop did between them: the synchronous
# save, or the background save's copy into the staging and the writer's competition.
# The median M is over the steps outside every save's window (the steps after the save up
# to its duration as rank 0 reports it, rounded up to whole steps of M). Reported, per mode
# and trial:
#   - sync:  the save's cost, the mean over the saves of (the step after the save) - M,
#            in steps (goal: at least 5, the regime the claim is about);
#   - async: the steps overlapping each save (its window), their mean time / M (goal: at
#            most 1.2), the worst save's, and the save's cost: the mean over the saves of
#            the window's time beyond M per step, in steps, which the last line also gives
#            as a share of the synchronous save's cost.
# Every checkpoint is verified (`shardlm ckpt verify`); a failed run or checkpoint fails
# the benchmark (exit 1); a ratio off its goal only with --strict.
#
# usage: benchmarks/bench_ckpt_async.sh [--shardlm PATH] [--dir DIR] [--steps N]
#                                       [--every N] [--trials N] [--strict] [--keep]
#                                       [--job FILE] [--set KEY=VALUE]...
set -u

shardlm=./shardlm
dir=""
steps=600
every=150
trials=2
strict=0
keep=0
job=""
sets=""
while [ $# -gt 0 ]; do
    case $1 in
    --shardlm) shardlm=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --trials) trials=$2; shift 2 ;;
    --strict) strict=1; shift ;;
    --keep) keep=1; shift ;;
    --job) job=$2; shift 2 ;;
    --set) sets="$sets --set $2"; shift 2 ;;
    *) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
job=${job:-$here/../jobs/tiny.ini}
mpi="$here/../tests/mpi_test.sh"
[ -x "$shardlm" ] || { echo "bench_ckpt_async: no shardlm at $shardlm (use --shardlm)"; exit 2; }
if [ -z "$dir" ]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/shlm-bench-ckpt-async.XXXXXX") || exit 2
else
    mkdir -p "$dir" || exit 2
fi
"$shardlm" data prepare --tokenizer bytes "$here/../jobs/data/shakespeare-train.txt" \
    "$dir/train.bin" >/dev/null || exit 1

# run MODE TRIAL: one training run (checkpoint.async = MODE), its checkpoints verified
run() {
    name=$1-$2
    rm -rf "$dir/$name"
    # the defaults a --set does not name (shardlm refuses a key set twice), then the --sets;
    # unquoted: split into --set KEY=VALUE words (values without spaces)
    defaults=""
    for kv in "data.train=$dir/train.bin" train.seq_len=16 train.micro_batch=1 \
        train.global_batch=1 runtime.threads=1; do
        case "$sets " in *"--set ${kv%%=*}="*) ;; *) defaults="$defaults --set $kv" ;; esac
    done
    sh "$mpi" 1 "$shardlm" train "$job" $defaults \
        --set data.val= --set train.sample_tokens=0 --set log.every=1 \
        --set "train.steps=$steps" --set "checkpoint.every=$every" \
        --set "checkpoint.dir=$dir/$name/ck" --set "log.run_dir=$dir/$name" \
        --set "checkpoint.async=$1" $sets >"$dir/$name.log" 2>&1 </dev/null || {
        echo "bench_ckpt_async: the $1 run failed:" >&2
        tail -n 20 "$dir/$name.log" >&2
        return 1
    }
    for f in "$dir/$name/ck/"step_*.h5; do
        "$shardlm" ckpt verify "$f" >/dev/null 2>&1 ||
            { echo "bench_ckpt_async: $f does not verify" >&2; return 1; }
    done
    if [ "$1" = true ] && ! grep -q "^checkpoint: saved step $every to .* in the background" "$dir/$name.log"; then
        echo "bench_ckpt_async: the async run did not save in the background" >&2
        return 1
    fi
}

# measure MODE TRIAL: "median_ms sync_cost_steps overlap_ratio worst_ratio overlapped_steps
# free_steps async_cost_steps"
measure() {
    name=$1-$2
    # "step interval_s" from metrics.jsonl; "step seconds" of each save from the log
    sed -n 's/.*"step": \([0-9]*\),.*"elapsed_s": \([0-9.]*\),.*/\1 \2/p' "$dir/$name/metrics.jsonl" \
        >"$dir/$name.elapsed"
    sed -n 's/^checkpoint: saved step \([0-9]*\) to .* in \([0-9.]*\) s = .*/\1 \2/p' "$dir/$name.log" \
        >"$dir/$name.saves"
    awk -v every="$every" -v last="$steps" '
        # the median of iv[] over the steps outside the windows of the saves, a window being
        # the steps after save s up to its duration at median step m (at least one)
        function window_median(m,    s, q, w, n, i, j, x) {
            split("", out)
            for (s = every; s < last; s += every) {
                w = (s in dur) ? int(dur[s] / m + 0.999999) : 1
                if (w < 1) w = 1
                win[s] = w
                for (q = s + 1; q <= s + w; q++) out[q] = 1
            }
            n = 0
            for (q = 2; q <= last; q++) if ((q in iv) && !(q in out)) v[++n] = iv[q]
            for (i = 1; i <= n; i++)
                for (j = i + 1; j <= n; j++)
                    if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
            free = n
            return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        }
        FNR == NR { dur[$1] = $2; next }
        { t[$1] = $2 }
        END {
            for (s = 2; s <= last; s++) if (((s - 1) in t) && (s in t)) iv[s] = t[s] - t[s - 1]
            m = window_median(1e9)            # windows of one step: the steps after a save
            m = window_median(m)
            m = window_median(m)
            cost = 0; k = 0; sum = 0; cnt = 0; worst = 0; extra = 0
            for (s = every; s < last; s += every) {
                if (!(s in dur) || !((s + 1) in iv)) continue
                cost += iv[s + 1] - m; k++
                ws = 0; wc = 0
                for (q = s + 1; q <= s + win[s] && q <= last; q++) { ws += iv[q]; wc++ }
                if (wc > 0 && ws / wc / m > worst) worst = ws / wc / m
                sum += ws; cnt += wc; extra += ws - wc * m
            }
            printf "%.2f %.2f %.3f %.3f %d %d %.3f\n", 1e3 * m, k ? cost / k / m : 0,
                   cnt ? sum / cnt / m : 0, worst, cnt, free, k ? extra / k / m : 0
        }' "$dir/$name.saves" "$dir/$name.elapsed"
}

echo "# bench_ckpt_async: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores; $($shardlm --version)"
echo "# $(basename "$job"), 1 rank, $steps steps, saved every $every; defaults a --set may replace: seq 16, 1 sequence a step, 1 thread${sets:+; given:$sets}"
echo "#   (a checkpoint: fp32 weights and both AdamW moments); file system of $dir:" \
    "$(df -hT "$dir" | awk 'NR == 2 { print $1 " " $2 ", " $5 " free" }')"
printf "#%6s %6s %10s %16s %16s %14s %10s %10s %16s\n" mode trial median_ms sync_cost_steps overlap_ratio \
    worst_ratio overlapped free async_cost_steps
fails=0
for trial in $(seq 1 "$trials"); do
    for mode in false true; do
        run "$mode" "$trial" || { fails=$((fails + 1)); continue; }
        set -- $(measure "$mode" "$trial")
        if [ "$mode" = false ]; then
            printf "%7s %6s %10s %16s %16s %14s %10s %10s %16s\n" sync "$trial" "$1" "$2" - - - "$6" -
            echo "$2" >>"$dir/sync_costs"
        else
            printf "%7s %6s %10s %16s %16s %14s %10s %10s %16s\n" async "$trial" "$1" - "$3" "$4" "$5" "$6" "$7"
            echo "$3" >>"$dir/ratios"
            echo "$7" >>"$dir/async_costs"
        fi
    done
done
[ "$fails" -eq 0 ] || { echo "bench_ckpt_async: FAIL: $fails run(s) failed; kept $dir"; exit 1; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
cost=$(median <"$dir/sync_costs")
ratio=$(median <"$dir/ratios")
acost=$(median <"$dir/async_costs")
echo "# medians over the trials: synchronous save = $cost steps (goal >= 5); steps overlapping a" \
    "background save = $ratio x the median step (goal <= 1.2); a background save costs $acost" \
    "steps, $(awk -v a="$acost" -v c="$cost" 'BEGIN { printf "%.1f%%", (c > 0 ? 100 * a / c : 0) }') of the synchronous save's cost"
ok=$(awk -v c="$cost" -v r="$ratio" 'BEGIN { print (c >= 5 && r <= 1.2) ? 1 : 0 }')
[ "$keep" -eq 1 ] || rm -rf "$dir"
if [ "$ok" -ne 1 ]; then
    echo "# bench_ckpt_async: off the goal"
    [ "$strict" -eq 1 ] && exit 1
fi
exit 0
