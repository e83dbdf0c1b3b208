#!/bin/sh
# QLoRA's base against bitsandbytes, transformers and PEFT: tests/qlora_peft_ref.py saves a
# tiny random Llama (hidden 40, intermediate 100: k_proj and the MLP's matrices end in a
# partial block of 64 values) and a PEFT adapter of it (r 4 / alpha 8 on all seven
# projections, random non-zero A and B), and prints the fp32 loss of base + adapter over
# val.bin's windows of 256 tokens with the base as saved, and with every projection weight
# replaced by bitsandbytes' dequantize_4bit(quantize_4bit(W)) without and with double quant.
# shardlm's eval (model.init_from = the base, lora.init_from = the adapter) must give each
# to 1e-4 relative: lora.base_dtype = param_dtype (fp32) the first, nf4 with
# lora.double_quant = false the second on 1 rank and on 3 (FULL_SHARD: a matrix's blocks
# spread over the ranks unevenly), nf4 (double quant) the third on 1 rank and on 2. The
# three references must be more than 1e-4 apart (each case tells the forms apart). generate
# on the double-quant base (2 ranks, through the KV cache) must give the reference's 8
# greedy tokens after its prompt.
# Skipped (77) without a python3 that has torch and transformers (tests/pyenv.sh), peft in
# $SHLM_PEFT or bitsandbytes in $SHLM_BITSANDBYTES (tests/setup_pyenv.sh installs them), or
# without an MPI launcher. About 20 s on 2 cores.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/qlora_peft_ref.sh
set -u

here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"

. "$SHLM_SRCDIR/tests/pyenv.sh"
. "$SHLM_SRCDIR/tests/lib.sh"

shlm_python torch transformers safetensors >/dev/null ||
    skip_test "$(shlm_python torch transformers safetensors)"
[ -d "$SHLM_PEFT/peft" ] || skip_test "no peft in $SHLM_PEFT (run tests/setup_pyenv.sh)"
[ -d "$SHLM_BITSANDBYTES/bitsandbytes" ] ||
    skip_test "no bitsandbytes in $SHLM_BITSANDBYTES (run tests/setup_pyenv.sh)"

test_begin qlora_peft_ref shlm-qlora-peft
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1

"$SHLM" data random --vocab 256 --tokens 1025 --seed 3 "$work/val.bin" >/dev/null || exit 1
# torch on one thread with its AVX2 kernels: the double-quant offset's sum in the order
# kernels/nf4.c follows (tests/nf4_ref.sh)
echo "+ ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=$SHLM_PEFT:$SHLM_BITSANDBYTES $SHLM_PY" \
    "$SHLM_SRCDIR/tests/qlora_peft_ref.py $work $work/val.bin"
ATEN_CPU_CAPABILITY=avx2 PYTHONPATH="$SHLM_PEFT:$SHLM_BITSANDBYTES${PYTHONPATH:+:$PYTHONPATH}" \
    "$SHLM_PY" "$SHLM_SRCDIR/tests/qlora_peft_ref.py" "$work" "$work/val.bin" \
    >"$work/reference.log" 2>&1 </dev/null ||
    { tail -n 15 "$work/reference.log"; fail "the reference failed"; test_end; }
grep '^loss ' "$work/reference.log"
ref() { sed -n "s/^loss $1 //p" "$work/reference.log"; }
# rel A B: |A - B| / |B|
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; printf "%.3e", d }'; }

for pair in "fp32 plain" "fp32 dq" "plain dq"; do
    set -- $pair
    d=$(rel "$(ref "$1")" "$(ref "$2")")
    if awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }'; then
        echo "$test_name: ok: the references $1 and $2 are $d apart"
    else
        fail "the references $1 ($(ref "$1")) and $2 ($(ref "$2")) are only $d apart"
    fi
done

printf '[model]\ninit_from = %s\n[train]\nseq_len = 256\n[data]\nval = %s\n[lora]\ninit_from = %s\n[runtime]\nbackend = cpu\nthreads = 1\n' \
    "$work/base" "$work/val.bin" "$work/peft" >"$work/eval.ini"

# check NAME NP CASE ARGS...: shardlm's eval on NP ranks equals the reference CASE
check() {
    name=$1 np=$2 case=$3
    shift 3
    step "$name" sh "$mpi" "$np" "$SHLM" eval "$work/eval.ini" --set "log.run_dir=$work/$name" \
        "$@" || return
    l=$(sed -n 's/^eval: .* mean loss \([0-9.]*\) nats.*/\1/p' "$work/$name.log")
    r=$(ref "$case")
    if [ -z "$l" ] || [ -z "$r" ]; then
        fail "$name: no loss from shardlm ('$l') or the reference ('$r')"
        return
    fi
    d=$(rel "$l" "$r")
    if awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }'; then
        fail "$name: shardlm's eval $l, the reference's ($case) $r: $d apart"
    else
        echo "$test_name: ok: $name: shardlm's eval $l, the reference's ($case) $r: $d apart"
    fi
}
check fp32 1 fp32
check plain_1r 1 plain --set lora.base_dtype=nf4 --set lora.double_quant=false
check plain_3r 3 plain --set lora.base_dtype=nf4 --set lora.double_quant=false
check dq_1r 1 dq --set lora.base_dtype=nf4
check dq_2r 2 dq --set lora.base_dtype=nf4

want=$(sed -n 's/^ids dq //p' "$work/reference.log")
if step gen_dq_2r sh "$mpi" 2 "$SHLM" generate "$work/eval.ini" --set lora.base_dtype=nf4 \
    --prompt-ids 5,6,7,8,9,10,11,12 --tokens 8 --temperature 0 --ids; then
    got=$(sed -n 's/^generated ids: //p' "$work/gen_dq_2r.log")
    if [ -n "$want" ] && [ "$got" = "$want" ]; then
        echo "$test_name: ok: gen_dq_2r: greedy tokens equal the reference's: $got"
    else
        fail "gen_dq_2r: greedy tokens '$got', the reference's '$want'"
    fi
fi

test_end
