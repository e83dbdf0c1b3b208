#!/bin/sh
# Start-up of a job whose weights are imported, against the time its weights take to read
# from disk: the target is that read plus a few seconds.
#   benchmarks/startup.sh [--drop-caches] JOB.ini OUT_DIR     (e.g. jobs/tinyllama-1b.ini)
# Makes OUT_DIR/rand.bin (random byte-valued tokens: any model takes them), a one-step checkpoint of the job's model
# (weights from the seed; removed once exported: 12 bytes per parameter, 81 GB for 7B),
# its Hugging Face export OUT_DIR/hf (bf16 safetensors, 2 bytes per parameter), then
# times: the export's read with O_DIRECT (dd: the disk, not the page cache), `eval` and a
# one-step `train` starting from model.init_from = OUT_DIR/hf, each printing its start-up
# breakdown. --drop-caches (root) empties the page cache before each timed read. One
# process on one GPU (no mpirun: its binding to a core slows the seed's initialisation).
set -u
SHLM=${SHLM:-./shardlm}
drop=0
[ "${1:-}" = --drop-caches ] && { drop=1; shift; }
[ $# -eq 2 ] || { echo "usage: $0 [--drop-caches] JOB.ini OUT_DIR" >&2; exit 2; }
job=$1 out=$2
mkdir -p "$out" || exit 1
run() { echo "+ $*"; "$@"; }
dropcaches() { [ $drop -eq 1 ] && sync && echo 3 >/proc/sys/vm/drop_caches; }
[ -f "$out/rand.bin" ] || run "$SHLM" data random --vocab 256 --tokens 20000000 "$out/rand.bin" || exit 1
common="--set data.train=$out/rand.bin --set data.val=$out/rand.bin --set train.eval_batches=1 --set fsdp.param_dtype=bf16 --set train.micro_batch=1 --set train.global_batch=1 --set train.sample_tokens=0 --set train.eval_every=0"
if [ ! -f "$out/hf/config.json" ]; then
    # shellcheck disable=SC2086
    run "$SHLM" train "$job" $common --set train.steps=1 --set train.warmup_steps=0 \
        --set "checkpoint.dir=$out/ck" --set "log.run_dir=$out/run-ckpt" >"$out/make_ckpt.log" 2>&1 || { tail -n 5 "$out/make_ckpt.log"; exit 1; }
    run "$SHLM" ckpt export "$out/ck" "$out/hf" --dtype bf16 >"$out/export.log" 2>&1 ||
        { tail -n 5 "$out/export.log"; exit 1; }
    rm -rf "$out/ck"
fi
bytes=$(cat "$out"/hf/*.safetensors | wc -c)
dropcaches
t0=$(date +%s.%N)
for f in "$out"/hf/*.safetensors; do dd if="$f" of=/dev/null bs=16M iflag=direct 2>/dev/null; done
t1=$(date +%s.%N)
read_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
echo "disk: $bytes bytes of safetensors read in $read_s s (O_DIRECT)"
dropcaches
# shellcheck disable=SC2086
run "$SHLM" eval "$job" $common --set "model.init_from=$out/hf" --set checkpoint.resume=none \
    --set "log.run_dir=$out/run-eval" 2>&1 |
    grep -E '^(start-up|checkpoint: imported|eval:)'
dropcaches
# shellcheck disable=SC2086
run "$SHLM" train "$job" $common --set "model.init_from=$out/hf" --set checkpoint.resume=none \
    --set train.steps=1 --set train.warmup_steps=0 --set log.run_dir="$out/run-train" 2>&1 |
    grep -E '^(start-up|checkpoint: imported)'
echo "target: $read_s s of reading plus a few seconds; the seed's initialisation is not done when weights are imported"
