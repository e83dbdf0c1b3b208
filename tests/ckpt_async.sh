#!/bin/sh
# Checkpoints saved in the background (checkpoint.async = true), on the CPU backend with
# 2 ranks, saving every 4 steps:
#  same:   a run that leaves checkpoint.async at its default saves in the background,
#          and its saves of steps 4 and 8 hold the same bytes as the synchronous saves
#          (checkpoint.async=false) of the same steps (every dataset and attribute, read by
#          h5py through tests/ckpt_same.py; created_utc and the job text's
#          checkpoint.async line aside); the staging the run allocates is what
#          `shardlm plan` counts (ckpt_staging_bytes), and plan counts none for a job
#          that sets no checkpoint.dir or no checkpoint.every (nothing saved before the
#          last step, nothing staged);
#  last:   a run whose only save is its last (synchronous, as every run's last save is)
#          allocates no staging and says nothing of the background;
#  resume: resuming from the background step_8.h5 gives the uninterrupted run's losses and
#          gradient norms of steps 9-12 and its step-12 checkpoint, bit for bit;
#  kill:   a rank killed (SIGKILL, test hook SHLM_TEST_KILL_IN_SAVE) while the background
#          save of step 8 is in flight leaves `latest` on step_4.h5, which verifies;
#  error:  a write error planted in rank 1's background save of step 8
#          (SHLM_TEST_WRITE_ERROR) stops the run with one error line naming the file,
#          non-zero exit, `latest` on step_4.h5, nothing saved after it;
#  signal: SIGUSR1 to the launcher while the save of step 4 is in flight (made slow by
#          SHLM_TEST_SLOW_SAVE): the save completes, the step it stopped at is saved and
#          named by `latest`, exit 0;
#  fallback: where the host cannot hold the staging (one byte short on rank 1, or its
#          allocation refused there) or MPI gives no MPI_THREAD_MULTIPLE, every rank
#          saves synchronously and rank 0 says why in one line; a host that holds exactly
#          the staging saves in the background (tests/test_ckpt_async on 2 ranks).
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, SHLM_BUILDDIR, MPIRUN), or by hand from a
# build directory:
#   SHLM=./shardlm SHLM_BUILDDIR=. SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/ckpt_async.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher, or no python3 with h5py). The work
# directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
SHLM_BUILDDIR=${SHLM_BUILDDIR:-.}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"

. "$SHLM_SRCDIR/tests/lib.sh"
find_h5py
[ -n "$h5py" ] || skip_test "no python3 with h5py and numpy (apt-get install python3-h5py)"
test_begin ckpt_async shlm-ckpt-async
prepare_corpus "$work/train.bin"

# train NAME [--set ...]: 2 ranks, $STEPS (12) steps, saved every 4 into $work/NAME/ck
# (log $work/NAME.log, metrics in $work/NAME); returns its status. PRE (e.g. env VAR=1)
# may be set by the caller.
train() {
    name=$1
    shift
    set -- sh "$mpi" 2 "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$name" --set "checkpoint.dir=$work/$name/ck" \
        --set "train.steps=${STEPS:-12}" --set checkpoint.every=4 "$@"
    echo "+ ${PRE:-} $*"
    # shellcheck disable=SC2086 # PRE is words
    ${PRE:-} "$@" >"$work/$name.log" 2>&1 </dev/null
    rc=$?
    skip_without_launcher $rc
    return $rc
}

# same A B [--key KEY]...: the checkpoints A and B hold the same bytes (tests/ckpt_same.py),
# their job texts differing at most by checkpoint.async and the KEYs
same() {
    echo "+ $h5py $SHLM_SRCDIR/tests/ckpt_same.py $* --key checkpoint.async"
    "$h5py" "$SHLM_SRCDIR/tests/ckpt_same.py" "$@" --key checkpoint.async
}

latest_is() { # NAME FILE
    got=$(cat "$work/$1/ck/latest" 2>/dev/null)
    [ "$got" = "$2" ] || fail "$1: latest names '$got', want $2"
}

# ---- same: background and synchronous saves of the same steps, run in the same
# directories one after the other (the job texts then differ only by checkpoint.async) ----
if train run; then
    mv "$work/run" "$work/async"
    mv "$work/run.log" "$work/async.log"
    for n in 4 8; do
        grep -q "^checkpoint: saved step $n to .* in the background:" "$work/async.log" ||
            fail "async: step $n was not saved in the background"
    done
    # the staging the run allocated is the one `shardlm plan` counts
    staged=$(sed -n 's/^checkpoint: saved in the background: .* per rank (\([0-9]*\) bytes;.*/\1/p' \
        "$work/async.log")
    echo "+ $SHLM plan $job --ranks 2 --set checkpoint.dir=$work/async/ck --set checkpoint.every=4"
    planned=$("$SHLM" plan "$job" --ranks 2 --set "checkpoint.dir=$work/async/ck" \
        --set checkpoint.every=4 | awk '$1 == "ckpt_staging_bytes" { print $2 }')
    [ -n "$staged" ] && [ "$staged" = "$planned" ] ||
        fail "plan: ckpt_staging_bytes '$planned', the run's staging '$staged' bytes"
    for sets in "" "--set checkpoint.dir=$work/async/ck"; do
        echo "+ $SHLM plan $job --ranks 2 $sets"
        # shellcheck disable=SC2086 # the --set words
        "$SHLM" plan "$job" --ranks 2 $sets >"$work/plan-none.out" 2>&1 ||
            fail "plan $sets failed: $(tail -n 3 "$work/plan-none.out")"
        ! grep -q "ckpt_staging_bytes" "$work/plan-none.out" ||
            fail "plan: ckpt_staging_bytes counted for a job that saves nothing in the background ($sets)"
    done
else
    tail -n 20 "$work/run.log"
    fail "the run with checkpoint.async = true failed"
fi
if train run --set checkpoint.async=false; then
    mv "$work/run" "$work/sync"
    mv "$work/run.log" "$work/sync.log"
    for n in 4 8 12; do
        same "$work/async/ck/step_$n.h5" "$work/sync/ck/step_$n.h5" ||
            fail "same: the background save of step $n differs from the synchronous one"
    done
else
    tail -n 20 "$work/run.log"
    fail "the run with checkpoint.async = false failed"
fi

# ---- last: train.stop_after=4, saved at step 4 only ----
if train last --set train.stop_after=4; then
    grep -q "^checkpoint: saved step 4 to $work/last/ck/step_4.h5: " "$work/last.log" ||
        fail "last: step 4 was not saved synchronously"
    ! grep -q "in the background\|saving synchronously" "$work/last.log" ||
        fail "last: $(grep "in the background\|saving synchronously" "$work/last.log" | head -n 1)"
else
    tail -n 20 "$work/last.log"
    fail "the run stopped after 4 steps failed"
fi

# ---- resume: from the background step_8.h5 to step 12 ----
if train resume --set checkpoint.async=true --set "checkpoint.resume=$work/async/ck/step_8.h5"; then
    for key in loss grad_norm; do
        steps "$work/sync/metrics.jsonl" $key | awk '$1 > 8' >"$work/sync.$key"
        steps "$work/resume/metrics.jsonl" $key >"$work/resume.$key"
        if [ ! -s "$work/sync.$key" ] || ! cmp -s "$work/sync.$key" "$work/resume.$key"; then
            diff "$work/sync.$key" "$work/resume.$key" | head -n 6
            fail "resume: the $key of steps 9-12 differs from the uninterrupted run's"
        fi
    done
    same "$work/sync/ck/step_12.h5" "$work/resume/ck/step_12.h5" --key log.run_dir \
        --key checkpoint.dir --key checkpoint.resume ||
        fail "resume: step_12.h5 differs from the uninterrupted run's"
else
    tail -n 20 "$work/resume.log"
    fail "the resume from the background step_8.h5 failed"
fi

# ---- kill: rank 1 dies in the middle of the background save of step 8 ----
PRE="env SHLM_TEST_KILL_IN_SAVE=1:8" train kill --set checkpoint.async=true
[ "$rc" -ne 0 ] || fail "kill: the run survived SHLM_TEST_KILL_IN_SAVE"
grep -q "SHLM_TEST_KILL_IN_SAVE: rank 1 raises SIGKILL" "$work/kill.log" ||
    fail "kill: the hook did not fire"
grep -q "^checkpoint: saved step 4 to .* in the background" "$work/kill.log" ||
    fail "kill: step 4 was not saved in the background"
latest_is kill step_4.h5
[ ! -e "$work/kill/ck/step_8.h5" ] || fail "kill: step_8.h5 exists"
echo "+ $SHLM ckpt verify $work/kill/ck"
"$SHLM" ckpt verify "$work/kill/ck" >"$work/kill-verify.log" 2>&1 ||
    { cat "$work/kill-verify.log"; fail "kill: step_4.h5 does not verify"; }

# ---- error: a planted write error in the background save of step 8 ----
PRE="env SHLM_TEST_WRITE_ERROR=1:8" STEPS=40 train error --set checkpoint.async=true
[ "$rc" -ne 0 ] || fail "error: the run succeeded despite the planted write error"
errs=$(grep "^shardlm: error:" "$work/error.log")
echo "error: $errs"
[ "$(echo "$errs" | grep -c .)" -eq 1 ] || fail "error: want one error line"
echo "$errs" | grep -q "checkpoint save of step 8 failed.*$work/error/ck/step_8.h5.tmp.*SHLM_TEST_WRITE_ERROR" ||
    fail "error: the line does not name the save of step 8 and its file"
latest_is error step_4.h5
for f in "$work/error/ck/"step_*.h5*; do
    case $f in */step_4.h5) ;; *) fail "error: $f left behind" ;; esac
done
last=$(steps "$work/error/metrics.jsonl" loss | tail -n 1 | cut -d' ' -f1)
# reported at the first step boundary after the writers ended, at the latest by the next
# save (step 12), which waits for them
[ -n "$last" ] && [ "$last" -ge 8 ] && [ "$last" -le 12 ] ||
    fail "error: last logged step '$last', want 8 to 12"

# ---- signal: SIGUSR1 while the save of step 4 is in flight ----
# the save of step 4 takes 2 x runtime.comm_timeout_s = 10 s more, steps about 0.3 s
PRE="env SHLM_TEST_SLOW_SAVE=0:4" STEPS=40 train signal --set checkpoint.async=true \
    --set runtime.comm_timeout_s=5 --set runtime.comm_delay_us=20000 &
bg=$!
wait_step "$work/signal" 1 $bg >/dev/null
lp=$(launcher_pid $bg)
n=$(wait_step "$work/signal" 5 $bg)
if [ -z "$lp" ] || [ "$n" -lt 5 ]; then
    fail "signal: no launcher under $bg, or the run did not reach step 5"
    kill $bg 2>/dev/null
elif grep -q "^checkpoint: saved step 4" "$work/signal.log"; then
    fail "signal: the save of step 4 ended before the signal (no save in flight to test)"
    kill $bg 2>/dev/null
else
    echo "signal: kill -USR1 $lp (launcher) after step $n, the save of step 4 in flight"
    kill -USR1 "$lp"
fi
wait $bg
rc=$?
[ "$rc" -eq 0 ] || { tail -n 20 "$work/signal.log"; fail "signal: exit $rc, want 0"; }
msg=$(grep "^shardlm: caught SIGUSR1 at step" "$work/signal.log")
s=$(echo "$msg" | sed -n 's/.* at step \([0-9]*\): saved .*/\1/p')
echo "signal: $msg"
if [ -z "$s" ] || [ "$s" -le 4 ] || [ "$s" -ge 40 ]; then
    fail "signal: no 'caught SIGUSR1 at step N' after step 4"
else
    grep -q "^checkpoint: saved step 4 to .* in the background" "$work/signal.log" ||
        fail "signal: the save of step 4 did not complete"
    latest_is signal "step_$s.h5"
    "$SHLM" ckpt verify "$work/signal/ck/step_4.h5" >/dev/null 2>&1 ||
        fail "signal: step_4.h5 does not verify"
fi

# ---- fallback: synchronous saves where the host or MPI cannot give the background ----
# fallback MODE PATTERN...: tests/test_ckpt_async MODE on 2 ranks passes and prints every
# PATTERN (a line of rank 0's, whole)
fallback() {
    fb=$1
    shift
    echo "+ sh $mpi 2 $SHLM_BUILDDIR/tests/test_ckpt_async $fb"
    sh "$mpi" 2 "$SHLM_BUILDDIR/tests/test_ckpt_async" "$fb" >"$work/fallback-$fb.log" 2>&1 </dev/null
    fb_rc=$?
    skip_without_launcher $fb_rc
    [ $fb_rc -eq 0 ] || { cat "$work/fallback-$fb.log"; fail "fallback $fb: exit $fb_rc"; return; }
    for p in "$@"; do
        grep -qx -e "$p" "$work/fallback-$fb.log" ||
            { cat "$work/fallback-$fb.log"; fail "fallback $fb: no line '$p'"; return; }
    done
    grep '^checkpoint: ' "$work/fallback-$fb.log" | sed "s/^/fallback $fb: /"
}
sync_line="checkpoint: checkpoint.async = true, but"
fallback memory \
    "$sync_line its staging needs .* per rank, more than the test's bound: saving synchronously" \
    "$sync_line the host refused .* of staging memory on rank 1: saving synchronously" \
    "checkpoint: saved in the background: .* of host staging per rank (.*)"
fallback thread \
    "$sync_line this MPI library gives no MPI_THREAD_MULTIPLE, .*: saving synchronously"

test_end
