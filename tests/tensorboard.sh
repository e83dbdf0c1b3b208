#!/bin/sh
# TensorBoard event files (log.tensorboard) on 2 ranks, read by tensorboard's own code:
#  1. a directory that cannot be made or written is refused before step 1 (one error line
#     on 2 ranks, exit 1, no step trained): a file at the path, a read-only tmpfs and a
#     directory to make inside one (those two skipped where mounting is not allowed and
#     the test runs as root);
#  2. a run with `tensorboard = auto` in its job file (<run_dir>/tb, not a path beside the
#     job file) that validates every 3 steps, logs every 2 and stops after step 6 with
#     checkpoints at 4 and 6; then a run resumed from step 4's checkpoint to step 8, the
#     directory given by its path. tests/tensorboard_read.py, with PyPI tensorboard
#     ($SHLM_TENSORBOARD, tests/setup_pyenv.sh): two event files, every record sound;
#     every scalar equals metrics.jsonl's value at its step (as float32), steps 5.. being
#     the resumed run's; each run's job table as text at its first step. The runs train on
#     a data.train mixture of two files, so each file's tokens (data/tokens_seen/<file>)
#     are among the scalars. Skipped (77) without tensorboard, after part 1.
#   SHLM=./shardlm SHLM_SRCDIR=. sh tests/tensorboard.sh
set -u
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
test_begin tensorboard.sh shlm_tensorboard
mounted=""
cleanup() { [ -n "$mounted" ] && umount "$work/ro" 2>/dev/null; }
trap cleanup EXIT
prepare_corpus "$work/train.bin"
"$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-val.txt" \
    "$work/val.bin" >"$work/prepare-val.log" 2>&1 || fail "could not prepare the validation data"
cp "$SHLM_SRCDIR/tests/jobs/small.ini" "$work/w.ini"
printf '\n[log]\ntensorboard = auto\n' >>"$work/w.ini"

# run NAME [--set ...]: trains the small job for 8 steps on 2 ranks, validating every 3 and
# logging every 2, into run_dir $work/${RUN_DIR:-NAME}; output in $work/NAME.out, .err;
# sets $rc
run() {
    rn=$1
    shift
    set -- "$SHLM" train "$work/w.ini" --set "data.train=$work/train.bin:3, $work/val.bin:1" \
        --set "data.val=$work/val.bin" --set train.steps=8 --set train.eval_every=3 \
        --set train.eval_batches=2 --set log.every=2 --set "log.run_dir=$work/${RUN_DIR:-$rn}" "$@"
    echo "+ sh $mpi 2 $*"
    sh "$mpi" 2 "$@" >"$work/$rn.out" 2>"$work/$rn.err" </dev/null
    rc=$?
    [ $rc -eq 77 ] && skip_test "no MPI launcher"
}

# 1. directories that cannot be used
: >"$work/a-file"
run tbfile --set "log.tensorboard=$work/a-file"
refused_on_ranks tbfile $rc "log.tensorboard = $work/a-file" "not a directory"
mkdir "$work/ro"
if mount -t tmpfs -o ro,size=1m tmpfs "$work/ro" 2>/dev/null; then
    mounted=1
elif [ "$(id -u)" -ne 0 ]; then
    chmod a-w "$work/ro"
fi
if [ -n "$mounted" ] || [ "$(id -u)" -ne 0 ]; then
    run tbro --set "log.tensorboard=$work/ro"
    refused_on_ranks tbro $rc "log.tensorboard = $work/ro" "cannot open for writing"
    run tbrosub --set "log.tensorboard=$work/ro/tb"
    refused_on_ranks tbrosub $rc "log.tensorboard = $work/ro/tb" "cannot create directory $work/ro/tb"
else
    echo "tensorboard.sh: SKIP: an unwritable directory: root, and no tmpfs can be mounted here"
fi
cleanup
mounted=""

# 2. a run, stopped after step 6, and its resume from step 4 into the same directory
run a --set train.stop_after=6 --set "checkpoint.dir=$work/ck" --set checkpoint.every=4 \
    --set log.peak_tflops=0.001
[ $rc -eq 0 ] || { tail -n 5 "$work/a.err"; fail "a: exit $rc"; }
[ -d "$work/a/tb" ] && [ ! -e "$work/auto" ] ||
    fail "a: log.tensorboard = auto in the job file is not <run_dir>/tb"
grep -q "^tensorboard: $work/a/tb/events.out.tfevents\." "$work/a.out" ||
    fail "a: no line naming the event file"
RUN_DIR=a run b --set "checkpoint.dir=$work/ck" --set "checkpoint.resume=$work/ck/step_4.h5" \
    --set "log.tensorboard=$work/a/tb"
[ $rc -eq 0 ] || { tail -n 5 "$work/b.err"; fail "b: exit $rc"; }
export PYTHONPATH="$SHLM_TENSORBOARD${PYTHONPATH:+:$PYTHONPATH}"
if ! shlm_python tensorboard numpy >/dev/null; then
    [ $fails -eq 0 ] || test_end
    skip_test "reading the event files: $(shlm_python tensorboard numpy)" \
        "(tests/setup_pyenv.sh installs tensorboard into $SHLM_TENSORBOARD)"
fi
echo "+ TB_SOURCES='train.bin val.bin' PYTHONPATH=$PYTHONPATH $SHLM_PY $SHLM_SRCDIR/tests/tensorboard_read.py $work/a/tb" \
    "$work/a/metrics.jsonl $work/a.out:0 $work/b.out:4"
TB_SOURCES="train.bin val.bin" \
"$SHLM_PY" "$SHLM_SRCDIR/tests/tensorboard_read.py" "$work/a/tb" "$work/a/metrics.jsonl" \
    "$work/a.out:0" "$work/b.out:4" 2>"$work/read.err" || {
    sed 's/^/    stderr: /' "$work/read.err" | tail -n 5
    fail "the event files are not what metrics.jsonl and the job say"
}
test_end
