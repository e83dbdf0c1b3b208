/* `shardlm generate`: text sampled from a checkpoint (or a Hugging Face directory) at
 * any world size and strategy through the model's KV cache, for one prompt (printed as it
 * comes) or a file of them (JSONL out, in input order), the prompts encoded and the
 * replies decoded with the job's tokenizer, chat prompts rendered with the model's
 * template, and optionally the prompt's logits for golden checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config_file.h"
#include "io/safe_file.h"
#include "io/safetensors.h"
#include "kernels/check.h"
#include "src/data/chat_template.h"
#include "src/data/data_prepare.h"
#include "src/ckpt/checkpoint.h"
#include "src/cli/commands.h"
#include "src/data/doc_pieces.h"
#include "src/base/numbers.h"
#include "src/base/utf8.h"
#include "src/run/sample.h"
#include "src/run/run.h"

/* Rows a prompt file runs at once without --batch, fewer where memory holds fewer: a
 * decode step reads every weight once for all its rows, so rows are nearly free until the
 * step's products stop being bound by that read; 64 rows keep a 2-core CPU and a GPU busy
 * without holding many caches. */
enum { GEN_ROWS_DEFAULT = 64, GEN_ROWS_MAX = 4096 };

static const char usage_text[] =
    "usage: shardlm generate JOB.ini [--ckpt CKPT]\n"
    "         (--prompt TEXT | --prompt-ids I,J,... | --prompts FILE.jsonl --output OUT.jsonl)\n"
    "         [--chat [--system TEXT] [--chat-template auto|chatml|qwen2.5|llama2|llama3]] [--tokens N]\n"
    "         [--temperature T] [--top-p P] [--seed S] [--ids] [--truncate-prompt]\n"
    "         [--batch N] [--recompute] [--dump-logits FILE.safetensors]\n"
    "         [--set section.key=value ...]\n"
    "  Weights: CKPT (a step_<N>.h5 file, a checkpoint directory (its `latest`), or a\n"
    "  Hugging Face directory), else checkpoint.resume (auto: checkpoint.dir's latest), else\n"
    "  model.init_from, else the seed's initialisation (said so). The prompt is encoded with\n"
    "  the job's tokenizer (data.tokenizer; bos as the model's configuration says); --chat\n"
    "  renders it as one user turn (after --system, if given) with the model's chat template\n"
    "  (a tokenizer without one: the model family's, qwen2's being qwen2.5) and the\n"
    "  assistant's turn opened. The reply is printed as it is generated and ends at\n"
    "  an eos id or after N tokens (--tokens; default train.sample_tokens, else 200).\n"
    "  --temperature 0 is greedy; defaults come from the job's [train] sample_* keys.\n"
    "  --prompts: one prompt a line, {\"prompt\": TEXT} (a user turn with --chat) or\n"
    "  {\"messages\": [{\"role\", \"content\"}, ...]} (rendered with the chat template, the\n"
    "  assistant's turn opened), generated --batch N at a time (default: as many as the\n"
    "  memory holds, at most 64; the next prompt starts as soon as one ends) and written to\n"
    "  --output, one JSON line a prompt in input order: {\"prompt\", \"completion\",\n"
    "  \"tokens\": [ids], \"stop\": \"eos\" | \"length\"}; prompt i samples with seed + i.\n"
    "  A prompt longer than the context (train.seq_len) is refused: the model would not\n"
    "  see its start; --truncate-prompt keeps its last train.seq_len tokens, saying so.\n"
    "  Each sequence's keys and values are cached, so a token is one pass over one token;\n"
    "  the weights are gathered once for the whole generation where they fit beside the\n"
    "  cache, else unit by unit each step. A sequence longer than the context recomputes its\n"
    "  last train.seq_len tokens for each token; --recompute does that for every token (no\n"
    "  cache: the reference the cache is checked against).\n"
    "  --ids also prints the prompt's and the reply's token ids. --dump-logits writes the\n"
    "  prompt's logits (input_ids I32 [1,T], logits F32 [1,T,V]) before sampling (into a\n"
    "  FIFO or a character device such as /dev/null as it is). No [train] schedule keys\n"
    "  are needed; train.seq_len (the context) defaults to model.max_seq_len.\n";

typedef struct gen_args {
    const char *job, *ckpt, *prompt, *prompt_ids, *prompts, *output, *dump, *system;
    const char *chat_template;
    int chat, show_ids;
    int truncate_prompt;   /* keep the last train.seq_len tokens of a longer prompt */
    int recompute;         /* no KV cache: every token recomputes its window */
    int batch;             /* --batch N, 0: from memory */
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
        long long n = 0;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            snprintf(err, errlen, "help");
            return -1;
        }
        int *flag = strcmp(o, "--chat") == 0              ? &a->chat
                  : strcmp(o, "--ids") == 0               ? &a->show_ids
                  : strcmp(o, "--truncate-prompt") == 0   ? &a->truncate_prompt
                  : strcmp(o, "--recompute") == 0         ? &a->recompute
                                                          : NULL;
        if (flag) {
            *flag = 1;
            continue;
        }
        if (o[0] == '-' && !has) {
            snprintf(err, errlen, "%s needs a value", o);
            return -1;
        }
        if (strcmp(o, "--ckpt") == 0) a->ckpt = argv[++i];
        else if (strcmp(o, "--prompt") == 0) a->prompt = argv[++i];
        else if (strcmp(o, "--prompt-ids") == 0) a->prompt_ids = argv[++i];
        else if (strcmp(o, "--prompts") == 0) a->prompts = argv[++i];
        else if (strcmp(o, "--output") == 0) a->output = argv[++i];
        else if (strcmp(o, "--dump-logits") == 0) a->dump = argv[++i];
        else if (strcmp(o, "--system") == 0) a->system = argv[++i];
        else if (strcmp(o, "--chat-template") == 0) a->chat_template = argv[++i];
        else if (strcmp(o, "--set") == 0) a->sets[a->n_sets++] = argv[++i];
        else if (strcmp(o, "--batch") == 0) {
            if (num_option_int(o, argv[++i], 1, GEN_ROWS_MAX, &n, err, errlen) != 0) return -1;
            a->batch = (int)n;
        }
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
    const int sources = !!a->prompt + !!a->prompt_ids + !!a->prompts;
    if (!a->job) snprintf(err, errlen, "no job file given");
    else if (sources != 1) snprintf(err, errlen, "give one of --prompt, --prompt-ids or --prompts");
    else if ((a->chat || a->system || a->chat_template) && a->prompt_ids)
        snprintf(err, errlen, "--chat, --system and --chat-template take a --prompt TEXT or --prompts");
    else if ((a->system || a->chat_template) && !a->chat)
        snprintf(err, errlen, "--system and --chat-template go with --chat");
    else if (!a->prompts != !a->output)
        snprintf(err, errlen, a->prompts ? "--prompts needs --output OUT.jsonl"
                                         : "--output goes with --prompts");
    else if (a->prompts && (a->show_ids || a->dump))
        snprintf(err, errlen, "--ids and --dump-logits take one prompt (--prompts writes the ids)");
    else if (a->batch && !a->prompts) snprintf(err, errlen, "--batch goes with --prompts");
    else return 0;
    return -1;
}

/* The prompts to continue: ids, and the text the output names each by. */
typedef struct prompt {
    int32_t *ids;
    int n;
    char *text;              /* the prompt as given, or the rendered conversation */
    unsigned long long line; /* of the prompt file (0: the command line's) */
} prompt;

typedef struct prompt_set {
    prompt *p;
    int n, cap;
    /* what encoding needs */
    const gen_args *a;
    run *r;
    chat_template ct;
    int have_ct;
    const char *path; /* the prompt file, for messages */
} prompt_set;

static void prompt_set_free(prompt_set *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->p[i].ids);
        free(s->p[i].text);
    }
    free(s->p);
    if (s->have_ct) chat_template_free(&s->ct);
}

/* The chat template (once): --chat-template, else the tokenizer's, else the family's. */
static int template_of(prompt_set *s, char *err, size_t errlen) {
    if (s->have_ct) return 0;
    const char *name = s->a->chat_template;
    if ((!name || strcmp(name, "auto") == 0) && !tokenizer_chat_template(s->r->tok))
        name = s->r->cfg.model.family->chat_template;
    if (chat_template_for(&s->ct, s->r->tok, name, err, errlen) != 0) return -1;
    s->have_ct = 1;
    return 0;
}

static char *text_dup(const char *s, size_t n) {
    char *t = malloc(n + 1);
    SHLM_CHECK_ALLOC(t);
    memcpy(t, s, n);
    t[n] = '\0';
    return t;
}

/* Adds one prompt: text encoded with bos as the model's configuration says, or with
 * --chat one user turn of it (after --system); or a conversation rendered with the template
 * (which writes its own special tokens), the assistant's turn opened. */
static int add_prompt(prompt_set *s, unsigned long long line, const char *text,
                      const chat_message *msgs, int n_msgs, char *err, size_t errlen) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->p = realloc(s->p, (size_t)s->cap * sizeof *s->p);
        SHLM_CHECK_ALLOC(s->p);
    }
    token_ids t = {0};
    int rc;
    char *shown = NULL;
    if (msgs || s->a->chat) {
        const chat_message turn[2] = {{"system", s->a->system}, {"user", text}};
        if (!msgs) {
            msgs = s->a->system ? turn : turn + 1;
            n_msgs = s->a->system ? 2 : 1;
        }
        doc_pieces d = {0};
        byte_buf flags = {0};
        rc = template_of(s, err, errlen);
        if (rc == 0) rc = chat_render_pieces(&s->ct, msgs, n_msgs, 1, &d, err, errlen);
        if (rc == 0) rc = doc_pieces_encode(s->r->tok, &d, &t, &flags, err, errlen);
        shown = text ? text_dup(text, strlen(text))
                     : text_dup(d.text.data ? d.text.data : "", d.text.n);
        doc_pieces_free(&d);
        free(flags.data);
    } else {
        rc = tokenizer_encode_with(s->r->tok, text, strlen(text),
                                   tokenizer_default_flags(s->r->tok) & TOKENIZER_ADD_BOS, &t,
                                   err, errlen);
        shown = text_dup(text, strlen(text));
    }
    if (rc == 0 && t.n == 0) {
        snprintf(err, errlen, "the prompt is empty");
        rc = -1;
    }
    s->p[s->n++] = (prompt){t.ids, (int)t.n, shown, line};
    return rc;
}

/* --prompt-ids: comma-separated ids, each a strict number (src/base/numbers.h) in [0, V). */
static int add_prompt_ids(prompt_set *s, const char *list, char *err, size_t errlen) {
    const int V = model_shape_vocab_size(&s->r->cfg.model);
    int32_t *ids = malloc((strlen(list) + 1) * sizeof(int32_t));
    SHLM_CHECK_ALLOC(ids);
    int n = 0;
    for (const char *p = list;;) {
        const size_t len = strcspn(p, ",");
        char item[32];
        long long v = -1;
        snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), p);
        if (len >= sizeof item || num_parse_int(item, &v) != NUM_OK || v < 0 || v >= V) {
            snprintf(err, errlen, "--prompt-ids: '%.*s' (id %d of '%.200s') is not a token id "
                     "in [0, %d)", (int)(len < 40 ? len : 40), p, n + 1, list, V);
            free(ids);
            return -1;
        }
        ids[n++] = (int32_t)v;
        if (!p[len]) break;
        p += len + 1;
    }
    s->p = calloc(1, sizeof *s->p);
    SHLM_CHECK_ALLOC(s->p);
    s->p[0] = (prompt){ids, n, text_dup(list, strlen(list)), 0};
    s->n = s->cap = 1;
    return 0;
}

static int visit_prompt(void *ctx, uint64_t line, const char *text, const chat_message *msgs,
                        int n, char *err, size_t errlen) {
    prompt_set *s = ctx;
    char why[1024];
    if (add_prompt(s, line, text, msgs, n, why, sizeof why) == 0) return 0;
    snprintf(err, errlen, "%s:%llu: %s", s->path, (unsigned long long)line, why);
    return -1;
}

/* The prompts of the command line or of --prompts, encoded. */
static int read_prompts(prompt_set *s, char *err, size_t errlen) {
    const gen_args *a = s->a;
    if (a->prompt_ids) return add_prompt_ids(s, a->prompt_ids, err, errlen);
    if (run_check_tokenizer(s->r, err, errlen) != 0) return -1;
    if (a->prompt) return add_prompt(s, 0, a->prompt, NULL, 0, err, errlen);
    char *text = NULL;
    s->path = a->prompts;
    if (config_file_read(a->prompts, &text, err, errlen) != 0) return -1;
    const int rc = prompt_records(a->prompts, text, strlen(text), visit_prompt, s, err, errlen);
    free(text);
    return rc;
}

/* The context rule: a prompt longer than train.seq_len would lose its start before its
 * first token (the reply would answer another text), so it is refused unless
 * --truncate-prompt, which keeps its last seq_len tokens and says so. */
static int fit_context(prompt_set *s, int rank, char *err, size_t errlen) {
    const job_config *c = &s->r->cfg;
    int cut = 0, longest = 0;
    for (int i = 0; i < s->n; i++) {
        prompt *p = &s->p[i];
        if (p->n <= c->seq_len) continue;
        if (!s->a->truncate_prompt) {
            char where[1100] = "", longer[96] = "";
            if (p->line) snprintf(where, sizeof where, "%s:%llu: ", s->path, p->line);
            if (c->seq_len < model_shape_max_seq_len(&c->model))
                snprintf(longer, sizeof longer, ", raise train.seq_len (up to model.max_seq_len = %d)",
                         model_shape_max_seq_len(&c->model));
            snprintf(err, errlen, "%sthe prompt has %d tokens, more than the context "
                     "(train.seq_len = %d): the model would not see its first %d; shorten it%s "
                     "or give --truncate-prompt to keep its last %d tokens", where, p->n,
                     c->seq_len, p->n - c->seq_len, longer, c->seq_len);
            return -1;
        }
        if (p->n > longest) longest = p->n;
        memmove(p->ids, p->ids + (p->n - c->seq_len), (size_t)c->seq_len * sizeof *p->ids);
        p->n = c->seq_len;
        cut++;
    }
    if (cut && rank == 0 && s->n == 1)
        fprintf(stderr, "shardlm: warning: the prompt has %d tokens, more than the context "
                "(train.seq_len = %d): its first %d are dropped, its last %d kept "
                "(--truncate-prompt)\n", longest, c->seq_len, longest - c->seq_len, c->seq_len);
    else if (cut && rank == 0)
        fprintf(stderr, "shardlm: warning: %d prompts have more tokens than the context "
                "(train.seq_len = %d), the longest %d: each keeps its last %d "
                "(--truncate-prompt)\n", cut, c->seq_len, longest, c->seq_len);
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

/* text[0, n) as a JSON string's content: valid UTF-8 whatever the ids decoded to (a byte
 * tokenizer's reply may stop inside a character), each byte that starts no well-formed
 * character, and NUL (which cJSON's strings cannot hold), written as U+FFFD, as Python's
 * decode(errors="replace") shows such bytes; the line's "tokens" keep the exact ids. */
static char *json_text_of(const char *text, size_t n) {
    char *t = malloc(3 * n + 1);
    SHLM_CHECK_ALLOC(t);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const size_t k = text[i] ? utf8_valid_len((const unsigned char *)text + i, n - i) : 0;
        if (k) {
            memcpy(t + o, text + i, k);
            o += k;
            i += k;
        } else {
            memcpy(t + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    t[o] = '\0';
    return t;
}

/* --prompts' output: each sequence's line, in input order, as soon as the ones before it
 * are written (rank 0). */
typedef struct jsonl_out {
    safe_file f;
    tokenizer *tok;
    const prompt_set *ps;
    const sample_seq *seqs;
    unsigned char *done;
    int next, failed;
    char err[1100];
} jsonl_out;

static void write_line(jsonl_out *w, int i) {
    const sample_seq *s = &w->seqs[i];
    const int32_t *gen = s->out + s->n_prompt;
    cJSON *o = cJSON_CreateObject();
    SHLM_CHECK_ALLOC(o);
    cJSON_AddStringToObject(o, "prompt", w->ps->p[i].text);
    byte_buf text = {0};
    char err[256];
    if (tokenizer_decode(w->tok, gen, (size_t)s->n_gen, TOKENIZER_SKIP_SPECIAL, &text, err,
                         sizeof err) == 0) {
        char *t = json_text_of(text.data ? text.data : "", text.n);
        cJSON_AddStringToObject(o, "completion", t);
        free(t);
    } else { /* ids this tokenizer cannot spell (the byte tokenizer under a larger vocabulary) */
        cJSON_AddNullToObject(o, "completion");
    }
    free(text.data);
    cJSON *ids = cJSON_AddArrayToObject(o, "tokens");
    for (int k = 0; k < s->n_gen; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(gen[k]));
    cJSON_AddStringToObject(o, "stop", s->stopped ? "eos" : "length");
    char *line = cJSON_PrintUnformatted(o);
    SHLM_CHECK_ALLOC(line);
    if (!w->failed && (fputs(line, w->f.fp) < 0 || fputc('\n', w->f.fp) < 0)) {
        snprintf(w->err, sizeof w->err, "%s: cannot write", w->f.path);
        w->failed = 1;
    }
    free(line);
    cJSON_Delete(o);
}

static void on_seq_end(void *ctx, int i) {
    jsonl_out *w = ctx;
    if (!w) return;
    w->done[i] = 1;
    while (w->next < w->ps->n && w->done[w->next]) write_line(w, w->next++);
    if (!w->failed) fflush(w->f.fp);
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
    if (run_setup_begin(&r, a.job, a.n_sets, a.sets, 0) != 0) {
        free(a.sets);
        return 1;
    }
    free(a.sets);
    const job_config *c = &r.cfg;
    const int V = model_shape_vocab_size(&c->model);
    int rc = 1;
    float *logits = NULL;
    sample_seq *seqs = NULL;
    jsonl_out *out = NULL;
    prompt_set ps = {.a = &a, .r = &r};
    /* the prompts and the output, before anything is allocated */
    ok = read_prompts(&ps, err, sizeof err) == 0 && fit_context(&ps, r.rank, err, sizeof err) == 0;
    if (ok && a.output && r.rank == 0) {
        out = calloc(1, sizeof *out);
        SHLM_CHECK_ALLOC(out);
        ok = safe_file_begin_output(&out->f, a.output, err, sizeof err) == 0;
    }
    if (any_rank_failed(ok, err)) goto done;
    const int n_new = a.tokens >= 0 ? a.tokens : (c->sample_tokens > 0 ? c->sample_tokens : 200);
    int longest = 0;
    for (int i = 0; i < ps.n; i++) longest = ps.p[i].n > longest ? ps.p[i].n : longest;
    /* the cache holds what a step feeds: a prompt and all but the last reply token, at
     * most the context */
    const int need = longest + n_new - 1 < c->seq_len ? longest + n_new - 1 : c->seq_len;
    const int want_rows = a.batch ? a.batch : GEN_ROWS_DEFAULT;
    const run_gen_request req = {
        .rows = a.recompute || n_new == 0 ? 0 : ps.n < want_rows ? ps.n : want_rows,
        .shrink = !a.batch, .cap = need > longest ? need : longest, .hold = 1};
    if (run_setup_end(&r, 0, &req) != 0) goto done;
    char what[2100];
    if (run_load_weights(&r, a.ckpt, what, sizeof what) != 0) goto done;
    if (a.dump) {
        const prompt *p = &ps.p[0];
        logits = malloc((size_t)p->n * V * sizeof(float));
        SHLM_CHECK_ALLOC(logits);
        fsdp_begin_pass(r.engine, 0);
        const model_batch b = {p->ids, NULL, NULL, 1, p->n, NULL};
        model_forward(r.model, &b, NULL, logits, NULL);
        ok = r.rank != 0 || dump_logits(a.dump, p->ids, p->n, logits, V, err, sizeof err) == 0;
        if (any_rank_failed(ok, err)) goto done;
        if (r.rank == 0) printf("generate: wrote the logits of %d prompt tokens to %s\n", p->n, a.dump);
    }
    int n_stop = 0;
    const int32_t *stop = tokenizer_eos_ids(r.tok, &n_stop);
    sample_options so = {.temperature = isnan(a.temperature) ? c->sample_temperature
                                                              : a.temperature,
                         .top_p = isnan(a.top_p) ? c->sample_top_p : a.top_p,
                         .seed = a.seed_given ? a.seed : c->seed,
                         .stop_ids = stop, .n_stop = n_stop};
    seqs = calloc((size_t)ps.n, sizeof *seqs);
    SHLM_CHECK_ALLOC(seqs);
    for (int i = 0; i < ps.n; i++) {
        seqs[i] = (sample_seq){.prompt = ps.p[i].ids, .n_prompt = ps.p[i].n};
        seqs[i].out = malloc((size_t)(ps.p[i].n + n_new) * sizeof(int32_t));
        SHLM_CHECK_ALLOC(seqs[i].out);
    }
    if (r.rank == 0) {
        printf("--- generate: up to %d tokens from %s, temperature %.2f, top_p %.2f, seed %llu, "
               "%d ranks %s ---\n", n_new, what, so.temperature, so.top_p,
               (unsigned long long)so.seed, r.world, strategy_name(c->strategy));
        if (r.gen)
            printf("generate: KV cache: %d rows of %d tokens (%.1f MiB a rank), weights %s\n",
                   model_gen_rows(r.gen), model_gen_cap(r.gen),
                   model_gen_bytes(r.gen) / 1048576.0,
                   r.gen_held ? "gathered once for the whole generation"
                              : "gathered unit by unit each step");
        else
            printf("generate: no KV cache (%s): every token recomputes its window\n",
                   a.recompute ? "--recompute" : "nothing to generate");
        fflush(stdout);
    }
    const double t0 = MPI_Wtime();
    fsdp_begin_pass(r.engine, 0);
    int n_gen = 0;
    if (!a.prompts) {
        /* the byte tokenizer cannot spell another vocabulary's ids: show ids */
        const int ids_only = strcmp(tokenizer_kind(r.tok), "bytes") == 0 && V != 256;
        n_gen = sample_print(r.model, r.gen, r.tok, ids_only, c->seq_len, seqs[0].prompt,
                             seqs[0].n_prompt, n_new, &so, r.rank == 0 ? stdout : NULL,
                             seqs[0].out);
        seqs[0].n_gen = n_gen;
        seqs[0].stopped = 0;
        for (int i = 0; n_gen > 0 && i < n_stop; i++)
            seqs[0].stopped |= seqs[0].out[seqs[0].n_prompt + n_gen - 1] == stop[i];
    } else {
        if (out) {
            out->tok = r.tok;
            out->ps = &ps;
            out->seqs = seqs;
            out->done = calloc((size_t)ps.n, 1);
            SHLM_CHECK_ALLOC(out->done);
        }
        so.on_end = on_seq_end;
        so.ctx = out;
        sample_generate(r.model, r.gen, c->seq_len, seqs, ps.n, n_new, &so);
        for (int i = 0; i < ps.n; i++) n_gen += seqs[i].n_gen;
        ok = !out || (!out->failed && safe_file_finish(&out->f, out->err, sizeof out->err) == 0);
        if (any_rank_failed(ok, out ? out->err : "")) goto done;
    }
    const double dt = MPI_Wtime() - t0;
    if (r.rank == 0) {
        if (a.prompts) {
            int eos = 0;
            for (int i = 0; i < ps.n; i++) eos += seqs[i].stopped;
            printf("generate: %d prompts, %d tokens (%d ended at an eos) in %.3f s, %.2f "
                   "tokens/s; wrote %s\n", ps.n, n_gen, eos, dt, dt > 0 ? n_gen / dt : 0.0,
                   a.output);
        } else {
            printf("\n---\ngenerate: %d tokens (%s) in %.3f s, %.2f tokens/s\n", n_gen,
                   seqs[0].stopped ? "ended at an eos" : "the limit", dt,
                   dt > 0 ? n_gen / dt : 0.0);
        }
        if (a.show_ids) {
            printf("prompt ids:");
            for (int i = 0; i < seqs[0].n_prompt; i++) printf(" %d", seqs[0].out[i]);
            printf("\ngenerated ids:");
            for (int i = 0; i < n_gen; i++) printf(" %d", seqs[0].out[seqs[0].n_prompt + i]);
            printf("\n");
        }
        fflush(stdout);
    }
    rc = 0;
done:
    if (out) {
        if (out->f.fp) safe_file_abort(&out->f);
        free(out->done);
        free(out);
    }
    for (int i = 0; seqs && i < ps.n; i++) free(seqs[i].out);
    free(seqs);
    prompt_set_free(&ps);
    free(logits);
    run_teardown(&r);
    return rc;
}
