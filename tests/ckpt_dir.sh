#!/bin/sh
# checkpoint.dir and export directories on hostile or failing file systems:
#  1. a checkpoint path of ~260 characters saves, resumes (loads) and verifies on 2 ranks
#     (Open MPI's sharedfp/lockedfile aborted on it); a checkpoint.dir too long for its
#     files is refused before step 1;
#  2. `ckpt export` that cannot write (the output path is a file; no inode left for the
#     second shard; no space left in the middle of the data) names the file it could not
#     write and errno's reason, never "corrupt" or "checksum";
#  3. a checkpoint.dir that cannot take a checkpoint is refused before step 1 with the
#     real reason: read-only (EROFS), full (ENOSPC), too small for the estimated size,
#     not writable by this user (EACCES; as root, run without the capability that
#     overrides file permissions: setpriv, util-linux);
#  4. two runs on one checkpoint.dir: the second refuses before step 1, naming the
#     holder's host, pid and job hash; a lock left by a killed run does not block;
#  5. a `latest` that is not one line naming step_<N>.h5 ("." and ".." among them), names
#     a missing file, is empty, or is a dangling link: one error line, before step 1,
#     never a fresh start.
# Cases 2 (inode, space) and 3 (read-only, full, small) mount small tmpfs file systems
# (root): where this machine does not allow that they are skipped, and the test with them.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/ckpt_dir.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin ckpt_dir shlm-ckpt-dir
ok() { echo "ckpt_dir: ok: $*"; }
mnt="$work/mnt"
mounted=""
holder=""
cleanup() {
    [ -n "$holder" ] && kill -9 "$holder" 2>/dev/null
    [ -n "$mounted" ] && umount "$mnt" 2>/dev/null
}
trap cleanup EXIT

prepare_corpus "$work/train.bin"

# run NAME CMD...: runs CMD (stdout $work/NAME.out, stderr $work/NAME.err), sets $rc
run() {
    name=$1
    shift
    echo "+ $*"
    "$@" >"$work/$name.out" 2>"$work/$name.err" </dev/null
    rc=$?
}

# train NAME NP DIR [--set ...]: a run of STEPS (default 2) steps with checkpoint.dir=DIR,
# on 1 rank as a plain process, on more under the launcher
train() {
    tn=$1
    np=$2
    d=$3
    shift 3
    set -- train "$job" --set "data.train=$work/train.bin" --set "train.steps=${STEPS:-2}" \
        --set train.warmup_steps=1 --set "checkpoint.dir=$d" --set "log.run_dir=$work/run-$tn" "$@"
    if [ "$np" -eq 1 ]; then
        # shellcheck disable=SC2086 # $as: a command prefix of words, or nothing
        run "$tn" ${as:-} "$SHLM" "$@"
        return
    fi
    run "$tn" sh "$mpi" "$np" "$SHLM" "$@"
    skip_without_launcher "$rc"
}

# refused NAME PATTERN...: the last run exited 1..127 with one error line naming every
# PATTERN and no word of corruption
refused() {
    name=$1
    shift
    why=$(error_line_problem "$work/$name.err" "$@")
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
        why="exit status $rc, expected a refusal"
    elif [ -z "$why" ] && grep -q -i -e corrupt -e checksum "$work/$name.err"; then
        why="the message blames the checkpoint"
    fi
    if [ -n "$why" ]; then
        fail "$name: $why"
        sed 's/^/    /' "$work/$name.err" | head -n 5
        return 1
    fi
    ok "$name refused: $(cat "$work/$name.err")"
}

# early NAME: the last run (a refusal) trained no step
early() {
    if grep -q '^ *1/[0-9]* |' "$work/$1.out"; then fail "$1: refused only after training began"; fi
}

# mount_tmpfs OPTIONS: a fresh tmpfs at $mnt; 1 when this machine does not allow it
mount_tmpfs() {
    [ -n "$mounted" ] && umount "$mnt" 2>/dev/null
    mounted=""
    mkdir -p "$mnt"
    [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o "$1" shlm-ckpt-dir "$mnt" 2>/dev/null || return 1
    mounted=1
}

# ---- 1. a long checkpoint path: save, load, verify on 2 ranks ----
long="$work/$(printf 'a%.0s' $(seq 120))/$(printf 'b%.0s' $(seq 110))"
echo "checkpoint.dir of ${#long} characters"
STEPS=3 train long-save 2 "$long" --set train.stop_after=2
if [ "$rc" -ne 0 ] || [ ! -f "$long/step_2.h5" ]; then
    fail "long-save: saving under a ${#long}-character path failed (status $rc): $(tail -n 3 "$work/long-save.err")"
else
    ok "long-save: saved $long/step_2.h5 on 2 ranks"
fi
STEPS=3 train long-load 2 "$long"
if [ "$rc" -ne 0 ] || ! grep -q "loaded weights and optimizer of $long/step_2.h5" "$work/long-load.out"; then
    fail "long-load: resuming from the ${#long}-character path failed (status $rc): $(tail -n 3 "$work/long-load.err")"
else
    ok "long-load: resumed from it on 2 ranks and saved step 3"
fi
run long-verify sh "$mpi" 2 "$SHLM" ckpt verify "$long"
grep -q "every checksum matches" "$work/long-verify.out" && ok "long-verify: ckpt verify on 2 ranks" ||
    fail "long-verify: $(tail -n 3 "$work/long-verify.err")"
c195=$(printf 'c%.0s' $(seq 195))
toolong="$work/$c195/$c195/$c195/$c195/$c195"
train too-long 1 "$toolong"
refused too-long "checkpoint.dir is" "characters long, at most" && early too-long

# ---- 2. export that cannot write ----
src="$long/step_3.h5"
touch "$work/afile"
run export-file "$SHLM" ckpt export "$src" "$work/afile"
refused export-file "$work/afile" "not a directory"
if mount_tmpfs size=1m,nr_inodes=3; then
    mkdir "$mnt/ex" # inodes: the root, ex, one file: the second shard finds none
    run export-inodes "$SHLM" ckpt export "$src" "$mnt/ex" --shard-size 100000
    refused export-inodes "$mnt/ex/model-00002-of-" "cannot create" "No space left on device"
    mount_tmpfs size=200k
    run export-full "$SHLM" ckpt export "$src" "$mnt/ex"
    refused export-full "$mnt/ex/model.safetensors" "No space left on device"
else
    skip_part "export to a full file system: cannot mount a tmpfs here (not root, or not allowed)"
fi

# ---- 3. checkpoint.dir that cannot take a checkpoint, before step 1 ----
if mount_tmpfs size=8m; then
    mkdir "$mnt/ck"
    mount -o remount,ro "$mnt"
    train ro 1 "$mnt/ck"
    refused ro "$mnt/ck" "Read-only file system" && early ro
    mount_tmpfs size=8m
    mkdir "$mnt/ck"
    dd if=/dev/zero of="$mnt/fill" bs=64k 2>/dev/null
    train full 1 "$mnt/ck"
    refused full "$mnt/ck" "No space left on device" && early full
    mount_tmpfs size=1m
    train small 1 "$mnt/ck"
    refused small "not enough space in $mnt/ck" "the checkpoint needs about" && early small
    umount "$mnt"
    mounted=""
else
    skip_part "read-only, full and small checkpoint.dir: cannot mount a tmpfs here (not root, or not allowed)"
fi
# root writes anywhere while it has CAP_DAC_OVERRIDE: it runs this case without it
as=
[ "$(id -u)" -ne 0 ] || as="setpriv --bounding-set=-dac_override,-dac_read_search --"
if [ -n "$as" ] && ! command -v setpriv >/dev/null 2>&1; then
    skip_part "a directory without write permission (EACCES): running as root, and no setpriv (util-linux)"
else
    mkdir -p "$work/noperm"
    chmod 555 "$work/noperm"
    train noperm 1 "$work/noperm"
    refused noperm "$work/noperm" "Permission denied" && early noperm
fi
as=

# ---- 4. two runs, one checkpoint.dir ----
shared="$work/shared"
echo "+ $SHLM train $job ... --set checkpoint.dir=$shared --set train.steps=100000 &"
"$SHLM" train "$job" --set "data.train=$work/train.bin" --set train.steps=100000 \
    --set "checkpoint.dir=$shared" --set "log.run_dir=$work/run-holder" \
    >"$work/holder.out" 2>"$work/holder.err" </dev/null &
holder=$!
i=0
while [ $i -lt 600 ] && ! grep -q '^ *1/[0-9]* |' "$work/holder.out" && kill -0 "$holder" 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
done
if ! grep -q '^ *1/[0-9]* |' "$work/holder.out"; then
    fail "the holder run did not start training: $(tail -n 3 "$work/holder.err")"
else
    train second 1 "$shared"
    refused second "$shared is in use by another run" "host $(hostname)" "pid $holder" "job " &&
        early second
    kill -9 "$holder"
    wait "$holder" 2>/dev/null
    holder_pid=$holder
    holder=""
    grep -q "pid $holder_pid" "$shared/shardlm.lock" ||
        fail "the killed run's lock file does not name it: $(cat "$shared/shardlm.lock")"
    train after-kill 1 "$shared"
    if [ "$rc" -eq 0 ] && [ -f "$shared/step_2.h5" ]; then
        ok "after-kill: the lock of the killed run (pid $holder_pid) did not block the next run"
    else
        fail "after-kill: the next run failed: $(cat "$work/after-kill.err")"
    fi
fi

# ---- 5. `latest` that does not name a checkpoint ----
ck="$work/latest"
train latest-setup 1 "$ck"
[ "$rc" -eq 0 ] || fail "latest-setup: $(cat "$work/latest-setup.err")"
# latest_case NAME CONTENT: `latest` holds CONTENT (printf format); a resume is refused
latest_case() {
    rm -f "$ck/latest"
    # shellcheck disable=SC2059
    printf "$2" >"$ck/latest"
    train "latest-$1" 1 "$ck"
    refused "latest-$1" "$ck/latest" "$3" && early "latest-$1"
}
latest_case dot '.\n' "got '.'"
latest_case dotdot '..\n' "got '..'"
latest_case slash '../latest/step_2.h5\n' "step_<N>.h5"
latest_case other 'step_2.h5.tmp\n' "step_<N>.h5"
latest_case lines 'step_2.h5\nstep_1.h5\n' "more than one line"
latest_case empty '' "got ''"
latest_case missing 'step_99.h5\n' "$ck/step_99.h5, which cannot be read"
rm -f "$ck/latest"
ln -s "$ck/step_99.h5" "$ck/latest"
train latest-dangling 1 "$ck"
refused latest-dangling "$ck/latest" "symbolic link" && early latest-dangling
rm -f "$ck/latest"
printf '.\n' >"$ck/latest"
run latest-info "$SHLM" ckpt info "$ck"
refused latest-info "$ck/latest" "got '.'"

test_end
