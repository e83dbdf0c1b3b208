#!/bin/sh
# fsdp.offload = optimizer (the fp32 master and the AdamW moments in host memory, AdamW on
# the host, docs/engine.md "Optimizer offload") on the cpu backend, where the same path runs
# with host buffers standing for page-locked ones:
#
#  same: each run below trains tests/jobs/ckpt.ini 6 steps with fsdp.offload = none and
#        with optimizer; the loss and gradient norm of every step (metrics.jsonl, %.9g)
#        and the checkpoint saved after the last step (every dataset's checksum: master and
#        both moments) must be equal, bit for bit. Every strategy; 1, 2 and 4 ranks;
#        clipping on (train.grad_clip 1.0, active from step 1) and off; accumulation; bf16
#        gathers and reductions; an FP8 recipe (fp8-tensorwise, whose gather makes the codes
#        from the device copy, in bf16 parameters); LoRA. Each offloaded run's plan check
#        must hold (master and moments 0 on the device, the copy and the host bytes as
#        planned).
#  resume: a run stopped after step 3 with one setting and resumed with the other ends
#        with the losses, gradient norms and checkpoint of the straight run, both ways.
#  refused: llama2-7b offloaded on this machine is refused before step 1 with one line
#        naming the host memory needed and available (its 6.7B parameters' master and
#        moments alone are 75 GiB).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/offload.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). Each command is printed; the work
# directory is kept when the test fails.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
steps=6
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin offload shlm-offload
prepare_corpus "$work/train.bin"
ok() { echo "offload: ok: $*"; }

# train NAME NP [--set k=v ...]: trains the job into $work/NAME, checkpoint in $work/NAME/ck
train() {
    tr_name=$1 tr_np=$2
    shift 2
    step "$tr_name" sh "$mpi" "$tr_np" "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$tr_name" --set "checkpoint.dir=$work/$tr_name/ck" \
        --set train.steps=$steps "$@"
}

# same NAME NP [--set k=v ...]: the run with and without the offload, compared
same() {
    sm_name=$1 sm_np=$2
    shift 2
    train "$sm_name-none" "$sm_np" --set fsdp.offload=none "$@" || return
    train "$sm_name-opt" "$sm_np" --set fsdp.offload=optimizer "$@" || return
    log="$work/$sm_name-opt.log"
    if ! grep -q 'master_bytes=0 .*moments_bytes=0 .*param_copy_bytes=[1-9].* host_bytes=[1-9]' "$log" ||
        ! grep -q '^plan check: allocated == plan' "$log" || grep -q '^plan check: rank' "$log"; then
        fail "$sm_name: the offloaded run's plan check: $(grep '^memory per rank by\|^plan check' "$log" | tr '\n' ' ')"
        return
    fi
    why=$(curves_problem "$sm_name-none" "$sm_name-opt" $steps)
    [ -z "$why" ] && why=$(sums_problem "$work/$sm_name-none/ck" "$work/$sm_name-opt/ck")
    if [ -n "$why" ]; then
        fail "$sm_name ($sm_np ranks): offloaded: $why"
    else
        ok "$sm_name ($sm_np ranks): $steps losses, gradient norms and the final state equal with and without the offload"
    fi
}

same full-1 1
same full-accum 2 --set train.micro_batch=1
same full-fp8-bf16 2 --set train.matmul=fp8-tensorwise --set fsdp.param_dtype=bf16
same gradop-bf16 2 --set fsdp.strategy=SHARD_GRAD_OP --set fsdp.param_dtype=bf16 \
    --set fsdp.reduce_dtype=bf16
same noshard-noclip 4 --set fsdp.strategy=NO_SHARD --set train.grad_clip=0
same hybrid-accum 4 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
    --set train.micro_batch=1
same lora 2 --set lora.rank=2

# ---- resume across the settings: straight runs are full-accum's ----
for way in "none optimizer" "optimizer none"; do
    set -- $way
    name=resume-$1-$2
    train "$name" 2 --set train.micro_batch=1 --set fsdp.offload=$1 --set train.stop_after=3 ||
        continue
    train "$name" 2 --set train.micro_batch=1 --set fsdp.offload=$2 || continue
    grep -q "loaded weights and optimizer of $work/$name/ck/step_3.h5" "$work/$name.log" ||
        fail "$name: the second run did not resume from step_3.h5"
    why=$(curves_problem full-accum-none "$name" $steps)
    [ -z "$why" ] && why=$(sums_problem "$work/full-accum-none/ck" "$work/$name/ck")
    if [ -n "$why" ]; then
        fail "$name: saved with fsdp.offload = $1, resumed with $2: $why"
    else
        ok "$name: saved with fsdp.offload = $1 after step 3, resumed with $2: steps 1-$steps and the final state equal the straight run's"
    fi
done

# ---- refused: the host cannot hold llama2-7b's offloaded state ----
run_expecting_error "fsdp.offload = optimizer needs" "GiB of host memory per rank" \
    "GiB are free per rank (this machine's available memory" -- \
    "$SHLM" train "$SHLM_SRCDIR/jobs/llama2-7b.ini" --set "data.train=$work/train.bin" \
    --set runtime.backend=cpu --set fsdp.offload=optimizer --set "log.run_dir=$work/7b"
if [ $rc -ne 1 ] || [ -n "$why" ] || grep -q '^ *1/[0-9]* |' "$work/out"; then
    sed 's/^/    stderr: /' "$work/err" | tail -n 3
    fail "llama2-7b offloaded: exit $rc (want 1 before step 1) $why"
else
    ok "llama2-7b offloaded refused before step 1: $(cat "$work/err")"
fi
test_end
