#!/bin/sh
# A rank that hangs on the GPU path: tests/hung_rank.sh's NCCL cases (a rank stopped by
# SIGSTOP at step 3; the other ends the job within runtime.comm_timeout_s naming it and the
# collective) on 2 GPUs. Skipped (77) where fewer than 2 GPUs are visible.
# Usage: SHLM=./shardlm SHLM_SRCDIR=. sh tests/gpu/hung_rank.sh
set -u
SRC=${SHLM_SRCDIR:-.}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 2 ] || { echo "hung_rank (cuda): $ngpu GPU(s) visible, 2 needed: skipped"; exit 77; }
exec sh "$SRC/tests/hung_rank.sh" cuda
