#!/bin/sh
# `make check-gpu`: every GPU test in one command, on a machine with GPUs (minutes):
#   test_ops             every op of the cuda backend against the double reference and,
#                        at Llama sizes and where bits are the contract, the cpu backend
#   model_steps.sh       whole-model steps on 1 and 2 GPUs against the cpu backend, every
#                        strategy, accumulation, bitwise repeat, exact resume
#   fp8_steps.sh         whole-model FP8 steps (both recipes) on one GPU against the cpu
#                        backend's emulation (skipped where the GPU cannot run FP8)
#   doc_mask.sh          data.doc_mask through the model: packed documents' eval loss on
#                        cuda (both attention kernels) against the cpu backend, masks on/off
#   plan_memory.sh       one GPU's memory in use grows by the shard plan's total within 1%
#                        (op scratch and library workspace included)
#   attn_sm90_check      the attention forward: Hopper default against the mma.sync
#                        fallback and float64
#   attn_bwd_sm90_check  the attention backward: default and fallback bitwise equal,
#                        both against float64, with and without RoPE
#   hung_rank.sh         a rank stopped mid-run on 2 GPUs: the other ends the job within
#                        runtime.comm_timeout_s naming it (NCCL watchdog; skipped on 1 GPU)
#   nvml_fields.sh       the NVML telemetry's fields against nvidia-smi --query-gpu
#   telemetry_overhead.sh  a 7B step with telemetry every 100 ms and off: < 0.5% apart
# Each log goes to check-gpu-NAME.log in the current directory. A test that finds no
# suitable GPU exits 77 and is reported SKIP. Exit 1 when any test failed.
# Env: BUILDDIR (the build directory), SHLM, SHLM_SRCDIR, MPIRUN (as `make check` sets).
set -u
B=${BUILDDIR:-.}
failed=0
run() { # NAME COMMAND...
    name=$1; shift
    "$@" > "check-gpu-$name.log" 2>&1
    rc=$?
    case $rc in
    0) echo "check-gpu: PASS $name" ;;
    77) echo "check-gpu: SKIP $name (no suitable GPU)" ;;
    *) echo "check-gpu: FAIL $name (exit $rc; log check-gpu-$name.log)"; failed=1 ;;
    esac
}
run test_ops "$B/tests/test_ops" --backend cuda
run model_steps sh "$SHLM_SRCDIR/tests/gpu/model_steps.sh"
run fp8_steps sh "$SHLM_SRCDIR/tests/gpu/fp8_steps.sh"
run doc_mask sh "$SHLM_SRCDIR/tests/gpu/doc_mask.sh"
run plan_memory sh "$SHLM_SRCDIR/tests/gpu/plan_memory.sh"
run attn_sm90_check "$B/tests/gpu/attn_sm90_check" --no-time
run attn_bwd_sm90_check "$B/tests/gpu/attn_bwd_sm90_check" --no-time
run hung_rank sh "$SHLM_SRCDIR/tests/gpu/hung_rank.sh"
run nvml_fields sh "$SHLM_SRCDIR/tests/gpu/nvml_fields.sh"
run telemetry_overhead sh "$SHLM_SRCDIR/tests/gpu/telemetry_overhead.sh"
exit $failed
