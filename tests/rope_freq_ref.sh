#!/bin/sh
# RoPE's frequencies (kernels/rope_freq.h) against transformers': tests/rope_freq_ref.py
# prints transformers' fp32 inverse frequencies for Llama-3.1/3.2's llama3 scaling, smaller
# llama3 cases that put pairs in every band, linear and default (ROPE_INIT_FUNCTIONS, the
# rotary embedding's own for default); tests/test_rope_freq --ref compares each with ours
# within transformers' fp32 rounding (the tolerance and its reason are in test_rope_freq.c).
# Needs the Python environment of tests/pyenv.sh (skips, 77, without it).
# Reproduce: make check TESTS=tests/rope_freq_ref.sh
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
test_begin rope_freq_ref ropefreq
if ! shlm_python torch transformers >"$work/why"; then
    skip_test "$(cat "$work/why")"
fi
if ! $SHLM_PY "$SHLM_SRCDIR/tests/rope_freq_ref.py" >"$work/ref.txt" 2>"$work/err"; then
    fail "tests/rope_freq_ref.py failed: $(tail -n 3 "$work/err")"
    test_end
fi
echo "$test_name: $(wc -l <"$work/ref.txt") cases from transformers"
"$SHLM_BUILDDIR/tests/test_rope_freq" --ref "$work/ref.txt" || fail "frequencies differ"
test_end
