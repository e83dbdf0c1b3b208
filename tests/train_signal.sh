#!/bin/sh
# Stop signals on 2 MPI ranks (src/base/signals.h; what Slurm's --signal and scancel send):
#
#  usr1:   SIGUSR1 to the launcher (mpirun forwards it to every rank) in the middle of a
#          run: exit 0, rank 0 prints "shardlm: caught SIGUSR1 at step N: saved
#          <dir>/step_N.h5, exiting", <dir>/latest names that committed file, and the
#          last logged step is N. A resume (checkpoint.resume = auto) continues to step 40:
#          the loss and gradient-norm strings of all 40 steps (metrics.jsonl, %.9g) and
#          every checksum of the final checkpoint equal an uninterrupted run's.
#  one:    SIGTERM to one rank only: every rank stops after the same step (the flag is
#          combined over ranks at each step's end), exit 0, same checks.
#  double: two SIGUSR1 to the launcher, 0.3 s apart, early in a long step: the second
#          aborts at once (non-zero exit, "second stop signal" on stderr, nothing saved,
#          no further step logged).
#  nodir:  SIGUSR1 without checkpoint.dir: stops after the step with one error line and a
#          non-zero exit (nowhere to save).
#  term2:  two SIGTERM to Open MPI's mpirun, 0.3 s apart: mpirun ends at once on the second
#          without passing it on; the ranks (at full speed, saving every step) must end
#          within 1 s of it, having written no step and no save more than 0.4 s after it
#          ended (Open MPI's own end of orphaned ranks comes a second or more later, after
#          a step and a save), each saying its launcher is gone.
#  eval:   SIGUSR1 to the launcher during a long validation pass: every rank ends the
#          pass at one batch, the step is logged without a validation loss, saved, exit
#          0 within seconds, not after the pass; the resume checks as above.
#  int:    SIGINT (Ctrl-C) to a run without a launcher: saved, exit 0, as SIGUSR1 is.
#  pipe:   a run without a launcher whose stdout is a pipe closed early (`| head -n 1`):
#          it trains to its end and saves, exit 0, one warning on stderr.
#
# The interrupted runs are slowed with runtime.comm_delay_us (every collective takes at
# least that long; timing only, the numbers are the same, which the comparison checks)
# so the signal lands mid-run; the reference and the resumes run at full speed.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/train_signal.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). Each command is printed; the work
# directory is kept when the test fails.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
# a hang fails the test instead of blocking it (mpi_test.sh wraps the launch in timeout)
SHLM_TEST_TIMEOUT=${SHLM_TEST_TIMEOUT:-120}
export SHLM_TEST_TIMEOUT

. "$SHLM_SRCDIR/tests/lib.sh"
skip_unless_launcher
test_begin train_signal shlm-train-signal

prepare_corpus "$work/train.bin"

# the command of run NAME: 2 ranks, its own run and checkpoint directories
cmd() {
    name=$1
    shift
    set -- sh "$mpi" 2 "$SHLM" train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$name" "$@"
    echo "+ $*" >&2
    "$@"
}

# steps FILE KEY: "step value" lines of metrics.jsonl, value as printed (%.9g)
steps() {
    sed -n "s/.*\"step\": \([0-9]*\),.*\"$2\": \([^,}]*\).*/\1 \2/p" "$1"
}

checksums() {
    "$SHLM" ckpt info "$1" | grep ' 0x'
}

# ---- the reference: 40 steps uninterrupted, final checkpoint for its checksums ----
cmd ref --set "checkpoint.dir=$work/ref/ckpt" >"$work/ref.log" 2>&1 </dev/null ||
    { tail -n 20 "$work/ref.log"; fail "the reference run failed"; exit 1; }

slow=--set=runtime.comm_delay_us=20000 # ~0.26 s a step: the signal lands mid-run

# check_stop NAME SIGNAME RC: the stopped run's exit, message, checkpoint, resume
check_stop() {
    name=$1 sig=$2 rc=$3
    log=$work/$name.log
    [ "$rc" -eq 0 ] || { tail -n 20 "$log"; fail "$name: exit $rc after $sig, want 0"; return; }
    msg=$(grep "^shardlm: caught $sig at step" "$log")
    [ -n "$msg" ] || { tail -n 20 "$log"; fail "$name: no 'caught $sig' line"; return; }
    echo "$name: $msg"
    [ "$(echo "$msg" | wc -l)" -eq 1 ] || fail "$name: the message is printed more than once"
    n=$(echo "$msg" | sed -n 's/.* at step \([0-9]*\): saved .*/\1/p')
    [ -n "$n" ] && [ "$n" -lt 40 ] || { fail "$name: stopped at step '$n', want < 40"; return; }
    echo "$msg" | grep -q ": saved $work/$name/ckpt/step_$n.h5, exiting\$" ||
        fail "$name: the message does not name $work/$name/ckpt/step_$n.h5"
    [ -f "$work/$name/ckpt/step_$n.h5" ] || fail "$name: step_$n.h5 missing"
    [ "$(cat "$work/$name/ckpt/latest" 2>/dev/null)" = "step_$n.h5" ] ||
        fail "$name: latest does not name step_$n.h5"
    for t in "$work/$name/ckpt/"*.tmp "$work/$name/ckpt/"*.tmp.*; do
        [ -e "$t" ] && fail "$name: a temporary file is left: $t"
    done
    last=$(steps "$work/$name/metrics.jsonl" loss | tail -n 1 | cut -d' ' -f1)
    [ "$last" = "$n" ] || fail "$name: last logged step $last, stopped at $n"
    # the resume, at full speed, to step 40
    cmd "$name" --set "checkpoint.dir=$work/$name/ckpt" >"$work/$name-resume.log" 2>&1 \
        </dev/null || { tail -n 20 "$work/$name-resume.log"; fail "$name: the resume failed"; return; }
    grep -q "^checkpoint: loaded step $n\|resum.*step_$n.h5\|step_$n.h5" "$work/$name-resume.log" ||
        fail "$name: the resume did not load step_$n.h5"
    for key in loss grad_norm; do
        if ! steps "$work/ref/metrics.jsonl" $key >"$work/ref.$key" ||
            ! steps "$work/$name/metrics.jsonl" $key >"$work/$name.$key" ||
            ! cmp -s "$work/ref.$key" "$work/$name.$key"; then
            diff "$work/ref.$key" "$work/$name.$key" | head -n 6
            fail "$name: $key of steps 1-40 differs from the uninterrupted run"
        fi
    done
    checksums "$work/ref/ckpt" >"$work/ref.sums"
    checksums "$work/$name/ckpt" >"$work/$name.sums"
    if [ ! -s "$work/ref.sums" ] || ! cmp -s "$work/ref.sums" "$work/$name.sums"; then
        diff "$work/ref.sums" "$work/$name.sums" | head -n 6
        fail "$name: the step-40 checkpoint differs from the uninterrupted run's"
    else
        echo "$name: stopped at step $n, resumed: 40 losses and $(wc -l <"$work/ref.sums") checksums equal the uninterrupted run's"
    fi
}

# ---- usr1: SIGUSR1 to the launcher, which forwards it to every rank ----
cmd usr1 --set "checkpoint.dir=$work/usr1/ckpt" $slow >"$work/usr1.log" 2>&1 </dev/null &
bg=$!
wait_step "$work/usr1" 3 $bg >/dev/null
lp=$(launcher_pid $bg)
if [ -z "$lp" ]; then
    fail "usr1: no launcher process found under $bg"
    kill $bg 2>/dev/null
else
    echo "usr1: kill -USR1 $lp (launcher) after step $(lines "$work/usr1")"
    kill -USR1 "$lp"
fi
wait $bg
check_stop usr1 SIGUSR1 $?

# ---- one: SIGTERM to one rank only ----
cmd one --set "checkpoint.dir=$work/one/ckpt" $slow >"$work/one.log" 2>&1 </dev/null &
bg=$!
wait_step "$work/one" 3 $bg >/dev/null
rp=$(rank_pids $bg | tail -n 1)
if [ -z "$rp" ] || [ "$(rank_pids $bg | wc -l)" -ne 2 ]; then
    fail "one: did not find the 2 rank processes under $bg"
    kill $bg 2>/dev/null
else
    echo "one: kill -TERM $rp (one rank of $(rank_pids $bg | tr '\n' ' ')) after step $(lines "$work/one")"
    kill -TERM "$rp"
fi
wait $bg
check_stop one SIGTERM $?

# ---- double: the second signal aborts at once ----
cmd double --set "checkpoint.dir=$work/double/ckpt" --set runtime.comm_delay_us=200000 \
    >"$work/double.log" 2>&1 </dev/null &
bg=$!
wait_step "$work/double" 1 $bg >/dev/null
lp=$(launcher_pid $bg) # first: reading /proc takes seconds on a loaded machine
at=$(wait_step "$work/double" 0 $bg) # just after a step ended: the next takes ~2.5 s
if [ -z "$lp" ]; then
    fail "double: no launcher process found under $bg"
    kill $bg 2>/dev/null
else
    echo "double: kill -USR1 $lp twice, 0.3 s apart, after step $at"
    t0=$(date +%s)
    kill -USR1 "$lp"
    sleep 0.3
    kill -USR1 "$lp"
fi
wait $bg
rc=$?
t1=$(date +%s)
if [ $rc -eq 0 ]; then
    tail -n 20 "$work/double.log"
    fail "double: exit 0 after two signals, want non-zero"
fi
grep -q "second stop signal: aborting without saving" "$work/double.log" ||
    fail "double: no 'second stop signal' line"
grep -q "^shardlm: caught" "$work/double.log" && fail "double: it saved instead of aborting"
ls "$work/double/ckpt/"step_*.h5 >/dev/null 2>&1 && fail "double: a checkpoint was committed"
[ "$(lines "$work/double")" -eq "$at" ] ||
    fail "double: a step was logged after the signals (step $(lines "$work/double"), signals after $at)"
echo "double: exit $rc $((t1 - t0)) s after the first signal, nothing saved"

# proc_state PID: the state letter of PID (R, S, D, Z, ...), empty when it is gone
proc_state() {
    sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null
}

# mtime FILE: its modification time, seconds since the epoch with the fraction
mtime() { stat -c %.9Y "$1" 2>/dev/null || echo 0; }

# ---- term2: mpirun's own abort, forced by a second SIGTERM: the ranks end, no more saves ----
# shellcheck disable=SC2086 # MPIRUN may carry options: split it on purpose
if ${MPIRUN:-mpirun} --version 2>&1 | grep -q 'Open MPI'; then
    # each rank's output in a file of its own (as a site's wrapper may do), not through
    # mpirun's pipe, which ends with mpirun: what the ranks say after it is kept
    set -- sh "$mpi" 2 sh -c 'exec "$@" >"$0.$OMPI_COMM_WORLD_RANK.log" 2>&1' "$work/term2" \
        "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/term2" \
        --set "checkpoint.dir=$work/term2/ckpt" --set checkpoint.every=1 --set checkpoint.keep=3 \
        --set train.steps=100000
    echo "+ $*"
    "$@" >"$work/term2.log" 2>&1 </dev/null &
    bg=$!
    wait_step "$work/term2" 3 $bg >/dev/null
    lp=$(launcher_pid $bg)
    ranks=$(rank_pids $bg | tr '\n' ' ')
    if [ -z "$lp" ] || [ "$(echo $ranks | wc -w)" -ne 2 ]; then
        fail "term2: did not find mpirun and 2 ranks under $bg"
        kill $bg 2>/dev/null
        wait $bg
    else
        echo "term2: kill -TERM $lp (mpirun) twice, 0.3 s apart, after step $(lines "$work/term2"); ranks $ranks"
        kill -TERM "$lp"
        sleep 0.3
        kill -TERM "$lp"
        wait $bg
        t_return=$(date +%s.%N)
        i=0 alive=$ranks
        while [ -n "$alive" ] && [ $i -lt 50 ]; do # 5 s at most
            alive=""
            for p in $ranks; do
                st=$(proc_state "$p")
                [ -n "$st" ] && [ "$st" != Z ] && alive="$alive $p"
            done
            [ -n "$alive" ] && sleep 0.1
            i=$((i + 1))
        done
        t_gone=$(date +%s.%N)
        # the newest write of a step (metrics.jsonl) or a save (a checkpoint, its temporary
        # file, latest)
        newest=0 newest_file=""
        for f in "$work/term2/metrics.jsonl" "$work/term2/ckpt/"step_* "$work/term2/ckpt/latest"; do
            t=$(mtime "$f")
            if awk -v a="$t" -v b="$newest" 'BEGIN { exit !(a > b) }'; then newest=$t newest_file=$f; fi
        done
        echo "term2: mpirun returned at $t_return; ranks ended by $t_gone${alive:+ (still running:$alive)}; newest write $newest (${newest_file##*/}); latest: $(cat "$work/term2/ckpt/latest" 2>/dev/null)"
        [ -z "$alive" ] || fail "term2: ranks$alive still running 5 s after mpirun returned"
        awk -v a="$t_return" -v b="$t_gone" 'BEGIN { exit !(b - a < 1) }' ||
            fail "term2: the ranks ran on for 1 s or more after mpirun returned"
        # a save whose commit was under way may end within the launcher watch's 50 ms (and
        # the time a loaded machine takes to run it)
        awk -v a="$t_return" -v l="$newest" 'BEGIN { exit !(l < a + 0.4) }' ||
            fail "term2: ${newest_file##*/} written $(echo "$newest $t_return" | awk '{ printf "%.2f", $1 - $2 }') s after mpirun returned: a step or a save after the second signal"
        for r in 0 1; do
            grep "launcher that started this rank .* is gone: aborting without saving" \
                "$work/term2.$r.log" || fail "term2: rank $r did not say its launcher is gone"
        done
        for p in $alive; do kill -KILL "$p" 2>/dev/null; done
    fi
else
    echo "term2: SKIP: the launcher is not Open MPI's mpirun (its abort on a second signal is what this checks)"
fi

# ---- eval: a stop signal during a long validation pass ends it at a batch ----
# validation after step 10 of 80 batches of ~0.1 s each (the collectives slowed)
cmd eval --set "checkpoint.dir=$work/eval/ckpt" $slow --set "data.val=$work/train.bin" \
    --set train.eval_every=10 --set train.eval_batches=40 >"$work/eval.log" 2>&1 </dev/null &
bg=$!
wait_step "$work/eval" 1 $bg >/dev/null
lp=$(launcher_pid $bg)
wait_step "$work/eval" 9 $bg >/dev/null
sleep 1.5 # step 10 (~0.3 s) is trained, its validation (~8 s) under way
t0=$(date +%s)
[ -n "$lp" ] && kill -USR1 "$lp"
echo "eval: kill -USR1 $lp during the validation after step 10"
wait $bg
rc=$?
took=$(($(date +%s) - t0))
check_stop eval SIGUSR1 $rc
grep -q "^shardlm: caught SIGUSR1 at step 10:" "$work/eval.log" ||
    fail "eval: not stopped at step 10, whose validation the signal interrupted: $(grep '^shardlm: caught' "$work/eval.log")"
grep "^validation after step 10 stopped by SIGUSR1" "$work/eval.log" ||
    fail "eval: no 'validation after step 10 stopped by SIGUSR1' line"
sed -n '/"step": 10,/p' "$work/eval/metrics.jsonl" | head -n 1 | grep -q '"val_loss"' &&
    fail "eval: step 10 is logged with a validation loss from a pass cut short"
[ $took -le 4 ] || fail "eval: exit $took s after the signal (want 4 s at most: the pass takes ~8 s)"
echo "eval: exit $took s after the signal"

# ---- int: Ctrl-C (SIGINT) to a run without a launcher stops and saves ----
# A terminal's Ctrl-C finds SIGINT at its default action, where a script's background job
# inherits it ignored: restored with coreutils' env where it can
dflt=""
env --default-signal=INT true 2>/dev/null && dflt="env --default-signal=INT"
set -- "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/int" \
    --set "checkpoint.dir=$work/int/ckpt" --set train.steps=100000
echo "+ $dflt $*"
$dflt "$@" >"$work/int.log" 2>&1 </dev/null &
bg=$!
wait_step "$work/int" 5 $bg >/dev/null
kill -INT $bg
i=0
while [ -n "$(proc_state $bg)" ] && [ "$(proc_state $bg)" != Z ] && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
kill -KILL $bg 2>/dev/null # still running 30 s after SIGINT: the failure below says so
wait $bg
rc=$?
msg=$(grep "^shardlm: caught SIGINT at step" "$work/int.log")
n=$(echo "$msg" | sed -n 's/.* at step \([0-9]*\): saved .*/\1/p')
if [ $rc -ne 0 ] || [ -z "$n" ]; then
    tail -n 5 "$work/int.log"
    fail "int: exit $rc after SIGINT, want 0 and 'caught SIGINT at step N: saved ...'"
else
    [ "$(cat "$work/int/ckpt/latest" 2>/dev/null)" = "step_$n.h5" ] ||
        fail "int: latest does not name step_$n.h5"
    "$SHLM" ckpt verify "$work/int/ckpt" >"$work/int.verify" 2>&1 ||
        { cat "$work/int.verify"; fail "int: ckpt verify of the saved checkpoint failed"; }
    echo "int: $msg"
fi

# ---- pipe: a closed stdout does not end the run ----
echo "+ $SHLM train $job ... --set train.steps=20 | head -n 1"
{
    "$SHLM" train "$job" --set "data.train=$work/train.bin" --set "log.run_dir=$work/pipe" \
        --set "checkpoint.dir=$work/pipe/ckpt" --set train.steps=20 2>"$work/pipe.err" </dev/null
    echo $? >"$work/pipe.rc"
} | head -n 1 >/dev/null
rc=$(cat "$work/pipe.rc")
[ "$rc" = 0 ] || { cat "$work/pipe.err"; fail "pipe: exit $rc with stdout closed, want 0"; }
[ "$(cat "$work/pipe/ckpt/latest" 2>/dev/null)" = step_20.h5 ] ||
    fail "pipe: the run did not save its last step (latest: $(cat "$work/pipe/ckpt/latest" 2>/dev/null))"
[ "$(grep -c "standard output cannot be written" "$work/pipe.err")" = 1 ] ||
    { cat "$work/pipe.err"; fail "pipe: not one warning that stdout cannot be written"; }
echo "pipe: exit $rc, latest $(cat "$work/pipe/ckpt/latest" 2>/dev/null); $(grep "standard output" "$work/pipe.err")"

# ---- nodir: nowhere to save: stop cleanly, say so, exit non-zero ----
cmd nodir $slow >"$work/nodir.log" 2>&1 </dev/null &
bg=$!
wait_step "$work/nodir" 3 $bg >/dev/null
lp=$(launcher_pid $bg)
[ -n "$lp" ] && kill -USR1 "$lp"
wait $bg
rc=$?
[ $rc -ne 0 ] || fail "nodir: exit 0 without a checkpoint.dir, want non-zero"
grep "checkpoint.dir is not set: nothing saved" "$work/nodir.log" ||
    { tail -n 20 "$work/nodir.log"; fail "nodir: no 'checkpoint.dir is not set' line"; }
grep -q "second stop signal\|exited on signal" "$work/nodir.log" && fail "nodir: aborted instead of stopping"

echo "train_signal: $(($(date +%s) - t_start)) s"
if [ $fails -ne 0 ]; then
    echo "train_signal: $fails failure(s); work directory kept: $work"
    exit 1
fi
rm -rf "$work"
echo "train_signal: OK"
exit 0
