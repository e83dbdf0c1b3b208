#!/usr/bin/env bash
# The GPU benchmark suite: shardlm's GPU tests, kernels, collectives and training steps,
# each training step beside PyTorch FSDP2 (benchmarks/anchor/torch_fsdp2.py) at the same
# shape in the same command, on however many GPUs are visible. Every figure in
# benchmarks/RESULTS.md names the phase that measures it.
#
#   bash benchmarks/gpu_suite.sh [options] PHASE...
#
# Phases (minutes on 2 H200s; one command on a lent machine may run 10):
#   tests          tests/gpu/check_gpu.sh (what `make check-gpu` runs) on the binaries (~4)
#   record         Llama-2-7B, seq 4096, FULL_SHARD, no activation checkpointing, bf16
#                  params / fp32 reduce: shardlm, PyTorch eager, PyTorch torch.compile per
#                  layer, and the ratios (~5). Micro-batch 2 on 2 or more GPUs; 1 on one GPU,
#                  where PyTorch at micro-batch 2 needs more than an H200's 141 GB (its
#                  fp32 weights, gradients and AdamW moments alone are 108 GB) while both
#                  fit at micro-batch 1 without checkpointing
#   shard-grad-op  the same pair with SHARD_GRAD_OP (PyTorch: reshard_after_forward=False),
#                  micro-batch 2; 2 or more GPUs (~5)
#   small          the TinyLlama-1.1B shape, seq 2048, micro-batch 8, FULL_SHARD: shardlm,
#                  PyTorch eager and torch.compile (~3)
#   kernels        bench_kernels (every op at 7B shapes, attention causal and with
#                  documents of 512 tokens, against the matmul and copy ceilings it measures)
#                  and PyTorch's ceilings (benchmarks/anchor/ceilings.py) (~2)
#   comm           bench_comm --backend nccl beside torch.distributed (anchor/nccl_busbw.py):
#                  all-gather, reduce-scatter, all-reduce bus bandwidth, 1 MiB-1 GiB; 2+ GPUs (~1)
#   scaling        benchmarks/strong_scaling.sh over 1, 2, 4, ... visible GPUs at one global
#                  batch (default 2 x GPUs, micro-batch 2, 7B), median of --repeat runs (~6)
#   weak-scaling   the same driver with one micro-batch of 1 per GPU per step (~2)
#   fp8            the record's shape and micro-batch per matmul recipe: shardlm bf16,
#                  fp8-tensorwise and fp8-rowwise (train.matmul), PyTorch torch.compile bf16
#                  and torchao float8 tensorwise and rowwise (anchor --float8), and a table
#                  of each against shardlm bf16 (~9 on one GPU). torchao comes from
#                  $TORCHAO_WHEEL when python lacks it (eager with --cpu)
#   fp8-variants   the fp8 phase's shape, shardlm only: bf16, fp8-tensorwise, and
#                  fp8-tensorwise with train.fp8_fast_accum = false (the forward products
#                  summed in fp32) and with fsdp.fp8_all_gather = false (the weights
#                  gathered in bf16 and quantized in each product), each against bf16 (~4
#                  on one GPU)
#   fp8-accum      the fp8 phase's shape with 16 micro-batches accumulated a step (the
#                  optimizer amortized as in multi-GPU runs of a large global batch):
#                  shardlm bf16 and fp8-tensorwise (~3 on one GPU)
#   lora           LoRA r 16 on the seven projections of every block at the record's shape:
#                  shardlm's full fine-tune and LoRA (lora.rank 16, alpha 32, bf16 frozen
#                  base), PyTorch FSDP2 + Hugging Face PEFT eager and torch.compile
#                  (anchor --lora 16; PEFT and accelerate from .gpu/pylib when PYTHON lacks
#                  them) (~5 on one GPU)
#   generate       benchmarks/bench_generate_gpu.sh: 7B-shaped greedy decode with the KV
#                  cache against the decode bound and PyTorch torch.compile; one GPU (~3)
#   ckpt-async     benchmarks/bench_ckpt_async.sh on one GPU: Llama-2-7B's width with 8 of
#                  its 32 blocks (a 23 GB checkpoint: two fit the 64 GB disk of the machines
#                  lent, where the 7B's 81 GB does not), seq 4096, 8 sequences a step, one
#                  save at step 30 of 60: its cost in steps saved synchronously and in the
#                  background (~5)
#   all            every phase above, in that order
# Options:
#   --gpus N          use GPUs 0..N-1 (default: every visible GPU)
#   --dry-run         print every command, run none (no GPU needed; --gpus N sets the count)
#   --cpu             the training pairs at the tiny shape on the CPU backend and the anchors'
#                     CPU modes, on --gpus N ranks (default 2): checks the suite, measures nothing
#   --repeat K        scaling phases: runs per point, the median kept (default 3)
#   --global-batch G  scaling: sequences per optimizer step (default 2 x GPUs)
#   --run-timeout S   a run that takes longer fails (default 600)
#   --float8-all-gather  fp8: torchao's tensorwise run all-gathers its weights in float8
# Environment: SHLM_BIN  a directory holding shardlm, test_ops, attn_sm90_check, nvml_fields,
#                        attn_bwd_sm90_check, bench_kernels, bench_comm, flat or as a build
#                        tree (default .gpu/bin; with --cpu the build this script is in)
#              OUT       logs, run directories and results.jsonl (default /tmp/shlm-suite)
#              PYTHON    a python3 with torch and transformers (default python3)
#              MPIRUN    the launcher (default "mpirun --bind-to none": ranks free to use
#                        every core, as torchrun leaves its processes)
#              TORCHAO_WHEEL  torchao's wheel (default .gpu/wheels/torchao-*.whl), installed
#                        with --no-deps into $TMPDIR/shlm-suite-work/torchao for the fp8
#                        phase when PYTHON cannot import torchao.float8
# The GPU machine's toolchain (carried binaries and libraries) is benchmarks/gpu/README.md.
# GPU settings are never changed: nvidia-smi is only queried. NCCL_NVLS_ENABLE=0 for every
# process. Prints a table per kind of result last; exit status 1 when any run or check failed.
set -u

here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
die() { echo "gpu_suite: error: $*" >&2; exit 2; }

gpus="" dry=0 cpu=0 repeat=3 scal_gb="" run_timeout=600 phases="" f8_gather=0
while [ $# -gt 0 ]; do
    case $1 in
    --gpus) gpus=${2:?--gpus needs N}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --cpu) cpu=1; shift ;;
    --repeat) repeat=${2:?--repeat needs K}; shift 2 ;;
    --global-batch) scal_gb=${2:?--global-batch needs G}; shift 2 ;;
    --run-timeout) run_timeout=${2:?--run-timeout needs S}; shift 2 ;;
    --float8-all-gather) f8_gather=1; shift ;;
    -h | --help) sed -n '2,/^# process/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) phases="$phases $1"; shift ;;
    esac
done
[ -n "$phases" ] || die "no phase given (tests record shard-grad-op small kernels comm scaling weak-scaling fp8 fp8-variants fp8-accum lora generate ckpt-async all; see --help)"
for n in ${gpus:-1} "$repeat" ${scal_gb:-1} "$run_timeout"; do
    case $n in '' | *[!0-9]* | 0) die "not a whole number >= 1: '$n'" ;; esac
done
all_phases="tests record shard-grad-op small kernels comm scaling weak-scaling fp8 fp8-variants fp8-accum lora generate ckpt-async"
expanded=""
for p in $phases; do
    case " $all_phases all " in *" $p "*) ;; *) die "unknown phase '$p' (one of: $all_phases all)" ;; esac
    [ "$p" = all ] && expanded="$expanded $all_phases" || expanded="$expanded $p"
done

export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/shlm-suite}
PY=${PYTHON:-python3}
MPIRUN=${MPIRUN:-mpirun --bind-to none}
export MPIRUN
results=$OUT/results.jsonl
runs=$OUT/runs
work=${TMPDIR:-/tmp}/shlm-suite-work
if [ "$cpu" = 1 ]; then
    G=${gpus:-2}
    BIN=${SHLM_BIN:-$(dirname "${SHLM:-$src/shardlm}")}
elif [ -n "$gpus" ]; then
    G=$gpus
    BIN=${SHLM_BIN:-$src/.gpu/bin}
else
    G=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    BIN=${SHLM_BIN:-$src/.gpu/bin}
    if [ "$G" -lt 1 ]; then
        [ "$dry" = 1 ] || die "no GPU visible (nvidia-smi -L lists none); --dry-run --gpus N prints the commands for N"
        G=1
    fi
fi
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$cpu" = 1 ] || [ "$dry" = 1 ] || [ "$G" -le "$visible" ] || die "--gpus $G but $visible GPU(s) visible"

# ---- helpers ----
failed=0
say() { echo "$*"; }
# run LOG CMD...: prints the command, runs it with its output in LOG (not in --dry-run)
run() {
    local log=$1
    shift
    echo "+ $*"
    [ "$dry" = 1 ] && return 0
    "$@" > "$log" 2>&1
}
# bin NAME: the path of a binary in $BIN, flat or a build tree
bin() {
    local d
    for d in "$BIN" "$BIN/tests" "$BIN/tests/gpu" "$BIN/benchmarks"; do
        [ -x "$d/$1" ] && { echo "$d/$1"; return 0; }
    done
    [ "$dry" = 1 ] && { echo "$BIN/$1"; return 0; }
    echo "gpu_suite: error: no $1 in $BIN (benchmarks/gpu/stage.sh fills .gpu/bin; SHLM_BIN=BUILD_DIR takes a build)" >&2
    return 1
}
table() { "$PY" "$here/suite_table.py" "$@" || failed=1; }
need_python() {
    [ "$dry" = 1 ] && return 0
    "$PY" -c 'import torch, transformers' 2>/dev/null && return 0
    echo "gpu_suite: error: $PY cannot import torch and transformers (set PYTHON)" >&2
    failed=1
    return 1
}
# torchao for the anchor's --float8: PYTHON's own, else its wheel installed (no
# dependencies) into the work directory, which PYTHONPATH then names
need_torchao() {
    [ "$dry" = 0 ] && "$PY" -c 'import torchao.float8' 2>/dev/null && return 0
    local whl=${TORCHAO_WHEEL:-} lib=$work/torchao
    [ -n "$whl" ] || whl=$(ls "$src"/.gpu/wheels/torchao-*.whl 2>/dev/null | tail -n 1)
    [ -n "$whl" ] || whl="$src/.gpu/wheels/torchao-VERSION.whl"
    echo "+ $PY -m pip install --no-deps --no-index --target $lib $whl; PYTHONPATH=$lib"
    export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}"
    [ "$dry" = 1 ] && return 0
    if [ ! -f "$whl" ]; then
        echo "gpu_suite: error: $PY cannot import torchao.float8 and there is no wheel at $whl (pip download --no-deps torchao -d .gpu/wheels, or set TORCHAO_WHEEL)" >&2
        return 1
    fi
    rm -rf "$lib" && mkdir -p "$work" &&
        "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$lib" "$whl" \
            > "$OUT/torchao-install.log" 2>&1 && "$PY" -c 'import torchao.float8' 2>> "$OUT/torchao-install.log" ||
        { echo "gpu_suite: error: installing $whl failed: $(tail -n 1 "$OUT/torchao-install.log")" >&2; return 1; }
}
# the random token file every training run reads (vocab of the shape, 4M tokens)
tokens() { # VOCAB -> path
    local f=$work/random-$1.bin
    if [ "$dry" = 0 ] && [ ! -s "$f" ]; then
        mkdir -p "$work" && "$SHLM" data random --vocab "$1" --tokens 4000000 "$f" > /dev/null ||
            { echo "gpu_suite: error: shardlm data random failed" >&2; return 1; }
    fi
    echo "$f"
}
# nvidia-smi's clocks and power once a second while a phase runs (a query: changes nothing)
smi_pid=""
smi_start() {
    [ "$dry" = 1 ] || [ "$cpu" = 1 ] && return 0
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,memory.used \
        --format=csv,noheader,nounits -lms 1000 > "$OUT/smi-$1.csv" 2>/dev/null &
    smi_pid=$!
}
smi_stop() {
    [ -n "$smi_pid" ] || return 0
    kill "$smi_pid" 2>/dev/null
    wait "$smi_pid" 2>/dev/null
    smi_pid=""
    # busy samples (above a third of the largest power seen): mean SM clock and power per GPU
    awk -F', *' '{ if ($4 + 0 > top) top = $4 + 0; t[NR] = $2; c[NR] = $3; p[NR] = $4; m[NR] = $5 }
        END { for (i = 1; i <= NR; i++) if (p[i] > top / 3) { n[t[i]]++; sc[t[i]] += c[i]; sp[t[i]] += p[i] }
              for (g in n) printf "  gpu %s: %d busy samples, mean SM clock %.0f MHz, mean power %.0f W\n",
                  g, n[g], sc[g] / n[g], sp[g] / n[g] }' "$OUT/smi-$1.csv" | sort | tee "$OUT/smi-$1.txt"
}

# ---- one training run on each side ----
# shape NAME: sets job, model, seq, vocab and the micro-batch of a phase's pair
shape() {
    if [ "$cpu" = 1 ]; then
        job=$src/jobs/tiny.ini model=tiny seq=128 vocab=256 mb=${2:-2}
        return
    fi
    case $1 in
    7b) job=$src/jobs/llama2-7b.ini model=llama2-7b seq=4096 vocab=32000 mb=$2 ;;
    1b) job=$src/jobs/tinyllama-1b.ini model=tinyllama-1b seq=2048 vocab=32000 mb=$2 ;;
    esac
}
common_sets() { # the job keys every shardlm run of the suite sets
    printf '%s\n' --set data.val= --set train.eval_every=0 --set train.sample_tokens=0 \
        --set fsdp.param_dtype=bf16 --set fsdp.reduce_dtype=fp32 --set log.every=1
    [ "$cpu" = 1 ] && printf '%s\n' --set runtime.backend=cpu --set runtime.threads=1
}
# the steps of a shardlm run and the micro-batches it accumulates a step (phases may set
# them with local: bash's scoping hands them to shardlm_run)
suite_steps=6 suite_accum=1
shardlm_run() { # PHASE PAIR STRATEGY AC [MATMUL [VARIANT KEY=VALUE...]]
    # MATMUL sets train.matmul (unset or empty: the default, bf16); VARIANT names what the
    # KEY=VALUE job keys change (the run's name and its row's recipe: MATMUL+VARIANT)
    local phase=$1 pair=$2 st=$3 ac=$4 matmul=${5:-} variant=${6:-} data kv
    shift $(($# < 6 ? $# : 6))
    local name=$phase-$pair-shardlm${matmul:+-$matmul}${variant:+-$variant}
    data=$(tokens "$vocab") || { failed=1; return; }
    local -a sets
    mapfile -t sets < <(common_sets)
    [ -n "$matmul" ] && sets+=(--set train.matmul="$matmul")
    for kv in "$@"; do sets+=(--set "$kv"); done
    rm -rf "${runs:?}/$name"
    run "$runs/$name.log" env SHLM_TEST_TIMEOUT="$run_timeout" sh "$src/tests/mpi_test.sh" "$G" \
        "$SHLM" train "$job" --set data.train="$data" --set train.steps=$suite_steps \
        --set train.warmup_steps=1 --set train.micro_batch="$mb" \
        --set train.global_batch=$((mb * G * suite_accum)) \
        --set fsdp.strategy="$st" --set fsdp.activation_checkpointing="$ac" "${sets[@]}" \
        --set log.run_dir="$runs/$name"
    local rc=$?
    [ "$dry" = 1 ] && return
    [ $rc = 0 ] || echo "  shardlm exited $rc; log $runs/$name.log"
    # steps 3..: the first two build cuBLASLt plans and NCCL's channels
    table shardlm "$runs/$name/metrics.jsonl" --warmup 2 --out "$results" --phase "$phase" \
        --pair "$pair" --system shardlm --model "$model" --seq "$seq" --gpus "$G" --strategy "$st" \
        --ac "$ac" --mb "$mb" --matmul "${matmul:-bf16}${variant:++$variant}" --log "$runs/$name.log"
}
anchor_lora=0 # a phase's local: the anchor's --lora rank (0: full fine-tune)
anchor_run() { # PHASE PAIR STRATEGY AC eager|compile [FLOAT8]: FLOAT8 the anchor's --float8 recipe
    local phase=$1 pair=$2 st=$3 ac=$4 mode=$5 f8=${6:-} name=$1-$2-torch-$5${6:+-float8-$6}
    local -a extra=()
    [ "$anchor_lora" -gt 0 ] && name=$name-lora$anchor_lora
    if [ "$cpu" = 1 ]; then
        [ "$mode" = compile ] && { echo "  (torch.compile left out with --cpu: minutes of CPU compilation)"; return; }
        extra=(--device cpu --warmup 2 --steps 3)
    else
        extra=(--warmup 3 --steps 5)
    fi
    [ "$mode" = compile ] && extra+=(--compile)
    local label=bf16
    [ -n "$f8" ] && extra+=(--float8 "$f8") && label="float8 $f8"
    [ "$anchor_lora" -gt 0 ] && extra+=(--lora "$anchor_lora") && label="lora r$anchor_lora"
    [ "$f8" = tensorwise ] && [ "$f8_gather" = 1 ] && extra+=(--float8-all-gather) &&
        label="$label, fp8 all-gather"
    rm -f "$runs/$name.json"
    run "$runs/$name.log" timeout -k 10 "$run_timeout" "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node="$G" "$here/anchor/torch_fsdp2.py" --model "$model" --seq "$seq" \
        --micro-batch "$mb" --strategy "$st" --ac "$ac" "${extra[@]}" --name "$name" \
        --json "$runs/$name.json"
    local rc=$?
    [ "$dry" = 1 ] && return
    [ $rc = 0 ] || echo "  anchor exited $rc; log $runs/$name.log"
    table anchor "$runs/$name.json" --out "$results" --phase "$phase" --pair "$pair" \
        --system "torch $mode" --model "$model" --seq "$seq" --gpus "$G" --strategy "$st" --ac "$ac" \
        --mb "$mb" --matmul "$label" --log "$runs/$name.log"
}
pair() { # PHASE PAIR STRATEGY AC SYSTEMS...: shardlm, then each PyTorch mode
    local phase=$1 pair=$2 st=$3 ac=$4
    shift 4
    smi_start "$phase"
    shardlm_run "$phase" "$pair" "$st" "$ac"
    need_python && for m in "$@"; do anchor_run "$phase" "$pair" "$st" "$ac" "$m"; done
    smi_stop "$phase"
}

# ---- phases ----
phase_tests() {
    [ "$cpu" = 1 ] && { say "tests: needs GPUs (--cpu): left out"; return; }
    local b t
    # check_gpu.sh reads a build tree: the binaries' own, or links laid out as one
    if [ -x "$BIN/tests/test_ops" ]; then
        b=$BIN
    else
        b=$work/check-gpu-build
        say "+ mkdir -p $b/tests/gpu && ln -sf $BIN/test_ops $b/tests/ && ln -sf $BIN/{attn_sm90_check,attn_bwd_sm90_check,nvml_fields} $b/tests/gpu/"
        if [ "$dry" = 0 ]; then
            mkdir -p "$b/tests/gpu"
            t=$(bin test_ops) || { failed=1; return; }
            ln -sf "$t" "$b/tests/"
            for t in attn_sm90_check attn_bwd_sm90_check nvml_fields; do
                t=$(bin "$t") || { failed=1; return; }
                ln -sf "$t" "$b/tests/gpu/"
            done
        fi
    fi
    say "+ (cd $OUT && BUILDDIR=$b SHLM=$SHLM SHLM_SRCDIR=$src MPIRUN='$MPIRUN' sh $src/tests/gpu/check_gpu.sh)"
    [ "$dry" = 1 ] && return
    (cd "$OUT" && BUILDDIR=$b SHLM=$SHLM SHLM_SRCDIR=$src sh "$src/tests/gpu/check_gpu.sh") |
        tee "$OUT/check-gpu.txt"
    table tests "$OUT/check-gpu.txt" --out "$results"
}
phase_record() {
    shape 7b $([ "$G" -ge 2 ] && echo 2 || echo 1)
    pair record "$model" FULL_SHARD none eager compile
}
phase_shard_grad_op() {
    [ "$G" -ge 2 ] || { say "shard-grad-op: needs 2 or more GPUs ($G): left out"; return; }
    shape 7b 2
    pair shard-grad-op "$model" SHARD_GRAD_OP none eager compile
}
phase_small() {
    shape 1b 8
    pair small "$model" FULL_SHARD none eager compile
}
phase_lora() {
    shape 7b 1
    local anchor_lora=16 m
    smi_start lora
    shardlm_run lora "$model" FULL_SHARD none
    shardlm_run lora "$model" FULL_SHARD none "" lora16 lora.rank=16 lora.alpha=32 lora.targets=all
    if need_python; then
        "$PY" -c 'import peft' 2>/dev/null || [ ! -d "$src/.gpu/pylib" ] ||
            export PYTHONPATH="$src/.gpu/pylib${PYTHONPATH:+:$PYTHONPATH}"
        for m in eager compile; do anchor_run lora "$model" FULL_SHARD none "$m"; done
    fi
    smi_stop lora
}
phase_generate() {
    [ "$cpu" = 1 ] && { say "generate: needs a GPU (--cpu): left out"; return; }
    say "+ TOKENS=256 PYTHON=$PY sh $src/benchmarks/bench_generate_gpu.sh $SHLM"
    [ "$dry" = 1 ] && return
    TOKENS=256 PYTHON=$PY sh "$src/benchmarks/bench_generate_gpu.sh" "$SHLM" | tee "$OUT/generate.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || failed=1
}
phase_ckpt_async() {
    [ "$cpu" = 1 ] && { say "ckpt-async: the GPU shape (--cpu): left out; the CPU figure is bench_ckpt_async.sh's default"; return; }
    local data cmd
    data=$(tokens 32000) || { failed=1; return; }
    cmd="sh $src/benchmarks/bench_ckpt_async.sh --shardlm $SHLM --dir $work/ckpt-async --steps 60 --every 30
        --trials 1 --job $src/jobs/llama2-7b.ini --set data.train=$data --set model.n_layers=8
        --set train.seq_len=4096 --set train.global_batch=8 --set train.micro_batch=1
        --set fsdp.param_dtype=bf16 --set fsdp.reduce_dtype=fp32 --set train.warmup_steps=1
        --set runtime.threads=0 --set checkpoint.keep=1"
    say "+ $(echo $cmd)"
    [ "$dry" = 1 ] && return
    $cmd | tee "$OUT/ckpt-async.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || failed=1
}
phase_fp8() {
    shape 7b $([ "$G" -ge 2 ] && echo 2 || echo 1)
    local mode=compile m
    [ "$cpu" = 1 ] && { mode=eager; say "  (the PyTorch side eager with --cpu: minutes of CPU compilation otherwise)"; }
    smi_start fp8
    for m in "" fp8-tensorwise fp8-rowwise; do shardlm_run fp8 "$model" FULL_SHARD none "$m"; done
    if need_python; then
        need_torchao || failed=1 # the float8 runs then fail, each with torch_fsdp2's error line
        for m in "" tensorwise rowwise; do anchor_run fp8 "$model" FULL_SHARD none "$mode" "$m"; done
    fi
    smi_stop fp8
}
phase_fp8_variants() {
    shape 7b $([ "$G" -ge 2 ] && echo 2 || echo 1)
    smi_start fp8-variants
    shardlm_run fp8-variants "$model" FULL_SHARD none
    shardlm_run fp8-variants "$model" FULL_SHARD none fp8-tensorwise
    shardlm_run fp8-variants "$model" FULL_SHARD none fp8-tensorwise fp32_accum \
        train.fp8_fast_accum=false
    shardlm_run fp8-variants "$model" FULL_SHARD none fp8-tensorwise bf16_gather \
        fsdp.fp8_all_gather=false
    smi_stop fp8-variants
}
phase_fp8_accum() {
    shape 7b $([ "$G" -ge 2 ] && echo 2 || echo 1)
    local suite_accum=16 suite_steps=4
    smi_start fp8-accum
    shardlm_run fp8-accum "$model-ga16" FULL_SHARD none
    shardlm_run fp8-accum "$model-ga16" FULL_SHARD none fp8-tensorwise
    smi_stop fp8-accum
}
phase_kernels() {
    [ "$cpu" = 1 ] && { say "kernels: bench_kernels needs a GPU (--cpu): left out"; return; }
    local bk
    bk=$(bin bench_kernels) || { failed=1; return; }
    run "$OUT/bench_kernels.txt" "$bk"
    local rc=$?
    [ "$dry" = 1 ] || grep -v '^#' "$OUT/bench_kernels.txt"
    [ "$rc" = 0 ] || { echo "  bench_kernels exited $rc"; failed=1; }
    rm -f "$OUT/ceilings.jsonl"
    need_python && { run "$OUT/ceilings.txt" "$PY" "$here/anchor/ceilings.py" --json "$OUT/ceilings.jsonl" ||
        { echo "  ceilings.py failed; log $OUT/ceilings.txt"; failed=1; }; }
    [ "$dry" = 1 ] && return
    table kernels "$OUT/bench_kernels.txt" --torch "$OUT/ceilings.jsonl" --out "$results"
}
phase_comm() {
    [ "$G" -ge 2 ] || { say "comm: needs 2 or more GPUs ($G): left out"; return; }
    # sizes: FSDP units' (a 7B block is 202M parameters: 404 MB in bf16, 808 MB in fp32)
    local bc backend=nccl dev=cuda lo=1M hi=1G sizes=1M,4M,16M,64M,256M,1G
    [ "$cpu" = 1 ] && backend=mpi dev=cpu lo=64K hi=256K sizes=64K,256K
    bc=$(bin bench_comm) || { failed=1; return; }
    rm -f "$OUT/bench_comm.json" "$OUT/nccl_busbw.json"
    run "$OUT/bench_comm.txt" env SHLM_TEST_TIMEOUT="$run_timeout" sh "$src/tests/mpi_test.sh" "$G" \
        "$bc" --backend "$backend" -b "$lo" -e "$hi" -f 4 -n 20 -w 5 --nonblocking --json "$OUT/bench_comm.json" ||
        { echo "  bench_comm failed; log $OUT/bench_comm.txt"; failed=1; }
    need_python && run "$OUT/nccl_busbw.txt" timeout -k 10 "$run_timeout" "$PY" -m torch.distributed.run \
        --standalone --nproc-per-node="$G" "$here/anchor/nccl_busbw.py" --device "$dev" \
        --sizes "$sizes" --json "$OUT/nccl_busbw.json" ||
        { echo "  nccl_busbw failed; log $OUT/nccl_busbw.txt"; failed=1; }
    [ "$dry" = 1 ] && return
    table comm "$OUT/bench_comm.json" "$OUT/nccl_busbw.json" --out "$results"
}
scaling_ranks() { # 1, 2, 4, ... up to G, and G itself
    local n=1 list=""
    while [ "$n" -lt "$G" ]; do list="$list,$n"; n=$((n * 2)); done
    echo "${list#,},$G" | sed 's/^,//'
}
scaling_run() { # PHASE MB STRONG|WEAK GLOBAL
    local phase=$1 mbs=$2 mode=$3 gb=$4 data
    [ "$G" -ge 2 ] || { say "$phase: needs 2 or more GPUs ($G): left out"; return; }
    shape 7b "$mbs"
    data=$(tokens "$vocab") || { failed=1; return; }
    local -a sets weak=()
    mapfile -t sets < <(common_sets)
    [ "$mode" = weak ] && weak=(--weak)
    rm -rf "${OUT:?}/$phase"
    run "$OUT/$phase.txt" sh "$here/strong_scaling.sh" "${weak[@]}" --ranks "$(scaling_ranks)" \
        --strategies FULL_SHARD --steps 5 --warmup 2 --repeat "$repeat" --global-batch "$gb" \
        --timeout "$run_timeout" --shardlm "$SHLM" --out "$OUT/$phase" "$job" \
        --set data.train="$data" --set train.micro_batch="$mb" \
        --set fsdp.activation_checkpointing=none "${sets[@]}"
    local rc=$?
    [ "$dry" = 1 ] && return
    [ "$rc" = 0 ] || { echo "  strong_scaling.sh exited $rc; log $OUT/$phase.txt"; failed=1; }
    tail -n 8 "$OUT/$phase.txt"
    [ -s "$OUT/$phase/scaling.csv" ] && table scaling "$OUT/$phase/scaling.csv" --phase "$phase" --out "$results"
}
phase_scaling() { scaling_run scaling 2 strong "${scal_gb:-$((2 * G))}"; }
phase_weak_scaling() { scaling_run weak-scaling 1 weak 1; }

# ---- the command ----
mkdir -p "$OUT" "$runs" || die "cannot create $OUT"
[ "$dry" = 1 ] || : > "$results"
SHLM=$(bin shardlm) || exit 1
tree=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "unknown (no git)")
[ -n "$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)" ] && tree="$tree + changes"
build=$(sed -n 's/^commit //p' "$BIN/BUILD-INFO" 2>/dev/null)
{
    echo "# gpu_suite:$expanded; $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname); tree $tree; binaries ${build:-of an unrecorded build} ($BIN)"
    if [ "$cpu" = 1 ]; then
        echo "# --cpu: $G CPU ranks at the tiny shape ($(getconf _NPROCESSORS_ONLN) cores): checks the suite, measures nothing"
    elif [ "$dry" = 0 ]; then
        echo "# $G of $visible GPU(s): $(nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv,noheader -i 0 2>/dev/null)"
    fi
    [ "$dry" = 1 ] && echo "# --dry-run on $G GPU(s): the commands only"
    [ "$dry" = 1 ] || echo "# $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null || echo "no torch in $PY")"
} | tee "$OUT/suite-header.txt"
[ "$dry" = 1 ] || [ "$cpu" = 1 ] || nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
case $tree in "unknown"*) ;; *) [ -n "$build" ] && [ "${tree%% *}" != "$build" ] &&
    echo "# note: the binaries were built from $build, the tree is $tree" ;; esac
for p in $expanded; do
    t0=$SECONDS
    echo "== $p"
    "phase_${p//-/_}"
    echo "== $p: $((SECONDS - t0)) s"
done
[ "$dry" = 1 ] && exit 0
echo
cat "$OUT/suite-header.txt"
table print "$results"
exit $failed
