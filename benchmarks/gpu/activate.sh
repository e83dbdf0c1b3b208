# Sourced at the start of a command on a GPU machine that received the carried folder
# (benchmarks/gpu/README.md): makes the binaries built elsewhere runnable there and points
# the suite at them. From the repository root:
#     source benchmarks/gpu/activate.sh [DIR]      # DIR: the carried folder, default .gpu
# 1. DIR/env.sh DIR/debs: Open MPI, parallel HDF5, CUDA and NCCL paths (the toolchain recipe;
#    it unpacks DIR/debs under its DEB_PREFIX, /opt/deb by default, once per machine)
# 2. DIR/extra-debs/*.deb (OpenBLAS, inih, cJSON, SentencePiece, PCRE2 ...) unpacked once
#    into $SHLM_RUNTIME_PREFIX (default /tmp/shlm-runtime); links to the libraries among them
#    that the machine lacks go to $SHLM_RUNTIME_PREFIX/shlib, put on LD_LIBRARY_PATH
# 3. SHLM_BIN=DIR/bin, checked: every library DIR/bin/shardlm needs resolves
# Returns non-zero, after one line saying what is missing, when a step fails.

_shlm_activate() {
    local d=${1:-.gpu} prefix=${SHLM_RUNTIME_PREFIX:-/tmp/shlm-runtime} f m missing
    [ -d "$d" ] || { echo "activate.sh: error: no carried folder '$d' (carry it with the command)" >&2; return 1; }
    d=$(cd "$d" && pwd)
    [ -f "$d/env.sh" ] || { echo "activate.sh: error: no $d/env.sh (benchmarks/gpu/README.md)" >&2; return 1; }
    DEB_ENV_QUIET=${DEB_ENV_QUIET:-1} . "$d/env.sh" "$d/debs" || return 1
    if [ ! -f "$prefix/.unpacked" ]; then
        ls "$d"/extra-debs/*.deb > /dev/null 2>&1 ||
            { echo "activate.sh: error: no .deb files in $d/extra-debs (stage.sh --runtime-debs)" >&2; return 1; }
        mkdir -p "$prefix" || return 1
        for f in "$d"/extra-debs/*.deb; do
            if command -v dpkg-deb > /dev/null; then
                dpkg-deb -x "$f" "$prefix" || { echo "activate.sh: error: dpkg-deb -x $f failed" >&2; return 1; }
            else # a .deb is an ar archive holding data.tar.*
                m=$(ar t "$f" | grep '^data\.tar') && ar p "$f" "$m" > "$prefix/.$m" &&
                    tar -xf "$prefix/.$m" -C "$prefix" && rm -f "$prefix/.$m" ||
                    { echo "activate.sh: error: unpacking $f failed" >&2; return 1; }
            fi
        done
        # only the libraries the machine lacks (by soname), so that nothing else it runs
        # (python, torch) loads a carried copy of one it has
        local have p b
        have=$(ldconfig -p 2>/dev/null | awk 'NR > 1 { print $1 }' | sort -u)
        mkdir -p "$prefix/shlib"
        for p in "$prefix"/usr/lib/x86_64-linux-gnu/lib*.so.* \
                 "$prefix"/usr/lib/x86_64-linux-gnu/openblas-pthread/lib*.so.*; do
            [ -e "$p" ] || continue
            b=${p##*/}
            printf '%s\n' "$b" | grep -Eq '\.so\.[0-9]+$' || continue # soname-style names only
            grep -qxF "$b" <<< "$have" || ln -sfn "$p" "$prefix/shlib/$b"
        done
        touch "$prefix/.unpacked"
    fi
    case ":${LD_LIBRARY_PATH:-}:" in
    *":$prefix/shlib:"*) ;;
    *) export LD_LIBRARY_PATH="$prefix/shlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
    export SHLM_BIN="$d/bin"
    [ -x "$SHLM_BIN/shardlm" ] || { echo "activate.sh: error: no $SHLM_BIN/shardlm (benchmarks/gpu/stage.sh)" >&2; return 1; }
    missing=$(ldd "$SHLM_BIN/shardlm" 2>&1 | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' | tr '\n' ' ')
    [ -z "$missing" ] || { echo "activate.sh: error: $SHLM_BIN/shardlm needs libraries not found: $missing" >&2; return 1; }
    echo "activate.sh: SHLM_BIN=$SHLM_BIN ($(sed -n 's/^commit //p' "$SHLM_BIN/BUILD-INFO" 2>/dev/null || echo 'no BUILD-INFO')); MPI $MPI_FLAVOUR; runtime libraries in $prefix"
}
_shlm_activate "$@"
