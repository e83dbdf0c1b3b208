#!/bin/sh
# generate through the KV cache against the window recompute (`generate --recompute`:
# every token recomputes its window through the forward, the reference), on a small random
# model (model.init_std 0.3, so that greedy tokens are not one id repeated) with the byte
# tokenizer:
#  1. a prompt file of 64 prompts of 1 to 12 words (a blank line among them) runs 16 rows
#     at a time on 1 rank: 64 JSON lines in input order, each naming its prompt, 40 tokens
#     each, "stop": "length", equal to --recompute's file line for line, greedy and at
#     temperature 0.8 (prompt i samples with seed + i);
#  2. one prompt whose reply runs past the context (train.seq_len 48: 13 + 60 tokens, the
#     cache's last tokens then the window of 48): equal to --recompute's tokens;
#  3. the prompt file on 2 ranks FULL_SHARD (the weights gathered once for the whole
#     generation), 4 ranks HYBRID_SHARD 2 x 2 and 4 ranks SHARD_GRAD_OP: the 1-rank
#     recompute's lines;
#  4. a 2-step training on 2 ranks FULL_SHARD whose closing sample (train.sample_*: its own
#     generator, the training engine gathering unit by unit each step) runs past its cache:
#     its text is what generate --ckpt of the saved step prints, through the cache and by
#     --recompute; every run above allocated what its plan counts (the units held gathered,
#     the generator's caches: "plan check: allocated == plan");
#  5. bad input, one error line each, nothing written: a prompt line with neither "prompt"
#     nor "messages" and one with both (naming FILE:LINE), a prompt longer than the context
#     in the file (FILE:LINE) and on the command line, --prompts without --output.
#   SHLM=./shardlm SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/generate.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin generate shlm-generate

cat >"$work/gen.ini" <<EOF
[model]
dim = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 96
vocab_size = 256
init_std = 0.3
[train]
seq_len = 96
micro_batch = 1
steps = 2
seed = 5
sample_prompt = ROMEO:
sample_tokens = 60
sample_temperature = 0
[data]
train = $work/train.bin
[log]
run_dir = $work/run
[runtime]
backend = cpu
threads = 1
EOF
# 64 prompts of 1 to 12 words, a blank line after the 11th (skipped: 64 prompts still)
awk 'BEGIN { split("the king is dead long live the queen of hearts and spades who knows what comes next", w, " ")
    s = 7
    for (i = 0; i < 64; i++) {
        s = (s * 1103515245 + 12345) % 2147483648; n = 1 + int(s / 65536) % 12; line = ""
        for (k = 0; k < n; k++) { s = (s * 1103515245 + 12345) % 2147483648; line = line (k ? " " : "") w[1 + int(s / 65536) % 17] }
        printf "{\"prompt\": \"%s\"}\n", line
        if (i == 10) print ""
    } }' >"$work/prompts.jsonl"

# gen NAME NP ARGS...: generate on NP ranks (1: no launcher), stdout in NAME.log
gen() {
    g_name=$1 g_np=$2
    shift 2
    if [ "$g_np" -eq 1 ]; then
        step "$g_name" "$SHLM" generate "$work/gen.ini" "$@"
    else
        step "$g_name" sh "$mpi" "$g_np" "$SHLM" generate "$work/gen.ini" "$@"
    fi
}
# same_file WHAT A B: the two output files are equal
same_file() {
    if cmp -s "$2" "$3"; then
        echo "generate: ok: $1"
    else
        fail "$1: $(basename "$2") and $(basename "$3") differ: $(diff "$2" "$3" | head -n 2)"
    fi
}
file_args="--prompts $work/prompts.jsonl --tokens 40"

# ---- 1. a prompt file, 16 rows at a time, against the recompute ----
gen kv 1 $file_args --output "$work/kv.jsonl" --batch 16 --temperature 0
gen rc 1 $file_args --output "$work/rc.jsonl" --recompute --temperature 0
grep -q '^generate: KV cache: 16 rows of ' "$work/kv.log" ||
    fail "kv: no 'KV cache: 16 rows of' line: $(grep '^generate:' "$work/kv.log" | head -n 1)"
grep -q '^generate: no KV cache (--recompute)' "$work/rc.log" || fail "rc: the recompute does not say so"
want=$(sed -n 's/^{"prompt": "\(.*\)"}$/\1/p' "$work/prompts.jsonl")
got=$(sed -n 's/^{"prompt":"\([^"]*\)",.*/\1/p' "$work/kv.jsonl" 2>/dev/null)
lines=$(wc -l <"$work/kv.jsonl" 2>/dev/null || echo 0)
counts=$(sed 's/.*"tokens":\[\([^]]*\)\].*/\1/' "$work/kv.jsonl" 2>/dev/null | awk -F, '{ print NF }' | sort -u)
stops=$(sed 's/.*"stop":"\([a-z]*\)".*/\1/' "$work/kv.jsonl" 2>/dev/null | sort -u)
if [ "$lines" -eq 64 ] && [ "$got" = "$want" ] && [ "$counts" = 40 ] && [ "$stops" = length ]; then
    echo "generate: ok: 64 prompts in 16 rows: 64 lines in input order, 40 tokens each, stop length"
else
    fail "kv.jsonl: $lines lines (want 64), prompts in order: $([ "$got" = "$want" ] && echo yes || echo no), token counts '$counts', stops '$stops'"
fi
same_file "64 prompts, greedy: the KV cache's lines are the recompute's" "$work/kv.jsonl" "$work/rc.jsonl"
gen kv_t 1 $file_args --output "$work/kv_t.jsonl" --batch 16 --temperature 0.8
gen rc_t 1 $file_args --output "$work/rc_t.jsonl" --recompute --temperature 0.8
same_file "64 prompts, temperature 0.8: the KV cache's lines are the recompute's" "$work/kv_t.jsonl" "$work/rc_t.jsonl"
if cmp -s "$work/kv.jsonl" "$work/kv_t.jsonl"; then fail "temperature 0.8 gave the greedy tokens"; fi

# ---- 2. past the context ----
ids() { sed -n 's/^generated ids: //p' "$work/$1.log"; }
gen long_kv 1 --prompt "To be, or not" --tokens 60 --temperature 0 --ids --set train.seq_len=48
gen long_rc 1 --prompt "To be, or not" --tokens 60 --temperature 0 --ids --set train.seq_len=48 --recompute
if [ "$(ids long_kv | wc -w)" -eq 60 ] && [ "$(ids long_kv)" = "$(ids long_rc)" ]; then
    echo "generate: ok: 13 + 60 tokens past a context of 48: the recompute's tokens"
else
    fail "past the context: KV '$(ids long_kv)', recompute '$(ids long_rc)'"
fi

# ---- 3. ranks and strategies ----
gen full2 2 $file_args --output "$work/full2.jsonl" --batch 16 --temperature 0
grep -q 'weights gathered once for the whole generation' "$work/full2.log" ||
    fail "full2: the weights are not gathered once: $(grep '^generate: KV' "$work/full2.log")"
same_file "2 ranks FULL_SHARD: the 1-rank recompute's lines" "$work/full2.jsonl" "$work/rc.jsonl"
gen hybrid4 4 $file_args --output "$work/hybrid4.jsonl" --batch 16 --temperature 0 \
    --set fsdp.strategy=HYBRID_SHARD --set runtime.ranks_per_node=2
same_file "4 ranks HYBRID_SHARD 2 x 2: the 1-rank recompute's lines" "$work/hybrid4.jsonl" "$work/rc.jsonl"
gen sgo4 4 $file_args --output "$work/sgo4.jsonl" --batch 16 --temperature 0 \
    --set fsdp.strategy=SHARD_GRAD_OP
same_file "4 ranks SHARD_GRAD_OP: the 1-rank recompute's lines" "$work/sgo4.jsonl" "$work/rc.jsonl"

# ---- 4. the closing sample of a training run ----
prepare_corpus "$work/train.bin"
step train sh "$mpi" 2 "$SHLM" train "$work/gen.ini" --set "checkpoint.dir=$work/ck" \
    --set train.seq_len=48
# text NAME MARK: the lines after the line starting MARK up to the closing "---"
text() { sed -n "/^$2/,/^---\$/p" "$work/$1.log" | sed '1d;$d'; }
gen ck_kv 1 --ckpt "$work/ck" --prompt ROMEO: --tokens 60 --temperature 0 --set train.seq_len=48
gen ck_rc 1 --ckpt "$work/ck" --prompt ROMEO: --tokens 60 --temperature 0 --set train.seq_len=48 --recompute
sample=$(text train '--- sample:')
if [ -n "$sample" ] && [ "$sample" = "$(text ck_kv 'generate: KV cache')" ] &&
    [ "$sample" = "$(text ck_rc 'generate: no KV cache')" ]; then
    echo "generate: ok: the closing sample (2 ranks, unit by unit) is generate's text of the checkpoint, KV cache and recompute"
else
    fail "closing sample '$sample', generate '$(text ck_kv 'generate: KV cache')', recompute '$(text ck_rc 'generate: no KV cache')'"
fi

# every run allocated what its plan counts (the held units, the generator's caches)
for n in kv kv_t long_kv full2 hybrid4 sgo4 train ck_kv; do
    grep -q '^plan check: allocated == plan' "$work/$n.log" ||
        fail "$n: $(grep '^plan check' "$work/$n.log" | head -n 1)"
done

# ---- 5. bad input ----
# refused NAME RC WANT_RC PATTERN...: one error line naming every PATTERN, exit WANT_RC,
# no output file
refused() {
    r_name=$1 r_rc=$2 r_want=$3
    shift 3
    r_why=$(error_line_problem "$work/err" "$@")
    if [ "$r_rc" -ne "$r_want" ] || [ -n "$r_why" ] || [ -e "$work/bad.jsonl" ]; then
        sed 's/^/    stderr: /' "$work/err" | head -n 5
        fail "$r_name: exit $r_rc (want $r_want) $r_why$([ -e "$work/bad.jsonl" ] && echo '; wrote bad.jsonl')"
    else
        echo "generate: ok: $r_name: $(cat "$work/err")"
    fi
}
bad_file() {
    bf_name=$1
    shift
    { head -n 3 "$work/prompts.jsonl"; printf '%s\n' "$@"; } >"$work/$bf_name.jsonl"
}
bad_file neither '{"text": "no prompt here"}'
run_expecting_error -- "$SHLM" generate "$work/gen.ini" --prompts "$work/neither.jsonl" --output "$work/bad.jsonl"
refused "a line with neither field" $rc 1 "$work/neither.jsonl:4:" '"prompt"' '"messages"' neither
bad_file both '{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}'
run_expecting_error -- "$SHLM" generate "$work/gen.ini" --prompts "$work/both.jsonl" --output "$work/bad.jsonl"
refused "a line with both fields" $rc 1 "$work/both.jsonl:4:" 'not both'
long=$(awk 'BEGIN { for (i = 0; i < 100; i++) printf "x" }')
bad_file long "{\"prompt\": \"$long\"}"
run_expecting_error -- "$SHLM" generate "$work/gen.ini" --prompts "$work/long.jsonl" --output "$work/bad.jsonl"
refused "a prompt file's prompt longer than the context" $rc 1 "$work/long.jsonl:4:" \
    'the prompt has 100 tokens' 'train.seq_len = 96' --truncate-prompt
run_expecting_error -- "$SHLM" generate "$work/gen.ini" --prompt "$long"
refused "a --prompt longer than the context" $rc 1 'the prompt has 100 tokens' 'train.seq_len = 96'
run_expecting_error -- "$SHLM" generate "$work/gen.ini" --prompts "$work/prompts.jsonl"
refused "--prompts without --output" $rc 2 '--prompts needs --output'
test_end
