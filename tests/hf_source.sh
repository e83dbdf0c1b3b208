#!/bin/sh
# model.init_from and the weights source of forward-only commands, on the golden fixture
# as a Hugging Face directory (tests/golden/; no network, no python):
#  1. a job with no [model] keys takes the architecture from init_from's config.json and
#     trains; the keys it does give must agree: one error line lists every key that
#     differs with both values and the file; agreeing keys load;
#  2. eval and generate need no [train] schedule keys (train.seq_len: the model's
#     context, or the validation file as one window); eval prints the tokens it scored;
#     eval says when it evaluates freshly initialised weights; eval --ckpt takes a
#     checkpoint; a training run without checkpoint.dir says, at start and at the end,
#     that its weights are not kept;
#  3. bad input, one error line each naming the path, nothing trained: init_from at a
#     bare .safetensors, at a directory with no model, at a GGUF file, at a config.json
#     without weights; a tokenizer whose vocabulary does not fit the model (naming the
#     tokenizer and the config.json), also a real tokenizer file of another model (SmolLM2's,
#     where get-model.sh made it: skipped otherwise, and the test with it).
#   SHLM=./shardlm SHLM_BUILDDIR=. SHLM_SRCDIR=/path/to/src sh /path/to/src/tests/hf_source.sh
# Exit 0 pass, 1 fail, 77 skip (no MPI launcher). The work directory is kept on failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
SHLM_SRCDIR=${SHLM_SRCDIR:-$(dirname "$here")}
SHLM=${SHLM:-./shardlm}
SHLM_BUILDDIR=${SHLM_BUILDDIR:-.}
export SHLM_SRCDIR
mpi="$SHLM_SRCDIR/tests/mpi_test.sh"
. "$SHLM_SRCDIR/tests/lib.sh"
test_begin hf_source shlm-hf-source

# go NAME NP CMD...: runs shardlm CMD on NP ranks (1: without a launcher), stdout in
# $work/NAME.log, stderr in $work/NAME.err; returns its status
go() {
    name=$1 np=$2
    shift 2
    if [ "$np" -eq 1 ]; then # an MPI singleton: no launcher lines on stderr
        echo "+ $SHLM $*"
        "$SHLM" "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
    else
        echo "+ sh $mpi $np $SHLM $*"
        sh "$mpi" "$np" "$SHLM" "$@" >"$work/$name.log" 2>"$work/$name.err" </dev/null
    fi
    rc=$?
    skip_without_launcher $rc
    return $rc
}
# ok_run NAME: the run NAME exited 0
ok_run() {
    if [ "$1" -ne 0 ]; then
        tail -n 5 "$work/$2.err" "$work/$2.log"
        fail "$2: exit $1"
        return 1
    fi
    return 0
}
# has NAME TEXT WHAT: NAME's stdout holds TEXT (fixed string)
has() {
    if grep -q -F -e "$2" "$work/$1.log"; then echo "hf_source: ok: $3"; else
        fail "$1: no '$2' in its output ($3)"
    fi
}

hf="$work/hf"
mkdir -p "$hf"
cat >"$hf/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
 "intermediate_size": 44, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 67, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false}
EOF
"$SHLM_BUILDDIR/tests/test_ckpt_hf" weights "$hf/model.safetensors" >"$work/weights.log" 2>&1 ||
    { cat "$work/weights.log"; fail "cannot write the fixture's weights"; exit 1; }
"$SHLM" data random --vocab 67 --tokens 3000 "$work/r.bin" >/dev/null || exit 1
"$SHLM" data random --vocab 67 --tokens 40 "$work/v.bin" >/dev/null || exit 1

# job NAME [MODEL-LINES] [TRAIN-LINES]: $work/NAME.ini with init_from the fixture
job() {
    {
        printf '[model]\ninit_from = %s\n%s\n' "$hf" "${2:-}"
        [ -n "${3:-}" ] && printf '[train]\n%s\n' "$3"
        printf '[data]\ntrain = %s\nval = %s\n' "$work/r.bin" "$work/v.bin"
        printf '[log]\nrun_dir = %s\n[runtime]\nbackend = cpu\nthreads = 1\n' "$work/run.$1"
    } >"$work/$1.ini"
}

# ---- 1. the architecture from config.json ----
job bare "" "seq_len = 16
steps = 2"
go train_bare 2 train "$work/bare.ini"
if ok_run $? train_bare; then
    has train_bare "model.dim                  = 32" "no [model] keys: dim 32 from config.json"
    has train_bare "model.max_seq_len          = 64" "max_seq_len from max_position_embeddings"
    has train_bare "note: checkpoint.dir is not set: the weights this run trains will not be kept" \
        "a run without checkpoint.dir says so at start"
    has train_bare "note: the trained weights were not kept" "and at the end"
fi
job agree "dim = 32
n_heads = 4" "seq_len = 16
steps = 1"
go train_agree 1 train "$work/agree.ini"
ok_run $? train_agree && echo "hf_source: ok: [model] keys that agree with config.json load"
job disagree "dim = 64
n_layers = 3
rope_theta = 500000" "seq_len = 16
steps = 1"
go train_disagree 1 train "$work/disagree.ini"
refused_before_step1 train_disagree $? "$hf/config.json" "dim = 64 ($work/disagree.ini:3) but hidden_size = 32" \
    "n_layers = 3 ($work/disagree.ini:4) but num_hidden_layers = 2" \
    "rope_theta = 500000 ($work/disagree.ini:5) but rope_theta = 10000"

# ---- 2. eval and generate without [train] ----
job fwd
go eval_fwd 2 eval "$work/fwd.ini"
if ok_run $? eval_fwd; then
    has eval_fwd "39 tokens scored (windows of 39)" \
        "eval with no [train]: the 40-token file as one window, 39 tokens scored"
    has eval_fwd "weights: $hf" "eval's weights are init_from's"
fi
go gen_fwd 1 generate "$work/fwd.ini" --prompt-ids 1,2,3 --tokens 4 --temperature 0 --ids
if ok_run $? gen_fwd; then
    has gen_fwd "generate: 4 tokens (the limit)" "generate with no [train] keys"
    has gen_fwd "prompt ids: 1 2 3" "generate --ids prints the prompt's ids"
fi
printf '[model]\npreset = tiny\n[data]\nval = %s\n[runtime]\nbackend = cpu\nthreads = 1\n' \
    "$work/v.bin" >"$work/fresh.ini"
go eval_fresh 1 eval "$work/fresh.ini"
ok_run $? eval_fresh && has eval_fresh "the model has freshly initialised weights (train.seed = 1337)" \
    "eval says when it evaluates freshly initialised weights"
# a checkpoint of the bare job, then eval --ckpt of it
go train_ck 1 train "$work/bare.ini" --set "checkpoint.dir=$work/ck"
if ok_run $? train_ck; then
    go eval_ck 1 eval "$work/fwd.ini" --ckpt "$work/ck"
    ok_run $? eval_ck && has eval_ck "weights: $work/ck" "eval --ckpt DIR takes the checkpoint's weights"
fi

# ---- 3. bad input ----
# bad NAME INIT_FROM PATTERN...: a job whose init_from is INIT_FROM is refused before step 1
bad() {
    name=$1 src=$2
    shift 2
    printf '[model]\ninit_from = %s\n[train]\nseq_len = 16\nsteps = 1\n[data]\ntrain = %s\n[log]\nrun_dir = %s\n' \
        "$src" "$work/r.bin" "$work/$name" >"$work/$name.ini"
    go "$name" 1 train "$work/$name.ini"
    refused_before_step1 "$name" $? "$work/$name.ini:2" "$@"
}
bad bad_safetensors "$hf/model.safetensors" "$hf/model.safetensors is a safetensors file" \
    "give the Hugging Face directory"
mkdir -p "$work/empty"
bad bad_empty "$work/empty" "$work/empty is a directory with neither config.json" "nor latest"
printf 'GGUF\003\000\000\000\000\000\000\000' >"$work/model.gguf"
bad bad_gguf "$work/model.gguf" "$work/model.gguf is a GGUF file"
mkdir -p "$work/noweights" && cp "$hf/config.json" "$work/noweights/"
bad bad_noweights "$work/noweights" "$work/noweights has a config.json but no weights"
bad bad_missing "$work/nothing" "$work/nothing: No such file or directory"
go bad_tokenizer 1 train "$work/bare.ini" --set data.tokenizer=bytes
refused_before_step1 bad_tokenizer $? "the tokenizer bytes has 256 ids" \
    "the model's vocab_size is 67 ($hf/config.json)"

# a real tokenizer file of another model, where get-model.sh's SmolLM2 is cached
. "$SHLM_SRCDIR/tests/pyenv.sh"
if [ -f "$SHLM_SMOLLM2/tokenizer.json" ]; then
    go bad_tokenizer_file 1 eval "$work/fwd.ini" --set "data.tokenizer=$SHLM_SMOLLM2"
    refused_before_step1 bad_tokenizer_file $? "$SHLM_SMOLLM2/tokenizer.json has 49152 ids" \
        "the model's vocab_size is 67 ($hf/config.json)"
else
    skip_part "a real tokenizer file of another model: no $SHLM_SMOLLM2/tokenizer.json" \
        "(examples/smollm2/get-model.sh makes it)"
fi

test_end
