#!/bin/sh
# Generation speed on one GPU: `shardlm generate` (the KV cache; each decode step replayed
# as a recorded CUDA graph, and with cuda.graphs = false every op launched by itself)
# against benchmarks/anchor/torch_decode.py (PyTorch bf16, a static cache,
# torch.compile(mode="reduce-overhead")) in the same command, at the Llama-2-7B shape with
# random weights (the seed's init; the speed does not depend on the values), bf16, one
# sequence, a 4-token prompt, greedy, TOKENS new tokens (default 256). The anchor also
# measures the copy bandwidth and gives the decode bound (the bytes a step reads over it):
# the % of bound column is each system's tokens/s over that bound.
#   [TOKENS=N] [PYTHON=python3] sh benchmarks/bench_generate_gpu.sh [SHARDLM]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
shlm=${1:-$here/shardlm}
n_new=${TOKENS:-256}
py=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/benchgengpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/job.ini" <<JOB
[model]
preset = llama2-7b
[runtime]
backend = cuda
JOB
echo "# generate on one GPU: Llama-2-7B shape, random weights, bf16, 1 sequence, 4-token prompt, greedy, $n_new new tokens"
build=$(sed -n 's/^commit //p' "$(dirname "$shlm")/BUILD-INFO" 2>/dev/null)
echo "# binaries of ${build:-$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo ?)}, $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"

# shardlm NAME GRAPHS: sets s_n, s_s
shardlm() {
    "$shlm" generate "$work/job.ini" --set cuda.graphs="$2" --prompt-ids 1,450,451,452 \
        --tokens "$n_new" --temperature 0 --ids >"$work/$1.log" 2>&1 ||
        { echo "# shardlm ($1) failed:"; tail -n 5 "$work/$1.log"; exit 1; }
    set -- $(sed -n 's/^generate: \([0-9]*\) tokens (.*) in \([0-9.]*\) s, .*/\1 \2/p' "$work/$1.log")
    s_n=$1 s_s=$2
}
shardlm graphs true
g_n=$s_n g_s=$s_s g_ids=$(sed -n 's/^generated ids: //p' "$work/graphs.log")
shardlm eager false
e_n=$s_n e_s=$s_s e_ids=$(sed -n 's/^generated ids: //p' "$work/eager.log")
"$py" "$here/benchmarks/anchor/torch_decode.py" --tokens "$n_new" >"$work/anchor.log" 2>&1 ||
    { echo "# anchor failed:"; tail -n 5 "$work/anchor.log"; exit 1; }
a_line=$(grep '^anchor_decode' "$work/anchor.log")
set -- $a_line
a_n=$3 a_s=$5 a_tps=$7
bound=$(sed -n 's/^bound_tokens_per_s //p' "$work/anchor.log")
echo "# $(echo "$a_line" | sed 's/.*(\(.*\))/anchor: \1/'); copy $(sed -n 's/^copy_gbs //p' "$work/anchor.log") GB/s, $(sed -n 's/^bytes_per_token //p' "$work/anchor.log") bytes a token: bound $bound tokens/s"
printf '# %-40s %7s %9s %9s %9s %7s\n' system tokens seconds tokens/s "% bound" ratio
row() { awk -v name="$1" -v n="$2" -v s="$3" -v b="$bound" -v a="$a_tps" \
    'BEGIN { printf "  %-40s %7d %9.3f %9.2f %8.1f%% %7.2f\n", name, n, s, n / s, 100 * n / s / b, n / s / a }'; }
row "PyTorch torch.compile, static cache" "$a_n" "$a_s"
row "shardlm generate (KV cache, CUDA graph)" "$g_n" "$g_s"
row "shardlm generate, cuda.graphs = false" "$e_n" "$e_s"
echo "# ratio: tokens/s over the anchor's"
[ "$g_ids" = "$e_ids" ] || { echo "# WRONG: the recorded steps' tokens differ from the op-by-op steps'"; exit 1; }
