#!/bin/sh
# Replays every committed fuzz corpus (tests/fuzz/corpus/NAME/) through its harness,
# built with AddressSanitizer and UndefinedBehaviorSanitizer (tests/fuzz/replay_NAME):
# the inputs that found bugs stay fixed, and the seeds keep working. A corpus without a
# harness fails; a sanitizer report or a breached error contract fails. Skipped (77),
# with configure's reason, where clang cannot build the harnesses.
#   env SHLM_BUILDDIR=. SHLM_SRCDIR=. FUZZ_REPLAY=yes sh tests/fuzz_replay.sh
set -u
: "${SHLM_SRCDIR:?}" "${SHLM_BUILDDIR:?}"
. "$SHLM_SRCDIR/tests/lib.sh"
[ "${FUZZ_REPLAY:-no}" = yes ] ||
    skip_test "${FUZZ_WHY:-configure found no clang for the fuzz harnesses}"
fails=0
for dir in "$SHLM_SRCDIR"/tests/fuzz/corpus/*/; do
    name=$(basename "$dir")
    bin="$SHLM_BUILDDIR/tests/fuzz/replay_$name"
    if [ ! -x "$bin" ]; then
        echo "fuzz_replay: FAIL: $dir has no harness ($bin)"
        fails=$((fails + 1))
        continue
    fi
    # leaks are findings too, except where MPI and HDF5 keep their own for the process
    leaks=1
    [ "$name" = ckpt ] && leaks=0
    echo "+ ASAN_OPTIONS=detect_leaks=$leaks:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 $bin $dir"
    if ASAN_OPTIONS=detect_leaks=$leaks:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$bin" "$dir" >"$SHLM_BUILDDIR/tests/fuzz/replay_$name.out" 2>&1; then
        tail -n 1 "$SHLM_BUILDDIR/tests/fuzz/replay_$name.out"
    else
        tail -n 30 "$SHLM_BUILDDIR/tests/fuzz/replay_$name.out"
        echo "fuzz_replay: FAIL: $name (the whole output: $SHLM_BUILDDIR/tests/fuzz/replay_$name.out)"
        fails=$((fails + 1))
    fi
done
[ $fails -eq 0 ]
