/* `shardlm generate`: text sampled from a checkpoint (or a Hugging Face directory) at
 * any world size and strategy, and optionally the prompt's logits for golden checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "kernels/check.h"
#include "src/checkpoint.h"
#include "src/commands.h"
#include "src/sample.h"
#include "src/train.h"

static const char usage_text[] =
    "usage: shardlm generate JOB.ini --ckpt CKPT (--prompt TEXT | --prompt-ids I,J,...)\n"
    "         [--tokens N] [--temperature T] [--top-p P] [--seed S]\n"
    "         [--dump-logits FILE.safetensors] [--set section.key=value ...]\n"
    "  CKPT: a step_<N>.h5 file, a checkpoint directory (its `latest`), or a Hugging Face\n"
    "  directory (config.json + safetensors). Defaults come from the job's [train]\n"
    "  sample_* keys. --dump-logits writes the prompt's logits (input_ids I32 [1,T],\n"
    "  logits F32 [1,T,V]) before sampling.\n";

typedef struct gen_args {
    const char *job, *ckpt, *prompt, *prompt_ids, *dump;
    int tokens;            /* -1: the job's sample_tokens */
    float temperature;     /* NAN: the job's */
    float top_p;           /* NAN: the job's */
    long long seed;        /* -1: the job's */
    int n_sets;
    char **sets;
} gen_args;

static int parse(int argc, char **argv, gen_args *a, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    a->tokens = -1;
    a->temperature = NAN;
    a->top_p = NAN;
    a->seed = -1;
    a->sets = calloc((size_t)argc + 1, sizeof(char *));
    SHLM_CHECK_ALLOC(a->sets);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int has = i + 1 < argc;
        char *end = NULL;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            snprintf(err, errlen, "help");
            return -1;
        }
        if (o[0] == '-' && !has) {
            snprintf(err, errlen, "%s needs a value", o);
            return -1;
        }
        if (strcmp(o, "--ckpt") == 0) a->ckpt = argv[++i];
        else if (strcmp(o, "--prompt") == 0) a->prompt = argv[++i];
        else if (strcmp(o, "--prompt-ids") == 0) a->prompt_ids = argv[++i];
        else if (strcmp(o, "--dump-logits") == 0) a->dump = argv[++i];
        else if (strcmp(o, "--set") == 0) a->sets[a->n_sets++] = argv[++i];
        else if (strcmp(o, "--tokens") == 0) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > (1 << 24)) goto bad;
            a->tokens = (int)v;
        } else if (strcmp(o, "--temperature") == 0) {
            a->temperature = strtof(argv[++i], &end);
            if (*end || !(a->temperature >= 0)) goto bad;
        } else if (strcmp(o, "--top-p") == 0) {
            a->top_p = strtof(argv[++i], &end);
            if (*end || !(a->top_p > 0 && a->top_p <= 1)) goto bad;
        } else if (strcmp(o, "--seed") == 0) {
            a->seed = strtoll(argv[++i], &end, 10);
            if (*end || a->seed < 0) goto bad;
        } else if (o[0] == '-') {
            snprintf(err, errlen, "unknown option '%s'", o);
            return -1;
        } else if (a->job) {
            snprintf(err, errlen, "more than one job file ('%s' and '%s')", a->job, o);
            return -1;
        } else {
            a->job = o;
        }
        continue;
    bad:
        snprintf(err, errlen, "bad value '%s' for %s", argv[i], o);
        return -1;
    }
    if (!a->job) snprintf(err, errlen, "no job file given");
    else if (!a->ckpt) snprintf(err, errlen, "--ckpt CKPT is required");
    else if (!a->prompt == !a->prompt_ids) snprintf(err, errlen, "give one of --prompt or --prompt-ids");
    else return 0;
    return -1;
}

/* The prompt as token ids: bytes (vocab 256 byte tokenizer) or a comma-separated list. */
static int prompt_tokens(const gen_args *a, int V, int32_t **ids, int *n, char *err,
                         size_t errlen) {
    const char *s = a->prompt ? a->prompt : a->prompt_ids;
    size_t cap = strlen(s) + 1;
    *ids = malloc(cap * sizeof(int32_t));
    SHLM_CHECK_ALLOC(*ids);
    *n = 0;
    if (a->prompt) {
        for (const unsigned char *p = (const unsigned char *)s; *p; p++) (*ids)[(*n)++] = *p % V;
    } else {
        const char *p = s;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= V) {
                snprintf(err, errlen, "--prompt-ids: '%s' is not a list of ids in [0, %d)", s, V);
                return -1;
            }
            (*ids)[(*n)++] = (int32_t)v;
            p = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') {
                snprintf(err, errlen, "--prompt-ids: expected ',' in '%s'", s);
                return -1;
            }
        }
    }
    if (*n == 0) {
        snprintf(err, errlen, "the prompt is empty");
        return -1;
    }
    return 0;
}

/* Rank 0 writes the prompt's logits (all positions) as safetensors. */
static int dump_logits(const char *path, const int32_t *ids, int n, const float *logits, int V,
                       char *err, size_t errlen) {
    const char *names[] = {"input_ids", "logits"};
    safetensors_dtype dt[] = {SAFETENSORS_I32, SAFETENSORS_F32};
    int nd[] = {2, 3};
    int64_t s0[] = {1, n}, s1[] = {1, n, V};
    const int64_t *shapes[] = {s0, s1};
    const void *data[] = {ids, logits};
    return safetensors_write(path, 2, names, dt, nd, shapes, data, 0, NULL, NULL, err, errlen);
}

int cmd_generate(int argc, char **argv) {
    gen_args a;
    char err[1536] = "";
    int ok = parse(argc, argv, &a, err, sizeof err) == 0;
    if (!ok && strcmp(err, "help") == 0) {
        if (shlm_rank() <= 0) fputs(usage_text, stdout);
        free(a.sets);
        return 0;
    }
    if (all_ranks_ok(ok, err)) {
        if (shlm_rank() <= 0) fputs(usage_text, stderr);
        free(a.sets);
        return 2;
    }
    /* sampling needs no validation data: do not open the job's (unless asked to) */
    int val_set = 0;
    for (int i = 0; i < a.n_sets; i++) val_set |= strncmp(a.sets[i], "data.val", 8) == 0;
    if (!val_set) a.sets[a.n_sets++] = "data.val=";
    run r;
    if (run_setup(&r, a.job, a.n_sets, a.sets, 0) != 0) {
        free(a.sets);
        return 1;
    }
    free(a.sets);
    const job_config *c = &r.cfg;
    const int V = c->model.vocab_size;
    int rc = 1;
    int32_t *prompt = NULL, *out = NULL;
    float *logits = NULL;
    if (checkpoint_init_from(r.engine, &r.topo, &c->model, a.ckpt, err, sizeof err) != 0) {
        all_ranks_ok(0, err);
        goto done;
    }
    int n_prompt = 0;
    ok = prompt_tokens(&a, V, &prompt, &n_prompt, err, sizeof err) == 0;
    if (ok && a.dump && n_prompt > c->seq_len) {
        snprintf(err, sizeof err, "--dump-logits: the prompt has %d tokens, more than "
                 "train.seq_len = %d", n_prompt, c->seq_len);
        ok = 0;
    }
    if (all_ranks_ok(ok, err)) goto done;
    if (a.dump) {
        logits = malloc((size_t)n_prompt * V * sizeof(float));
        SHLM_CHECK_ALLOC(logits);
        fsdp_begin_pass(r.engine, 0);
        llama_forward(r.model, prompt, NULL, 1, n_prompt, NULL, logits, NULL);
        ok = r.rank != 0 || dump_logits(a.dump, prompt, n_prompt, logits, V, err, sizeof err) == 0;
        if (all_ranks_ok(ok, err)) goto done;
        if (r.rank == 0) printf("generate: wrote the logits of %d prompt tokens to %s\n", n_prompt, a.dump);
    }
    const int n_new = a.tokens >= 0 ? a.tokens : (c->sample_tokens > 0 ? c->sample_tokens : 200);
    const float temp = isnan(a.temperature) ? c->sample_temperature : a.temperature;
    const float top_p = isnan(a.top_p) ? c->sample_top_p : a.top_p;
    const uint64_t seed = a.seed >= 0 ? (uint64_t)a.seed : c->seed;
    out = malloc((size_t)(n_prompt + n_new) * sizeof(int32_t));
    SHLM_CHECK_ALLOC(out);
    const double t0 = MPI_Wtime();
    fsdp_begin_pass(r.engine, 0);
    sample_generate(r.model, c->seq_len, prompt, n_prompt, n_new, temp, top_p, seed, out);
    const double dt = MPI_Wtime() - t0;
    if (r.rank == 0) {
        printf("--- generate: %d tokens from %s, temperature %.2f, top_p %.2f, seed %llu, %d "
               "ranks %s (%.1f tokens/s) ---\n", n_new, a.ckpt, temp, top_p,
               (unsigned long long)seed, r.world, c->strategy, dt > 0 ? n_new / dt : 0.0);
        if (V == 256) { /* the byte tokenizer: show text */
            for (int i = 0; i < n_prompt + n_new; i++) {
                int ch = out[i];
                putchar(ch == '\n' || ch == '\t' || (ch >= 32 && ch < 127) ? ch : '?');
            }
            putchar('\n');
        } else {
            for (int i = 0; i < n_prompt + n_new; i++) printf("%s%d", i ? " " : "", out[i]);
            putchar('\n');
        }
        printf("---\n");
        fflush(stdout);
    }
    rc = 0;
done:
    free(prompt);
    free(out);
    free(logits);
    run_teardown(&r);
    return rc;
}
