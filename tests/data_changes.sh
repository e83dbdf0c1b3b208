#!/bin/sh
# A token file that changes under a running job (io/tokens.h token_file_check): 2 MPI
# ranks train on a copy of the corpus, and after a few logged steps the test
#
#  truncate: truncates the file to 64 bytes (a mapped file would raise SIGBUS here),
#  replace:  replaces it with another file by rename (the old inode stays readable),
#  rewrite:  overwrites its tokens in place, same size, new modification time,
#
# and each run must end within a step or two with exactly one line "shardlm: error:
# FILE: the token file ..." saying what changed, a non-zero exit status below 128, no
# crash report (SIGBUS, MPI_ABORT) and no further logged step beyond the one that read
# the changed file. The runs are slowed with runtime.comm_delay_us so the change lands
# mid-run.
#
# Run by `make check` (env SHLM, SHLM_SRCDIR, MPIRUN), or by hand from a build directory:
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/data_changes.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
job="$SHLM_SRCDIR/tests/jobs/ckpt.ini"
SHLM_TEST_TIMEOUT=${SHLM_TEST_TIMEOUT:-60}
export SHLM_TEST_TIMEOUT

. "$SHLM_SRCDIR/tests/lib.sh"
skip_unless_launcher
test_begin data_changes shlm-data-changes

prepare_corpus "$work/corpus.bin"

# change_during_run NAME PROBLEM ACTION...: trains on $work/NAME.bin (a copy of the
# corpus), runs ACTION once two steps are logged, then checks the run's end
change_during_run() {
    name=$1 problem=$2
    shift 2
    data=$work/$name.bin
    cp "$work/corpus.bin" "$data"
    set -- "$@" "$data"
    echo "+ sh $mpi 2 $SHLM train $job --set data.train=$data --set log.run_dir=$work/$name" \
        "--set runtime.comm_delay_us=20000   (then, after step 2: $*)"
    sh "$mpi" 2 "$SHLM" train "$job" --set "data.train=$data" --set "log.run_dir=$work/$name" \
        --set runtime.comm_delay_us=20000 >"$work/$name.out" 2>"$work/$name.err" </dev/null &
    bg=$!
    wait_step "$work/$name" 2 $bg >/dev/null
    "$@"
    at=$(lines "$work/$name") # the steps logged once the change is made (a loaded machine
    # may log more between wait_step and the change: those are not "after" it)
    t0=$(date +%s)
    wait $bg
    rc=$?
    secs=$(($(date +%s) - t0))
    last=$(lines "$work/$name")
    n=$(grep -c '^shardlm: error: ' "$work/$name.err")
    line=$(grep '^shardlm: error: ' "$work/$name.err")
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then
        fail "$name: exit status $rc, want 1..123 (124: timed out)"
    elif grep -q -i -e 'bus error' -e SIGBUS -e 'signal [0-9]' -e 'core dumped' -e MPI_ABORT \
        "$work/$name.err" "$work/$name.out"; then
        fail "$name: crash report: $(grep -i -h -m1 -e 'bus error' -e SIGBUS -e 'signal [0-9]' \
            -e 'core dumped' -e MPI_ABORT "$work/$name.err" "$work/$name.out")"
    elif [ "$n" -ne 1 ]; then
        fail "$name: $n 'shardlm: error:' lines, want 1"
    elif ! printf '%s\n' "$line" | grep -q -F -e "$data: the token file $problem"; then
        fail "$name: the error line does not say '$data: the token file $problem'"
    elif [ "$last" -gt $((at + 2)) ]; then
        fail "$name: steps went on after the change (changed after step $at, last logged $last)"
    else
        echo "$name: changed after step $at, exit $rc ${secs} s later, last logged step $last:"
        echo "    $line"
        return
    fi
    sed 's/^/    stderr: /' "$work/$name.err"
}

change_during_run truncate "changed size" truncate -s 64
change_during_run replace "was replaced" sh -c 'cp "$1" "$1.new" && mv "$1.new" "$1"' sh
change_during_run rewrite "was modified" \
    sh -c 'dd if=/dev/zero of="$1" bs=1 seek=32 count=4096 conv=notrunc 2>/dev/null &&
           touch -d "2001-01-01" "$1"' sh

echo "data_changes: $(($(date +%s) - t_start)) s"
if [ $fails -ne 0 ]; then
    echo "data_changes: $fails failure(s); work directory kept: $work"
    exit 1
fi
rm -rf "$work"
