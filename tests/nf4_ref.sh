#!/bin/sh
# NF4 against bitsandbytes: kernels/nf4.c's packed codes, absmaxes and double-quant statistics,
# and the cpu backend's nf4_dequantize, bit for bit against bitsandbytes 0.50.2's
# quantize_4bit and dequantize_4bit on the CPU, for the tensors tests/nf4_ref.py lists (fp32
# and bf16, plain and double quant), through tests/nf4_dump. torch runs on one thread with its
# AVX2 kernels, whose results kernels/nf4.c follows. Needs torch (tests/pyenv.sh)
# and bitsandbytes in $SHLM_BITSANDBYTES (both from tests/setup_pyenv.sh); skips (77) without.
# Reproduce: make check TESTS=tests/nf4_ref.sh
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
if ! shlm_python torch numpy >/dev/null; then
    skip_test "$(shlm_python torch numpy)"
fi
if [ ! -d "$SHLM_BITSANDBYTES/bitsandbytes" ]; then
    skip_test "no bitsandbytes in $SHLM_BITSANDBYTES (run tests/setup_pyenv.sh)"
fi
test_begin nf4_ref nf4ref
echo "+ ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=$SHLM_BITSANDBYTES $SHLM_PY" \
    "$SHLM_SRCDIR/tests/nf4_ref.py $SHLM_BUILDDIR/tests/nf4_dump $work"
ATEN_CPU_CAPABILITY=avx2 PYTHONPATH="$SHLM_BITSANDBYTES${PYTHONPATH:+:$PYTHONPATH}" \
    "$SHLM_PY" "$SHLM_SRCDIR/tests/nf4_ref.py" "$SHLM_BUILDDIR/tests/nf4_dump" "$work" \
    2>"$work/stderr" || fail "shardlm's NF4 differs from bitsandbytes' (stderr: $(tail -n 3 "$work/stderr"))"
test_end
