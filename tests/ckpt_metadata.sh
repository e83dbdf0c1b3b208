#!/bin/sh
# Checkpoint metadata that lies (docs/checkpoints.md "Checkpoints": state attributes,
# state checksum, links): each case edits a copy of a good checkpoint with h5py
# (tests/corrupt.py) and checks that resuming from it, or `ckpt info` / `ckpt verify`,
# fails before step 1 with one error line naming the attribute or dataset, exit 1:
#  - an edit the range checks cannot see (tokens_seen, a changed seed, two datasets of one
#    shape swapped) is caught by the state checksum;
#  - with the checksum recomputed ("restamp"), each out-of-range value is caught by its
#    own bound: step = 2^40, model.dim = 2^32 + 16 (not read as 16), data_position =
#    2^64 - 1, lr_last = NaN, step = 0 under adamw_step = 10 (also without a restamp),
#    a float where an integer belongs, a negative data_position, a 1-D dataset of
#    another length (the message says [16] and [64]);
#  - soft, hard and external links between datasets are refused;
#  - `ckpt info` with model.n_layers = 1e8 ends at once with the bound (no allocation
#    from it, no out-of-memory), `ckpt verify` with n_heads = 0 likewise;
#  - a format-1 file (no state checksum), a format-2 file (no tie_word_embeddings), a
#    format-3 file (no data.train attributes) and a format-4 file (no RoPE scaling keys, no
#    data.train_sources)
#    still resume; format 6 is refused.
# Skipped (77) without a python3 that has h5py and numpy (Debian: python3-h5py).
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/ckpt_metadata.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
. "$SHLM_SRCDIR/tests/lib.sh"
find_h5py
[ -n "$h5py" ] || skip_test "no python3 with h5py and numpy (apt-get install python3-h5py)"
edit="$h5py $SHLM_SRCDIR/tests/corrupt.py"
test_begin ckpt_metadata shlm-ckpt-metadata
prepare_corpus "$work/train.bin"

# train NAME [--set ...]: one rank (an MPI singleton), log $work/NAME.log, stderr in
# $work/NAME.err; returns its status
train() {
    name=$1
    shift
    echo "+ $SHLM train $job --set data.train=$work/train.bin --set log.run_dir=$work/$name $*"
    "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/$name" \
        "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
}

# case_file NAME EDIT...: a copy of the good checkpoint as $work/NAME.h5, edited by corrupt.py
case_file() {
    name=$1
    shift
    cmd=$1
    shift
    cp "$good" "$work/$name.h5"
    echo "+ $edit $cmd $work/$name.h5 $*"
    $edit "$cmd" "$work/$name.h5" "$@" || fail "$name: corrupt.py $cmd failed"
}

# resume_case NAME PATTERN... : resumes from $work/NAME.h5 and expects the refusal
resume_case() {
    name=$1
    shift
    train "$name" --set "checkpoint.resume=$work/$name.h5"
    refused_before_step1 "$name" $? "$@"
}

# ---- the good checkpoint: 10 steps ----
train good --set "checkpoint.dir=$work/ck" --set train.stop_after=10 ||
    { tail -n 5 "$work/good.err"; fail "the 10-step run that makes the good checkpoint failed"; exit 1; }
good="$work/ck/step_10.h5"
"$h5py" "$SHLM_SRCDIR/tests/ckpt_h5py.py" "$good" >"$work/h5py.log" 2>&1 ||
    { cat "$work/h5py.log"; fail "h5py does not reproduce the state checksum"; }

# ---- edits the state checksum catches ----
case_file tokens attr tokens_seen 7
resume_case tokens "$work/tokens.h5" "state checksum" "corrupt or edited"
case_file seed attr train.seed 4242
resume_case seed "$work/seed.h5" "state checksum"
case_file swap swap /model/model.layers.0.self_attn.q_proj.weight \
    /model/model.layers.1.self_attn.q_proj.weight
resume_case swap "$work/swap.h5" "state checksum"

# ---- edits the range checks catch (checksum recomputed) ----
case_file big_step attr step 1099511627776 restamp
resume_case big_step "attribute step = 1099511627776" "out of range"
case_file dim attr model.dim 4294967312 restamp
resume_case dim "attribute model.dim = 4294967312" "must be in [1, 1048576]"
case_file pos attr data_position 18446744073709551615 restamp
resume_case pos "attribute data_position = 18446744073709551615"
case_file nan_lr attr lr_last nan restamp
resume_case nan_lr "attribute lr_last = nan" "not a number"
case_file strategy attr fsdp.strategy .. restamp
resume_case strategy "attribute fsdp.strategy is not a strategy"
case_file step0 attr step 0
resume_case step0 "adamw_step = 10 is more than step = 0"
case_file float_step attr-float step 10.5
resume_case float_step "attribute step of /" "not an integer"
case_file neg_pos attr-int data_position -1
resume_case neg_pos "attribute data_position of /" "negative"
case_file short reshape /model/model.norm.weight 16
resume_case short "dataset /model/model.norm.weight has shape [16], the model needs [64]"

# ---- links inside the file ----
q0=/model/model.layers.0.self_attn.q_proj.weight
q1=/model/model.layers.1.self_attn.q_proj.weight
case_file soft soft "$q1" "$q0"
resume_case soft "$q1 is a soft link"
case_file hard hard "$q1" "$q0"
resume_case hard "is one object under 2 names"
case_file hardgroup hard /optim/exp_avg_sq /optim/exp_avg
resume_case hardgroup "/optim/exp_avg" "is one object under 2 names"
case_file ext external "$q1" "$good" "$q1"
resume_case ext "$q1 is an external link"

# ---- ckpt info / verify trust no shape attribute ----
case_file layers attr model.n_layers 100000000 restamp
echo "+ $SHLM ckpt info $work/layers.h5"
"$SHLM" ckpt info "$work/layers.h5" >"$work/info.log" 2>"$work/info.err"
refused_before_step1 info $? "attribute model.n_layers = 100000000" "must be in [1, 65536]"
case_file heads attr model.n_heads 0 restamp
echo "+ $SHLM ckpt verify $work/heads.h5"
"$SHLM" ckpt verify "$work/heads.h5" >"$work/verify.log" 2>"$work/verify.err"
refused_before_step1 verify $? "attribute model.n_heads = 0" "must be in [1, 65536]"

# ---- format versions ----
case_file v1 v1
train v1 --set "checkpoint.resume=$work/v1.h5" --set train.stop_after=12
if [ $? -ne 0 ]; then
    tail -n 3 "$work/v1.err"
    fail "a format-1 checkpoint does not resume"
elif ! grep -q "format 1: the state has no checksum to compare" "$work/v1.log"; then
    fail "the resume from a format-1 file does not say its state has no checksum"
else
    echo "ckpt_metadata: ok: a format-1 checkpoint resumes (range-checked, no state checksum)"
fi
case_file v2 v2
train v2 --set "checkpoint.resume=$work/v2.h5" --set train.stop_after=12
if [ $? -ne 0 ]; then
    tail -n 3 "$work/v2.err"
    fail "a format-2 checkpoint (before model.tie_word_embeddings) does not resume"
else
    echo "ckpt_metadata: ok: a format-2 checkpoint resumes (its state checksum without" \
        "model.tie_word_embeddings)"
fi
case_file v3 v3
train v3 --set "checkpoint.resume=$work/v3.h5" --set train.stop_after=12
if [ $? -ne 0 ]; then
    tail -n 3 "$work/v3.err"
    fail "a format-3 checkpoint (before the training file's attributes) does not resume"
else
    echo "ckpt_metadata: ok: a format-3 checkpoint resumes (its state checksum without" \
        "data.train, data.train_bytes, data.train_fingerprint)"
fi
case_file v4 v4
train v4 --set "checkpoint.resume=$work/v4.h5" --set train.stop_after=12
if [ $? -ne 0 ]; then
    tail -n 3 "$work/v4.err"
    fail "a format-4 checkpoint (before the RoPE scaling keys, a mixture's sources and LoRA's attributes) does not resume"
else
    echo "ckpt_metadata: ok: a format-4 checkpoint resumes (its state checksum without" \
        "model.rope_type and its parameters, data.train_sources, and lora.rank, lora.targets," \
        "lora.dora, lora.base, lora.base_fingerprint)"
fi
case_file v5 v5
train v5 --set "checkpoint.resume=$work/v5.h5" --set train.stop_after=12
if [ $? -ne 0 ]; then
    tail -n 3 "$work/v5.err"
    fail "a format-5 checkpoint (before lora.alpha, lora.rslora, lora.dropout) does not resume"
else
    echo "ckpt_metadata: ok: a format-5 checkpoint resumes (its state checksum without" \
        "lora.alpha, lora.rslora, lora.dropout)"
fi
case_file v7 attr format_version 7
resume_case v7 "checkpoint format version 7, this shardlm reads 1 to 6"

echo "ckpt_metadata: $fails failure(s) ($(($(date +%s) - t_start)) s)"
[ "$fails" -eq 0 ] && rm -rf "$work" || echo "ckpt_metadata: work directory kept: $work"
[ "$fails" -eq 0 ]
