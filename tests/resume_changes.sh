#!/bin/sh
# A resumed job that changes train.steps, global_batch or seq_len (docs/checkpoints.md
# "Resume"), on one rank, from a checkpoint of step 10 of a 20-step run:
#  steps:    refused by default, before step 1, naming both values and
#            checkpoint.allow_steps_change; allowed, the learning rate of steps 11-40
#            follows a cosine from the checkpoint's (step 10's) rate to min_lr at step 40,
#            computed here from that formula, and never rises above it (no jump); a run
#            stopped at step 25 of that schedule and resumed again gives steps 26-40 the
#            same rates and losses (the extended schedule is saved with the checkpoint);
#  global_batch: refused by default; allowed, the next step starts at the checkpoint's
#            sample and the position advances by the new batch (80 + 2 x 16 = 112);
#  seq_len:  refused by default; allowed but with shuffled data, refused with the reason;
#            allowed with data.shuffle = false, the position is re-expressed in tokens
#            (window 80 of 32 tokens starts at token 2560 = window 160 of 16 tokens);
#  data.train: another token file, and the same file with one token of its first block
#            changed, are refused by default naming both files and
#            checkpoint.allow_data_change; a copy under another name resumes; allowed,
#            the next step takes sample 80 of the new file, and the next checkpoint names it.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/resume_changes.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin resume_changes shlm-resume-changes
prepare_corpus "$work/train.bin"
ok() { echo "resume_changes: ok: $*"; }

# train NAME CKDIR [--set ...]: one rank (an MPI singleton) training on $data (default
# $work/train.bin), checkpoints in CKDIR, log $work/NAME.log, stderr $work/NAME.err; sets $rc
data=""
train() {
    name=$1 ck=$2
    shift 2
    echo "+ $SHLM train $job --set data.train=${data:-$work/train.bin} --set log.run_dir=$work/$name" \
        "--set checkpoint.dir=$ck $*"
    "$SHLM" train "$job" --set "data.train=${data:-$work/train.bin}" --set "log.run_dir=$work/$name" \
        --set "checkpoint.dir=$ck" "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
    rc=$?
}

# ran NAME: the run succeeded
ran() {
    [ "$rc" -eq 0 ] && return 0
    tail -n 5 "$work/$1.err"
    fail "$1: exit $rc, want 0"
    return 1
}

# position_after NAME PATTERN CKPT POS WHAT: run NAME said PATTERN (a grep regex) and
# checkpoint CKPT holds data position POS
position_after() {
    if grep -q "$2" "$work/$1.log" && "$SHLM" ckpt info "$3" | grep -q "data_position  *$4 "; then
        ok "$1: $5: the position of $(basename "$3" .h5) is $4"
    else
        fail "$1: the data position after the change (want $4 in $3)"
    fi
}

# field FILE KEY: "step value" of every line of metrics.jsonl, value as printed
field() { sed -n "s/.*\"step\": \([0-9]*\),.*\"$2\": \([^,}]*\).*/\1 \2/p" "$1"; }

# copy NAME: a copy of the step-10 checkpoint directory as $work/NAME
copy() { cp -r "$base" "$work/$1"; }

# ---- the checkpoint: step 10 of a 20-step run ----
base="$work/base"
train base "$base" --set train.steps=20 --set train.stop_after=10
ran base || exit 1
lr10=$(field "$work/base/metrics.jsonl" lr | awk '$1 == 10 { print $2 }')

# ---- steps ----
copy s1
train steps "$work/s1" --set train.steps=40
refused_before_step1 steps "$rc" "train.steps = 20" "this job has 40" "checkpoint.allow_steps_change = true"
train steps_ok "$work/s1" --set train.steps=40 --set checkpoint.allow_steps_change=true
if ran steps_ok; then
    grep -q "train.steps 20 -> 40 (checkpoint.allow_steps_change): the learning rate continues" \
        "$work/steps_ok.log" || fail "steps_ok: the resume does not say what it does"
    # lr(k) = min + (L - min) (1 + cos(pi (k - 10) / 30)) / 2, L = step 10's, min = 1e-4
    field "$work/steps_ok/metrics.jsonl" lr | awk -v L="$lr10" -v min=1e-4 '
        BEGIN { pi = atan2(0, -1); bad = 0; n = 0 }
        { k = $1; got = $2 + 0; n++
          want = min + (L - min) * (1 + cos(pi * (k - 10) / 30)) / 2
          if (got > L * (1 + 1e-6) || (got - want) > 1e-6 * want || (want - got) > 1e-6 * want) {
              printf "step %d: lr %s, want %.6e (L %s)\n", k, $2, want, L; bad++ } }
        END { if (n != 30 || bad) { printf "%d steps, %d wrong\n", n, bad; exit 1 } }' &&
        [ "$(field "$work/steps_ok/metrics.jsonl" lr | tail -n 1)" = "40 1.000000e-04" ] &&
        ok "steps_ok: lr of steps 11-40 decays from step 10's $lr10 to 1e-4 at step 40, no jump" ||
        fail "steps_ok: the extended schedule is not the cosine from step 10's rate"
fi
copy s2
train steps_a "$work/s2" --set train.steps=40 --set checkpoint.allow_steps_change=true \
    --set train.stop_after=25
ran steps_a
train steps_b "$work/s2" --set train.steps=40
if ran steps_b; then
    for key in lr loss; do
        field "$work/steps_ok/metrics.jsonl" $key | awk '$1 > 25' >"$work/one.$key"
        field "$work/steps_b/metrics.jsonl" $key >"$work/two.$key"
        [ "$(wc -l <"$work/two.$key")" -eq 15 ] && cmp -s "$work/one.$key" "$work/two.$key" ||
            { diff "$work/one.$key" "$work/two.$key" | head -n 4; fail "steps_b: $key of steps 26-40"; }
    done
    ok "steps_b: stopped at 25 and resumed: the rates and losses of steps 26-40 are the same"
fi

# ---- global_batch ----
copy g1
train gb "$work/g1" --set train.steps=20 --set train.global_batch=16
refused_before_step1 gb "$rc" "train.global_batch = 8" "this job has 16" "checkpoint.allow_global_batch_change = true"
train gb_ok "$work/g1" --set train.steps=20 --set train.global_batch=16 \
    --set checkpoint.allow_global_batch_change=true --set train.stop_after=12
ran gb_ok && position_after gb_ok "train.global_batch 8 -> 16 .*: the next step starts at sample 80" \
    "$work/g1/step_12.h5" 112 "16 sequences a step from sample 80 on"

# ---- seq_len ----
copy q1
train sl "$work/q1" --set train.steps=20 --set train.seq_len=16
refused_before_step1 sl "$rc" "train.seq_len = 32" "this job has 16" "checkpoint.allow_seq_len_change = true"
train sl_shuffled "$work/q1" --set train.steps=20 --set train.seq_len=16 \
    --set checkpoint.allow_seq_len_change=true
refused_before_step1 sl_shuffled "$rc" "its data is shuffled"
train plain "$work/p1" --set train.steps=20 --set train.stop_after=10 --set data.shuffle=false
ran plain
train sl_ok "$work/p1" --set train.steps=20 --set data.shuffle=false --set train.seq_len=16 \
    --set checkpoint.allow_seq_len_change=true --set train.stop_after=12
ran sl_ok && position_after sl_ok "train.seq_len 32 -> 16 .*: data position 80 -> 160" \
    "$work/p1/step_12.h5" 176 "windows of 16 from token 2560 (window 160) on"

# ---- the training file ----
"$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-val.txt" \
    "$work/other.bin" >"$work/other.log" 2>&1 || fail "cannot prepare $work/other.bin"
cp "$work/train.bin" "$work/same.bin"
# the same size, one token of the first block changed (token 10, 2 bytes wide after the
# 96-byte header): another file all the same
cp "$work/train.bin" "$work/edited.bin"
old=$(od -An -tu1 -j116 -N1 "$work/edited.bin" | tr -d ' ')
new=$((old == 65 ? 66 : 65))
# shellcheck disable=SC2059 # the byte, written in octal
printf "\\$(printf %o $new)" | dd of="$work/edited.bin" bs=1 seek=116 conv=notrunc 2>/dev/null
cmp -s "$work/train.bin" "$work/edited.bin" && fail "could not edit $work/edited.bin"
copy d1
data="$work/other.bin"
train data_other "$work/d1" --set train.steps=20
refused_before_step1 data_other "$rc" "was saved training on $work/train.bin" \
    "this job's data.train $work/other.bin is another file" "checkpoint.allow_data_change = true"
data="$work/edited.bin"
train data_edited "$work/d1" --set train.steps=20
refused_before_step1 data_edited "$rc" "was saved training on $work/train.bin" \
    "this job's data.train $work/edited.bin is another file" "checkpoint.allow_data_change = true"
data="$work/same.bin"
train data_same "$work/d1" --set train.steps=20 --set train.stop_after=11
if ran data_same && ! grep -q "not the checkpoint's file" "$work/data_same.log"; then
    ok "data_same: a copy of the training file under another name resumes, nothing said"
else
    fail "data_same: a copy of the training file under another name is not taken as the same"
fi
copy d2
data="$work/other.bin"
train data_ok "$work/d2" --set train.steps=20 --set checkpoint.allow_data_change=true \
    --set train.stop_after=12
data=""
if ran data_ok &&
    grep -q "data.train is not the checkpoint's file $work/train.bin (checkpoint.allow_data_change): the next step takes sample 80 of $work/other.bin" "$work/data_ok.log" &&
    "$SHLM" ckpt info "$work/d2/step_12.h5" | grep -q "data.train  *$work/other.bin ("; then
    ok "data_ok: allowed, the next step takes sample 80 of the new file, whose name step 12 keeps"
else
    fail "data_ok: the allowed change of data.train does not say so or is not kept"
fi

echo "resume_changes: $fails failure(s) ($(($(date +%s) - t_start)) s)"
[ "$fails" -eq 0 ] && rm -rf "$work" || echo "resume_changes: work directory kept: $work"
[ "$fails" -eq 0 ]
