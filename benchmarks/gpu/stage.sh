#!/bin/sh
# Fills the carried folder (default .gpu) for a GPU machine that builds nothing: the
# suite's binaries from a CUDA build here, stripped, with BUILD-INFO naming their commit;
# optionally the Debian runtime libraries they load and the Open MPI + parallel HDF5
# toolchain recipe. benchmarks/gpu/README.md describes the folder and the run command.
#
#   sh benchmarks/gpu/stage.sh [--build DIR] [--dest DIR] [--runtime-debs] [--toolchain DIR]
#     --build DIR      a configured build with CUDA (default: this tree; a VPATH build
#                      directory works too): make builds the binaries there first
#     --dest DIR       the carried folder (default: .gpu at the top of the tree)
#     --runtime-debs   apt-get download the libraries the binaries load that the GPU
#                      machine lacks into DIR/extra-debs (replacing what is there)
#     --toolchain DIR  copy DIR/env.sh to DEST/env.sh and run DIR/fetch-debs.sh DEST/debs
#                      (DIR: the recipe's folder, e.g. ../shared/device)
#     --dry-run        print what would be done
# Exit status: 0, 1 when a step failed, 2 bad usage.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
die() { echo "stage.sh: error: $*" >&2; exit "${2:-2}"; }

build=$src dest=$src/.gpu runtime_debs=0 toolchain="" dry=0
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=${2:?--build needs DIR}; shift 2 ;;
    --dest) dest=${2:?--dest needs DIR}; shift 2 ;;
    --runtime-debs) runtime_debs=1; shift ;;
    --toolchain) toolchain=${2:?--toolchain needs DIR}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) sed -n '2,/^# Exit/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# What gpu_suite.sh runs, as make targets of the build (their file names are the last part)
TARGETS="shardlm tests/test_ops tests/gpu/attn_sm90_check tests/gpu/attn_bwd_sm90_check
tests/gpu/nvml_fields benchmarks/bench_kernels benchmarks/bench_comm"
# Debian 12 packages of the libraries those load beyond glibc, libstdc++, libgomp, CUDA,
# NCCL, Open MPI and parallel HDF5 (the toolchain's): OpenBLAS (and the Fortran runtime it
# needs), inih, cJSON, SentencePiece (and protobuf-lite), PCRE2, utf8proc
RUNTIME_DEBS="libopenblas0-pthread libopenblas0 libgfortran5 libinih1 libcjson1 libsentencepiece0
libprotobuf-lite32 libpcre2-8-0 libutf8proc2"

x() { echo "+ $*"; [ "$dry" = 1 ] || "$@"; }

[ -f "$build/shlm_config.h" ] || die "$build is not a configured build (run ./configure there)"
grep -Eq '^#define (SHLM_)?HAVE_CUDA 1' "$build/shlm_config.h" ||
    die "$build was configured without CUDA: run ./configure (CUDA is auto-detected) or --with-cuda=DIR there"
jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
# shellcheck disable=SC2086 # the target list is words
x make -C "$build" -j"$jobs" $TARGETS || die "make failed in $build" 1

x mkdir -p "$dest/bin" || exit 1
for t in $TARGETS; do
    x cp "$build/$t" "$dest/bin/" || die "cannot copy $build/$t" 1
    # host symbols only: the device code is data to strip and stays
    x strip --strip-unneeded "$dest/bin/${t##*/}" || exit 1
done
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+changes"
echo "+ write $dest/bin/BUILD-INFO"
[ "$dry" = 1 ] || {
    echo "commit $commit"
    echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "host $(hostname) ($(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"))"
    echo "configure $(cd "$build" && ./config.status --config 2>/dev/null | grep . || echo '(no options)')"
    echo "nvcc $(sed -n 's/^NVCC *= *//p' "$build/Makefile" | head -n 1)"
    echo "nvcc_version $($(sed -n 's/^NVCC *= *//p' "$build/Makefile" | head -n 1) --version 2>/dev/null | tail -n 1)"
    echo "binaries $(for t in $TARGETS; do printf '%s ' "${t##*/}"; done)"
} > "$dest/bin/BUILD-INFO"

if [ "$runtime_debs" = 1 ]; then
    x rm -rf "$dest/extra-debs" && x mkdir -p "$dest/extra-debs" || exit 1
    # shellcheck disable=SC2086
    (cd "$dest/extra-debs" && x apt-get download $RUNTIME_DEBS) || die "apt-get download failed" 1
fi
if [ -n "$toolchain" ]; then
    [ -f "$toolchain/env.sh" ] && [ -f "$toolchain/fetch-debs.sh" ] ||
        die "$toolchain holds no env.sh and fetch-debs.sh"
    x cp "$toolchain/env.sh" "$dest/env.sh" || exit 1
    x bash "$toolchain/fetch-debs.sh" "$dest/debs" || die "fetch-debs.sh failed" 1
fi

[ "$dry" = 1 ] && exit 0
missing=""
for f in env.sh debs extra-debs bin/shardlm; do [ -e "$dest/$f" ] || missing="$missing $f"; done
[ -z "$missing" ] || echo "stage.sh: note: $dest still lacks:$missing (see benchmarks/gpu/README.md)"
kib=$(du -sk "$dest" | cut -f1)
echo "stage.sh: $dest holds $((kib / 1024)) MiB:"
du -sh "$dest"/* 2>/dev/null | sed 's/^/  /'
# the lent machine takes at most 64 MiB of carried paths
[ "$kib" -le 65536 ] || echo "stage.sh: warning: more than 64 MiB: carry only what the phases need"
exit 0
