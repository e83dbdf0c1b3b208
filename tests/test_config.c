/* Tests of job files (src/job/config.c over io/config_file.c): a valid job, every class of
 * error with its file:line and key, --set overrides, and data paths relative to the job. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/config_file.h"
#include "src/families/families.h"
#include "src/job/config.h"
#include "src/model/decoder.h"

#include "shlm_config.h"
#include "tests/check.h"

/* the resolved shape as the decoder families keep it */
#define SHAPE(c) ((const decoder_config *)model_shape_cdata(&(c).model))

static char dir[256];     /* temp directory; job files go in dir/jobs/ */
static char job[512];     /* dir/jobs/job.ini, rewritten by each case */

static void write_job(const char *text) {
    FILE *f = fopen(job, "w");
    if (!f || fputs(text, f) < 0) {
        perror(job);
        exit(1);
    }
    fclose(f);
}

/* A valid job, to which each case adds or from which it changes one thing. Line numbers
 * of this text are used by the expected messages below. */
static const char *base_lines[] = {
    "; the demo job",          /* 1 */
    "[model]",                 /* 2 */
    "preset = tiny",           /* 3 */
    "",                        /* 4 */
    "[train]",                 /* 5 */
    "seq_len = 64",            /* 6 */
    "steps = 10",              /* 7 */
    "lr = 1e-3",               /* 8 */
    "",                        /* 9 */
    "[data]",                  /* 10 */
    "train = data/train.bin",  /* 11 */
    "val = data/val.bin",      /* 12 */
    NULL,
};

/* The base job with line `at` replaced by `repl` (NULL: deleted) and `extra` appended. */
static const char *variant(int at, const char *repl, const char *extra) {
    static char text[4096];
    text[0] = '\0';
    for (int i = 0; base_lines[i]; i++) {
        const char *l = i + 1 == at ? repl : base_lines[i];
        if (!l) continue;
        strcat(text, l);
        strcat(text, "\n");
    }
    if (extra) strcat(text, extra);
    return text;
}

/* Loads `text` as the job with the given overrides and expects failure with a message
 * equal to want (after "PATH" is replaced by the job's path). */
static void expect_error(const char *what, const char *text, int n_sets, char **sets,
                         const char *want) {
    char expected[1024], with_path[1024], err[1536] = "";
    const char *p = strstr(want, "PATH");
    if (p)
        snprintf(with_path, sizeof with_path, "%.*s%s%s", (int)(p - want), want, job, p + 4);
    else
        snprintf(with_path, sizeof with_path, "%s", want);
    /* PRESETS: every family's presets, as the registry lists them */
    p = strstr(with_path, "PRESETS");
    if (p)
        snprintf(expected, sizeof expected, "%.*s%s%s", (int)(p - with_path), with_path,
                 family_preset_names(), p + 7);
    else
        snprintf(expected, sizeof expected, "%s", with_path);
    write_job(text);
    job_config cfg;
    int rc = job_config_load(&cfg, job, n_sets, sets, err, sizeof err);
    int ok = rc == -1 && strcmp(err, expected) == 0 && cfg.text == NULL;
    check(ok, "%s: %s", what, err);
    if (!ok) printf("     want: %s\n", expected);
    if (rc == 0) job_config_free(&cfg);
}

static int load(const char *text, int n_sets, char **sets, job_config *cfg, char *err,
                size_t errlen) {
    write_job(text);
    return job_config_load(cfg, job, n_sets, sets, err, errlen);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static void test_valid(void) {
    job_config c;
    char err[1536] = "", want[1100];
    const char *text = variant(0, NULL, "[log]\nevery = 5\n");
    int rc = load(text, 0, NULL, &c, err, sizeof err);
    check(rc == 0, "valid job loads (%s)", err);
    if (rc != 0) return;
    check(strcmp(c.preset, "tiny") == 0 && SHAPE(c)->dim == 128 && SHAPE(c)->n_layers == 4 &&
              SHAPE(c)->n_heads == 4 && SHAPE(c)->n_kv_heads == 2 && SHAPE(c)->head_dim == 32 &&
              SHAPE(c)->vocab_size == 256,
          "preset tiny: dim %d layers %d heads %d/%d head_dim %d vocab %d", SHAPE(c)->dim,
          SHAPE(c)->n_layers, SHAPE(c)->n_heads, SHAPE(c)->n_kv_heads, SHAPE(c)->head_dim,
          SHAPE(c)->vocab_size);
    check(c.seq_len == 64 && c.steps == 10 && c.lr == 1e-3f && c.log_every == 5,
          "explicit values: seq_len %d steps %d lr %g log.every %d", c.seq_len, c.steps, c.lr,
          c.log_every);
    check(c.micro_batch == 1 && c.global_batch == 0 && c.min_lr == 1e-3f / 10 &&
              c.warmup_steps == 0 && c.beta1 == 0.9f && c.beta2 == 0.95f && c.eps == 1e-8f &&
              c.weight_decay == 0.1f && c.grad_clip == 1.0f && c.seed == 1337 && c.shuffle == 1 &&
              c.sample_temperature == 0.8f && c.sample_top_p == 0.9f &&
              c.backend == SHLM_BACKEND_AUTO && c.threads == 0,
          "defaults: micro_batch %d global_batch %d (0 = micro_batch x ranks) min_lr %g (lr/10) seed %llu backend %s",
          c.micro_batch, c.global_batch, c.min_lr, (unsigned long long)c.seed,
          shlm_backend_choice_name(c.backend));
    /* the backends' and the checkpoint's options are job keys with these defaults */
    check(c.comm_timeout_s == 600 && c.cuda_attention == SHLM_ATTENTION_SM90 &&
              c.nccl_cta_policy == SHLM_NCCL_CTA_DEFAULT && c.nccl_copy_engine_allgather == 1 &&
              c.ckpt_direct_io == 1 && c.ckpt_collective_io == 0 && c.ckpt_alignment == 1 << 20,
          "defaults: runtime.comm_timeout_s %g, cuda.attention %d, nccl.cta_policy %d, "
          "nccl.copy_engine_allgather %d, checkpoint.direct_io %d collective_io %d alignment %d",
          c.comm_timeout_s, c.cuda_attention, c.nccl_cta_policy, c.nccl_copy_engine_allgather,
          c.ckpt_direct_io, c.ckpt_collective_io, c.ckpt_alignment);
    check(c.strategy == FSDP_FULL_SHARD && c.param_dtype == SHLM_F32 &&
              c.reduce_dtype == SHLM_F32 && c.activation_checkpointing == MODEL_AC_NONE &&
              c.on_nonfinite == NONFINITE_ABORT,
          "defaults parsed into enums: strategy %d param_dtype %d reduce_dtype %d ac %d "
          "on_nonfinite %d", c.strategy, c.param_dtype, c.reduce_dtype,
          c.activation_checkpointing, c.on_nonfinite);
    snprintf(want, sizeof want, "%s/jobs/data/train.bin", dir);
    check(strcmp(c.data_train, want) == 0, "data.train relative to the job's directory: %s",
          c.data_train);
    check(strcmp(c.run_dir, "runs/job") == 0, "log.run_dir defaults to runs/<job stem>: %s",
          c.run_dir);
    check(c.text && strcmp(c.text, text) == 0 && job_config_hash(&c) == fnv1a(text) &&
              strcmp(c.path, job) == 0,
          "text is the file, hash is its FNV-1a (%016llx)",
          (unsigned long long)job_config_hash(&c));
    printf("     job_config_print:\n");
    fflush(stdout);
    job_config_print(&c, 4);
    job_config_free(&c);
    job_config_free(&c); /* twice is harmless */

    /* log.run_dir set in the file is relative to the file too */
    rc = load(variant(0, NULL, "[log]\nrun_dir = ../runs/x\n"), 0, NULL, &c, err, sizeof err);
    snprintf(want, sizeof want, "%s/jobs/../runs/x", dir);
    check(rc == 0 && strcmp(c.run_dir, want) == 0, "log.run_dir set in the job file: %s (%s)",
          c.run_dir, err);
    if (rc == 0) job_config_free(&c);

    /* a preset, then explicit keys over it, whatever their order in the file */
    rc = load("[model]\ndim = 256\nn_kv_heads = 4\npreset = tiny\n[train]\nseq_len = 8\n"
              "steps = 1\n[data]\ntrain = /abs/t.bin\n",
              0, NULL, &c, err, sizeof err);
    check(rc == 0 && SHAPE(c)->dim == 256 && SHAPE(c)->head_dim == 64 && SHAPE(c)->n_kv_heads == 4 &&
              SHAPE(c)->n_layers == 4 && strcmp(c.data_train, "/abs/t.bin") == 0,
          "explicit keys override the preset: dim %d head_dim %d kv %d; absolute path kept %s",
          SHAPE(c)->dim, SHAPE(c)->head_dim, SHAPE(c)->n_kv_heads, c.data_train);
    if (rc == 0) job_config_free(&c);

    /* no preset: every shape key, the rest derived */
    rc = load("[model]\ndim = 64\nn_layers = 2\nn_heads = 4\nffn_dim = 128\nvocab_size = 256\n"
              "[train]\nseq_len = 32\nsteps = 3\nglobal_batch = 8\nmicro_batch = 4\n"
              "min_lr = 0\nsample_prompt = \"ROMEO:\\n\"\n[data]\ntrain = t.bin\nshuffle = off\n"
              "[runtime]\nbackend = cpu\n",
              0, NULL, &c, err, sizeof err);
    check(rc == 0 && SHAPE(c)->n_kv_heads == 4 && SHAPE(c)->max_seq_len == 32 &&
              SHAPE(c)->head_dim == 16 && SHAPE(c)->norm_eps == 1e-5f && SHAPE(c)->rope_theta == 10000 &&
              SHAPE(c)->init_std == 0.02f && c.global_batch == 8 && c.min_lr == 0 &&
              c.shuffle == 0 && strcmp(c.sample_prompt, "ROMEO:\n") == 0 &&
              c.backend == SHLM_BACKEND_CPU,
          "no preset: n_kv_heads = n_heads, max_seq_len = seq_len, quoted prompt decoded (%s)",
          err);
    if (rc == 0) job_config_free(&c);

    /* every choice key parsed once into its enum; the backends' options as set */
    rc = load(variant(0, NULL, "[fsdp]\nstrategy = HYBRID_SHARD\nparam_dtype = bf16\n"
                               "reduce_dtype = bf16\nactivation_checkpointing = selective\n"
                               "[train]\non_nonfinite = skip\n[runtime]\nbackend = cuda\n"
                               "comm_timeout_s = 2.5\n[cuda]\nattention = mma_sync\n"
                               "[nccl]\ncta_policy = efficiency\ncopy_engine_allgather = false\n"
                               "[checkpoint]\ndirect_io = false\ncollective_io = true\n"
                               "alignment = 4096\n"),
              0, NULL, &c, err, sizeof err);
    check(rc == 0 && c.strategy == FSDP_HYBRID_SHARD && c.param_dtype == SHLM_BF16 &&
              c.reduce_dtype == SHLM_BF16 && c.activation_checkpointing == MODEL_AC_SELECTIVE &&
              c.on_nonfinite == NONFINITE_SKIP && c.backend == SHLM_BACKEND_CUDA &&
              c.comm_timeout_s == 2.5f && c.cuda_attention == SHLM_ATTENTION_MMA_SYNC &&
              c.nccl_cta_policy == SHLM_NCCL_CTA_EFFICIENCY && c.nccl_copy_engine_allgather == 0 &&
              c.ckpt_direct_io == 0 && c.ckpt_collective_io == 1 && c.ckpt_alignment == 4096,
          "choice keys into enums, [runtime] [cuda] [nccl] [checkpoint] options (%s)", err);
    check(rc == 0 && strcmp(job_choice_name("fsdp.strategy", c.strategy), "HYBRID_SHARD") == 0 &&
              strcmp(job_choice_name("cuda.attention", c.cuda_attention), "mma_sync") == 0 &&
              strcmp(job_choice_name("fsdp.strategy", 9), "?") == 0 &&
              strcmp(job_choice_name("train.steps", 0), "?") == 0,
          "job_choice_name gives the word of a choice, ? for none");
    if (rc == 0) job_config_free(&c);

    /* layout: indentation, inline comments, '#' comments, CRLF, key: value */
    rc = load("# job\r\n  [model]\r\n    preset = tiny ; the small one\r\n[train]\r\n"
              "\tseq_len: 16\r\n  steps = 2\r\n[data]\r\n  train = t.bin\r\n",
              0, NULL, &c, err, sizeof err);
    check(rc == 0 && c.seq_len == 16 && c.steps == 2 && strcmp(c.preset, "tiny") == 0,
          "indentation, comments, CRLF and 'key: value' are read (%s)", err);
    if (rc == 0) job_config_free(&c);
}

static void test_errors(void) {
    expect_error("unknown section", variant(5, "[trian]", NULL), 0, NULL,
                 "PATH:5: unknown section [trian] (did you mean [train]? known: model train "
                 "fsdp lora data log checkpoint runtime cuda nccl)");
    expect_error("unknown empty section", variant(0, NULL, "[optimizer]\n"), 0, NULL,
                 "PATH:13: unknown section [optimizer] (known: model train fsdp lora data log "
                 "checkpoint runtime cuda nccl)");
    expect_error("unknown key", variant(8, "lrr = 1e-3", NULL), 0, NULL,
                 "PATH:8: unknown key 'lrr' in [train] (did you mean 'lr'?)");
    expect_error("unknown key, swapped letters", variant(7, "setps = 10", NULL), 0, NULL,
                 "PATH:7: unknown key 'setps' in [train] (did you mean 'steps'?)");
    expect_error("unknown key, nothing close", variant(8, "learning_rate = 1", NULL), 0, NULL,
                 "PATH:8: unknown key 'learning_rate' in [train]");
    expect_error("key in the wrong section", variant(0, NULL, "seed = 3\n"), 0, NULL,
                 "PATH:13: unknown key 'seed' in [data] (it belongs in [train])");
    expect_error("key outside any section", "steps = 3\n[model]\npreset = tiny\n", 0, NULL,
                 "PATH:1: key 'steps' is outside any section (put it under [train])");
    expect_error("not an integer", variant(7, "steps = ten", NULL), 0, NULL,
                 "PATH:7: [train] steps = 'ten': not an integer");
    expect_error("integer with a fraction", variant(6, "seq_len = 64.5", NULL), 0, NULL,
                 "PATH:6: [train] seq_len = '64.5': not an integer");
    expect_error("not a number", variant(8, "lr = fast", NULL), 0, NULL,
                 "PATH:8: [train] lr = 'fast': not a number");
    expect_error("nan", variant(8, "lr = nan", NULL), 0, NULL,
                 "PATH:8: [train] lr = 'nan': not a number");
    expect_error("-inf", variant(8, "lr = -inf", NULL), 0, NULL,
                 "PATH:8: [train] lr = '-inf': not a number");
    expect_error("past a double", variant(8, "lr = 1e999", NULL), 0, NULL,
                 "PATH:8: [train] lr = '1e999': out of range, must be in [0, 10]");
    expect_error("hexadecimal integer", variant(7, "steps = 0x10", NULL), 0, NULL,
                 "PATH:7: [train] steps = '0x10': not an integer");
    expect_error("not a boolean", variant(0, NULL, "shuffle = maybe\n"), 0, NULL,
                 "PATH:13: [data] shuffle = 'maybe': not a boolean (true or false)");
    expect_error("not an enum value", variant(0, NULL, "[runtime]\nbackend = gpu\n"), 0, NULL,
                 "PATH:14: [runtime] backend = 'gpu': not one of auto|cpu|cuda");
    expect_error("backend option, bad choice", variant(0, NULL, "[nccl]\ncta_policy = fast\n"), 0,
                 NULL, "PATH:14: [nccl] cta_policy = 'fast': not one of default|efficiency");
    expect_error("backend option, bad boolean",
                 variant(0, NULL, "[nccl]\ncopy_engine_allgather = 2\n"), 0, NULL,
                 "PATH:14: [nccl] copy_engine_allgather = '2': not a boolean (true or false)");
    expect_error("comm timeout of zero", variant(0, NULL, "[runtime]\ncomm_timeout_s = 0\n"), 0,
                 NULL, "PATH:14: [runtime] comm_timeout_s = '0': out of range, must be in (0, 10000000]");
    expect_error("comm timeout not a number",
                 variant(0, NULL, "[runtime]\ncomm_timeout_s = abc\n"), 0, NULL,
                 "PATH:14: [runtime] comm_timeout_s = 'abc': not a number");
    expect_error("negative checkpoint alignment",
                 variant(0, NULL, "[checkpoint]\nalignment = -4096\n"), 0, NULL,
                 "PATH:14: [checkpoint] alignment = '-4096': out of range, must be in [0, 1073741824]");
    expect_error("attention kernels", variant(0, NULL, "[cuda]\nattention = flash\n"), 0, NULL,
                 "PATH:14: [cuda] attention = 'flash': not one of sm90|mma_sync");
    expect_error("negative seed", variant(0, NULL, "[train]\nseed = -1\n"), 0, NULL,
                 "PATH:14: [train] seed = '-1': not an unsigned integer");
    expect_error("out of range (int)", variant(7, "steps = 0", NULL), 0, NULL,
                 "PATH:7: [train] steps = '0': out of range, must be in [1, 2147483647]");
    expect_error("out of range (int overflow)", variant(7, "steps = 99999999999", NULL), 0, NULL,
                 "PATH:7: [train] steps = '99999999999': out of range, must be in [1, 2147483647]");
    expect_error("out of range (half-open)", variant(0, NULL, "[train]\nbeta2 = 1\n"), 0, NULL,
                 "PATH:14: [train] beta2 = '1': out of range, must be in [0, 1)");
    expect_error("top_p = 0", variant(0, NULL, "[train]\nsample_top_p = 0\n"), 0, NULL,
                 "PATH:14: [train] sample_top_p = '0': out of range, must be in (0, 1]");
    expect_error("top_p > 1", variant(0, NULL, "[train]\nsample_top_p = 1.5\n"), 0, NULL,
                 "PATH:14: [train] sample_top_p = '1.5': out of range, must be in (0, 1]");
    expect_error("eps underflows float", variant(0, NULL, "[train]\neps = 1e-60\n"), 0, NULL,
                 "PATH:14: [train] eps = '1e-60': out of range, must be in (0, 1]");
    expect_error("duplicate key", variant(0, NULL, "[train]\nlr = 2e-3\n"), 0, NULL,
                 "PATH:14: duplicate key 'lr' in [train] (first set on line 8)");
    expect_error("data.train missing", variant(11, NULL, NULL), 0, NULL,
                 "PATH: [data] train is required");
    expect_error("data.train empty", variant(11, "train = \"\"", NULL), 0, NULL,
                 "PATH: [data] train is required");
    expect_error("steps missing", variant(7, NULL, NULL), 0, NULL,
                 "PATH: [train] steps is required");
    expect_error("seq_len missing", variant(6, NULL, NULL), 0, NULL,
                 "PATH: [train] seq_len is required");
    expect_error("no preset, shape incomplete",
                 variant(3, "dim = 64\nn_heads = 4\nvocab_size = 256", NULL), 0, NULL,
                 "PATH: [model] needs a preset (PRESETS), all of dim, n_layers, n_heads, ffn_dim, "
                 "vocab_size, or init_from a Hugging Face directory; missing: n_layers, ffn_dim");
    expect_error("unknown preset", variant(3, "preset = gpt2-medium", NULL), 0, NULL,
                 "PATH:3: [model] preset = 'gpt2-medium': unknown preset (known: PRESETS)");
    expect_error("syntax error", variant(8, "lr 1e-3", NULL), 0, NULL,
                 "PATH:8: syntax error: expected '[section]', 'key = value' or a comment");
    expect_error("unclosed section", variant(5, "[train", NULL), 0, NULL,
                 "PATH:5: syntax error: expected '[section]', 'key = value' or a comment");
    /* a line longer than inih's default buffer: the value's own limit speaks, not the
     * line's length (a path of 1023 characters loads: test_long_lines) */
    char longline[400];
    snprintf(longline, sizeof longline, "sample_prompt = %0300d", 7);
    char *t = strdup(variant(0, NULL, "[train]\n"));
    t = realloc(t, strlen(t) + sizeof longline + 2);
    strcat(strcat(t, longline), "\n");
#if HAVE_INIH_RUNTIME_LINE
    expect_error("long line, value too long", t, 0, NULL,
                 "PATH:14: [train] sample_prompt = '0000000000000000000000000000000000000000000"
                 "00000000000000000...': longer than 255 characters");
#else
    expect_error("line too long", t, 0, NULL, "PATH:14: line too long (over 197 characters)");
#endif
    free(t);
    expect_error("first error wins", variant(7, "steps = ten", "[train]\nlrr = 3\n"), 0, NULL,
                 "PATH:7: [train] steps = 'ten': not an integer");
    expect_error("syntax error before a bad key", variant(6, "oops", "[train]\nlrr = 3\n"), 0,
                 NULL, "PATH:6: syntax error: expected '[section]', 'key = value' or a comment");
    expect_error("bad escape", variant(0, NULL, "[train]\nsample_prompt = \"a\\qb\"\n"), 0, NULL,
                 "PATH:14: [train] sample_prompt = '\"a\\qb\"': bad escape '\\q' (use \\\" \\\\ "
                 "\\n \\t)");

    /* cross-key checks, each naming where the offending key was set */
    expect_error("seq_len > max_seq_len", variant(6, "seq_len = 512", NULL), 0, NULL,
                 "PATH:6: [train] seq_len = 512 is larger than [model] max_seq_len = 256");
    expect_error("global_batch not a multiple",
                 variant(0, NULL, "[train]\nmicro_batch = 2\nglobal_batch = 3\n"), 0, NULL,
                 "PATH:15: [train] global_batch = 3 is not a multiple of micro_batch = 2");
    expect_error("n_kv_heads does not divide n_heads",
                 variant(3, "preset = tiny\nn_kv_heads = 3", NULL), 0, NULL,
                 "PATH:4: [model] n_kv_heads = 3 does not divide n_heads = 4");
    expect_error("dim not divisible by n_heads", variant(3, "preset = tiny\ndim = 130", NULL), 0,
                 NULL, "PATH:4: [model] dim = 130 is not divisible by n_heads = 4");
    expect_error("min_lr > lr", variant(0, NULL, "[train]\nmin_lr = 0.01\n"), 0, NULL,
                 "PATH:14: [train] min_lr = 0.01 is larger than lr = 0.001");
    expect_error("warmup_steps > steps", variant(0, NULL, "[train]\nwarmup_steps = 11\n"), 0,
                 NULL, "PATH:14: [train] warmup_steps = 11 is more than steps = 10");
    expect_error("model validation", variant(3, "preset = tiny\ndim = 132\nn_heads = 12\nn_kv_heads = 12", NULL), 0,
                 NULL, "PATH: bad model shape: head_dim (11) must be even for RoPE");

    char missing[600];
    snprintf(missing, sizeof missing, "%s/nope.ini", dir);
    job_config c;
    char err[1536] = "";
    int rc = job_config_load(&c, missing, 0, NULL, err, sizeof err);
    char want[700];
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", missing);
    check(rc == -1 && strcmp(err, want) == 0, "missing job file: %s", err);
}

static void test_overrides(void) {
    const char *text = variant(0, NULL, NULL);
    job_config c;
    char err[1536] = "";
    char *sets[] = {"train.lr=0.01", " data.train = other.bin ", "log.run_dir=/tmp/r"};
    int rc = load(text, 3, sets, &c, err, sizeof err);
    char want_text[4096];
    snprintf(want_text, sizeof want_text,
             "%s\n--set train.lr=0.01\n--set  data.train = other.bin \n--set log.run_dir=/tmp/r",
             text);
    check(rc == 0 && c.lr == 0.01f && fabsf(c.min_lr - 0.001f) < 1e-9f && strcmp(c.data_train, "other.bin") == 0 &&
              strcmp(c.run_dir, "/tmp/r") == 0,
          "--set overrides the file (lr %g, min_lr %g), a --set path is not joined to the job's "
          "directory (%s) %s", c.lr, c.min_lr, c.data_train, err);
    check(rc == 0 && strcmp(c.text, want_text) == 0 && job_config_hash(&c) == fnv1a(want_text),
          "text and hash include the --set lines");
    if (rc == 0) job_config_free(&c);

    char *bad1[] = {"train.lrr=1"};
    expect_error("--set unknown key", text, 1, bad1,
                 "--set train.lrr: unknown key 'lrr' in [train] (did you mean 'lr'?)");
    char *bad2[] = {"train.steps=ten"};
    expect_error("--set malformed", text, 1, bad2,
                 "--set train.steps: [train] steps = 'ten': not an integer");
    char *bad3[] = {"steps=3"};
    expect_error("--set without a section", text, 1, bad3,
                 "--set 'steps=3': expected section.key=value");
    char *bad4[] = {"train.steps"};
    expect_error("--set without a value", text, 1, bad4,
                 "--set 'train.steps': expected section.key=value");
    char *bad5[] = {"trian.steps=3"};
    expect_error("--set unknown section", text, 1, bad5,
                 "--set trian.steps: unknown section [trian] (did you mean [train]? known: "
                 "model train fsdp lora data log checkpoint runtime cuda nccl)");
    char *bad6[] = {"train.seq_len=1024"};
    expect_error("--set breaking a cross-key check", text, 1, bad6,
                 "--set train.seq_len: [train] seq_len = 1024 is larger than [model] "
                 "max_seq_len = 256");
    char *bad7[] = {"train.steps=3", "train.steps=4"};
    expect_error("--set twice", text, 2, bad7, "--set train.steps: given twice");
    char *bad8[] = {"model.preset=gpt2"};
    expect_error("--set unknown preset", text, 1, bad8,
                 "--set model.preset: [model] preset = 'gpt2': unknown preset (known: PRESETS)");
    char *ok9[] = {"train.steps=100", "train.warmup_steps=50"};
    rc = load(variant(0, NULL, "[train]\nwarmup_steps = 5\n"), 2, ok9, &c, err, sizeof err);
    check(rc == 0 && c.steps == 100 && c.warmup_steps == 50, "--set of two keys (%s)", err);
    if (rc == 0) job_config_free(&c);
    char *ok10[] = {"data.val="};
    rc = load(text, 1, ok10, &c, err, sizeof err);
    check(rc == 0 && c.data_val[0] == '\0', "--set data.val= turns validation off (%s)", err);
    if (rc == 0) job_config_free(&c);
}

/* Paths as long as a path key holds (1023 characters) in the job file and in a --set;
 * one longer gets that key's limit in the message, however it is given. */
static void test_long_lines(void) {
    job_config c;
    char err[1536] = "", path[1100];
    path[0] = '/';
    memset(path + 1, 'p', 1022);
    path[1023] = '\0';
    char *t = malloc(8192);
    snprintf(t, 8192, "%s[checkpoint]\ndir = %s\n", variant(0, NULL, NULL), path);
    int rc = load(t, 0, NULL, &c, err, sizeof err);
#if HAVE_INIH_RUNTIME_LINE
    check(rc == 0 && strcmp(c.ckpt_dir, path) == 0,
          "a 1023-character path on a job-file line loads (%s)", rc ? err : "ok");
#else
    check(rc == -1 && strstr(err, "line too long"), "a line longer than inih's buffer: %s", err);
#endif
    if (rc == 0) job_config_free(&c);
    char *set = malloc(4200);
    snprintf(set, 4200, "checkpoint.dir=%s", path);
    char *sets[] = {set};
    rc = load(variant(0, NULL, NULL), 1, sets, &c, err, sizeof err);
    check(rc == 0 && strcmp(c.ckpt_dir, path) == 0, "a 1023-character path in a --set loads (%s)",
          rc ? err : "ok");
    if (rc == 0) job_config_free(&c);
    /* 3,000 characters: longer than the key holds (and than 2,048) */
    snprintf(set, 4200, "checkpoint.dir=/%03000d", 0);
    expect_error("--set of 3,000 characters", variant(0, NULL, NULL), 1, sets,
                 "--set checkpoint.dir: [checkpoint] dir = '/00000000000000000000000000000000000"
                 "000000000000000000000000...': longer than 1023 characters");
    free(set);
    free(t);
}

static void test_paths(void) {
    job_config c;
    char err[1536] = "";
    write_job(variant(0, NULL, NULL));
    /* from the job's own directory, the job path has no directory part */
    char cwd[1024], jobs_dir[600];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", dir);
    if (!getcwd(cwd, sizeof cwd) || chdir(jobs_dir) != 0) {
        check(0, "chdir %s", jobs_dir);
        return;
    }
    int rc = job_config_load(&c, "job.ini", 0, NULL, err, sizeof err);
    check(rc == 0 && strcmp(c.data_train, "data/train.bin") == 0 &&
              strcmp(c.data_val, "data/val.bin") == 0 && strcmp(c.run_dir, "runs/job") == 0,
          "loaded as job.ini from its directory: train %s val %s", c.data_train, c.data_val);
    if (rc == 0) job_config_free(&c);
    /* from the directory above: jobs/job.ini finds jobs/data/... */
    if (chdir(dir) != 0) return;
    rc = job_config_load(&c, "jobs/job.ini", 0, NULL, err, sizeof err);
    check(rc == 0 && strcmp(c.data_train, "jobs/data/train.bin") == 0 &&
              strcmp(c.data_val, "jobs/data/val.bin") == 0,
          "loaded as jobs/job.ini: train %s val %s", c.data_train, c.data_val);
    if (rc == 0) job_config_free(&c);
    if (chdir(cwd) != 0) check(0, "chdir back to %s", cwd);
}

/* [data] tokenizer: bytes by default, model.init_from's directory when it holds a
 * tokenizer, a path relative to the job file, and the word bytes kept as it is. */
static void test_tokenizer_key(void) {
    job_config c;
    char err[1536] = "", model[600], want[700];
    int rc = load(variant(0, NULL, NULL), 0, NULL, &c, err, sizeof err);
    check(rc == 0 && !strcmp(c.tokenizer, "bytes"), "data.tokenizer defaults to bytes: %s",
          rc ? err : c.tokenizer);
    if (rc == 0) job_config_free(&c);
    snprintf(model, sizeof model, "%s/jobs/model", dir);
    mkdir(model, 0700);
    /* a directory model.init_from takes: a checkpoint directory's `latest` (the shape is
     * then the job's preset) */
    snprintf(want, sizeof want, "%s/latest", model);
    FILE *latest = fopen(want, "w");
    if (latest) fclose(latest);
    const char *with_init = variant(3, "preset = tiny\ninit_from = model", NULL);
    rc = load(with_init, 0, NULL, &c, err, sizeof err);
    check(rc == 0 && !strcmp(c.tokenizer, "bytes"),
          "init_from without a tokenizer: data.tokenizer is bytes: %s", rc ? err : c.tokenizer);
    if (rc == 0) job_config_free(&c);
    snprintf(want, sizeof want, "%s/tokenizer.json", model);
    FILE *f = fopen(want, "w");
    if (f) fclose(f);
    rc = load(with_init, 0, NULL, &c, err, sizeof err);
    check(rc == 0 && !strcmp(c.tokenizer, model),
          "init_from holding tokenizer.json: data.tokenizer is that directory: %s",
          rc ? err : c.tokenizer);
    if (rc == 0) job_config_free(&c);
    snprintf(want, sizeof want, "%s/jobs/tok/tokenizer.model", dir);
    rc = load(variant(0, NULL, "tokenizer = tok/tokenizer.model\n"), 0, NULL, &c, err, sizeof err);
    check(rc == 0 && !strcmp(c.tokenizer, want), "data.tokenizer is relative to the job: %s",
          rc ? err : c.tokenizer);
    if (rc == 0) job_config_free(&c);
    rc = load(variant(3, "preset = tiny\ninit_from = model", "tokenizer = bytes\n"), 0, NULL, &c,
              err, sizeof err);
    check(rc == 0 && !strcmp(c.tokenizer, "bytes"), "data.tokenizer = bytes stays bytes: %s",
          rc ? err : c.tokenizer);
    if (rc == 0) job_config_free(&c);
}

/* The repository's own job files, when the test knows where the sources are. */
static void test_repo_jobs(void) {
    const char *src = getenv("SHLM_SRCDIR");
    if (!src) {
        printf("# SHLM_SRCDIR not set: the repository's jobs/*.ini are not checked\n");
        return;
    }
    const char *names[] = {"tiny", "tinyllama-1b", "llama2-7b", "llama2-13b", "llama2-70b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024], err[1536] = "";
        snprintf(path, sizeof path, "%s/jobs/%s.ini", src, names[i]);
        if (access(path, R_OK) != 0) {
            printf("# %s: not there yet\n", path);
            continue;
        }
        job_config c;
        int rc = job_config_load(&c, path, 0, NULL, err, sizeof err);
        check(rc == 0, "%s loads %s", path, err);
        if (rc == 0) job_config_free(&c);
    }
}

int main(int argc, char **argv) {
    char cwd[512];
    printf("# reproduce: cd %s && %s\n", getcwd(cwd, sizeof cwd) ? cwd : ".", argv[0]);
    (void)argc;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/shlm-test-config-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    snprintf(job, sizeof job, "%s/jobs", dir);
    mkdir(job, 0700);
    snprintf(job, sizeof job, "%s/jobs/job.ini", dir);

    test_valid();
    test_errors();
    test_overrides();
    test_long_lines();
    test_paths();
    test_tokenizer_key();
    test_repo_jobs();

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    return check_exit();
}
