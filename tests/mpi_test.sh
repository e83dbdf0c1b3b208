#!/bin/sh
# Runs one MPI test program under the MPI launcher, for `make check` and by hand:
#   tests/mpi_test.sh NP PROGRAM [ARGS...]
# The launcher is $MPIRUN (may carry options, split on spaces), else mpirun or mpiexec
# from PATH; with none the test is skipped (exit 77, automake's SKIP). The run is
# wrapped in `timeout` ($SHLM_TEST_TIMEOUT seconds, default 300) so a hang fails
# instead of blocking CI. What the launcher needs on a small shared box (root, more
# ranks than cores, no cross-memory attach) is set for this launch only, never exported
# to the caller: users on a cluster get Open MPI's defaults.
set -u

if [ $# -lt 2 ]; then
    echo "usage: $0 NP PROGRAM [ARGS...]" >&2
    exit 99 # automake: hard error
fi
np=$1
shift
case $np in
'' | *[!0-9]*)
    echo "mpi_test.sh: NP must be a number of ranks, got '$np'" >&2
    exit 99
    ;;
esac

launcher=${MPIRUN:-}
if [ -z "$launcher" ]; then
    for c in mpirun mpiexec; do
        if command -v "$c" >/dev/null 2>&1; then
            launcher=$c
            break
        fi
    done
fi
# shellcheck disable=SC2086 # the launcher may carry options: split it on purpose
set -- $launcher -- "$@"
launcher_bin=${1:-}
if [ -z "$launcher_bin" ] || [ "$launcher_bin" = "--" ] || ! command -v "$launcher_bin" >/dev/null 2>&1; then
    echo "SKIP: no MPI launcher (set MPIRUN or put mpirun on PATH)"
    exit 77
fi

# Split "$@" back into launcher words and the program: rebuild it as
#   env VARS... LAUNCHER-WORDS NP-OPTION EXTRA... PROGRAM ARGS...
launcher_words=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    launcher_words="$launcher_words $1"
    shift
done
shift # the "--"

envs=""
extra=""
case $(basename "$launcher_bin") in
srun)
    np_opt="-n $np" # a Slurm step: the allocation decides placement, no Open MPI knobs
    ;;
*)
    np_opt="-np $np"
    if "$launcher_bin" --version 2>&1 | grep -qi -e 'open mpi' -e 'openrte'; then
        # Open MPI refuses root without both variables (these boxes run as root)
        if [ "$(id -u)" = 0 ]; then
            envs="OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
        fi
        # more ranks than cores: the flag when the launcher lists it, else the MCA knob
        # (--help needs the root variables too, or it prints a refusal instead)
        # shellcheck disable=SC2086
        if env $envs "$launcher_bin" --help all 2>&1 | grep -q -e '--oversubscribe' ||
            env $envs "$launcher_bin" --help 2>&1 | grep -q -e '--oversubscribe'; then
            extra="--oversubscribe"
        elif [ -z "${OMPI_MCA_rmaps_base_oversubscribe:-}" ]; then
            envs="$envs OMPI_MCA_rmaps_base_oversubscribe=1"
        fi
        # containers often forbid cross-memory attach (CMA): shared-memory transfers
        # then fail with "Read -1, expected ..."; copy through the buffer instead
        if [ -z "${OMPI_MCA_btl_vader_single_copy_mechanism:-}" ] &&
            command -v ompi_info >/dev/null 2>&1 &&
            ompi_info --param btl vader --level 9 2>/dev/null | grep -q single_copy_mechanism; then
            envs="$envs OMPI_MCA_btl_vader_single_copy_mechanism=none"
        fi
    fi
    ;;
esac

limit=${SHLM_TEST_TIMEOUT:-300}
wrap=""
if command -v timeout >/dev/null 2>&1; then
    wrap="timeout -k 10 $limit"
else
    echo "mpi_test.sh: note: no timeout(1) here, a hang will not be cut short"
fi

# shellcheck disable=SC2086
set -- $wrap env $envs $launcher_words $np_opt $extra "$@"
echo "+ $*"
t0=$(date +%s)
"$@" </dev/null
rc=$?
# 137 is also mpirun's own status when a rank was SIGKILLed: a timeout only if it took that long
if [ -n "$wrap" ] && { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && [ $(($(date +%s) - t0)) -ge "$limit" ]; then
    echo "mpi_test.sh: FAIL: timed out after ${limit} s (SHLM_TEST_TIMEOUT)" >&2
fi
exit $rc
