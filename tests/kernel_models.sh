#!/bin/sh
# The CPU models of the GPU kernels' index math and synchronisation (tests/gpu/*_model.py):
# they need no GPU, run in seconds and must pass. Skipped (77) when no python3 is found.
#   SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/kernel_models.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
. "$SHLM_SRCDIR/tests/pyenv.sh"
shlm_python random || { echo "kernel_models: SKIP"; exit 77; }
failed=0
for m in "$SHLM_SRCDIR"/tests/gpu/*_model.py; do
    echo "+ $SHLM_PY $m"
    "$SHLM_PY" "$m" || { echo "kernel_models: FAIL $m"; failed=1; }
done
exit $failed
