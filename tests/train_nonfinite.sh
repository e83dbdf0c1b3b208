#!/bin/sh
# Non-finite losses, gradient norms and weights (docs/engine.md "Non-finite steps"),
# made to happen mid-run by the test hook SHLM_TEST_NONFINITE
# (src/run/faults.c) on one rank only, so every case also checks that all ranks agree:
#  abort:   a NaN loss on rank 1 of 2 at step 5 (train.on_nonfinite = abort, the default):
#           exit 1 with one line naming step 5, step 5 logged as skipped and nothing after
#           it, no step_5 checkpoint, `latest` still names step_4.h5 and checkpoint.keep
#           rotated nothing away;
#  skip:    NaN losses at steps 5 and 6 (skip, max_skipped 2): exit 0, both steps marked
#           skipped in the log and metrics.jsonl, and the checkpoints of steps 4, 5 and 6
#           hold the same weights and AdamW moments (no update, no moment change), with
#           adamw_step 4 and the data position advanced; ckpt info says 2 steps skipped;
#  limit:   NaN losses at steps 5-8 (skip, max_skipped 3): exit 1 at step 8, "4 steps in
#           a row"; latest names step_7.h5, whose tensors are step_4's;
#  hybrid:  a NaN gradient norm on rank 3 of 4 (HYBRID_SHARD 2 x 2) at step 3: every rank
#           stops at step 3 (one error line, "on 1 of 4 ranks"), no hang;
#  noshard: a NaN loss on rank 0 of 2 under NO_SHARD with skip: the replicas skip together
#           (step 3's checkpoint equals step 2's);
#  weights: NaN weights on rank 1 after the update of step 5: the save of step 5
#           (synchronous: checkpoint.async=false) refuses them naming the dataset, exit 1,
#           `latest` names step_4.h5, step_3 and step_4 are kept (keep = 2), no step_5
#           file or .tmp;
#  weights_async: the same with the save of step 5 in the background: its failure ends
#           the run when the save of step 6 waits for it (last logged step 6), the same
#           checks hold;
#  inflight: a NaN loss at step 5 while the background save of step 4 is still in flight
#           (rank 0 takes 2 x runtime.comm_timeout_s more over its data,
#           SHLM_TEST_SLOW_SAVE=0:4) and failing (SHLM_TEST_WRITE_ERROR=1:4): the run
#           waits for the save and its line, the earlier failure, is the one line (as a
#           synchronous run would say), `latest` names step_2.h5, no step_4 file is left;
#  import:  a NaN in one tensor of a Hugging Face model.safetensors (model.init_from) and
#           in one dataset of a shardlm checkpoint with every checksum recomputed
#           (model.init_from and checkpoint.resume): refused naming the tensor, before
#           step 1. Needs a python3 with h5py and numpy for the checkpoint edit (that
#           part is skipped without it, and the test with it).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/train_nonfinite.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
SHLM_TEST_TIMEOUT=${SHLM_TEST_TIMEOUT:-120}
export SHLM_TEST_TIMEOUT

. "$SHLM_SRCDIR/tests/lib.sh"
skip_unless_launcher
test_begin train_nonfinite shlm-train-nonfinite
prepare_corpus "$work/train.bin"
ok() { echo "train_nonfinite: ok: $*"; }

# train NAME NP HOOK [--set ...]: NP ranks with SHLM_TEST_NONFINITE=HOOK (- for none), checkpoints in
# $work/NAME/ck; output in $work/NAME.log (stdout) and $work/NAME.err; sets $rc
train() {
    name=$1 np=$2 hook=$3
    shift 3
    [ "$hook" = - ] && hook=""
    echo "+ env SHLM_TEST_NONFINITE=$hook sh $mpi $np $SHLM train $job" \
        "--set data.train=$work/train.bin --set log.run_dir=$work/$name" \
        "--set checkpoint.dir=$work/$name/ck $*"
    env SHLM_TEST_NONFINITE="$hook" sh "$mpi" "$np" "$SHLM" train "$job" \
        --set "data.train=$work/train.bin" --set "log.run_dir=$work/$name" \
        --set "checkpoint.dir=$work/$name/ck" "$@" >"$work/$name.log" 2>"$work/$name.err" \
        </dev/null
    rc=$?
}

# error_named NAME PATTERN...: the run failed (exit 1 from the launcher) and printed one
# shardlm error line naming every pattern (Open MPI adds its own lines about the exit)
error_named() {
    name=$1
    shift
    n=$(grep -c '^shardlm: error: ' "$work/$name.err")
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
        tail -n 5 "$work/$name.err"
        fail "$name: exit $rc, want a failure"
        return 1
    fi
    if [ "$n" -ne 1 ]; then
        cat "$work/$name.err"
        fail "$name: $n 'shardlm: error:' lines, want 1"
        return 1
    fi
    for p in "$@"; do
        grep '^shardlm: error: ' "$work/$name.err" | grep -q -F -e "$p" ||
            { cat "$work/$name.err"; fail "$name: the error line does not name '$p'"; return 1; }
    done
    echo "$name: $(grep '^shardlm: error: ' "$work/$name.err")"
}

# tensors FILE: every dataset's checksum line of `ckpt info`
tensors() { "$SHLM" ckpt info "$1" | grep ' 0x' | awk '{print $1, $NF}'; }

# same_tensors NAME A B: checkpoints A and B hold the same weights and moments
same_tensors() {
    tensors "$1/ck/$2" >"$work/a.sums" && tensors "$1/ck/$3" >"$work/b.sums" &&
        [ -s "$work/a.sums" ] && cmp -s "$work/a.sums" "$work/b.sums"
}

# no_step5 DIR: DIR holds no file of step 5 (no step_5.h5, no temporary of it)
no_step5() {
    for f in "$1"/step_5.h5*; do
        [ -e "$f" ] && return 1
    done
    return 0
}

# skipped_steps DIR: the steps metrics.jsonl marks as skipped
skipped_steps() {
    sed -n 's/^{"step": \([0-9]*\),.*"skipped": true.*/\1/p' "$1/metrics.jsonl" | tr '\n' ' '
}

# ---- abort ----
train abort 2 loss:5:1 --set checkpoint.every=2 --set checkpoint.keep=1
if error_named abort "step 5" "not finite on 1 of 2 ranks" "train.on_nonfinite = abort"; then
    last=$(tail -n 1 "$work/abort/metrics.jsonl" | sed 's/^{"step": \([0-9]*\),.*/\1/')
    [ "$last" = 5 ] || fail "abort: the last logged step is $last, want 5"
    [ "$(skipped_steps "$work/abort")" = "5 " ] || fail "abort: step 5 not marked skipped"
    grep -q '^ *5/[0-9]* | *nan |.*skipped' "$work/abort.log" ||
        fail "abort: the step line of step 5 does not say it was skipped"
    [ "$(cat "$work/abort/ck/latest")" = step_4.h5 ] && [ -f "$work/abort/ck/step_4.h5" ] &&
        no_step5 "$work/abort/ck" &&
        ok "abort: stopped at step 5, latest still names step_4.h5, nothing of step 5 saved" ||
        fail "abort: checkpoint directory: $(ls "$work/abort/ck" | tr '\n' ' ')"
fi

# ---- skip ----
train skip 2 loss:5-6:1 --set train.on_nonfinite=skip --set train.max_skipped=2 \
    --set checkpoint.every=1 --set train.stop_after=8
if [ "$rc" -ne 0 ]; then
    tail -n 5 "$work/skip.err"
    fail "skip: exit $rc, want 0"
else
    [ "$(skipped_steps "$work/skip")" = "5 6 " ] ||
        fail "skip: skipped steps '$(skipped_steps "$work/skip")', want 5 and 6"
    [ "$(grep -c 'skipped: not finite, no update' "$work/skip.log")" -eq 2 ] ||
        fail "skip: the step lines do not mark steps 5 and 6"
    same_tensors "$work/skip" step_4.h5 step_5.h5 && same_tensors "$work/skip" step_4.h5 step_6.h5 &&
        ! same_tensors "$work/skip" step_6.h5 step_7.h5 &&
        ok "skip: the weights and moments of steps 4, 5 and 6 are identical; step 7 updates" ||
        fail "skip: a skipped step changed the weights or moments (or step 7 did not)"
    "$SHLM" ckpt info "$work/skip/ck/step_6.h5" >"$work/skip.info"
    grep -q 'step  *6 (4 updates applied, 2 steps skipped' "$work/skip.info" &&
        grep -q 'data_position  *48 ' "$work/skip.info" &&
        ok "skip: step 6 has adamw_step 4 and data position 48 (the data advanced)" ||
        { grep -e step -e data_position "$work/skip.info"; fail "skip: step_6's state"; }
fi

# ---- limit: more than max_skipped in a row ----
train limit 2 loss:5-8:0 --set train.on_nonfinite=skip --set train.max_skipped=3 \
    --set checkpoint.every=1 --set train.stop_after=10
if error_named limit "step 8" "4 steps in a row" "train.max_skipped = 3"; then
    [ "$(cat "$work/limit/ck/latest")" = step_7.h5 ] && same_tensors "$work/limit" step_4.h5 step_7.h5 &&
        ok "limit: stopped at step 8; latest names step_7.h5, which holds step 4's tensors" ||
        fail "limit: latest '$(cat "$work/limit/ck/latest")' or its tensors"
fi

# ---- hybrid: replicas agree ----
train hybrid 4 norm:3:3 --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
    --set train.stop_after=6
error_named hybrid "step 3" "on 1 of 4 ranks" &&
    [ "$(tail -n 1 "$work/hybrid/metrics.jsonl" | sed 's/^{"step": \([0-9]*\),.*/\1/')" = 3 ] &&
    ok "hybrid: a NaN norm on one rank of 4 stops every rank at step 3"

# ---- noshard: replicas skip together ----
train noshard 2 loss:3:0 --set fsdp.strategy=NO_SHARD --set train.on_nonfinite=skip \
    --set checkpoint.every=1 --set train.stop_after=4
[ "$rc" -eq 0 ] && same_tensors "$work/noshard" step_2.h5 step_3.h5 &&
    ok "noshard: both replicas skipped step 3 (its checkpoint equals step 2's)" ||
    fail "noshard: exit $rc, or step 3 changed the tensors"

# ---- weights: the save refuses NaN tensors ----
# weights NAME [--set ...]: the case in $work/NAME
weights() {
    w=$1
    shift
    train "$w" 2 weights:5:1 --set checkpoint.every=1 --set checkpoint.keep=2 \
        --set train.stop_after=8 "$@"
    if error_named "$w" "checkpoint save of step 5 failed" "/model/model.embed_tokens.weight" \
        "not finite"; then
        [ "$(cat "$work/$w/ck/latest")" = step_4.h5 ] && [ -f "$work/$w/ck/step_3.h5" ] &&
            [ -f "$work/$w/ck/step_4.h5" ] && no_step5 "$work/$w/ck" &&
            ok "$w: the save of step 5 refused; latest names step_4.h5, steps 3 and 4 kept" ||
            fail "$w: checkpoint directory: $(ls "$work/$w/ck" | tr '\n' ' ')"
    fi
}
weights weights --set checkpoint.async=false
weights weights_async --set checkpoint.async=true
last=$(tail -n 1 "$work/weights_async/metrics.jsonl" | sed 's/^{"step": \([0-9]*\),.*/\1/')
[ "$last" = 6 ] || fail "weights_async: the last logged step is $last, want 6 (the save of step 6 waits for step 5's)"

# ---- inflight: a non-finite step while a failing background save is in flight ----
SHLM_TEST_SLOW_SAVE=0:4 SHLM_TEST_WRITE_ERROR=1:4
export SHLM_TEST_SLOW_SAVE SHLM_TEST_WRITE_ERROR
train inflight 2 loss:5:1 --set checkpoint.every=2 --set checkpoint.async=true \
    --set runtime.comm_timeout_s=2
unset SHLM_TEST_SLOW_SAVE SHLM_TEST_WRITE_ERROR
if error_named inflight "checkpoint save of step 4 failed" "SHLM_TEST_WRITE_ERROR"; then
    last=$(tail -n 1 "$work/inflight/metrics.jsonl" | sed 's/^{"step": \([0-9]*\),.*/\1/')
    left=""
    for f in "$work/inflight/ck"/step_4.h5*; do
        [ -e "$f" ] && left="$left ${f##*/}"
    done
    [ "$last" = 5 ] && [ "$(cat "$work/inflight/ck/latest")" = step_2.h5 ] && [ -z "$left" ] &&
        ok "inflight: stopped at step 5 with the failed save's line; latest names step_2.h5" ||
        fail "inflight: last logged step $last (want 5), latest '$(cat "$work/inflight/ck/latest")', left: $left"
fi

# ---- import: a NaN weight in a Hugging Face directory and in a shardlm checkpoint ----
hf="$work/hf"
echo "+ $SHLM ckpt export $work/skip/ck/step_4.h5 $hf"
"$SHLM" ckpt export "$work/skip/ck/step_4.h5" "$hf" >"$work/export.log" 2>&1 ||
    { cat "$work/export.log"; fail "export failed"; }
py=""
for p in python3 /usr/bin/python3; do
    command -v "$p" >/dev/null 2>&1 && py=$p && break
done
find_h5py
up=model.layers.1.mlp.up_proj.weight
if [ -z "$py" ]; then
    skip_part "import from Hugging Face: no python3 to edit the file"
elif "$py" "$SHLM_SRCDIR/tests/corrupt.py" st-poison "$hf/model.safetensors" "$up"; then
    train hfnan 1 - --set "model.init_from=$hf" --set train.stop_after=2
    error_named hfnan "$hf/model.safetensors: tensor $up holds 1 non-finite values" &&
        [ ! -s "$work/hfnan/metrics.jsonl" ] && ok "import: the NaN in $up is refused before step 1"
else
    fail "import from Hugging Face: corrupt.py could not put a NaN in $hf/model.safetensors"
fi
if [ -n "$h5py" ]; then
    cp "$work/skip/ck/step_4.h5" "$work/nan.h5"
    "$h5py" "$SHLM_SRCDIR/tests/corrupt.py" poison "$work/nan.h5" "/model/$up"
    train cknan 1 - --set "model.init_from=$work/nan.h5" --set train.stop_after=2
    error_named cknan "dataset /model/$up holds 1 non-finite values" &&
        ok "import: a shardlm checkpoint with a NaN (checksums recomputed) is refused"
    train cknan2 2 - --set "checkpoint.resume=$work/nan.h5" --set train.stop_after=6
    error_named cknan2 "dataset /model/$up holds 1 non-finite values" &&
        ok "resume: the same checkpoint is refused on 2 ranks"
else
    skip_part "NaN in a shardlm checkpoint: no python3 with h5py and numpy"
fi

test_end
