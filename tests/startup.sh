#!/bin/sh
# Start-up: the weights are initialised from the seed only when nothing is loaded. The
# start-up line counts the values drawn from the seed's RNG (llama_init_count): a fresh
# `eval` of a 24.4M-parameter model draws all of them, an `eval` resuming that model from a
# checkpoint none (a load replaces every value: drawing them first is wasted time). Both
# print the line with its phases; `train` prints it after the first step.
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/startup.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin startup.sh shlm_startup
prepare_corpus "$work/train.bin"
cat "$SHLM_SRCDIR/tests/jobs/small.ini" - >"$work/s.ini" <<'JOB'
[runtime]
threads = 1
JOB
shape="--set model.dim=384 --set model.n_layers=12 --set model.n_heads=6 --set model.n_kv_heads=6 --set model.ffn_dim=1024 --set model.vocab_size=4096"
common="--set data.train=$work/train.bin --set data.val=$work/train.bin --set train.eval_batches=1 --set log.run_dir=$work/run"
# shellcheck disable=SC2086
set -- "$SHLM" train "$work/s.ini" $shape $common --set train.steps=1 --set "checkpoint.dir=$work/ck"
echo "+ $*"
"$@" >"$work/train.out" 2>&1 || { tail -n 5 "$work/train.out"; fail "training failed"; exit 1; }
grep -q '^start-up: [0-9.]* s to the end of the first step: .*weights (init from the seed, [0-9]* values drawn) [0-9.]* s.*first step' \
    "$work/train.out" || fail "train: no start-up line after the first step"
# shellcheck disable=SC2086
for what in fresh resume; do
    r=none
    [ $what = resume ] && r="$work/ck"
    set -- "$SHLM" eval "$work/s.ini" $shape $common --set "checkpoint.resume=$r"
    echo "+ $*"
    "$@" >"$work/$what.out" 2>&1 || { tail -n 5 "$work/$what.out"; fail "eval ($what) failed"; }
    grep '^start-up:' "$work/$what.out"
done
params=$(sed -n 's/^  params *= *//p' "$work/train.out" | head -n 1)
grep -q "^start-up: .* to the evaluation: .*weights (init from the seed, $params values drawn)" \
    "$work/fresh.out" || fail "a fresh eval does not say it drew the $params parameters from the seed"
grep -q '^start-up: .* to the evaluation: .*weights (resume) ' "$work/resume.out" ||
    fail "a resumed eval drew values from the seed before loading them (or does not say resume)"
[ $fails -eq 0 ] || { echo "startup.sh: $fails failure(s); kept $work"; exit 1; }
rm -rf "$work"
echo "startup.sh: ok ($(($(date +%s) - t_start)) s)"
