#!/bin/sh
# The CPU models of the GPU kernels' index math and synchronisation (tests/gpu/*_model.py):
# they need no GPU, run in seconds and must pass. They read the kernels' tile sizes, slots
# and barrier counts from kernels/cuda/*.cu (tests/gpu/cu_constants.py); each model must
# then fail on a scratch copy of kernels/cuda with one of those changed (below), which a
# model restating the values could not. Skipped (77) when no python3 is found.
#   SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/kernel_models.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
. "$SHLM_SRCDIR/tests/lib.sh"
. "$SHLM_SRCDIR/tests/pyenv.sh"
shlm_python random >/dev/null || skip_test "$(shlm_python random)"
test_begin kernel_models shlm-kernel-models
for m in "$SHLM_SRCDIR"/tests/gpu/*_model.py; do
    echo "+ $SHLM_PY $m"
    "$SHLM_PY" "$m" || fail "$m"
done

# changed MODEL FILE OLD NEW: MODEL fails where kernels/cuda/FILE's line OLD reads NEW
changed() {
    rm -rf "$work/cuda"
    cp -R "$SHLM_SRCDIR/kernels/cuda" "$work/cuda"
    if ! grep -q -F -e "$3" "$work/cuda/$2"; then
        fail "kernels/cuda/$2 has no line '$3' to change"
        return
    fi
    sed -i "s|$3|$4|" "$work/cuda/$2"
    echo "+ SHLM_KERNELS_DIR=$work/cuda $SHLM_PY $1   ($2: '$4')"
    if SHLM_KERNELS_DIR=$work/cuda "$SHLM_PY" "$SHLM_SRCDIR/tests/gpu/$1" >"$work/changed.log" 2>&1; then
        fail "$1 passes with '$4' in $2: it does not check the kernel's value"
    else
        echo "kernel_models: ok: $1 fails with '$4' in $2: $(tail -n 1 "$work/changed.log")"
    fi
}
changed attn_bwd_ws_model.py attention_bwd_sm90.cu "constexpr int BQ = 64;" "constexpr int BQ = 32;"
changed attn_bwd_ws_model.py attention_bwd_sm90.cu "mbar_init(empty(s), 8);" "mbar_init(empty(s), 4);"
changed attn_doc_model.py attention.cu "constexpr int DQ_BC = 64;" "constexpr int DQ_BC = 32;"
test_end
