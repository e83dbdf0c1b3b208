#!/bin/sh
# The performance model runs the real engine: for small jobs on 2 and 4 ranks (every
# strategy, a replica group with fp32 and bf16 reductions, tied embeddings, two
# micro-batches a step) the bytes rank 0 sends per step in the shard and replica groups,
# as benchmarks/perf_model predicts them over the simulated comm backend, equal exactly
# what `shardlm train` counts on the MPI backend ("comm per step" lines). A replay that
# missed a gather, a reduce-scatter of a tied unit's second part or a replica all-reduce
# would differ.
#   env SHLM=./shardlm SHLM_BUILDDIR=. SHLM_SRCDIR=. sh tests/perf_model_sim.sh
set -u
: "${SHLM:?set SHLM to the shardlm binary}" "${SHLM_SRCDIR:?set SHLM_SRCDIR to the source tree}"
. "$SHLM_SRCDIR/tests/lib.sh"
SHLM_BUILDDIR=${SHLM_BUILDDIR:-.}
model="$SHLM_BUILDDIR/benchmarks/perf_model"
ops="$SHLM_SRCDIR/benchmarks/results/perf_model-cpu-ops.txt"
[ -x "$model" ] || { echo "perf_model_sim: FAIL: $model not built"; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/shlm-perfsim.XXXXXX") || exit 99
trap '[ -n "${SHLM_KEEP_TMP:-}" ] || rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
n_fail=0
fail() { echo "perf_model_sim: FAIL: $*"; n_fail=$((n_fail + 1)); }

"$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" \
    "$T/train.bin" >"$T/prepare.log" 2>&1 || { cat "$T/prepare.log"; echo "perf_model_sim: FAIL: cannot prepare the corpus"; exit 1; }
cp "$SHLM_SRCDIR/tests/jobs/small.ini" "$T/small.ini"

# case NAME NP ARGS...: trains small.ini 2 steps on NP ranks, predicts it on NP ranks,
# compares the two comm lines
case_() {
    name=$1 np=$2
    shift 2
    echo "+ tests/mpi_test.sh $np shardlm train small.ini $* ; perf_model --backend cpu --job small.ini $* --ranks $np"
    SHLM_TEST_TIMEOUT=${SHLM_TEST_TIMEOUT:-120} sh "$SHLM_SRCDIR/tests/mpi_test.sh" "$np" "$SHLM" train \
        "$T/small.ini" --set log.run_dir="$T/run.$name" --set train.global_batch=$((2 * np)) "$@" \
        >"$T/$name.train" 2>&1 </dev/null
    rc=$?
    skip_without_launcher $rc
    if [ $rc -ne 0 ]; then
        tail -n 20 "$T/$name.train"
        fail "$name: training on $np ranks exited $rc"
        return
    fi
    # link figures: any (bytes do not depend on time)
    "$model" --ops "$ops" --backend cpu --intra-gbs 5 --inter-gbs 5 --job "$T/small.ini" \
        --set train.global_batch=$((2 * np)) "$@" --ranks "$np" >"$T/$name.model" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        cat "$T/$name.model"
        fail "$name: perf_model exited $rc"
        return
    fi
    want=$(grep '^comm per step' "$T/$name.train")
    got=$(grep '^comm per step' "$T/$name.model")
    if [ -n "$want" ] && [ "$want" = "$got" ]; then
        echo "ok: $name: $got"
    else
        fail "$name: shardlm train: '$want'; perf_model: '$got'"
    fi
}

case_ full_shard 2 --set fsdp.strategy=FULL_SHARD
case_ shard_grad_op 2 --set fsdp.strategy=SHARD_GRAD_OP
case_ no_shard 2 --set fsdp.strategy=NO_SHARD
case_ tied 2 --set fsdp.strategy=FULL_SHARD --set model.tie_word_embeddings=true
case_ hybrid 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2
case_ hybrid_bf16 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
    --set fsdp.reduce_dtype=bf16 --set fsdp.param_dtype=bf16
[ $n_fail -eq 0 ] || exit 1
echo "perf_model_sim: PASS"
