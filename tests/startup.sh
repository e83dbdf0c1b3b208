#!/bin/sh
# Start-up: the weights are initialised from the seed only when nothing is loaded. A
# 24M-parameter model's init (~1 s of RNG on one thread) shows in a fresh `eval` as
# "weights (init from the seed)"; an `eval` resuming the same model from a checkpoint says
# "weights (resume)" and its allocation and weights phases together must take at least
# half an init less than the fresh eval's (were the init still done before the load, they
# would take longer: the same allocation and init, plus the read). `train` prints the
# start-up line after the first step.
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
grep -q '^start-up: [0-9.]* s to the end of the first step: .*weights (init from the seed) [0-9.]* s.*first step' \
    "$work/train.out" || fail "train: no start-up line after the first step"
# phase NAME FILE: seconds of start-up phase NAME in FILE's start-up line (0 when absent)
phase() {
    sed -n "s/^start-up: .*[:,] $1 \([0-9.]*\) s.*/\1/p" "$2" | head -n 1 | grep . || echo 0
}
# shellcheck disable=SC2086
for what in fresh resume; do
    r=none
    [ $what = resume ] && r="$work/ck"
    set -- "$SHLM" eval "$work/s.ini" $shape $common --set "checkpoint.resume=$r"
    echo "+ $*"
    "$@" >"$work/$what.out" 2>&1 || { tail -n 5 "$work/$what.out"; fail "eval ($what) failed"; }
    grep '^start-up:' "$work/$what.out"
done
init=$(phase 'weights (init from the seed)' "$work/fresh.out")
fresh=$(awk -v a="$(phase allocation "$work/fresh.out")" -v i="$init" 'BEGIN { print a + i }')
resume=$(awk -v a="$(phase allocation "$work/resume.out")" -v w="$(phase 'weights (resume)' "$work/resume.out")" 'BEGIN { print a + w }')
grep -q '^start-up: .* to the evaluation: .*weights (resume)' "$work/resume.out" ||
    fail "eval from a checkpoint does not say weights (resume)"
awk -v i="$init" -v f="$fresh" -v r="$resume" 'BEGIN { exit !(i >= 0.2 && r < f - i / 2) }' ||
    fail "a resumed eval's allocation and weights took $resume s, the fresh eval's $fresh s with an init of $init s: the weights were initialised before being loaded"
[ $fails -eq 0 ] || { echo "startup.sh: $fails failure(s); kept $work"; exit 1; }
rm -rf "$work"
echo "startup.sh: ok: allocation + weights: fresh $fresh s (init $init s), resumed $resume s ($(($(date +%s) - t_start)) s)"
