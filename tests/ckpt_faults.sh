#!/bin/sh
# Checkpoint faults, on the CPU backend with 2 ranks:
#  1. a rank killed (SIGKILL) in the middle of a save (test hook SHLM_TEST_KILL_IN_SAVE)
#     leaves `latest` on the previous checkpoint; resuming from it reproduces the
#     uninterrupted run bit for bit; with synchronous saves (checkpoint.async=false), then
#     with the save in the background (the rank's writer killed, its whole process with it);
#  2. a flipped byte in a tensor is reported on load naming the dataset, non-zero exit
#     (resume on 2 ranks, resume on 4 ranks for an optimizer dataset, `ckpt verify`,
#     `generate`);
#  3. a checkpoint of another model shape is refused with a message naming the key;
#  4. a full disk during a save fails it cleanly and leaves the earlier checkpoint and
#     `latest` intact: (a) a file-size limit (ulimit -f) caught by the space check at
#     start-up, before the first step; (b) the same limit with the check off, failing inside HDF5
#     (the job ends with the message); (c) a real full file system (a small tmpfs, when
#     this machine lets us mount one; skipped otherwise, and the test with it) with the
#     check off, failing in the middle of the data. After each, the earlier checkpoint
#     verifies and resumes.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/ckpt_faults.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"

. "$SHLM_SRCDIR/tests/lib.sh"
test_begin ckpt_faults shlm-ckpt-faults
ok() { echo "ckpt_faults: ok: $*"; }
mnt=""
cleanup() { [ -n "$mnt" ] && umount "$mnt" 2>/dev/null; }
trap cleanup EXIT

prepare_corpus "$work/train.bin"

# train NAME NP [--set ...]: runs the job (log $work/NAME.log); returns its status.
# PRE (a command prefix, e.g. env VAR=1) and PROG (the program: shardlm, or a shell
# that limits it first) may be set by the caller.
train() {
    name=$1
    np=$2
    shift 2
    echo "+ ${PRE:-} sh $mpi $np ${PROG:-$SHLM} train $job --set data.train=$work/train.bin" \
        "--set log.run_dir=$work/$name ${SETS:-} $*"
    # shellcheck disable=SC2086 # PRE, PROG and SETS are words
    ${PRE:-} sh "$mpi" "$np" ${PROG:-"$SHLM"} train "$job" --set "data.train=$work/train.bin" \
        --set "log.run_dir=$work/$name" ${SETS:-} "$@" >"$work/$name.log" 2>&1 </dev/null
    rc=$?
    skip_without_launcher $rc
    return $rc
}

# expect_fail NAME PATTERN...: the run NAME failed and its log has every pattern
expect_fail() {
    name=$1
    shift
    if [ "$rc" -eq 0 ]; then
        fail "$name succeeded, but should have failed"
        return 1
    fi
    for p in "$@"; do
        if ! grep -q -e "$p" "$work/$name.log"; then
            grep -i error "$work/$name.log" | head -n 5
            fail "$name: the output lacks '$p'"
            return 1
        fi
    done
    return 0
}

# losses FILE FIRST LAST: "step loss" lines as printed in metrics.jsonl
losses() {
    sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" |
        awk -v a="$2" -v b="$3" '$1 >= a && $1 <= b'
}

# flip FILE DATASET: flips one bit of a byte in the middle of DATASET's data in FILE
flip() {
    off=$(h5dump -p -H -d "$2" "$1" | sed -n 's/.*OFFSET \([0-9]*\).*/\1/p' | head -n 1)
    size=$(h5dump -p -H -d "$2" "$1" | sed -n 's/.*SIZE \([0-9]*\).*/\1/p' | head -n 1)
    if [ -z "$off" ] || [ -z "$size" ]; then
        fail "cannot find the data of $2 in $1 (h5dump -p)"
        return 1
    fi
    at=$((off + size / 2 + 1))
    b=$(od -An -tu1 -j "$at" -N1 "$1" | tr -d ' ')
    nb=$((b ^ 16))
    # shellcheck disable=SC2059
    printf "\\$(printf %03o "$nb")" | dd of="$1" bs=1 seek="$at" conv=notrunc 2>/dev/null
    echo "flipped byte $at of $1 ($2 at $off, $size bytes): $b -> $nb"
}

# intact DIR WHAT: DIR's `latest` still names step_10.h5, no step_20 file exists, and
# step_10.h5 verifies
intact() {
    l=$(cat "$1/latest" 2>/dev/null)
    [ "$l" = step_10.h5 ] || fail "$2: latest is '$l', not step_10.h5"
    for f in "$1"/step_20.h5*; do
        [ -e "$f" ] && fail "$2: $f was left behind"
    done
    "$SHLM" ckpt verify "$1/step_10.h5" >"$work/verify.log" 2>&1 ||
        { cat "$work/verify.log"; fail "$2: step_10.h5 does not verify"; }
}

# ---- the reference: 40 steps straight ----
train ref 2 || fail "reference run failed"
losses "$work/ref/metrics.jsonl" 11 40 >"$work/ref.loss"

# ---- 1. SIGKILL of rank 1 halfway through the save of step 20 ----
# killed NAME ASYNC: the case with checkpoint.async=ASYNC, in $work/NAME, resumed in
# $work/NAME-resume
killed() {
    k=$1
    PRE="env SHLM_TEST_KILL_IN_SAVE=1:20" train "$k" 2 --set "checkpoint.dir=$work/$k/ck" \
        --set checkpoint.every=10 --set "checkpoint.async=$2"
    # the temporary file has an unpredictable name: step_20.h5.tmp.<16 hex digits>
    left=$(cd "$work/$k/ck" && ls step_20.h5.tmp.* 2>/dev/null)
    expect_fail "$k" "rank 1 raises SIGKILL after" &&
        [ "$(cat "$work/$k/ck/latest")" = step_10.h5 ] && [ ! -e "$work/$k/ck/step_20.h5" ] &&
        [ -n "$left" ] &&
        ok "$k: killed mid-save: latest names step_10.h5, step_20.h5 never appeared (its $left did)" ||
        fail "$k: killed mid-save: latest='$(cat "$work/$k/ck/latest" 2>/dev/null)'; $(ls "$work/$k/ck")"
    train "$k-resume" 2 --set "checkpoint.dir=$work/$k/ck" --set checkpoint.every=10 \
        --set "checkpoint.async=$2" || fail "$k: resume after the kill failed"
    grep -q "loaded weights and optimizer of $work/$k/ck/step_10.h5" "$work/$k-resume.log" ||
        fail "$k: the resumed run did not load step_10.h5"
    [ -n "$left" ] && grep -q "removed $work/$k/ck/$left (left by a failed save)" "$work/$k-resume.log" &&
        [ ! -e "$work/$k/ck/$left" ] && ok "$k: the resumed run's first save removed $left" ||
        fail "$k: the killed save's temporary file was not removed: $(ls "$work/$k/ck")"
    losses "$work/$k-resume/metrics.jsonl" 11 40 >"$work/$k-resume.loss"
    if [ "$(wc -l <"$work/ref.loss")" -eq 30 ] && cmp -s "$work/ref.loss" "$work/$k-resume.loss"; then
        ok "$k: resumed from step_10.h5: losses of steps 11-40 identical to the uninterrupted run"
    else
        fail "$k: losses after resuming from the killed save differ from the reference"
    fi
    [ "$(cat "$work/$k/ck/latest")" = step_40.h5 ] || fail "$k: latest after the resumed run"
}
killed kill false
killed kill_async true
grep -q "^checkpoint: saved step 10 to .* in the background" "$work/kill_async.log" ||
    fail "kill_async: step 10 was not saved in the background"

# ---- 2. flipped bytes ----
mkdir -p "$work/flip"
cp "$work/kill/ck/step_10.h5" "$work/flip/w.h5"
cp "$work/kill/ck/step_10.h5" "$work/flip/m.h5"
wds=/model/model.layers.0.self_attn.q_proj.weight
mds=/optim/exp_avg_sq/model.layers.1.mlp.down_proj.weight
flip "$work/flip/w.h5" "$wds"
flip "$work/flip/m.h5" "$mds"
train flipw 2 --set "checkpoint.resume=$work/flip/w.h5"
expect_fail flipw "dataset $wds is corrupt" && ok "flipped byte in $wds: resume on 2 ranks refused, naming it"
train flipm 4 --set "checkpoint.resume=$work/flip/m.h5"
expect_fail flipm "dataset $mds is corrupt" && ok "flipped byte in $mds: resume on 4 ranks refused, naming it"
echo "+ $SHLM ckpt verify $work/flip/w.h5"
"$SHLM" ckpt verify "$work/flip/w.h5" >"$work/flipv.log" 2>&1
rc=$?
expect_fail flipv "dataset $wds is corrupt" && ok "ckpt verify names $wds, exit $rc"
echo "+ sh $mpi 2 $SHLM generate $job --ckpt $work/flip/w.h5 --prompt ROMEO: --tokens 4"
sh "$mpi" 2 "$SHLM" generate "$job" --ckpt "$work/flip/w.h5" --prompt ROMEO: --tokens 4 \
    --set "data.train=$work/train.bin" >"$work/flipg.log" 2>&1 </dev/null
rc=$?
expect_fail flipg "dataset $wds is corrupt" && ok "generate refuses the corrupt weights"

# ---- 3. another model shape ----
train shape 2 --set "checkpoint.resume=$work/kill/ck/step_10.h5" --set model.n_layers=3
expect_fail shape "holds a different model: \[model\] n_layers = 2 there, 3 in this job" &&
    ok "a 3-layer job refuses the 2-layer checkpoint"
train shape2 2 --set "checkpoint.resume=$work/kill/ck/step_10.h5" --set model.dim=32 \
    --set model.ffn_dim=96
expect_fail shape2 "\[model\] dim = 64 there, 32 in this job" && ok "a dim-32 job refuses it"

# ---- 4. full disk ----
# a first save, then a run that resumes from it and must fail to save step 20
setup_disk() { # DIR NAME: a step-10 checkpoint in DIR
    train "$2" 2 --set "checkpoint.dir=$1" --set train.stop_after=10 ||
        fail "$2: the first save failed: $(grep error "$work/$2.log")"
}
# a per-process file-size limit, set inside each rank (mpirun itself must not get it:
# its PMIx store files would hit it and it would hang); Open MPI's shared-memory
# transport sizes its files at start-up too, so the ranks talk over TCP instead
limit="$work/limit.sh"
printf '#!/bin/sh\nulimit -f 1536\nexec "$@"\n' >"$limit"
d="$work/fsize/ck"
setup_disk "$d" fsize0
PRE="env OMPI_MCA_btl=self,tcp" PROG="sh $limit $SHLM" train fsize 2 --set "checkpoint.dir=$d" \
    --set train.stop_after=20
expect_fail fsize "the checkpoint needs about" "ulimit -f" &&
    ! grep -q "^ *11/[0-9]* |" "$work/fsize.log" &&
    ok "file-size limit: refused at start-up, before step 11 (the start-up space check)" ||
    fail "file-size limit: not refused before the first step"
intact "$d" "file-size limit"
PRE="env OMPI_MCA_btl=self,tcp SHLM_TEST_NO_SPACE_CHECK=1" PROG="sh $limit $SHLM" \
    train fsize2 2 --set "checkpoint.dir=$d" --set train.stop_after=20
expect_fail fsize2 "checkpoint save of step 20 failed" "File too large" &&
    ok "file-size limit, no space check: HDF5 failed with EFBIG, the job ended with the message"
intact "$d" "file-size limit inside HDF5"
train fsize3 2 --set "checkpoint.dir=$d" --set train.stop_after=12 &&
    grep -q "loaded weights and optimizer of $d/step_10.h5" "$work/fsize3.log" &&
    ok "resumed from step_10.h5 after both failures" || fail "resume after the failed saves"

mnt="$work/mnt"
mkdir -p "$mnt"
# 1800 KiB: the first checkpoint takes ~1.1 MB of it (the rest of its 2.2 MB is sparse)
# both data paths: direct I/O (the default; tmpfs takes O_DIRECT since Linux 6.6, older
# kernels fall back to MPI-IO by themselves) and H5Dwrite through MPI-IO
if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=1800k shlm-ckpt-test "$mnt" 2>/dev/null; then
    for direct in 1 0; do
        rm -rf "$mnt/ck"
        d="$mnt/ck"
        e="env SHLM_TEST_NO_SPACE_CHECK=1"
        SETS="--set checkpoint.direct_io=$direct"
        PRE=$e setup_disk "$d" "full0-$direct"
        PRE=$e train "full-$direct" 2 --set "checkpoint.dir=$d" --set train.stop_after=20
        if grep -q "direct I/O" "$work/full0-$direct.log"; then
            why="No space left on device"
        else
            why="H5Dwrite failed"
        fi
        expect_fail "full-$direct" "checkpoint save of step 20 failed" "$why" &&
            ok "full file system ($(sed -n 's/.*ranks, \(.*\))$/\1/p' "$work/full0-$direct.log")):" \
                "the save of step 20 failed in the middle of the data, cleanly ($why)"
        grep -q "MPI_ABORT" "$work/full-$direct.log" && fail "full file system: the job aborted"
        intact "$d" "full file system"
        PRE=$e train "full2-$direct" 2 --set "checkpoint.resume=$d" --set train.stop_after=12 &&
            grep -q "loaded weights and optimizer of $d/step_10.h5" "$work/full2-$direct.log" &&
            ok "resumed from step_10.h5 on the full file system" || fail "resume from the full disk"
    done
    SETS=""
    umount "$mnt"
    mnt=""
else
    mnt=""
    skip_part "the real full file system (4c): cannot mount a tmpfs here (not root, or not allowed)"
fi

test_end
