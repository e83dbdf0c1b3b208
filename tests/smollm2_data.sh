#!/bin/sh
# The bundled fine-tuning data (examples/smollm2/data/*.jsonl) is what make_data.py makes
# from the pinned chatterbot-corpus 1.3.3 wheel, byte for byte, and within its size limit.
# Skipped (77) when the wheel is not cached or no python3 here has PyYAML
# (tests/setup_pyenv.sh provides both).
#   SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/smollm2_data.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
data="$SHLM_SRCDIR/examples/smollm2/data"
whl="$SHLM_CACHE/wheels/chatterbot_corpus-1.3.3-py2.py3-none-any.whl"
shlm_python yaml >/dev/null || skip_test "$(shlm_python yaml)"
[ -f "$whl" ] || skip_test "$whl not cached (run tests/setup_pyenv.sh)"
test_begin smollm2_data shlm-smollm2-data
echo "+ $SHLM_PY $data/make_data.py $whl $work"
"$SHLM_PY" "$data/make_data.py" "$whl" "$work" || fail "make_data.py failed"
for f in chat-train chat-val prompt-response-train prompt-response-val; do
    cmp "$work/$f.jsonl" "$data/$f.jsonl" || fail "$data/$f.jsonl is not what make_data.py makes"
done
test_end
