/* `shardlm generate`: text sampled from a checkpoint (or a Hugging Face directory) at
 * any world size and strategy, the prompt encoded and the reply decoded with the job's
 * tokenizer, a chat prompt rendered with the model's template, and optionally the
 * prompt's logits for golden checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "kernels/check.h"
#include "src/data/chat_template.h"
#include "src/ckpt/checkpoint.h"
#include "src/cli/commands.h"
#include "src/data/doc_pieces.h"
#include "src/base/numbers.h"
#include "src/run/sample.h"
#include "src/run/run.h"

static const char usage_text[] =
    "usage: shardlm generate JOB.ini [--ckpt CKPT] (--prompt TEXT | --prompt-ids I,J,...)\n"
    "         [--chat [--system TEXT] [--chat-template auto|chatml|qwen2.5|llama2]] [--tokens N]\n"
    "         [--temperature T] [--top-p P] [--seed S] [--ids] [--truncate-prompt]\n"
    "         [--dump-logits FILE.safetensors] [--set section.key=value ...]\n"
    "  Weights: CKPT (a step_<N>.h5 file, a checkpoint directory (its `latest`), or a\n"
    "  Hugging Face directory), else checkpoint.resume (auto: checkpoint.dir's latest), else\n"
    "  model.init_from, else the seed's initialisation (said so). The prompt is encoded with\n"
    "  the job's tokenizer (data.tokenizer; bos as the model's configuration says); --chat\n"
    "  renders it as one user turn (after --system, if given) with the model's chat template\n"
    "  (a tokenizer without one: the model family's, qwen2's being qwen2.5) and the\n"
    "  assistant's turn opened. The reply is printed as it is generated and ends at\n"
    "  an eos id or after N tokens (--tokens; default train.sample_tokens, else 200).\n"
    "  --temperature 0 is greedy; defaults come from the job's [train] sample_* keys.\n"
    "  A prompt longer than the context (train.seq_len) is refused: the model would not\n"
    "  see its start; --truncate-prompt keeps its last train.seq_len tokens, saying so.\n"
    "  --ids also prints the prompt's and the reply's token ids. --dump-logits writes the\n"
    "  prompt's logits (input_ids I32 [1,T], logits F32 [1,T,V]) before sampling (into a\n"
    "  FIFO or a character device such as /dev/null as it is). No [train] schedule keys\n"
    "  are needed; train.seq_len (the context) defaults to model.max_seq_len.\n";

typedef struct gen_args {
    const char *job, *ckpt, *prompt, *prompt_ids, *dump, *system, *chat_template;
    int chat, show_ids;
    int truncate_prompt;   /* keep the last train.seq_len tokens of a longer prompt */
    int tokens;            /* -1: the job's sample_tokens */
    float temperature;     /* NAN: the job's */
    float top_p;           /* NAN: the job's */
    uint64_t seed;
    int seed_given;        /* 0: the job's train.seed */
    int n_sets;
    char **sets;
} gen_args;

static int parse(int argc, char **argv, gen_args *a, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    a->tokens = -1;
    a->temperature = NAN;
    a->top_p = NAN;
    a->sets = calloc((size_t)argc + 1, sizeof(char *));
    SHLM_CHECK_ALLOC(a->sets);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int has = i + 1 < argc;
        double x = 0;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            snprintf(err, errlen, "help");
            return -1;
        }
        if (strcmp(o, "--chat") == 0 || strcmp(o, "--ids") == 0 ||
            strcmp(o, "--truncate-prompt") == 0) {
            *(o[2] == 'c' ? &a->chat : o[2] == 'i' ? &a->show_ids : &a->truncate_prompt) = 1;
            continue;
        }
        if (o[0] == '-' && !has) {
            snprintf(err, errlen, "%s needs a value", o);
            return -1;
        }
        if (strcmp(o, "--ckpt") == 0) a->ckpt = argv[++i];
        else if (strcmp(o, "--prompt") == 0) a->prompt = argv[++i];
        else if (strcmp(o, "--prompt-ids") == 0) a->prompt_ids = argv[++i];
        else if (strcmp(o, "--dump-logits") == 0) a->dump = argv[++i];
        else if (strcmp(o, "--system") == 0) a->system = argv[++i];
        else if (strcmp(o, "--chat-template") == 0) a->chat_template = argv[++i];
        else if (strcmp(o, "--set") == 0) a->sets[a->n_sets++] = argv[++i];
        /* the numbers stand for the job's sampling keys: their rules */
        else if (strcmp(o, "--tokens") == 0) {
            if (job_key_option("train.sample_tokens", o, argv[++i], &x, err, errlen) != 0) return -1;
            a->tokens = (int)x;
        } else if (strcmp(o, "--temperature") == 0) {
            if (job_key_option("train.sample_temperature", o, argv[++i], &x, err, errlen) != 0)
                return -1;
            a->temperature = (float)x;
        } else if (strcmp(o, "--top-p") == 0) {
            if (job_key_option("train.sample_top_p", o, argv[++i], &x, err, errlen) != 0) return -1;
            a->top_p = (float)x;
        } else if (strcmp(o, "--seed") == 0) {
            if (num_option_u64(o, argv[++i], &a->seed, err, errlen) != 0) return -1;
            a->seed_given = 1;
        } else if (o[0] == '-') {
            snprintf(err, errlen, "unknown option '%s'", o);
            return -1;
        } else if (a->job) {
            snprintf(err, errlen, "more than one job file ('%s' and '%s')", a->job, o);
            return -1;
        } else {
            a->job = o;
        }
    }
    if (!a->job) snprintf(err, errlen, "no job file given");
    else if (!a->prompt == !a->prompt_ids) snprintf(err, errlen, "give one of --prompt or --prompt-ids");
    else if ((a->chat || a->system || a->chat_template) && !a->prompt)
        snprintf(err, errlen, "--chat, --system and --chat-template take a --prompt TEXT");
    else if ((a->system || a->chat_template) && !a->chat)
        snprintf(err, errlen, "--system and --chat-template go with --chat");
    else return 0;
    return -1;
}

/* The prompt as token ids: --prompt-ids as given; --prompt encoded with the job's
 * tokenizer (bos as the model's configuration says), or with --chat rendered as one user
 * turn with the model's chat template (which writes its own special tokens) and the
 * assistant's turn opened. */
static int prompt_tokens(const gen_args *a, const run *r, int32_t **ids, int *n, char *err,
                         size_t errlen) {
    const int V = model_shape_vocab_size(&r->cfg.model);
    *ids = NULL;
    *n = 0;
    if (a->prompt_ids) {
        const char *s = a->prompt_ids, *p = s;
        *ids = malloc((strlen(s) + 1) * sizeof(int32_t));
        SHLM_CHECK_ALLOC(*ids);
        /* comma-separated ids, each a strict number (src/base/numbers.h) in [0, V) */
        for (;;) {
            const size_t len = strcspn(p, ",");
            char item[32];
            long long v = -1;
            snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), p);
            if (len >= sizeof item || num_parse_int(item, &v) != NUM_OK || v < 0 || v >= V) {
                snprintf(err, errlen, "--prompt-ids: '%.*s' (id %d of '%.200s') is not a token "
                         "id in [0, %d)", (int)(len < 40 ? len : 40), p, *n + 1, s, V);
                return -1;
            }
            (*ids)[(*n)++] = (int32_t)v;
            if (!p[len]) break;
            p += len + 1;
        }
    } else {
        if (run_check_tokenizer(r, err, errlen) != 0) return -1;
        token_ids t = {0};
        int rc;
        if (a->chat) {
            chat_template ct;
            doc_pieces d = {0};
            byte_buf flags = {0};
            const chat_message m[2] = {{"system", a->system}, {"user", a->prompt}};
            /* a tokenizer without a template of its own: the model family's default */
            const char *name = a->chat_template;
            if ((!name || strcmp(name, "auto") == 0) && !tokenizer_chat_template(r->tok))
                name = r->cfg.model.family->chat_template;
            rc = chat_template_for(&ct, r->tok, name, err, errlen);
            if (rc == 0) {
                rc = chat_render_pieces(&ct, a->system ? m : m + 1, a->system ? 2 : 1, 1, &d,
                                        err, errlen);
                if (rc == 0) rc = doc_pieces_encode(r->tok, &d, &t, &flags, err, errlen);
                chat_template_free(&ct);
            }
            doc_pieces_free(&d);
            free(flags.data);
        } else {
            rc = tokenizer_encode_with(r->tok, a->prompt, strlen(a->prompt),
                                       tokenizer_default_flags(r->tok) & TOKENIZER_ADD_BOS, &t,
                                       err, errlen);
        }
        *ids = t.ids;
        *n = (int)t.n;
        if (rc != 0) return -1;
    }
    if (*n == 0) {
        snprintf(err, errlen, "the prompt is empty");
        return -1;
    }
    return 0;
}

/* Rank 0 writes the prompt's logits (all positions) as safetensors (into a FIFO or a
 * character device as it is: io/safe_file.h). */
static int dump_logits(const char *path, const int32_t *ids, int n, const float *logits, int V,
                       char *err, size_t errlen) {
    const char *names[] = {"input_ids", "logits"};
    safetensors_dtype dt[] = {SAFETENSORS_I32, SAFETENSORS_F32};
    int nd[] = {2, 3};
    int64_t s0[] = {1, n}, s1[] = {1, n, V};
    const int64_t *shapes[] = {s0, s1};
    const void *data[] = {ids, logits};
    return safetensors_write_output(path, 2, names, dt, nd, shapes, data, 0, NULL, NULL, err,
                                    errlen);
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
    if (!ok) { /* one line; the usage is --help's */
        const size_t len = strlen(err);
        snprintf(err + len, sizeof err - len, " (usage: shardlm generate --help)");
    }
    if (any_rank_failed(ok, err)) {
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
    const int V = model_shape_vocab_size(&c->model);
    int rc = 1;
    int32_t *prompt = NULL, *out = NULL;
    float *logits = NULL;
    int n_prompt = 0;
    ok = prompt_tokens(&a, &r, &prompt, &n_prompt, err, sizeof err) == 0;
    /* The context slides over the reply as it grows, but a prompt longer than it would
     * lose its start before the first token: the reply would answer another text, so
     * that is refused unless asked for */
    if (ok && n_prompt > c->seq_len && !a.truncate_prompt) {
        char longer[96] = "";
        if (c->seq_len < model_shape_max_seq_len(&c->model))
            snprintf(longer, sizeof longer, ", raise train.seq_len (up to model.max_seq_len = %d)",
                     model_shape_max_seq_len(&c->model));
        snprintf(err, sizeof err, "the prompt has %d tokens, more than the context "
                 "(train.seq_len = %d): the model would not see its first %d; shorten it%s or "
                 "give --truncate-prompt to keep its last %d tokens", n_prompt, c->seq_len,
                 n_prompt - c->seq_len, longer, c->seq_len);
        ok = 0;
    } else if (ok && n_prompt > c->seq_len) {
        if (r.rank == 0)
            fprintf(stderr, "shardlm: warning: the prompt has %d tokens, more than the context "
                    "(train.seq_len = %d): its first %d are dropped, its last %d kept "
                    "(--truncate-prompt)\n", n_prompt, c->seq_len, n_prompt - c->seq_len,
                    c->seq_len);
        memmove(prompt, prompt + (n_prompt - c->seq_len), (size_t)c->seq_len * sizeof *prompt);
        n_prompt = c->seq_len;
    }
    if (any_rank_failed(ok, err)) goto done;
    char what[2100];
    if (run_load_weights(&r, a.ckpt, what, sizeof what) != 0) goto done;
    if (a.dump) {
        logits = malloc((size_t)n_prompt * V * sizeof(float));
        SHLM_CHECK_ALLOC(logits);
        fsdp_begin_pass(r.engine, 0);
        const model_batch b = {prompt, NULL, NULL, 1, n_prompt};
        model_forward(r.model, &b, NULL, logits, NULL);
        ok = r.rank != 0 || dump_logits(a.dump, prompt, n_prompt, logits, V, err, sizeof err) == 0;
        if (any_rank_failed(ok, err)) goto done;
        if (r.rank == 0) printf("generate: wrote the logits of %d prompt tokens to %s\n", n_prompt, a.dump);
    }
    const int n_new = a.tokens >= 0 ? a.tokens : (c->sample_tokens > 0 ? c->sample_tokens : 200);
    int n_stop = 0;
    const int32_t *stop = tokenizer_eos_ids(r.tok, &n_stop);
    const sample_options so = {.temperature = isnan(a.temperature) ? c->sample_temperature
                                                                    : a.temperature,
                               .top_p = isnan(a.top_p) ? c->sample_top_p : a.top_p,
                               .seed = a.seed_given ? a.seed : c->seed,
                               .stop_ids = stop, .n_stop = n_stop};
    out = malloc((size_t)(n_prompt + n_new) * sizeof(int32_t));
    SHLM_CHECK_ALLOC(out);
    if (r.rank == 0) {
        printf("--- generate: up to %d tokens from %s, temperature %.2f, top_p %.2f, seed %llu, "
               "%d ranks %s ---\n", n_new, what, so.temperature, so.top_p,
               (unsigned long long)so.seed, r.world, strategy_name(c->strategy));
        fflush(stdout);
    }
    /* the byte tokenizer cannot spell another vocabulary's ids: show ids */
    const int ids_only = strcmp(tokenizer_kind(r.tok), "bytes") == 0 && V != 256;
    const double t0 = MPI_Wtime();
    fsdp_begin_pass(r.engine, 0);
    const int n_gen = sample_print(r.model, r.tok, ids_only, c->seq_len, prompt, n_prompt, n_new,
                                   &so, r.rank == 0 ? stdout : NULL, out);
    const double dt = MPI_Wtime() - t0;
    if (r.rank == 0) {
        int stopped = 0; /* the last token is an eos */
        for (int i = 0; n_gen > 0 && i < n_stop; i++) stopped |= out[n_prompt + n_gen - 1] == stop[i];
        printf("\n---\ngenerate: %d tokens (%s), %.1f tokens/s\n", n_gen,
               stopped ? "ended at an eos" : "the limit", dt > 0 ? n_gen / dt : 0.0);
        if (a.show_ids) {
            printf("prompt ids:");
            for (int i = 0; i < n_prompt; i++) printf(" %d", out[i]);
            printf("\ngenerated ids:");
            for (int i = 0; i < n_gen; i++) printf(" %d", out[n_prompt + i]);
            printf("\n");
        }
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
