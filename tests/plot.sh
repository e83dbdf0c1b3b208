#!/bin/sh
# `shardlm plot`: PNGs of runs' metrics over steps, overlaid.
#  1. A run dir trained twice from step 1 (a restart) plots only the last run's rows; a
#     run dir whose run stopped at step 3 and resumed to 6 plots steps 1..6 of both runs.
#  2. Both dirs in one call give loss.png, lr.png, throughput.png and memory.png (PNG
#     files), and no GPU plots without telemetry.
#  3. Rows with GPU telemetry (written here as a GPU run writes them) add gpu_power.png,
#     gpu_clock.png and gpu_util.png.
#  4. A row that is not JSON, a missing run dir: one error line naming it.
# Skipped without gnuplot (Debian: gnuplot-nox).
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/plot.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
command -v gnuplot >/dev/null 2>&1 || skip_test "no gnuplot (Debian: apt-get install gnuplot-nox)"
test_begin plot.sh shlm_plot
prepare_corpus "$work/train.bin"
cp "$SHLM_SRCDIR/tests/jobs/small.ini" "$work/p.ini"
train() { # RUN_DIR [--set ...]
    d=$1
    shift
    echo "+ $SHLM train $work/p.ini --set data.train=$work/train.bin --set log.run_dir=$work/$d --set train.steps=6 $*"
    "$SHLM" train "$work/p.ini" --set "data.train=$work/train.bin" --set "log.run_dir=$work/$d" \
        --set train.steps=6 "$@" >>"$work/train.log" 2>&1 || fail "training into $d failed"
}
train restart --set train.lr=1e-3
train restart --set train.lr=2e-3
train chain --set train.stop_after=3 --set "checkpoint.dir=$work/ck"
train chain --set "checkpoint.dir=$work/ck"
is_png() { [ "$(od -An -tx1 -N8 "$1" 2>/dev/null | tr -d ' ')" = 89504e470d0a1a0a ]; }
plot() { # NAME ARGS...
    pn=$1
    shift
    echo "+ $SHLM plot $*"
    "$SHLM" plot "$@" >"$work/$pn.out" 2>"$work/$pn.err"
    rc=$?
}
plot two --out "$work/plots" "$work/restart" "$work/chain"
[ $rc -eq 0 ] || { cat "$work/two.err"; fail "plot of two run dirs: exit $rc"; }
for f in loss lr throughput memory; do
    is_png "$work/plots/$f.png" || fail "no $f.png"
done
[ -e "$work/plots/gpu_power.png" ] && fail "a GPU plot without telemetry"
# the tables: the restart's second run only (lr 2e-3), the chain's steps 1..6
steps() { grep -v '^#' "$1" | awk '{printf "%s ", $1}'; }
[ "$(steps "$work/plots/run1.dat")" = "1 2 3 4 5 6 " ] || fail "restart: steps $(steps "$work/plots/run1.dat")"
lr2=$(sed -n 's/.*"step": 6, .*"lr": \([^,]*\),.*/\1/p' "$work/restart/metrics.jsonl" | tail -n 1)
got=$(awk '$1 == 6 {print $4}' "$work/plots/run1.dat")
awk -v a="$got" -v b="$lr2" 'BEGIN { exit !((a - b) ^ 2 < 1e-20) }' ||
    fail "restart: the table's lr at step 6 is $got, the last run's $lr2"
[ "$(steps "$work/plots/run2.dat")" = "1 2 3 4 5 6 " ] || fail "chain: steps $(steps "$work/plots/run2.dat")"
[ "$(sed 's/.*"run_id": "\([^"]*\)".*/\1/' "$work/chain/metrics.jsonl" | sort -u | wc -l)" -eq 2 ] ||
    fail "chain: want two run ids in its metrics.jsonl"

# GPU rows, as a GPU run writes them
mkdir -p "$work/gpu"
i=1
while [ $i -le 20 ]; do
    printf '{"step": %d, "loss": %s, "lr": 1e-4, "grad_norm": 1, "tokens_per_s": 5e4, "tflops_per_gpu": 400, "mfu": 0.4, "step_ms": 300, "comm_exposed_ms": 1, "mem_peak_bytes": 9e10, "tokens_seen": %d, "steps": 20, "run_id": "g", "tokens_per_s_per_gpu": 6e3, "gpu": {"gpus": 8, "util_pct": {"mean": [%d, 99], "max": [100, 100]}, "sm_clock_mhz": {"mean": [1700, 1980], "max": [1980, 1980]}, "power_w": {"mean": [%d, 690], "max": [700, 700]}}}\n' \
        $i "$(awk -v i=$i 'BEGIN { print 3 + 2 / i }')" $((i * 8192)) $((90 + i / 4)) $((600 + i * 2)) >>"$work/gpu/metrics.jsonl"
    i=$((i + 1))
done
plot gpu "$work/gpu"
[ $rc -eq 0 ] || { cat "$work/gpu.err"; fail "plot of GPU rows: exit $rc"; }
for f in gpu_power gpu_clock gpu_util loss; do
    is_png "$work/gpu/plots/$f.png" || fail "no $f.png from GPU rows (in RUN_DIR/plots)"
done

# bad input
echo 'not json' >>"$work/gpu/metrics.jsonl"
plot badrow "$work/gpu"
[ $rc -ne 0 ] && [ "$(wc -l <"$work/badrow.err")" -eq 1 ] &&
    grep -q "^shardlm: error: plot: $work/gpu/metrics.jsonl:21: not a metrics row" "$work/badrow.err" ||
    fail "a bad row: exit $rc, $(cat "$work/badrow.err")"
plot missing "$work/none"
[ $rc -ne 0 ] && grep -q "^shardlm: error: plot: $work/none/metrics.jsonl: No such file" "$work/missing.err" ||
    fail "a missing run dir: exit $rc, $(cat "$work/missing.err")"
[ $fails -eq 0 ] || { echo "plot.sh: $fails failure(s); kept $work"; exit 1; }
rm -rf "$work"
echo "plot.sh: ok ($(($(date +%s) - t_start)) s)"
