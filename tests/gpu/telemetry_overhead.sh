#!/bin/sh
# What the NVML telemetry costs a training step: the same Llama-2-7B command on one GPU
# (micro-batch 1, seq 4096, bf16, 10 steps) with log.telemetry_interval_ms = 100 (ten
# times the default rate) and = 0 (off), three runs each, alternating; the median of each
# run's mean step time over steps 3..10. Fails when telemetry costs 0.5% or more.
# A plain process (no mpirun: its binding to one core would slow the initialisation).
# Run by `make check-gpu`; exit 77 where no GPU has room for the 7B step (~ 100 GiB).
# LAYERS=N cuts the model to N of its 32 blocks (a shorter step: a stricter ratio, since
# the sampler's cost does not shrink with the step).
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/gpu/telemetry_overhead.sh
set -u
SHLM=${SHLM:-./shardlm}
SRC=${SHLM_SRCDIR:-.}
LAYERS=${LAYERS:-32}
free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -n 1)
[ -n "$free" ] && [ "$free" -gt 110000 ] || { echo "telemetry_overhead: no GPU with 110 GB free: skipped"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$SHLM" data random --vocab 32000 --tokens 2000000 "$T/rand.bin" >/dev/null || exit 1
run() { # NAME INTERVAL
    echo "+ $SHLM train $SRC/jobs/llama2-7b.ini --set model.n_layers=$LAYERS --set data.train=$T/rand.bin --set train.steps=10 --set train.warmup_steps=1 --set train.global_batch=1 --set fsdp.param_dtype=bf16 --set log.run_dir=$T/$1 --set log.telemetry_interval_ms=$2"
    "$SHLM" train "$SRC/jobs/llama2-7b.ini" --set model.n_layers="$LAYERS" \
        --set data.train="$T/rand.bin" --set train.steps=10 \
        --set train.warmup_steps=1 --set train.global_batch=1 --set fsdp.param_dtype=bf16 \
        --set log.run_dir="$T/$1" --set log.telemetry_interval_ms="$2" >"$T/$1.log" 2>&1 ||
        { tail -n 5 "$T/$1.log"; exit 1; }
    grep '^telemetry:' "$T/$1.log"
    sed -n 's/.*"step": \([0-9]*\), .*"step_ms": \([0-9.]*\),.*/\1 \2/p' "$T/$1/metrics.jsonl" |
        awk '$1 > 2 { s += $2; n++ } END { printf "%.3f\n", s / n }' >>"$T/$3"
}
for i in 1 2 3; do
    run on$i 100 on
    run off$i 0 off
done
med() { sort -n "$1" | sed -n 2p; }
on=$(med "$T/on") off=$(med "$T/off")
echo "mean step (ms), per run: on $(tr '\n' ' ' <"$T/on")| off $(tr '\n' ' ' <"$T/off")"
awk -v a="$on" -v b="$off" 'BEGIN { d = 100 * (a - b) / b
    printf "telemetry at 100 ms: median step %.3f ms against %.3f ms off: %+.3f%%\n", a, b, d
    exit !(d < 0.5) }'
