#!/bin/sh
# Runs the libFuzzer harnesses one after another (`make fuzz`, and the long runs):
#   sh tests/fuzz/run_all.sh --seconds N --bin DIR --corpus DIR --out OUT NAME...
# Every DIR/fuzz_NAME is copied to OUT/bin/ first (a rebuild cannot change a run under
# way); then each runs for N seconds in libFuzzer's fork mode, so a crash, a timeout or an
# out-of-memory input is kept and the fuzzing goes on:
#   OUT/corpus/NAME/    the inputs it found (the committed seeds, --corpus/NAME, are
#                       read, never written)
#   OUT/crashes/NAME/   crash-*, timeout-*, oom-*, leak-* inputs: replay one with
#                       tests/fuzz/replay_NAME FILE
#   OUT/logs/NAME.log   libFuzzer's output
#   OUT/summary.txt     one line per harness run: name, seconds, executions, findings
# `tests/fuzz/run_all.sh --status OUT` prints the summary so far and the line of the
# harness running now. Exit 1 when a harness left a finding.
set -u
seconds=60 bin=tests/fuzz corpus=tests/fuzz/corpus out=fuzz-out
while [ $# -gt 0 ]; do
    case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --corpus) corpus=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --status)
        cat "$2/summary.txt" 2>/dev/null
        for log in "$2"/logs/*.log; do
            [ -f "$log" ] && ! grep -q "^INFO: exiting" "$log" &&
                echo "running: $(basename "$log" .log): $(grep '^#[0-9]*:' "$log" | tail -n 1)"
        done
        exit 0 ;;
    -*) echo "run_all.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: run_all.sh [--seconds N] [--bin DIR] [--corpus DIR] [--out OUT] NAME..." >&2; exit 2; }
mkdir -p "$out/bin" "$out/logs" || exit 1
for name in "$@"; do
    cp "$bin/fuzz_$name" "$out/bin/" || exit 1
done
found=0
for name in "$@"; do
    mkdir -p "$out/corpus/$name" "$out/crashes/$name"
    log="$out/logs/$name.log"
    leaks=1
    [ "$name" = ckpt ] && leaks=0 # MPI and HDF5 keep allocations for the process's life
    echo "run_all: $name for $seconds s ($(date -u +%FT%TZ)), log $log"
    # -timeout: one input taking 30 s is a hang; -rss_limit_mb: 2 GB is a memory bomb
    # Open MPI's session directories (the ckpt harness is an MPI singleton per job) go to
    # OUT/tmp, emptied after each harness: jobs ended by _Exit or a crash leave theirs
    mkdir -p "$out/tmp"
    OMPI_MCA_orte_tmpdir_base="$out/tmp" TMPDIR="$out/tmp" ASAN_OPTIONS=detect_leaks=$leaks \
        "$out/bin/fuzz_$name" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -detect_leaks=$leaks \
        -close_fd_mask=3 -artifact_prefix="$out/crashes/$name/" \
        "$out/corpus/$name" "$corpus/$name" >"$log" 2>&1
    rm -rf "${out:?}/tmp"
    last=$(grep '^#[0-9]*:' "$log" | tail -n 1)
    execs=$(echo "$last" | sed -n 's/^#\([0-9]*\):.*/\1/p')
    secs=$(echo "$last" | sed -n 's/.* time: \([0-9]*\)s.*/\1/p')
    counts=$(echo "$last" | sed -n 's|.*oom/timeout/crash: \([0-9/]*\).*|\1|p')
    files=$(find "$out/crashes/$name" -type f | wc -l | tr -d ' ')
    line="$name seconds=${secs:-0} execs=${execs:-0} oom/timeout/crash=${counts:-?} finding_files=$files"
    echo "run_all: $line"
    echo "$(date -u +%FT%TZ) $line" >>"$out/summary.txt"
    [ "$files" -eq 0 ] || found=1
done
exit $found
