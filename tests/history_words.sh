#!/bin/sh
# Source and docs say what the code does and why, not how it came to be: no development
# history (numbered sessions, lettered calls, notes on what has not run, ran for the first
# time or was written with no GPU at hand: $pattern below) in the checked paths. Fails naming each matching line; lines elsewhere in the tree are
# listed as a note (CHECKED grows as parts are cleaned). By hand:
#   SHLM_SRCDIR=SRC sh SRC/tests/history_words.sh
set -u
cd "$SHLM_SRCDIR" || exit 99
# the patterns, with a bracketed space so that this file does not match itself
pattern='session [0-9]|call [A-Z]\b|not[ ]yet run|without[ ]a gpu|first[ ]run'
OWN_TESTS="tests/history_words.sh tests/anchor_cpu.sh tests/gpu_suite_cpu.sh tests/results_files.sh"
CHECKED="benchmarks docs $OWN_TESTS"
ELSEWHERE="src kernels io tests slurm examples jobs/*.ini README.md Makefile.am configure.ac setup.sh"

printf '+ grep -rniIE %s %s\n' "'$pattern'" "$CHECKED"
# shellcheck disable=SC2086 # the path lists are words
hits=$(grep -rniIE "$pattern" $CHECKED 2>/dev/null)
# shellcheck disable=SC2086
others=$(grep -rniIE "$pattern" $ELSEWHERE 2>/dev/null | grep -v -F "$(printf '%s:\n' $OWN_TESTS)")
if [ -n "$others" ]; then
    echo "history_words: note: outside the checked paths ($(printf '%s\n' "$others" | wc -l) lines):"
    printf '%s\n' "$others" | sed 's/^/  /'
fi
if [ -n "$hits" ]; then
    printf '%s\n' "$hits" | sed 's/^/history_words: FAIL: /'
    exit 1
fi
echo "history_words: PASS (no development history in $CHECKED)"
