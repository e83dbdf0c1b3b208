#!/bin/sh
# Generation speed on the CPU: `shardlm generate` (the KV cache, one rank) against Hugging
# Face transformers' `generate` in the same run, on the same model, prompt and threads:
# SmolLM2-135M-Instruct (examples/smollm2/get-model.sh; tests/pyenv.sh finds it), fp32, a
# ChatML prompt of one user turn, greedy, TOKENS new tokens (default 128), THREADS threads
# each (default: every core; shardlm runtime.threads, torch.set_num_threads).
#   shardlm       its own timer: from before the first forward to the last token (the
#                 prompt's prefill and every step), weights already loaded
#   transformers  around model.generate(...) (prefill and steps; its DynamicCache), after a
#                 2-token warm-up call that the timing leaves out
# RECOMPUTE=1 adds a row for `generate --recompute` (every token recomputes its window: the
# path without a cache). Exits non-zero when shardlm's prompt ids or greedy tokens differ
# from transformers' (a benchmark that is wrong fails).
#   [TOKENS=N] [THREADS=T] [RECOMPUTE=1] benchmarks/bench_generate.sh [SHARDLM]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/tests/pyenv.sh"
shlm=${1:-$here/shardlm}
n_new=${TOKENS:-128}
threads=${THREADS:-$(nproc)}
model=$SHLM_SMOLLM2
prompt="Write a short story about a robot who learns to paint."
shlm_python torch transformers >/dev/null || { shlm_python torch transformers; exit 77; }
[ -f "$model/model.safetensors" ] || { echo "no $model (examples/smollm2/get-model.sh $model)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/benchgen.XXXXXX")
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1
cat >"$work/job.ini" <<EOF
[model]
init_from = $model
[runtime]
backend = cpu
threads = $threads
EOF
echo "# generate: SmolLM2-135M-Instruct, fp32, CPU, 1 rank, $threads threads, ChatML prompt, greedy, $n_new new tokens"
echo "# commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?), $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
printf '# %-34s %7s %9s %9s %7s\n' system tokens seconds tokens/s ratio
status=0

# shardlm NAME ARGS...: generate; sets s_n, s_s (tokens, seconds) and s_ids
shardlm() {
    name=$1
    shift
    "$shlm" generate "$work/job.ini" --chat --prompt "$prompt" --tokens "$n_new" --temperature 0 \
        --ids "$@" >"$work/$name.log" 2>&1 || { echo "# $name: shardlm failed:"; tail -n 3 "$work/$name.log"; exit 1; }
    set -- $(sed -n 's/^generate: \([0-9]*\) tokens (.*) in \([0-9.]*\) s, .*/\1 \2/p' "$work/$name.log")
    s_n=$1 s_s=$2
    s_ids=$(sed -n 's/^generated ids: //p' "$work/$name.log")
}

reference() { "$SHLM_PY" - "$model" "$prompt" "$n_new" "$threads" <<'EOF'
import sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model, prompt, n_new, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
tok = AutoTokenizer.from_pretrained(model)
m = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
p = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                            return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    m.generate(p, max_new_tokens=2, do_sample=False)
    t0 = time.perf_counter()
    out = m.generate(p, max_new_tokens=n_new, do_sample=False)
    s = time.perf_counter() - t0
gen = out[0, p.shape[1]:].tolist()
print("prompt_ids " + " ".join(map(str, p[0].tolist())))
print("generated_ids " + " ".join(map(str, gen)))
print(f"timing {len(gen)} {s:.3f}")
EOF
}

shardlm kv
reference >"$work/ref.txt" 2>"$work/ref.err" || { echo "# transformers failed:"; tail -n 3 "$work/ref.err"; exit 1; }
set -- $(sed -n 's/^timing //p' "$work/ref.txt")
r_n=$1 r_s=$2
r_tps=$(echo "$r_n / $r_s" | bc -l)
printf '  %-34s %7s %9.3f %9.2f %7s\n' "transformers generate" "$r_n" "$r_s" "$r_tps" "1.00"
printf '  %-34s %7s %9.3f %9.2f %7.2f\n' "shardlm generate (KV cache)" "$s_n" "$s_s" \
    "$(echo "$s_n / $s_s" | bc -l)" "$(echo "$s_n / $s_s / $r_tps" | bc -l)"
if [ "$(sed -n 's/^prompt ids: //p' "$work/kv.log")" != "$(sed -n 's/^prompt_ids //p' "$work/ref.txt")" ] ||
    [ "$s_ids" != "$(sed -n 's/^generated_ids //p' "$work/ref.txt")" ]; then
    echo "# WRONG: shardlm's prompt ids or greedy tokens differ from transformers'"
    status=1
fi
if [ "${RECOMPUTE:-0}" = 1 ]; then
    kv_ids=$s_ids
    shardlm rc --recompute
    printf '  %-34s %7s %9.3f %9.2f %7.2f\n' "shardlm generate --recompute" "$s_n" "$s_s" \
        "$(echo "$s_n / $s_s" | bc -l)" "$(echo "$s_n / $s_s / $r_tps" | bc -l)"
    [ "$s_ids" = "$kv_ids" ] || { echo "# WRONG: --recompute's tokens differ from the KV cache's"; status=1; }
fi
echo "# ratio: tokens/s over transformers'; both from the prompt's first forward to the last token"
exit $status
