#!/bin/sh
# The folders' floor plan (tests/layout.py, from the #include lines of kernels/, io/ and
# src/): no include from a lower layer to a higher one, no include circle, a model family
# included only by the registry; then layout.py's self-test, which plants an upward
# include and a circle in a copy of the tree and requires each to be reported. By hand:
#   SHLM_SRCDIR=SRC sh SRC/tests/layout.sh
set -u
. "$SHLM_SRCDIR/tests/lib.sh"
command -v python3 >/dev/null 2>&1 || skip_test "no python3 to run tests/layout.py"
fails=0
for mode in "" --self-test; do
    echo "+ python3 $SHLM_SRCDIR/tests/layout.py $mode $SHLM_SRCDIR"
    # shellcheck disable=SC2086 # $mode: no word or one
    python3 "$SHLM_SRCDIR/tests/layout.py" $mode "$SHLM_SRCDIR" || fails=$((fails + 1))
done
[ $fails -eq 0 ] || { echo "layout: FAIL"; exit 1; }
echo "layout: PASS"
