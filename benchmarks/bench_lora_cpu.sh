#!/bin/sh
# LoRA fine-tuning speed on the CPU: `shardlm train` with LoRA against Hugging Face
# transformers + PEFT in the same run, on the same model, token windows and threads:
# SmolLM2-135M-Instruct (examples/smollm2/get-model.sh; tests/pyenv.sh finds it, and PEFT
# in $SHLM_PEFT), fp32, one rank, THREADS threads each (default: every core; shardlm
# runtime.threads, torch.set_num_threads). The data: jobs/data/shakespeare-train.txt in
# SmolLM2's tokens (`shardlm data prepare --tokenizer MODEL`), unshuffled, so step s trains
# windows s·MICRO .. s·MICRO+MICRO-1 of SEQ+1 tokens every SEQ tokens (docs/data.md) on both
# sides. STEPS steps (default 8) of MICRO sequences (default 1) of SEQ tokens (default 256);
# LoRA rank 16, alpha 32, dropout 0 on all seven projections; AdamW lr 2e-4 constant,
# betas (0.9, 0.95), eps 1e-8, weight decay 0.1 (shardlm decays its adapters: every one is a
# matrix), the gradient norm of the trained parameters clipped at 1.0, on both sides.
#   shardlm LoRA      `lora.rank=16 lora.alpha=32 lora.targets=all`: its own step time
#                     (metrics.jsonl step_ms)
#   shardlm full      the same job without [lora]: every parameter trains
#   transformers +    get_peft_model(LoraConfig(the same)), torch.optim.AdamW over the
#   PEFT              adapters, each step timed around forward, loss, backward, clip,
#                     optimizer step and zero_grad
# tokens/s: MICRO·SEQ ÷ the mean step time of steps 3..STEPS (the first two are warm-up);
# each system's step times are printed.
# Exits non-zero when a side fails or when the first step's loss of shardlm's LoRA run or
# of its full fine-tune differs from PEFT's by more than 1e-4 relative (B is zero at
# initialisation, so all three are the base's loss on the same first batch).
# ROUNDS=R runs the three R times in turn (shardlm LoRA, PEFT, shardlm full) and averages
# every round's steps, so a change of the machine's load falls on all three.
#   [STEPS=N] [MICRO=B] [SEQ=T] [THREADS=T] [ROUNDS=R] benchmarks/bench_lora_cpu.sh [SHARDLM]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/tests/pyenv.sh"
shlm=${1:-$here/shardlm}
steps=${STEPS:-8}
micro=${MICRO:-1}
seq=${SEQ:-256}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-1}
warm=2
lr=2e-4
model=$SHLM_SMOLLM2
shlm_python torch transformers >/dev/null || { shlm_python torch transformers; exit 77; }
[ -d "$SHLM_PEFT/peft" ] || { echo "no peft in $SHLM_PEFT (tests/setup_pyenv.sh installs it)"; exit 77; }
[ -f "$model/model.safetensors" ] || { echo "no $model (examples/smollm2/get-model.sh $model)"; exit 77; }
[ "$steps" -gt "$warm" ] || { echo "STEPS=$steps: need more than the $warm warm-up steps"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/benchlora.XXXXXX")
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1

"$shlm" data prepare --tokenizer "$model" "$here/jobs/data/shakespeare-train.txt" "$work/train.bin" \
    >"$work/prepare.log" 2>&1 || { echo "# data prepare failed:"; tail -n 3 "$work/prepare.log"; exit 1; }
cat >"$work/job.ini" <<EOF
[model]
init_from = $model
[train]
seq_len = $seq
micro_batch = $micro
steps = $steps
lr = $lr
min_lr = $lr
warmup_steps = 0
weight_decay = 0.1
grad_clip = 1.0
[data]
train = $work/train.bin
shuffle = false
[runtime]
backend = cpu
threads = $threads
EOF

echo "# LoRA fine-tuning: SmolLM2-135M-Instruct, fp32, CPU, 1 rank, $threads threads, seq $seq, micro-batch $micro," \
    "$steps steps (mean of steps $((warm + 1))-$steps, $rounds round(s)), LoRA r 16 alpha 32 on q k v o gate up down, AdamW lr $lr, clip 1.0"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"

# Each system appends the step times after the warm-up to $work/NAME.ms (one a line) and
# its first step's loss to $work/NAME.loss, once per round.
# shardlm NAME ARGS...: trains the job into $work/NAME.ROUND
shardlm() {
    name=$1
    shift
    run=$work/$name.$round
    "$shlm" train "$work/job.ini" --set "log.run_dir=$run" "$@" >"$run.log" 2>&1 ||
        { echo "# $name: shardlm failed:"; tail -n 3 "$run.log"; exit 1; }
    sed 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*"step_ms": \([^,]*\),.*/step \1 \2 \3/' \
        "$run/metrics.jsonl" >"$run.steps"
    collect "$name" "$run.steps"
}

# collect NAME FILE: FILE's lines "step N LOSS MS" into $work/NAME.ms and $work/NAME.loss
collect() {
    awk -v warm=$warm -v ms="$work/$1.ms" -v loss="$work/$1.loss" '$1 == "step" {
        if ($2 == 1) print $3 >>loss
        if ($2 > warm) { print $4 >>ms; n++ } } END { exit n == 0 }' "$2" ||
        { echo "# $1: no steps after the warm-up in $2"; exit 1; }
}

reference() { PYTHONPATH="$SHLM_PEFT${PYTHONPATH:+:$PYTHONPATH}" "$SHLM_PY" - "$here" "$model" \
    "$work/train.bin" "$seq" "$micro" "$steps" "$threads" "$lr" <<'EOF'
import sys, time
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
here, model, tokens = sys.argv[1:4]
T, B, steps, threads = map(int, sys.argv[4:8])
lr = float(sys.argv[8])
sys.path.insert(0, here + "/tests")
import sft_data
torch.set_num_threads(threads)
torch.manual_seed(0)
_, ids, trained, _ = sft_data.read(tokens)
if (steps * B) * T + 1 > len(ids):
    sys.exit(f"{tokens}: {len(ids)} tokens, fewer than {steps} steps of {B} windows of {T + 1}")
m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
peft = get_peft_model(m, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"]))
peft.train()
params = [p for p in peft.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
for s in range(steps):
    # window i: tokens i*T .. i*T+T; a target whose trained bit is 0 is ignored
    w = torch.tensor([ids[i * T:i * T + T + 1] for i in range(s * B, s * B + B)])
    keep = torch.tensor([trained[i * T + 1:i * T + T + 1] for i in range(s * B, s * B + B)])
    x, y = w[:, :-1], w[:, 1:].masked_fill(keep == 0, -100)
    t0 = time.perf_counter()
    logits = peft(input_ids=x).logits
    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=-100)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss = loss.item()
    ms = (time.perf_counter() - t0) * 1000
    print(f"step {s + 1} {loss:.9g} {ms:.3f}", flush=True)
EOF
}

round=1
while [ "$round" -le "$rounds" ]; do
    shardlm lora --set lora.rank=16 --set lora.alpha=32 --set lora.targets=all --set lora.dropout=0
    reference >"$work/peft.$round.txt" 2>"$work/peft.$round.err" ||
        { echo "# transformers + PEFT failed:"; tail -n 3 "$work/peft.$round.err"; exit 1; }
    collect peft "$work/peft.$round.txt"
    shardlm full
    round=$((round + 1))
done
mean() { awk '{ s += $1; n++ } END { printf "%.3f", s / n }' "$work/$1.ms"; }
l_ms=$(mean lora) f_ms=$(mean full) r_ms=$(mean peft)

tps() { echo "$micro * $seq * 1000 / $1" | bc -l; }
printf '# %-30s %10s %10s %10s %14s\n' system tokens/s step_ms ratio "step 1 loss"
printf '  %-30s %10.1f %10.1f %10s %14s\n' "shardlm LoRA" "$(tps "$l_ms")" "$l_ms" "" \
    "$(head -n 1 "$work/lora.loss")"
printf '  %-30s %10.1f %10.1f %10.2f %14s\n' "shardlm full fine-tune" "$(tps "$f_ms")" "$f_ms" \
    "$(echo "$f_ms / $l_ms" | bc -l)" "$(head -n 1 "$work/full.loss")"
printf '  %-30s %10.1f %10.1f %10.2f %14s\n' "transformers + PEFT" "$(tps "$r_ms")" "$r_ms" \
    "$(echo "$r_ms / $l_ms" | bc -l)" "$(head -n 1 "$work/peft.loss")"
echo "# ratio: shardlm LoRA's tokens/s over the row's; step 1 loss: the base's on the first batch"
for name in lora full peft; do
    echo "# $name step ms: $(paste -s -d ' ' "$work/$name.ms")"
done
status=0
for name in lora full; do
    # the largest relative difference from PEFT's first loss over the rounds
    d=$(paste "$work/$name.loss" "$work/peft.loss" | awk '{ d = ($1 - $2) / $2; if (d < 0) d = -d
        if (d > m) m = d } END { printf "%.2e", m }')
    if awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }'; then
        echo "# WRONG: shardlm $name's first loss differs from PEFT's by $d relative (over 1e-4)"
        status=1
    else
        echo "# ok: shardlm $name's first loss is PEFT's within $d relative"
    fi
done
exit $status
