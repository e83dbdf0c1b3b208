/* Golden reference test: the model's logits, loss and every parameter gradient against
 * Hugging Face transformers' LlamaForCausalLM (tests/golden/tiny_llama_golden.safetensors). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "kernels/ops.h"
#include "tests/decoder_test.h"
#include "tests/check.h"

/* Per tensor: max|a-b| / max|b| must stay under this (see tests/golden/README.md). */
#define GOLDEN_TOL 1e-4
#define FIXTURE "tests/golden/tiny_llama_golden.safetensors"

/* ---- a param source over plain host buffers, which also checks the protocol ---- */
typedef struct golden_source {
    int n_units;
    size_t *numel;      /* per unit */
    float **params;     /* per unit, fp32 (the cpu backend's act dtype) */
    float **grads;      /* per unit, fp32 */
    int *held;          /* acquired and not yet released */
    int *grad_ready;    /* grad_ready() calls since the last reset */
    int protocol_errors;
    int overwrite;      /* what grad() tells the model */
} golden_source;

static const void *src_acquire(void *ctx, int u, model_phase phase) {
    golden_source *s = ctx;
    (void)phase;
    if (u < 0 || u >= s->n_units) {
        fprintf(stderr, "protocol: acquire of unit %d (of %d)\n", u, s->n_units);
        s->protocol_errors++;
        return NULL;
    }
    if (s->held[u]) {
        fprintf(stderr, "protocol: unit %d acquired twice without release\n", u);
        s->protocol_errors++;
    }
    s->held[u] = 1;
    return s->params[u];
}

static void src_release(void *ctx, int u, model_phase phase) {
    golden_source *s = ctx;
    (void)phase;
    if (u < 0 || u >= s->n_units || !s->held[u]) {
        fprintf(stderr, "protocol: release of unit %d that is not held\n", u);
        s->protocol_errors++;
        return;
    }
    s->held[u] = 0;
}

static float *src_grad(void *ctx, int u, int *overwrite) {
    golden_source *s = ctx;
    *overwrite = s->overwrite;
    if (u < 0 || u >= s->n_units) {
        fprintf(stderr, "protocol: grad of unit %d (of %d)\n", u, s->n_units);
        s->protocol_errors++;
        return NULL;
    }
    return s->grads[u];
}

static void src_grad_ready(void *ctx, int u) {
    golden_source *s = ctx;
    if (u >= 0 && u < s->n_units) s->grad_ready[u]++;
}

/* After one forward_backward: every unit's gradient reported ready exactly once, nothing
 * left acquired. */
static void check_protocol(golden_source *s, const char *what) {
    int bad = s->protocol_errors;
    for (int u = 0; u < s->n_units; u++) {
        if (s->grad_ready[u] != 1) {
            fprintf(stderr, "protocol: %s: unit %d grad_ready called %d times (want 1)\n", what,
                    u, s->grad_ready[u]);
            bad++;
        }
        if (s->held[u]) {
            fprintf(stderr, "protocol: %s: unit %d still acquired at the end\n", what, u);
            bad++;
        }
        s->grad_ready[u] = 0;
    }
    s->protocol_errors = 0;
    check(!bad, "%s", what);
}

/* ---- comparison ---- */

/* max|a - scale·b| / max|scale·b|; unless quiet, a check of it against GOLDEN_TOL. */
static double compare_q(const char *name, const float *a, const float *b, size_t n,
                        double scale, int quiet) {
    double max_b = 0, max_d = 0;
    size_t worst = 0;
    int nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        double ref = scale * (double)b[i];
        double d = fabs((double)a[i] - ref);
        if (!isfinite(a[i])) nonfinite = 1;
        if (fabs(ref) > max_b) max_b = fabs(ref);
        if (d > max_d) {
            max_d = d;
            worst = i;
        }
    }
    double rel = max_b > 0 ? max_d / max_b : max_d;
    if (nonfinite) rel = INFINITY;
    int ok = rel < GOLDEN_TOL;
    if (quiet) return rel;
    check(ok, "%-52s n=%-6zu max|ref|=%.3e max|diff|=%.3e rel=%.2e", name, n, max_b, max_d, rel);
    if (!ok) printf("     worst at %zu: got %.7g, want %.7g%s\n", worst, a[worst],
                    scale * (double)b[worst], nonfinite ? " non-finite" : "");
    return rel;
}

static double compare(const char *name, const float *a, const float *b, size_t n, double scale) {
    return compare_q(name, a, b, n, scale, 0);
}

/* ---- fixture helpers ---- */

static int meta_int(const safetensors_file *f, const char *key, int *out) {
    const char *v = safetensors_metadata(f, key);
    char *end;
    if (!v) return -1;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < -2147483647L || x > 2147483647L) return -1;
    *out = (int)x;
    return 0;
}

static int meta_float(const safetensors_file *f, const char *key, float *out) {
    const char *v = safetensors_metadata(f, key);
    char *end;
    if (!v) return -1;
    double x = strtod(v, &end);
    if (end == v || *end) return -1;
    *out = (float)x;
    return 0;
}

/* Reads the whole of an F32/I32 tensor with the expected element count. */
static void *read_whole(safetensors_file *f, const char *name, safetensors_dtype dt,
                        size_t numel) {
    char err[512];
    const safetensors_tensor *t = safetensors_find(f, name);
    if (!t) {
        fprintf(stderr, "%s: tensor '%s' missing\n", f->path, name);
        return NULL;
    }
    if (t->dtype != dt || t->numel != numel) {
        fprintf(stderr, "%s: tensor '%s' is %s with %llu elements, want %s with %zu\n",
                f->path, name, safetensors_dtype_name(t->dtype), (unsigned long long)t->numel,
                safetensors_dtype_name(dt), numel);
        return NULL;
    }
    void *buf = malloc(numel * 4 + 1);
    if (!buf || safetensors_read_raw(f, t, buf, numel * 4, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", buf ? err : "out of memory");
        free(buf);
        return NULL;
    }
    return buf;
}

int main(int argc, char **argv) {
    (void)argc;
    const char *srcdir = getenv("SHLM_SRCDIR");
    if (!srcdir || !*srcdir) srcdir = ".";
    printf("# reproduce: SHLM_SRCDIR=%s %s\n", srcdir, argv[0]);
    printf("# fixture:   python3 tests/golden/make_golden.py " FIXTURE "  (see "
           "tests/golden/README.md)\n");
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", srcdir, FIXTURE);

    safetensors_file f;
    if (safetensors_open(&f, path, err, sizeof err) != 0) {
        fprintf(stderr, "test_golden: %s\n", err);
        return 1;
    }
    /* ---- config from the fixture's metadata ---- */
    decoder_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int B = 0, T = 0;
    if (meta_int(&f, "dim", &cfg.dim) || meta_int(&f, "n_layers", &cfg.n_layers) ||
        meta_int(&f, "n_heads", &cfg.n_heads) || meta_int(&f, "n_kv_heads", &cfg.n_kv_heads) ||
        meta_int(&f, "ffn_dim", &cfg.ffn_dim) || meta_int(&f, "vocab_size", &cfg.vocab_size) ||
        meta_float(&f, "norm_eps", &cfg.norm_eps) ||
        meta_float(&f, "rope_theta", &cfg.rope_theta) || meta_int(&f, "batch", &B) ||
        meta_int(&f, "seq_len", &T)) {
        fprintf(stderr, "test_golden: %s: __metadata__ lacks a model field (dim, n_layers, "
                "n_heads, n_kv_heads, ffn_dim, vocab_size, norm_eps, rope_theta, batch, "
                "seq_len)\n", path);
        safetensors_close(&f);
        return 1;
    }
    cfg.head_dim = cfg.n_heads > 0 ? cfg.dim / cfg.n_heads : 0;
    if (meta_int(&f, "max_seq_len", &cfg.max_seq_len) != 0) cfg.max_seq_len = T;
    cfg.init_std = 0.02f; /* unused: the parameters come from the fixture */
    if (decoder_validate(&cfg, err, sizeof err, (int[2]){0}) != 0) {
        fprintf(stderr, "test_golden: %s: bad model shape: %s\n", path, err);
        safetensors_close(&f);
        return 1;
    }
    const char *tv = safetensors_metadata(&f, "transformers_version");
    const char *pv = safetensors_metadata(&f, "torch_version");
    printf("# model: dim %d, layers %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d, eps %g, "
           "theta %g; batch %dx%d; reference: transformers %s, torch %s\n", cfg.dim,
           cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim,
           cfg.vocab_size, cfg.norm_eps, cfg.rope_theta, B, T, tv ? tv : "?", pv ? pv : "?");
    printf("# criterion: max|a-b| / max|b| < %g per tensor\n", GOLDEN_TOL);

    /* ---- parameters by HF name into each unit's flat buffer ---- */
    model_layout lay;
    decoder_layout(&cfg, &lay);
    golden_source gs = {0};
    gs.n_units = lay.n_units;
    gs.numel = calloc((size_t)lay.n_units, sizeof(size_t));
    gs.params = calloc((size_t)lay.n_units, sizeof(float *));
    gs.grads = calloc((size_t)lay.n_units, sizeof(float *));
    gs.held = calloc((size_t)lay.n_units, sizeof(int));
    gs.grad_ready = calloc((size_t)lay.n_units, sizeof(int));
    int n_params = 0, load_errors = 0;
    for (int u = 0; u < lay.n_units; u++) {
        const model_unit *unit = &lay.units[u];
        gs.numel[u] = unit->numel;
        gs.params[u] = calloc(unit->numel + 1, sizeof(float));
        gs.grads[u] = calloc(unit->numel + 1, sizeof(float));
        for (int k = 0; k < unit->n_tensors; k++) {
            const model_tensor *lt = &unit->tensors[k];
            const safetensors_tensor *t = safetensors_find(&f, lt->name);
            n_params++;
            if (!t) {
                fprintf(stderr, "%s: the model's tensor '%s' is not in the fixture\n", path,
                        lt->name);
                load_errors++;
                continue;
            }
            int same = t->ndim == lt->ndim && t->numel == lt->numel;
            for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == lt->shape[d];
            if (!same) {
                fprintf(stderr, "%s: tensor '%s': fixture shape [%lld, %lld] (ndim %d) vs "
                        "model [%lld, %lld] (ndim %d)\n", path, lt->name,
                        (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                        t->ndim, (long long)lt->shape[0], (long long)lt->shape[1], lt->ndim);
                load_errors++;
                continue;
            }
            if (safetensors_read_f32(&f, t, 0, t->numel, gs.params[u] + lt->offset, err,
                                     sizeof err) != 0) {
                fprintf(stderr, "%s\n", err);
                load_errors++;
            }
        }
    }
    /* every fixture tensor that is not golden.* must be a model parameter */
    int n_fixture_params = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        if (strncmp(f.tensors[i].name, "golden.", 7) != 0) n_fixture_params++;
    }
    if (n_fixture_params != n_params) {
        fprintf(stderr, "%s: the fixture has %d parameters, the model's layout %d\n", path,
                n_fixture_params, n_params);
        load_errors++;
    }
    const size_t N = (size_t)B * T, V = (size_t)cfg.vocab_size;
    int32_t *tokens = read_whole(&f, "golden.input_ids", SAFETENSORS_I32, N);
    int32_t *targets = read_whole(&f, "golden.targets", SAFETENSORS_I32, N);
    float *gold_logits = read_whole(&f, "golden.logits", SAFETENSORS_F32, N * V);
    float *gold_loss = read_whole(&f, "golden.loss", SAFETENSORS_F32, 1);
    if (load_errors || !tokens || !targets || !gold_logits || !gold_loss) {
        fprintf(stderr, "test_golden: FAIL: could not load the fixture %s\n", path);
        return 1;
    }
    int want_valid = 0;
    for (size_t i = 0; i < N; i++) want_valid += targets[i] >= 0;
    printf("# %d parameter tensors, %zu tokens, %d non-ignored targets\n", n_params, N,
           want_valid);

    model_param_source src = {.ctx = &gs,
                              .acquire = src_acquire,
                              .release = src_release,
                              .grad = src_grad,
                              .grad_ready = src_grad_ready};
    decoder *m = decoder_create(&cfg, &shlm_ops_cpu, B, T, &(model_opts){0}, src);

    /* ---- forward: logits and loss ---- */
    float *logits = calloc(N * V, sizeof(float));
    int n_valid = -1;
    float loss_fwd = decoder_forward_mean(m, &(model_batch){tokens, targets, NULL, B, T}, &n_valid, logits, NULL);
    compare("forward: logits", logits, gold_logits, N * V, 1.0);
    compare("forward: loss", &loss_fwd, gold_loss, 1, 1.0);
    CHECK(n_valid == want_valid, "forward: n_valid %d, want %d", n_valid, want_valid);
    for (int u = 0; u < gs.n_units; u++)
        CHECK(!gs.held[u], "protocol: unit %d still acquired after llama_forward", u);

    /* ---- forward + backward: loss and every gradient ---- */
    /* the first pass is told to overwrite: buffers full of NaN must come back holding
     * exactly the gradients (every element written once, none added to) */
    for (int u = 0; u < lay.n_units; u++)
        for (size_t i = 0; i < gs.numel[u]; i++) gs.grads[u][i] = NAN;
    gs.overwrite = 1;
    n_valid = -1;
    /* the golden gradients are those of the mean loss: 1 / n per target */
    float loss_fb = (float)(decoder_forward_backward(m, &(model_batch){tokens, targets, NULL, B, T}, 1.0f / (float)want_valid, &n_valid) /
                            want_valid);
    compare("forward_backward: loss", &loss_fb, gold_loss, 1, 1.0);
    CHECK(n_valid == want_valid, "forward_backward: n_valid %d, want %d", n_valid, want_valid);
    check_protocol(&gs, "forward_backward: param source protocol");
    /* a pass with grad_scale 0.5 on top must accumulate (+=) to 1.5x the gradients */
    float **grads1 = calloc((size_t)lay.n_units, sizeof(float *));
    for (int u = 0; u < lay.n_units; u++) {
        grads1[u] = malloc((gs.numel[u] + 1) * sizeof(float));
        memcpy(grads1[u], gs.grads[u], gs.numel[u] * sizeof(float));
    }
    gs.overwrite = 0;
    decoder_forward_backward(m, &(model_batch){tokens, targets, NULL, B, T}, 0.5f / (float)want_valid, NULL);
    check_protocol(&gs, "forward_backward (2nd pass): param source protocol");

    double worst = 0, worst15 = 0;
    const char *worst_name = "", *worst15_name = "";
    for (int u = 0; u < lay.n_units; u++) {
        for (int k = 0; k < lay.units[u].n_tensors; k++) {
            const model_tensor *lt = &lay.units[u].tensors[k];
            char gname[160], label[200];
            snprintf(gname, sizeof gname, "golden.grad.%s", lt->name);
            float *gold = read_whole(&f, gname, SAFETENSORS_F32, lt->numel);
            if (!CHECK(gold != NULL, "the fixture's %s (the reason above)", gname)) continue;
            snprintf(label, sizeof label, "grad %s", lt->name);
            double rel = compare(label, grads1[u] + lt->offset, gold, lt->numel, 1.0);
            if (rel > worst) {
                worst = rel;
                worst_name = lt->name;
            }
            rel = compare_q(label, gs.grads[u] + lt->offset, gold, lt->numel, 1.5, 1);
            if (!(rel <= worst15)) {
                worst15 = rel;
                worst15_name = lt->name;
            }
            free(gold);
        }
    }
    printf("# worst gradient: %s (rel %.2e)\n", worst_name, worst);
    check(worst15 < GOLDEN_TOL, "%-52s rel=%.2e (worst: %s)",
          "2nd pass, grad_scale 0.5, += : all grads = 1.5x ref", worst15, worst15_name);

    decoder_destroy(m);
    for (int u = 0; u < lay.n_units; u++) {
        free(gs.params[u]);
        free(gs.grads[u]);
        free(grads1[u]);
    }
    free(grads1);
    free(gs.params);
    free(gs.grads);
    free(gs.numel);
    free(gs.held);
    free(gs.grad_ready);
    free(logits);
    free(tokens);
    free(targets);
    free(gold_logits);
    free(gold_loss);
    model_layout_free(&lay);
    safetensors_close(&f);
    return check_exit();
}
