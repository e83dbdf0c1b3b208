#!/bin/sh
# Source and docs say what the code does and why, not how it came to be: no development
# history (numbered sessions, lettered calls, notes on what has not run, ran for the first
# time, was written with no GPU at hand or is not measured yet; the issue or its finding a
# change answered: $pattern below) in the checked paths (the whole tree but this file, the
# corpus and the published chat templates copied into tests/data, which are the models'
# text, not ours). Fails naming each matching line. By hand:
#   SHLM_SRCDIR=SRC sh SRC/tests/history_words.sh
set -u
cd "$SHLM_SRCDIR" || exit 99
# the patterns, with a bracketed space so that this file does not match itself
pattern='session [0-9]|call [A-Z]\b|not[ ]yet run|without[ ]a gpu|first[ ]run|not[ ]yet measured|measured[ ]yet|issues?[ ]#?[0-9]|issue[ ]"|\(#[0-9]+\)|defect[ ][0-9]'
CHECKED="src kernels io benchmarks docs tests slurm examples jobs/*.ini README.md Makefile.am configure.ac setup.sh .ci"

printf '+ grep -rniIE %s %s\n' "'$pattern'" "$CHECKED"
# shellcheck disable=SC2086 # the path lists are words
hits=$(grep -rniIE "$pattern" $CHECKED 2>/dev/null |
    grep -v -e "^tests/history_words.sh:" -e "^tests/data/[a-z0-9]*_chat_template.jinja:")
if [ -n "$hits" ]; then
    printf '%s\n' "$hits" | sed 's/^/history_words: FAIL: /'
    exit 1
fi
echo "history_words: PASS (no development history in $CHECKED)"
