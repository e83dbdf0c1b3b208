#!/bin/sh
# FP8 training on the cpu backend's emulation (train.matmul, src/model/fp8_linear.h), on the
# checkpoint tests' 95k-parameter model (tests/jobs/ckpt.ini):
#  parity: 12 steps in each FP8 recipe stay within 1% (relative, every step's loss) of the
#          bf16 run's, and differ from it by more than 1e-5 somewhere (the FP8 path runs:
#          the cpu's bf16 recipe is fp32, which FP8's 3-bit mantissas perturb by ~1e-4),
#          and the two recipes differ from each other;
#  checkpointing: fp8-rowwise with selective and full activation checkpointing gives the
#          losses of none bit for bit (none keeps the quantized transposes of ln1, ln2, h);
#  fp8_all_gather: fp8-tensorwise with the gather making the e4m3 codes (the default)
#          matches the gather of weights quantized in each product bit for bit on 1, 2 and
#          4 ranks (FULL_SHARD, HYBRID_SHARD), and sends fewer bytes;
#  resume: under each recipe on 2 ranks (FULL_SHARD), a run stopped after step 6 and
#          resumed to step 12 matches the straight 12-step run bit for bit (loss and
#          gradient-norm strings, every checkpoint dataset's checksum);
#  switch: bf16 -> fp8-rowwise and fp8-tensorwise -> bf16 across a resume: the resumed run
#          trains, and the job text of its checkpoint records the new recipe;
#  errors: a train.matmul that is not a recipe gives one error line naming the key and the
#          recipes, before step 1.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/fp8_train.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin fp8_train shlm-fp8-train
prepare_corpus "$work/train.bin"
ok() { echo "fp8_train: ok: $*"; }

# train NAME NP [--set ...]: NP ranks, 12-step schedule, run directory $work/NAME
train() {
    tr_name=$1 tr_np=$2
    shift 2
    step "$tr_name" sh "$mpi" "$tr_np" "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$tr_name" --set train.steps=12 "$@"
}

# ---- parity ----
for mm in bf16 fp8-tensorwise fp8-rowwise; do
    train "par_$mm" 1 --set train.matmul=$mm
done
grep -q '^  train.matmul  *= fp8-rowwise$' "$work/par_fp8-rowwise.log" &&
    ok "the resolved configuration prints train.matmul = fp8-rowwise" ||
    fail "the resolved configuration does not print train.matmul = fp8-rowwise"
for mm in fp8-tensorwise fp8-rowwise; do
    d=$(maxrel loss "$work/par_bf16/metrics.jsonl" "$work/par_$mm/metrics.jsonl" 12)
    echo "fp8_train: $mm vs bf16: largest relative loss difference over 12 steps $d"
    if [ "$d" = missing ]; then
        fail "$mm: 12 steps of both runs expected"
    elif awk -v d="$d" 'BEGIN { exit !(d < 1e-2 && d > 1e-5) }'; then
        ok "$mm: loss within 1% of bf16's at every step, and not equal to it ($d)"
    else
        fail "$mm: largest relative loss difference from bf16 $d, expected in (1e-5, 1e-2)"
    fi
done
d=$(maxrel loss "$work/par_fp8-tensorwise/metrics.jsonl" "$work/par_fp8-rowwise/metrics.jsonl" 12)
awk -v d="$d" 'BEGIN { exit !(d > 0) }' 2>/dev/null && ok "the two recipes give different losses ($d)" ||
    fail "fp8-tensorwise and fp8-rowwise give the same losses ($d)"

# ---- checkpointing: without it the blocks keep q(ln1ᵀ), q(ln2ᵀ), q(hᵀ) from the forward,
# selective and full recompute ln1, ln2, h and quantize them in the backward: the same
# codes, so the same losses bit for bit ----
for ac in selective full; do
    train "ac_$ac" 1 --set train.matmul=fp8-rowwise --set fsdp.activation_checkpointing=$ac
    why=$(curves_problem par_fp8-rowwise "ac_$ac" 12)
    [ -z "$why" ] && ok "fp8-rowwise, activation checkpointing $ac: losses identical to none" ||
        fail "fp8-rowwise, activation checkpointing $ac: $why"
done

# ---- fsdp.fp8_all_gather (on by default): under fp8-tensorwise the gather makes the e4m3
# codes from the fp32 master (2 ranks: all-gathers the codes and the norms apart); the
# losses and gradient norms are those of gathering the weights and quantizing them in each
# product, bit for bit, on 1 rank (bf16 parameters: the gather slots), FULL_SHARD on 2 and
# HYBRID_SHARD on 4 (shard groups of 2); and the shard group sends fewer bytes ----
for cfg in "1 bf16 FULL_SHARD 0" "2 fp32 FULL_SHARD 0" "4 bf16 HYBRID_SHARD 2"; do
    set -- $cfg
    for g in true false; do
        train "ag_$1_$g" "$1" --set train.matmul=fp8-tensorwise --set fsdp.param_dtype="$2" \
            --set fsdp.strategy="$3" --set fsdp.shard_group_size="$4" --set fsdp.fp8_all_gather=$g
    done
    why=$(curves_problem "ag_$1_false" "ag_$1_true" 12)
    [ -z "$why" ] && ok "fp8_all_gather, $1 rank(s) $3 $2: identical to quantizing in each product" ||
        fail "fp8_all_gather, $1 rank(s) $3 $2: $why"
done
sent() { sed -n 's/^comm per step (rank 0, sent): shard_group_bytes=\([0-9]*\).*/\1/p' "$work/$1.log"; }
b_on=$(sent ag_2_true) b_off=$(sent ag_2_false)
if [ -n "$b_on" ] && [ -n "$b_off" ] && [ "$b_on" -lt "$b_off" ]; then
    ok "fp8_all_gather on 2 ranks: $b_on shard-group bytes a step, $b_off without it"
else
    fail "fp8_all_gather on 2 ranks: shard-group bytes '$b_on', without it '$b_off': expected fewer"
fi

# ---- resume bit for bit under each recipe, 2 ranks ----
for mm in fp8-tensorwise fp8-rowwise; do
    train "full_$mm" 2 --set train.matmul=$mm --set checkpoint.dir="$work/full_$mm.ck"
    train "half_$mm" 2 --set train.matmul=$mm --set checkpoint.dir="$work/half_$mm.ck" \
        --set train.stop_after=6
    train "half_$mm" 2 --set train.matmul=$mm --set checkpoint.dir="$work/half_$mm.ck"
    why=$(curves_problem "full_$mm" "half_$mm" 12)
    [ -z "$why" ] && why=$(sums_problem "$work/full_$mm.ck" "$work/half_$mm.ck")
    if [ -z "$why" ]; then
        ok "$mm: stopped at 6 and resumed = straight 12 steps, bit for bit (losses, state)"
    else
        fail "$mm resume: $why"
    fi
done

# ---- switching the recipe across a resume ----
switch() {
    from=$1 to=$2
    train "sw_$from" 1 --set train.matmul="$from" --set checkpoint.dir="$work/sw_$from.ck" \
        --set train.stop_after=6 || return
    train "sw_$from" 1 --set train.matmul="$to" --set checkpoint.dir="$work/sw_$from.ck" || return
    n=$(last_steps "$work/sw_$from/metrics.jsonl" loss | wc -l | tr -d ' ')
    "$SHLM" ckpt info "$work/sw_$from.ck" --job >"$work/sw_$from.info" 2>&1
    if [ "$n" -ne 12 ]; then
        fail "$from -> $to: $n steps logged, expected 12"
    elif ! grep -q "train.matmul=$to\$" "$work/sw_$from.info"; then
        fail "$from -> $to: the checkpoint's job text does not record train.matmul=$to"
    else
        ok "$from -> $to across a resume: 12 steps, the checkpoint's job text records $to"
    fi
}
switch bf16 fp8-rowwise
switch fp8-tensorwise bf16

# ---- a bad recipe ----
run_expecting_error train.matmul fp8-tensorwise fp8-rowwise fp8 -- "$SHLM" train "$job" \
    --set "data.train=$work/train.bin" --set "log.run_dir=$work/bad" --set train.matmul=fp8
if [ "$rc" -ne 0 ] && [ -z "$why" ] && [ ! -s "$work/bad/metrics.jsonl" ]; then
    ok "train.matmul = fp8: $(cat "$work/err")"
else
    fail "train.matmul = fp8: exit $rc, $why"
fi
test_end
