#!/usr/bin/env bash
# The GPU machine's work in as few calls as possible: op and whole-model tests, the
# training-step benchmark, and the PyTorch FSDP2 anchor measured in the same session.
#
#   bash benchmarks/gpu_session.sh test     # test_ops_cuda + tests/gpu/model_steps.sh
#   bash benchmarks/gpu_session.sh bench    # shardlm training steps, Llama-2-7B and 1.1B
#   bash benchmarks/gpu_session.sh anchor   # torch_fsdp_bench.py, same shapes
#   bash benchmarks/gpu_session.sh scaling  # benchmarks/strong_scaling.sh on 1, 2 GPUs + perf_model
#   bash benchmarks/gpu_session.sh all      # test, bench and anchor in one call
#   bash benchmarks/gpu_session.sh quick    # op + model tests, four 7B points and a profile
#   bash benchmarks/gpu_session.sh final    # tests, the 7B record beside PyTorch FSDP2 eager/compile
#   bash benchmarks/gpu_session.sh small    # attention tests, the 1.1B shape beside PyTorch
#   bash benchmarks/gpu_session.sh sm90     # the wgmma attention's checks, then both kernels timed
#   bash benchmarks/gpu_session.sh matrix   # SHARD_GRAD_OP and one-GPU points beside PyTorch eager
#   bash benchmarks/gpu_session.sh ratio    # the 7B record pair alone: shardlm, PyTorch eager, compile
#   bash benchmarks/gpu_session.sh overhead # the 1 -> 2 GPU overhead: fixed-global-batch pair, profiles
#   bash benchmarks/gpu_session.sh gbatch   # 1 -> 2 GPUs at mb 2 and a fixed global batch of 4 and 8
#   bash benchmarks/gpu_session.sh cers     # fp32 reduce-scatters on the copy engines against SM kernels
#   bash benchmarks/gpu_session.sh checkgpu # make check-gpu's script on the carried binaries
#   bash benchmarks/gpu_session.sh eight1   # issue 7 on 8 GPUs: comm, the 7B suite 1..8 GPUs
#   bash benchmarks/gpu_session.sh eight2   # issue 7 on 8 GPUs: the 13B suite, PyTorch, the model
#
# Expects: binaries in $SHLM_BIN (default .gpu/bin: shardlm, test_ops_cuda,
# bench_kernels, bench_comm, perf_model, attn_sm90_check, attn_bwd_sm90_check), Debian
# libraries they need as .debs in .gpu/extra-debs, the toolchain recipe in .gpu/env.sh +
# .gpu/debs, the anchor scripts in .gpu/anchors, and $OUT. The binaries are built on the
# workstation (nvcc, no GPU needed): `configure && make shardlm tests/gpu/test_ops_cuda
# benchmarks/bench_kernels benchmarks/bench_comm benchmarks/perf_model
# tests/gpu/attn_sm90_check tests/gpu/attn_bwd_sm90_check` in a build directory; then copied
# into .gpu/bin, which `run` carries (carry [".gpu"]).
# Prints one summary table per phase last. NCCL_NVLS_ENABLE stays 0.
set -u
phase=${1:?usage: gpu_session.sh test|bench|anchor|scaling|quick|final|small|sm90|matrix|ratio|overhead|gbatch|cers|checkgpu|eight1|eight2|all}
BIN=${SHLM_BIN:-.gpu/bin}
OUT=${OUT:-/tmp/shlm-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L | grep -c '^GPU')

setup_libs() {
    # Debian's OpenBLAS, inih, cJSON (and the Fortran runtime OpenBLAS needs), unpacked
    # beside the toolchain's /opt/deb, never into /
    mkdir -p /opt/shlm-libs
    for f in .gpu/extra-debs/*.deb; do dpkg-deb -x "$f" /opt/shlm-libs; done
    export LD_LIBRARY_PATH=/opt/shlm-libs/usr/lib/x86_64-linux-gnu/openblas-pthread:/opt/shlm-libs/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
}
setup_libs
export SHLM=$BIN/shardlm SHLM_SRCDIR=$PWD MPIRUN="mpirun --bind-to none"

test_phase() {
    echo "== test_ops_cuda"
    "$BIN/test_ops_cuda" > "$OUT/ops.log" 2>&1; echo "rc=$?"; tail -2 "$OUT/ops.log"
    echo "== bench_kernels"
    "$BIN/bench_kernels" > "$OUT/kernels.txt" 2>&1; echo "rc=$?"; grep -E "attention|ceiling|#wrong|PASS|FAIL" "$OUT/kernels.txt" | head -8
    echo "== model_steps"
    sh tests/gpu/model_steps.sh 2>&1 | tee "$OUT/model_steps.log" | grep -v '^+'
}

# SM clock, power and throttle reasons of every GPU once a second while a phase runs
# (read-only: nothing about the GPUs is changed)
smi_start() {
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active,memory.used \
        --format=csv,noheader -lms 1000 > "$OUT/smi-$1.csv" 2>/dev/null &
    SMI_PID=$!
}
smi_stop() {
    kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null
    # mean SM clock and power of the busy samples (power above 300 W), per GPU
    awk -F', *' '$4+0 > 300 { n[$2]++; c[$2] += $3; p[$2] += $4 }
        { if ($7 + 0 > m[$2]) m[$2] = $7 + 0 }
        END { for (g in n) printf "gpu %s: %d busy samples, mean SM clock %.0f MHz, mean power %.0f W, peak memory.used %.1f GiB\n", g, n[g], c[g] / n[g], p[g] / n[g], m[g] / 1024 }' \
        "$OUT/smi-$1.csv" | sort | tee "$OUT/smi-$1.txt"
}

bench_setup() {
    T=/tmp/shlm-bench
    mkdir -p $T
    [ -f $T/rand.bin ] || "$SHLM" data random --vocab 32000 --tokens 4000000 $T/rand.bin > /dev/null
    summary=$OUT/bench.tsv
    [ -f "$summary" ] || printf 'config\tgpus\tmb\tac\tstrategy\ttok_s_gpu\tstep_ms\texposed_ms\tmfu\tmem_gib\n' > "$summary"
}

# anchor NP NAME ARGS...: one PyTorch FSDP2 run of torch_fsdp_bench.py on NP GPUs; its
# last JSON line (tokens/s/GPU, MFU, memory) goes to $OUT/anchor.txt
anchor() {
    local np=$1 name=$2
    shift 2
    echo "+ torchrun --standalone --nproc-per-node=$np .gpu/anchors/torch_fsdp_bench.py $*"
    PYTHONUNBUFFERED=1 timeout 280 torchrun --standalone --nproc-per-node="$np" \
        .gpu/anchors/torch_fsdp_bench.py "$@" --out "$OUT/torch_$name.jsonl" > "$OUT/torch_$name.log" 2>&1
    echo "rc=$? $name: $(tail -1 "$OUT/torch_$name.jsonl" 2>/dev/null)" | tee -a "$OUT/anchor.txt"
}

bench_table() {
    echo "== shardlm training steps (mean of steps 3..N; tokens/s per GPU; MFU at 989 TFLOP/s)"
    awk -F'\t' '{ printf "%-22s %5s %3s %5s %14s %10s %8s %10s %7s %8s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }' "$summary"
}

run() { # name gpus job mb ac strategy steps [--set ...]
        local name=$1 np=$2 job=$3 mb=$4 ac=$5 st=$6 steps=$7
        shift 7
        local extra=("$@")
        echo "+ mpirun -np $np $SHLM train jobs/$job.ini --set train.micro_batch=$mb --set train.global_batch=$((mb * np)) --set fsdp.activation_checkpointing=$ac --set fsdp.strategy=$st --set train.steps=$steps ..."
        # shellcheck disable=SC2086
        $MPIRUN -np "$np" "$SHLM" train "jobs/$job.ini" --set data.train=$T/rand.bin \
            --set train.steps="$steps" --set train.warmup_steps=1 --set train.micro_batch="$mb" \
            --set train.global_batch=$((mb * np)) --set fsdp.param_dtype=bf16 \
            --set fsdp.reduce_dtype=fp32 --set fsdp.strategy="$st" \
            --set fsdp.activation_checkpointing="$ac" --set log.every=1 \
            --set log.run_dir="$T/$name" "${extra[@]}" > "$T/$name.log" 2>&1 || { tail -5 "$T/$name.log"; return; }
        # mean over the steps after the first two (warm-up: cuBLASLt plans, NCCL set-up)
        awk -v n="$name" -v g="$np" -v mb="$mb" -v ac="$ac" -v st="$st" -F'[:,}]' '
            { for (i = 1; i < NF; i++) { k = $i; gsub(/[ "{]/, "", k); v[k] = $(i+1) }
              if (v["step"] > 2) { c++; tok += v["tokens_per_s"]; ms += v["step_ms"];
                                   ex += v["comm_exposed_ms"]; mfu += v["mfu"];
                                   if (v["mem_peak_bytes"] > mem) mem = v["mem_peak_bytes"] } }
            END { if (c) printf "%s\t%d\t%d\t%s\t%s\t%.0f\t%.1f\t%.1f\t%.1f%%\t%.1f\n", n, g, mb, ac, st,
                         tok / c / g, ms / c, ex / c, 100 * mfu / c, mem / 1073741824 }' \
            "$T/$name/metrics.jsonl" >> "$summary"
    }

bench_phase() {
    bench_setup
    run 7b_fs_mb2_none 2 llama2-7b 2 none FULL_SHARD 6
    # the NCCL kernels' share of the SMs, traded against their speed (issue: limit CTAs)
    NCCL_MAX_CTAS=8 run 7b_fs_mb2_none_ctas8 2 llama2-7b 2 none FULL_SHARD 6
    run 7b_fs_mb1_none 2 llama2-7b 1 none FULL_SHARD 6
    run 7b_sgo_mb2_none 2 llama2-7b 2 none SHARD_GRAD_OP 6
    run 7b_fs_mb8_full 2 llama2-7b 8 full FULL_SHARD 4
    run 7b_1gpu_mb1_none 1 llama2-7b 1 none FULL_SHARD 6
    run 1b_fs_mb8_none 2 tinyllama-1b 8 none FULL_SHARD 8
    run 1b_1gpu_mb8_none 1 tinyllama-1b 8 none FULL_SHARD 8
    # where a step's time goes: every op timed between synchronisations (slower step)
    run 7b_fs_mb2_profile 2 llama2-7b 2 none FULL_SHARD 3 --set runtime.profile=true
    sed -n '/^# profile/,/measured step/p' "$T/7b_fs_mb2_profile.log" | tee "$OUT/profile.txt"
    bench_table
}

# the checks and the 7B points that decide a change, in one short call
quick_phase() {
    echo "== test_ops_cuda"
    "$BIN/test_ops_cuda" > "$OUT/ops.log" 2>&1; echo "rc=$?"; grep -E "FAIL" "$OUT/ops.log" | head -5; tail -1 "$OUT/ops.log"
    echo "== model_steps"
    sh tests/gpu/model_steps.sh > "$OUT/model_steps.log" 2>&1; echo "rc=$?"; grep -E "PASS|FAIL|failure" "$OUT/model_steps.log"
    echo "== bench_kernels (attention, rmsnorm)"
    "$BIN/bench_kernels" --only attention > "$OUT/kernels-quick.txt" 2>&1
    "$BIN/bench_kernels" --only rmsnorm | grep -v '^#' >> "$OUT/kernels-quick.txt" 2>&1
    grep -v '^#' "$OUT/kernels-quick.txt"
    echo "== all-gather bf16: SM kernels vs copy engines (registered receive buffer)"
    for reg in "" --registered; do
        $MPIRUN -np 2 "$BIN/bench_comm" --backend nccl --op all_gather --dtype bf16 -b 16M -e 1G -f 4 \
            --nonblocking $reg > "$OUT/bench_comm_ag$reg.txt" 2>&1
        echo "rc=$? ${reg:-plain}"; grep -v '^#' "$OUT/bench_comm_ag$reg.txt" | tail -4
    done
    bench_setup
    smi_start quick
    run 7b_fs_mb2_none 2 llama2-7b 2 none FULL_SHARD 6
    SHLM_NCCL_CE_ALLGATHER=0 run 7b_fs_mb2_sm_allgather 2 llama2-7b 2 none FULL_SHARD 6
    run 7b_fs_mb1_none 2 llama2-7b 1 none FULL_SHARD 6
    run 7b_1gpu_mb1_none 1 llama2-7b 1 none FULL_SHARD 6
    smi_stop quick
    run 7b_fs_mb2_profile 2 llama2-7b 2 none FULL_SHARD 3 --set runtime.profile=true
    sed -n '/^# profile/,/measured step/p' "$T/7b_fs_mb2_profile.log" > "$OUT/profile.txt"
    bench_table
    cat "$OUT/profile.txt"
}

anchor_phase() {
    : > "$OUT/anchor.txt"
    anchor 2 7b_fs_mb2_ac0 --model 7b --mb 2 --reshard 1 --ac 0 --steps 5
    anchor 2 7b_fs_mb2_ac0_compile --model 7b --mb 2 --reshard 1 --ac 0 --steps 5 --compile
    anchor 2 1b_fs_mb8_ac0 --model 1b --mb 8 --reshard 1 --ac 0 --steps 10
    anchor 2 7b_fs_mb8_ac1 --model 7b --mb 8 --reshard 1 --ac 1 --steps 3
}

# the strong-scaling suite itself over 1 and 2 GPUs, then the performance model's error
scaling_phase() {
    T=/tmp/shlm-bench
    mkdir -p $T
    [ -f $T/rand.bin ] || "$SHLM" data random --vocab 32000 --tokens 4000000 $T/rand.bin > /dev/null
    $MPIRUN -np 2 "$BIN/bench_comm" --backend nccl -b 1M -e 1G -n 20 -w 5 --nonblocking \
        --json "$OUT/nccl-nb-2.json" > "$OUT/bench_comm.txt" 2>&1; echo "bench_comm rc=$?"
    for m in llama2-7b:1:2 tinyllama-1b:8:16; do
        IFS=: read -r job mb gb <<< "$m"
        sh benchmarks/strong_scaling.sh --ranks 1,2 --steps 6 --warmup 2 --shardlm "$SHLM" \
            --out "$T/scale-$job" --global-batch "$gb" "jobs/$job.ini" --set data.train=$T/rand.bin \
            --set train.micro_batch="$mb" --set fsdp.param_dtype=bf16 \
            --set fsdp.reduce_dtype=fp32 > "$OUT/$job.txt" 2>&1
        echo "strong_scaling $job rc=$?"; tail -8 "$OUT/$job.txt"
        cp "$T/scale-$job/scaling.csv" "$OUT/$job-scaling.csv"
    done
    "$BIN/perf_model" --calibrate "$OUT/llama2-7b-scaling.csv" \
        --calibrate "$OUT/tinyllama-1b-scaling.csv" --comm-json "$OUT/nccl-nb-2.json" \
        --mem-gbs 3400 --overlap 0.6 --max-error 10 2>&1 | tee "$OUT/perf_model.txt" | tail -25
}

# the record of a change: tests, then shardlm and PyTorch FSDP2 on the same 7B command
# (the issue's "Done when" pair), then what time allows (the call has 10 minutes)
final_phase() {
    attn_checks --no-time
    echo "== bench_kernels"
    "$BIN/bench_kernels" > "$OUT/kernels.txt" 2>&1; echo "rc=$?"
    grep -E "ceiling|attention" "$OUT/kernels.txt"
    echo "== test_ops_cuda"
    "$BIN/test_ops_cuda" > "$OUT/ops.log" 2>&1; echo "rc=$?"; grep -E "FAIL" "$OUT/ops.log" | head -5; tail -1 "$OUT/ops.log"
    echo "== model_steps"
    sh tests/gpu/model_steps.sh > "$OUT/model_steps.log" 2>&1; echo "rc=$?"; grep -E "FAIL|failure" "$OUT/model_steps.log"
    record_pair
    # 1 -> 2 GPUs at the same per-GPU micro-batch
    run 7b_fs_mb1_none 2 llama2-7b 1 none FULL_SHARD 6
    run 7b_1gpu_mb1_none 1 llama2-7b 1 none FULL_SHARD 6
    bench_table
    echo "elapsed ${SECONDS}s"
    if [ "$SECONDS" -lt 450 ]; then
        echo "== memcheck attn_bwd_sm90_check --small"
        timeout 100 compute-sanitizer --tool memcheck "$BIN/attn_bwd_sm90_check" --small > "$OUT/bwd-memcheck.log" 2>&1
        echo "rc=$?"; tail -2 "$OUT/bwd-memcheck.log"
    fi
    if [ "$SECONDS" -lt 430 ]; then
        run 1b_fs_mb8_none 2 tinyllama-1b 8 none FULL_SHARD 8
        bench_table
    fi
    if [ "$SECONDS" -lt 480 ]; then
        run 7b_fs_mb2_profile 2 llama2-7b 2 none FULL_SHARD 3 --set runtime.profile=true
        sed -n '/^# profile/,/measured step/p' "$T/7b_fs_mb2_profile.log" | tee "$OUT/profile.txt"
    fi
    if [ "$SECONDS" -lt 430 ]; then
        anchor 2 1b_fs_mb8_ac0 --model 1b --mb 8 --reshard 1 --ac 0 --steps 10
        anchor 2 1b_fs_mb8_ac0_compile --model 1b --mb 8 --reshard 1 --ac 0 --steps 10 --compile
    fi
    echo "elapsed ${SECONDS}s"
}

# the rest of the issue's anchor matrix beside PyTorch FSDP2 eager: SHARD_GRAD_OP on 2
# GPUs (PyTorch: reshard_after_forward False) for both shapes, one GPU for the 1.1B shape,
# then (time permitting) PyTorch on one GPU for the 7B shape at micro-batch 1
matrix_phase() {
    bench_setup
    : > "$OUT/anchor.txt"
    run 7b_sgo_mb2_none 2 llama2-7b 2 none SHARD_GRAD_OP 6
    anchor 2 7b_sgo_mb2_ac0 --model 7b --mb 2 --reshard 0 --ac 0 --steps 5
    run 1b_sgo_mb8_none 2 tinyllama-1b 8 none SHARD_GRAD_OP 8
    anchor 2 1b_sgo_mb8_ac0 --model 1b --mb 8 --reshard 0 --ac 0 --steps 10
    run 1b_1gpu_mb8_none 1 tinyllama-1b 8 none FULL_SHARD 8
    anchor 1 1b_1gpu_mb8_ac0 --model 1b --mb 8 --reshard 1 --ac 0 --steps 10
    bench_table
    echo "elapsed ${SECONDS}s"
    if [ "$SECONDS" -lt 260 ]; then
        run 7b_1gpu_mb1_none 1 llama2-7b 1 none FULL_SHARD 6
        anchor 1 7b_1gpu_mb1_ac0 --model 7b --mb 1 --reshard 1 --ac 0 --steps 5
        bench_table
    fi
    echo "elapsed ${SECONDS}s"
}

# the issue's record: shardlm's 7B step, then PyTorch FSDP2 eager and torch.compile on the
# same command, nvidia-smi sampled over each side
record_pair() {
    bench_setup
    smi_start shardlm
    run 7b_fs_mb2_none 2 llama2-7b 2 none FULL_SHARD 6
    smi_stop shardlm
    bench_table
    : > "$OUT/anchor.txt"
    smi_start torch
    anchor 2 7b_fs_mb2_ac0 --model 7b --mb 2 --reshard 1 --ac 0 --steps 5
    anchor 2 7b_fs_mb2_ac0_compile --model 7b --mb 2 --reshard 1 --ac 0 --steps 5 --compile
    smi_stop torch
}

# the record pair alone: one more sample of the ratio that varies from call to call
ratio_phase() {
    record_pair
    echo "elapsed ${SECONDS}s"
}

# Where the 2-GPU step loses ~43 ms against one GPU at equal per-GPU work (session 4, call
# I: 360.1 against 364.7 ms although its optimizer shard is half): the fixed-global-batch
# pair of the strong-scaling suite (1 GPU: 2 micro-batches), both steps profiled, and the
# 2-GPU step with NCCL's reduce-scatters held to fewer SMs. Written without a GPU: not run.
overhead_phase() {
    bench_setup
    sh benchmarks/strong_scaling.sh --ranks 1,2 --strategies FULL_SHARD --steps 5 --warmup 2 \
        --shardlm "$SHLM" --out "$T/scale-7b-gb2" --global-batch 2 jobs/llama2-7b.ini \
        --set data.train=$T/rand.bin --set train.micro_batch=1 --set fsdp.param_dtype=bf16 \
        --set fsdp.reduce_dtype=fp32 > "$OUT/7b-gb2.txt" 2>&1
    echo "7b global batch 2 rc=$?"; tail -4 "$OUT/7b-gb2.txt"; cp "$T/scale-7b-gb2/scaling.csv" "$OUT/7b-gb2-scaling.csv"
    for np in 1 2; do
        run "7b_${np}gpu_mb1_profile" $np llama2-7b 1 none FULL_SHARD 3 --set runtime.profile=true
        sed -n '/^# profile/,/measured step/p' "$T/7b_${np}gpu_mb1_profile.log" | tee "$OUT/profile-$np.txt"
    done
    run 7b_fs_mb1_none 2 llama2-7b 1 none FULL_SHARD 6
    SHLM_NCCL_CTA_POLICY=efficiency run 7b_fs_mb1_cta_eff 2 llama2-7b 1 none FULL_SHARD 6
    NCCL_MAX_CTAS=4 run 7b_fs_mb1_ctas4 2 llama2-7b 1 none FULL_SHARD 6
    run 7b_1gpu_mb1_none 1 llama2-7b 1 none FULL_SHARD 6
    bench_table
    echo "elapsed ${SECONDS}s"
}

# the TinyLlama-1.1B shape beside PyTorch FSDP2 eager and compile, after the attention tests
# gbatch: strong scaling 1 -> 2 GPUs at the record's micro-batch (2) and a fixed global
# batch of 4 (the record's: 2 GPUs x mb 2; 1 GPU accumulates 2 micro-batches) and of 8
# (GBATCH_LIST: the global batches, default "4 8"; GBATCH_REPEAT: runs per point, the
# median kept, default 1)
gbatch_phase() {
    bench_setup
    smi_start gbatch
    for gb in ${GBATCH_LIST:-4 8}; do
        sh benchmarks/strong_scaling.sh --ranks 1,2 --strategies FULL_SHARD --steps 5 --warmup 2 \
            --repeat "${GBATCH_REPEAT:-1}" \
            --shardlm "$SHLM" --out "$T/scale-7b-gb$gb" --global-batch $gb jobs/llama2-7b.ini \
            --set data.train=$T/rand.bin --set train.micro_batch=2 --set fsdp.param_dtype=bf16 \
            --set fsdp.reduce_dtype=fp32 > "$OUT/7b-gb$gb.txt" 2>&1
        echo "7b global batch $gb, mb 2: rc=$?"; tail -4 "$OUT/7b-gb$gb.txt"
        cp "$T/scale-7b-gb$gb/scaling.csv" "$OUT/7b-gb$gb-scaling.csv" 2>/dev/null
    done
    smi_stop gbatch
    echo "elapsed ${SECONDS}s"
}
# cers: fp32 reduce-scatters on the copy engines (SHLM_NCCL_CE_REDUCE_SCATTER=1) against
# NCCL's SM kernels: bus bandwidth and checked values, whole-model bitwise agreement,
# the 7B step at mb 1 and 2, and the 2-GPU profile
cers_phase() {
    echo "== reduce_scatter fp32 (registered buffers): SM kernels (0) vs copy engines (1)"
    for ce in 0 1; do
        SHLM_NCCL_CE_REDUCE_SCATTER=$ce $MPIRUN -np 2 "$BIN/bench_comm" --backend nccl \
            --op reduce_scatter --dtype fp32 --redop avg -b 16M -e 1G -f 4 --nonblocking \
            --registered > "$OUT/bench_comm_rs_ce$ce.txt" 2>&1
        echo "rc=$? ce=$ce"; grep -v '^#' "$OUT/bench_comm_rs_ce$ce.txt" | tail -4
        grep -E "wrong|avg bus" "$OUT/bench_comm_rs_ce$ce.txt"
    done
    echo "== model_steps"
    timeout 300 sh tests/gpu/model_steps.sh > "$OUT/model_steps.log" 2>&1; echo "rc=$?"
    grep -E "FAIL|failure|ce_rs" "$OUT/model_steps.log"
    bench_setup
    smi_start cers
    for ce in 1 0; do
        SHLM_NCCL_CE_REDUCE_SCATTER=$ce run 7b_fs_mb1_ce$ce 2 llama2-7b 1 none FULL_SHARD 6
        SHLM_NCCL_CE_REDUCE_SCATTER=$ce run 7b_fs_mb2_ce$ce 2 llama2-7b 2 none FULL_SHARD 6
    done
    smi_stop cers
    SHLM_NCCL_CE_REDUCE_SCATTER=1 run 7b_2gpu_mb1_profile_ce1 2 llama2-7b 1 none FULL_SHARD 3 \
        --set runtime.profile=true
    sed -n '/^# profile/,/measured step/p' "$T/7b_2gpu_mb1_profile_ce1.log" | tee "$OUT/profile-2-ce1.txt"
    bench_table
    echo "elapsed ${SECONDS}s"
}
# checkgpu: `make check-gpu`'s script (tests/gpu/check_gpu.sh) on the carried binaries, laid
# out as the build directory it expects
checkgpu_phase() {
    local b=/tmp/shlm-checkgpu
    mkdir -p $b/tests/gpu
    local bin=$BIN
    case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
    for t in test_ops_cuda attn_sm90_check attn_bwd_sm90_check; do ln -sf "$bin/$t" $b/tests/gpu/$t; done
    (cd "$OUT" && BUILDDIR=$b SHLM="$bin/shardlm" sh "$SHLM_SRCDIR/tests/gpu/check_gpu.sh")
    echo "check_gpu.sh rc=$?"
    grep -hE "FAIL|failure|PASS: |checks," "$OUT"/check-gpu-*.log | head -20
    echo "elapsed ${SECONDS}s"
}
small_phase() {
    echo "== test_ops_cuda attention"
    "$BIN/test_ops_cuda" 1 attention > "$OUT/ops-attention.log" 2>&1; echo "rc=$?"; grep -E "FAIL" "$OUT/ops-attention.log" | head -5; tail -1 "$OUT/ops-attention.log"
    bench_setup
    run 1b_fs_mb8_none 2 tinyllama-1b 8 none FULL_SHARD 8
    bench_table
    : > "$OUT/anchor.txt"
    anchor 2 1b_fs_mb8_ac0 --model 1b --mb 8 --reshard 1 --ac 0 --steps 10
    anchor 2 1b_fs_mb8_ac0_compile --model 1b --mb 8 --reshard 1 --ac 0 --steps 10 --compile
}

# the Hopper wgmma attention (the default) beside the mma.sync one (SHLM_ATTN_SM90=0): its
# own checks with timings and memcheck, the ops tests, the kernels and the 7B step both ways
# the standalone checks of the wgmma attention forward and backward (tests/gpu/*_check.cu:
# against attention.cu's mma.sync kernels and float64); --no-time goes to both, --no-ws
# (leave out the warp-specialised variants) to the backward check only
attn_checks() {
    rc=0
    for c in attn_sm90_check attn_bwd_sm90_check; do
        args=""
        for a in "$@"; do
            [ "$a" = --no-ws ] && [ "$c" = attn_sm90_check ] && continue
            args="$args $a"
        done
        echo "== $c$args"
        # shellcheck disable=SC2086
        timeout 240 "$BIN/$c" $args > "$OUT/$c.log" 2>&1; r=$?; echo "rc=$r"; [ "$r" = 0 ] || rc=$r
        grep -E "FAIL|PASS|time " "$OUT/$c.log" | tail -24
    done
}

sm90_phase() {
    # The default kernels' checks first; then every variant (the warp-specialised dK/dV and
    # dQ passes) on the small shapes under a short time limit, so that a hang costs only
    # itself; the full-size timed check only if that passed.
    attn_checks --no-ws
    echo "== attn_bwd_sm90_check --small (every variant, warp-specialised included)"
    timeout 60 "$BIN/attn_bwd_sm90_check" --small > "$OUT/bwd-ws-small.log" 2>&1
    r=$?; echo "rc=$r"; grep -E "FAIL|PASS" "$OUT/bwd-ws-small.log" | tail -16
    if [ "$r" = 0 ]; then
        echo "== attn_bwd_sm90_check (every variant, full size, timed)"
        timeout 150 "$BIN/attn_bwd_sm90_check" > "$OUT/bwd-ws.log" 2>&1
        echo "rc=$?"; grep -E "FAIL|PASS|time " "$OUT/bwd-ws.log" | tail -40
    fi
    echo "== test_ops_cuda"
    "$BIN/test_ops_cuda" > "$OUT/ops.log" 2>&1; echo "rc=$?"
    grep -E "FAIL" "$OUT/ops.log" | head -5; tail -1 "$OUT/ops.log"
    echo "== model_steps"
    sh tests/gpu/model_steps.sh > "$OUT/model_steps.log" 2>&1; echo "rc=$?"; grep -E "FAIL|failure" "$OUT/model_steps.log"
    echo "== bench_kernels"
    "$BIN/bench_kernels" > "$OUT/kernels.txt" 2>&1; echo "rc=$?"; grep -v '^#' "$OUT/kernels.txt"
    bench_setup
    smi_start shardlm
    run 7b_fs_mb2_sm90 2 llama2-7b 2 none FULL_SHARD 6
    smi_stop shardlm
    bench_table
    echo "elapsed ${SECONDS}s"
    [ "$SECONDS" -lt 420 ] || { echo "no time left for memcheck"; return; }
    echo "== memcheck attn_bwd_sm90_check --small (every variant)"
    timeout 150 compute-sanitizer --tool memcheck "$BIN/attn_bwd_sm90_check" --small > "$OUT/bwd-memcheck.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|FAIL" "$OUT/bwd-memcheck.log" | tail -3
    echo "elapsed ${SECONDS}s"
}

# Issue 7 on the 8-GPU machine, in two calls (each under 10 minutes): eight1 = the comm
# benchmark and the 7B suite on 1, 2, 4, 8 GPUs (FULL_SHARD, SHARD_GRAD_OP; HYBRID_SHARD
# as two simulated nodes of 4); eight2 = the 13B suite (2 GPUs are the smallest that hold
# it), PyTorch FSDP2 on the same 8 GPUs, and the performance model refitted on every point
# (copy eight1's 7b-scaling.csv and nccl-nb-8.json into .gpu/ first). Written before an
# 8-GPU machine was lent: not yet run.
eight1_phase() {
    T=/tmp/shlm-bench
    mkdir -p $T
    [ -f $T/rand.bin ] || "$SHLM" data random --vocab 32000 --tokens 4000000 $T/rand.bin > /dev/null
    $MPIRUN -np 8 "$BIN/bench_comm" --backend nccl -b 1M -e 1G -f 4 -n 20 -w 5 --nonblocking \
        --json "$OUT/nccl-nb-8.json" > "$OUT/bench_comm-8.txt" 2>&1; echo "bench_comm rc=$?"
    $MPIRUN -np 8 "$BIN/bench_comm" --backend nccl --op all_gather --dtype bf16 -b 16M -e 1G -f 4 \
        --nonblocking --registered > "$OUT/bench_comm-8-ce.txt" 2>&1; echo "bench_comm --registered rc=$?"
    sh benchmarks/strong_scaling.sh --ranks 1,2,4,8 --strategies FULL_SHARD,SHARD_GRAD_OP --steps 5 \
        --warmup 2 --shardlm "$SHLM" --out "$T/scale-7b" --global-batch 8 --png "$OUT/7b-scaling.png" \
        jobs/llama2-7b.ini --set data.train=$T/rand.bin --set train.micro_batch=1 \
        --set fsdp.param_dtype=bf16 --set fsdp.reduce_dtype=fp32 > "$OUT/7b.txt" 2>&1
    echo "7b rc=$?"; tail -12 "$OUT/7b.txt"; cp "$T/scale-7b/scaling.csv" "$OUT/7b-scaling.csv"
    sh benchmarks/strong_scaling.sh --ranks 8 --strategies HYBRID_SHARD --steps 5 --warmup 2 \
        --shardlm "$SHLM" --out "$T/scale-7b-hybrid" --global-batch 8 jobs/llama2-7b.ini \
        --set data.train=$T/rand.bin --set train.micro_batch=1 --set runtime.ranks_per_node=4 \
        --set fsdp.param_dtype=bf16 --set fsdp.reduce_dtype=fp32 > "$OUT/7b-hybrid.txt" 2>&1
    echo "7b hybrid rc=$?"; tail -4 "$OUT/7b-hybrid.txt"; cp "$T/scale-7b-hybrid/scaling.csv" "$OUT/7b-hybrid-scaling.csv"
}

eight2_phase() {
    T=/tmp/shlm-bench
    mkdir -p $T
    [ -f $T/rand.bin ] || "$SHLM" data random --vocab 32000 --tokens 4000000 $T/rand.bin > /dev/null
    for st in FULL_SHARD:2,4,8 SHARD_GRAD_OP:4,8; do
        sh benchmarks/strong_scaling.sh --ranks "${st#*:}" --strategies "${st%%:*}" --steps 5 --warmup 2 \
            --shardlm "$SHLM" --out "$T/scale-13b-${st%%:*}" --global-batch 8 jobs/llama2-13b.ini \
            --set data.train=$T/rand.bin --set train.micro_batch=1 --set fsdp.param_dtype=bf16 \
            --set fsdp.reduce_dtype=fp32 > "$OUT/13b-${st%%:*}.txt" 2>&1
        echo "13b ${st%%:*} rc=$?"; tail -6 "$OUT/13b-${st%%:*}.txt"
        cp "$T/scale-13b-${st%%:*}/scaling.csv" "$OUT/13b-${st%%:*}-scaling.csv"
    done
    anchor 8 7b_fs_mb2_ac0_8 --model 7b --mb 2 --reshard 1 --ac 0 --steps 5
    anchor 8 7b_fs_mb2_ac0_compile_8 --model 7b --mb 2 --reshard 1 --ac 0 --steps 5 --compile
    run_8() { $MPIRUN -np 8 "$SHLM" train jobs/llama2-7b.ini --set data.train=$T/rand.bin --set train.steps=6 \
        --set train.micro_batch=2 --set train.global_batch=16 --set fsdp.param_dtype=bf16 \
        --set fsdp.reduce_dtype=fp32 --set log.run_dir=$T/7b-8-mb2 > "$OUT/7b-8-mb2.log" 2>&1; }
    run_8; echo "shardlm 7b 8 GPUs mb 2 rc=$?"; tail -3 "$OUT/7b-8-mb2.log"
    # eight1's 7b-scaling.csv and nccl-nb-8.json, copied into .gpu/ before this call
    [ -f .gpu/7b-scaling.csv ] && cal7=".gpu/7b-scaling.csv" || cal7=""
    [ -f .gpu/nccl-nb-8.json ] && comm8=".gpu/nccl-nb-8.json" || comm8=""
    "$BIN/perf_model" ${cal7:+--calibrate $cal7} --calibrate "$OUT/13b-FULL_SHARD-scaling.csv" \
        ${comm8:+--comm-json $comm8} --mem-gbs 3400 --overlap 0.6 --max-error 10 2>&1 |
        tee "$OUT/perf_model-8.txt" | tail -20
}

case "$phase" in
sm90) sm90_phase ;;
matrix) matrix_phase ;;
ratio) ratio_phase ;;
overhead) overhead_phase ;;
gbatch) gbatch_phase ;;
cers) cers_phase ;;
checkgpu) checkgpu_phase ;;
eight1) eight1_phase ;;
eight2) eight2_phase ;;
small) small_phase ;;
final) final_phase ;;
quick) quick_phase ;;
scaling) scaling_phase ;;
test) test_phase ;;
bench) bench_phase ;;
anchor) anchor_phase ;;
all) test_phase; bench_phase; anchor_phase ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
