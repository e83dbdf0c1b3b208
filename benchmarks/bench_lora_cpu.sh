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
# betas (0.9, 0.95), eps 1e-8, weight decay 0.1, gradient norm clipped at 1.0 (shardlm's
# defaults, which PEFT's side sets the same).
#   shardlm LoRA      `lora.rank=16 lora.alpha=32 lora.targets=all`: its own step time
#                     (metrics.jsonl step_ms)
#   shardlm full      the same job without [lora]: every parameter trains
#   transformers +    get_peft_model(LoraConfig(the same)), torch.optim.AdamW over the
#   PEFT              adapters, each step timed around forward, loss, backward, clip,
#                     optimizer step and zero_grad
# tokens/s: MICRO·SEQ ÷ the mean step time of steps 3..STEPS (the first two are warm-up).
# Exits non-zero when a side fails or when the first step's loss of shardlm's LoRA run or
# of its full fine-tune differs from PEFT's by more than 1e-4 relative (B is zero at
# initialisation, so all three are the base's loss on the same first batch).
#   [STEPS=N] [MICRO=B] [SEQ=T] [THREADS=T] benchmarks/bench_lora_cpu.sh [SHARDLM]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/tests/pyenv.sh"
shlm=${1:-$here/shardlm}
steps=${STEPS:-8}
micro=${MICRO:-1}
seq=${SEQ:-256}
threads=${THREADS:-$(nproc)}
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
    "$steps steps (mean of $((warm + 1))-$steps), LoRA r 16 alpha 32 on q k v o gate up down, AdamW lr $lr, clip 1.0"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"

# shardlm NAME ARGS...: trains the job into $work/NAME; sets s_loss (step 1) and s_ms (the
# mean step_ms after the warm-up)
shardlm() {
    name=$1
    shift
    "$shlm" train "$work/job.ini" --set "log.run_dir=$work/$name" "$@" >"$work/$name.log" 2>&1 ||
        { echo "# $name: shardlm failed:"; tail -n 3 "$work/$name.log"; exit 1; }
    set -- $(awk -v warm=$warm '
        { step = $0; sub(/.*"step": /, "", step); sub(/,.*/, "", step)
          loss = $0; sub(/.*"loss": /, "", loss); sub(/,.*/, "", loss)
          ms = $0; sub(/.*"step_ms": /, "", ms); sub(/,.*/, "", ms)
          if (step == 1) l1 = loss
          if (step > warm) { sum += ms; n++ } }
        END { if (n) printf "%s %.3f\n", l1, sum / n }' "$work/$name/metrics.jsonl")
    [ $# -eq 2 ] || { echo "# $name: no steps in $work/$name/metrics.jsonl"; exit 1; }
    s_loss=$1 s_ms=$2
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
# every adapter is a matrix: all decay, as shardlm decays its adapters
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

reference >"$work/ref.txt" 2>"$work/ref.err" || { echo "# transformers + PEFT failed:"; tail -n 3 "$work/ref.err"; exit 1; }
set -- $(awk -v warm=$warm '$1 == "step" { if ($2 == 1) l1 = $3; if ($2 > warm) { sum += $4; n++ } }
    END { if (n) printf "%s %.3f\n", l1, sum / n }' "$work/ref.txt")
[ $# -eq 2 ] || { echo "# transformers + PEFT: no steps"; exit 1; }
r_loss=$1 r_ms=$2
shardlm lora --set lora.rank=16 --set lora.alpha=32 --set lora.targets=all --set lora.dropout=0
l_loss=$s_loss l_ms=$s_ms
shardlm full
f_loss=$s_loss f_ms=$s_ms

tps() { echo "$micro * $seq * 1000 / $1" | bc -l; }
printf '# %-30s %10s %10s %10s %14s\n' system tokens/s step_ms ratio "step 1 loss"
printf '  %-30s %10.1f %10.1f %10s %14s\n' "shardlm LoRA" "$(tps "$l_ms")" "$l_ms" "" "$l_loss"
printf '  %-30s %10.1f %10.1f %10.2f %14s\n' "shardlm full fine-tune" "$(tps "$f_ms")" "$f_ms" \
    "$(echo "$f_ms / $l_ms" | bc -l)" "$f_loss"
printf '  %-30s %10.1f %10.1f %10.2f %14s\n' "transformers + PEFT" "$(tps "$r_ms")" "$r_ms" \
    "$(echo "$r_ms / $l_ms" | bc -l)" "$r_loss"
echo "# ratio: shardlm LoRA's tokens/s over the row's; step 1 loss: the base's on the first batch"
status=0
for c in "LoRA $l_loss" "full fine-tune $f_loss"; do
    d=$(awk -v a="${c##* }" -v b="$r_loss" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; printf "%.2e", d }')
    if awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }'; then
        echo "# WRONG: shardlm ${c% *}'s first loss differs from PEFT's by $d relative (over 1e-4)"
        status=1
    else
        echo "# ok: shardlm ${c% *}'s first loss is PEFT's within $d relative"
    fi
done
exit $status
