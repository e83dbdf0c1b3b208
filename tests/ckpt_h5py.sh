#!/bin/sh
# h5py reads a shardlm checkpoint without shardlm (tests/ckpt_h5py.py): every tensor under
# its HF name and shape, float32, every checksum recomputed from the documented formula.
# The checkpoint is saved by 4 ranks HYBRID_SHARD (2 x 2) after 3 steps. Skipped (77) when
# no python3 here has h5py (Debian: python3-h5py) or there is no MPI launcher.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/ckpt_h5py.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
. "$SHLM_SRCDIR/tests/lib.sh"
find_h5py
py=$h5py
[ -n "$py" ] || skip_test "no python3 with h5py and numpy (apt-get install python3-h5py)"
work=$(mktemp -d "${TMPDIR:-/tmp}/shlm-ckpt-h5py.XXXXXX") || exit 99
"$SHLM" data prepare --tokenizer bytes "$SHLM_SRCDIR/jobs/data/shakespeare-train.txt" \
    "$work/train.bin" >/dev/null || exit 1
set -- sh "$SHLM_SRCDIR/tests/mpi_test.sh" 4 "$SHLM" train "$SHLM_SRCDIR/tests/jobs/ckpt.ini" \
    --set "data.train=$work/train.bin" --set "log.run_dir=$work/run" --set train.stop_after=3 \
    --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2 --set "checkpoint.dir=$work/ck"
echo "+ $*"
"$@" >"$work/train.log" 2>&1 </dev/null
rc=$?
skip_without_launcher $rc
if [ $rc -ne 0 ]; then
    tail -n 20 "$work/train.log"
    echo "ckpt_h5py: FAIL: training failed; work directory kept: $work"
    exit 1
fi
echo "+ $py $SHLM_SRCDIR/tests/ckpt_h5py.py $work/ck/step_3.h5"
"$py" "$SHLM_SRCDIR/tests/ckpt_h5py.py" "$work/ck/step_3.h5"
rc=$?
[ $rc -eq 0 ] && rm -rf "$work" || echo "ckpt_h5py: work directory kept: $work"
exit $rc
