#!/bin/sh
# What data.doc_mask costs a Llama-2-7B-shaped training step on the GPUs of one machine:
# the same packed SFT-like file (FILE.v2 of benchmarks/bench_data_loader: documents of
# 64..1087 tokens, a third of each masked), micro-batch 2 x 4096 tokens, bf16 parameters,
# FULL_SHARD, STEPS steps with doc_mask off then on; prints each run's median step time
# over the steps after the second and the ratio. LAYERS (default 32) cuts the model to
# fewer blocks where the whole one does not fit the GPUs at hand (shardlm refuses before
# allocating, naming the bytes).
#   LAYERS=16 NP=1 sh benchmarks/bench_doc_mask.sh /tmp/bench.v2
set -u
SHLM=${SHLM:-./shardlm}
SRC=${SHLM_SRCDIR:-.}
LAYERS=${LAYERS:-32}
NP=${NP:-1}
STEPS=${STEPS:-8}
file=${1:?usage: bench_doc_mask.sh FILE.v2 (made by benchmarks/bench_data_loader)}
T=$(mktemp -d)
med() { # the median step_ms of steps 3.. of a metrics.jsonl
    sed -n 's/.*"step": \([0-9]*\),.*"step_ms": \([0-9.]*\),.*/\1 \2/p' "$1" |
        awk '$1 > 2 { print $2 }' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
printf '# %-10s %7s %5s %12s %14s\n' doc_mask layers ranks step_ms tokens/s/GPU
for dm in false true; do
    set -- "$SRC/jobs/llama2-7b.ini" --set model.n_layers="$LAYERS" --set data.train="$file" \
        --set train.micro_batch=2 --set train.global_batch=$((2 * NP)) --set train.steps="$STEPS" \
        --set train.warmup_steps=1 --set fsdp.param_dtype=bf16 --set data.doc_mask=$dm \
        --set log.run_dir="$T/$dm" --set runtime.backend=cuda
    # one rank: a plain process (mpirun binds it to one core, which slows the seed's
    # initialisation of the weights by the machine's core count)
    launch="mpirun --allow-run-as-root -np $NP"
    [ "$NP" = 1 ] && launch=""
    echo "+ $launch $SHLM train $*" >&2
    if ! $launch "$SHLM" train "$@" >"$T/$dm.log" 2>&1; then
        tail -5 "$T/$dm.log" >&2
        exit 1
    fi
    ms=$(med "$T/$dm/metrics.jsonl")
    eval "ms_$dm=\$ms"
    printf '  %-10s %7s %5s %12s %14.0f\n' $dm "$LAYERS" "$NP" "$ms" "$(echo "$ms" | awk '{ print 8192 / ($1 / 1000) }')"
done
echo "# doc_mask on / off: $(awk -v a="$ms_true" -v b="$ms_false" 'BEGIN { printf "%.4f", a / b }')"
rm -rf "$T"
