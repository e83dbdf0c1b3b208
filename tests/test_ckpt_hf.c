/* Hugging Face import/export against the golden fixture (tests/golden/): the imported
 * model's logits and loss, exports compared bit for bit, dumped logits' loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "io/hf_model.h"
#include "io/safetensors.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"
#include "src/ckpt/checkpoint.h"
#include "src/engine/fsdp.h"
#include "src/families/families.h"
#include "tests/decoder_test.h"
#include "src/engine/topology.h"
#include "tests/check.h"

/* Per tensor: max|a-b| / max|b| (tests/golden/README.md) */
#define GOLDEN_TOL 1e-4
#define FIXTURE "tests/golden/tiny_llama_golden.safetensors"

static int rank = 0;

static safetensors_file fx;
static decoder_config cfg;
static model_shape shape; /* cfg as a Llama shape (the job's and the checkpoint's view) */
static int B, T;

static int meta_int(const char *key) {
    const char *v = safetensors_metadata(&fx, key);
    return v ? atoi(v) : -1;
}

static void open_fixture(void) {
    const char *src = getenv("SHLM_SRCDIR");
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", src && *src ? src : ".", FIXTURE);
    if (safetensors_open(&fx, path, err, sizeof err) != 0) {
        fprintf(stderr, "test_ckpt_hf: %s\n", err);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(&cfg, 0, sizeof cfg);
    cfg.dim = meta_int("dim");
    cfg.n_layers = meta_int("n_layers");
    cfg.n_heads = meta_int("n_heads");
    cfg.n_kv_heads = meta_int("n_kv_heads");
    cfg.ffn_dim = meta_int("ffn_dim");
    cfg.vocab_size = meta_int("vocab_size");
    cfg.max_seq_len = meta_int("max_seq_len");
    cfg.head_dim = cfg.dim / cfg.n_heads;
    cfg.norm_eps = (float)atof(safetensors_metadata(&fx, "norm_eps"));
    cfg.rope_theta = (float)atof(safetensors_metadata(&fx, "rope_theta"));
    cfg.init_std = 0.02f;
    family_shape_defaults(family_named("llama"), &shape);
    memcpy(model_shape_data(&shape), &cfg, sizeof cfg);
    B = meta_int("batch");
    T = meta_int("seq_len");
}

static void *read_all(safetensors_file *f, const char *name, size_t *n) {
    const safetensors_tensor *t = safetensors_find(f, name);
    char err[512];
    if (!t) {
        fprintf(stderr, "%s: no tensor %s\n", f->path, name);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    void *buf = malloc(t->end - t->begin + 1);
    if (safetensors_read_raw(f, t, buf, t->end - t->begin, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (n) *n = t->numel;
    return buf;
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d; /* NaN propagates */
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

/* Mean cross-entropy of logits (rows x V) against targets (-100 = ignored). */
static double mean_xent(const float *logits, const int32_t *targets, int rows, int V, int *n) {
    double sum = 0;
    *n = 0;
    for (int r = 0; r < rows; r++) {
        if (targets[r] < 0) continue;
        const float *l = logits + (size_t)r * V;
        double m = l[0], z = 0;
        for (int v = 1; v < V; v++) m = l[v] > m ? l[v] : m;
        for (int v = 0; v < V; v++) z += exp((double)l[v] - m);
        sum += m + log(z) - l[targets[r]];
        (*n)++;
    }
    return sum / *n;
}

/* import HFDIR CKPTDIR: every rank imports its shard, the model reproduces the golden
 * logits and loss; then the engine is saved as a checkpoint (step 0). */
static void cmd_import(const char *hf, const char *ckdir) {
    char err[1536] = "";
    topology topo;
    topology_options topt = {.strategy = FSDP_FULL_SHARD};
    CHECK(topology_create(&topo, MPI_COMM_WORLD, &topt, err, sizeof err) == 0, "%s", err);
    model_desc md;
    model_shape_desc_open(&md, &shape);
    shard_plan plan;
    shard_plan_build(&plan, &md, &(plan_params){.strategy = topo.strategy, .S = topo.shard_size,
                                                .R = topo.replica_size, .B = B, .T = T});
    fsdp_options opt = {.prefetch = 1};
    fsdp_engine *e = fsdp_create(&md, &plan, &shlm_ops_cpu, &shlm_comm_mpi, &topo, &opt, 7);
    int rc = checkpoint_import_hf(e, &topo, &shape, hf, err, sizeof err);
    CHECK(rc == 0, "import: %s", err);
    decoder *m = decoder_create(&cfg, &shlm_ops_cpu, B, T, &(model_opts){0}, fsdp_param_source(e));
    int32_t *ids = read_all(&fx, "golden.input_ids", NULL);
    int32_t *tg = read_all(&fx, "golden.targets", NULL);
    float *want = read_all(&fx, "golden.logits", NULL);
    float *want_loss = read_all(&fx, "golden.loss", NULL);
    const size_t nl = (size_t)B * T * cfg.vocab_size;
    float *logits = malloc(nl * sizeof(float));
    int valid = 0;
    fsdp_begin_pass(e, 0);
    float loss = decoder_forward_mean(m, &(model_batch){ids, tg, NULL, B, T}, &valid, logits, NULL);
    double rl = rel_diff(logits, want, nl);
    double rloss = fabs(loss - want_loss[0]) / fabs(want_loss[0]);
    CHECK(rl < GOLDEN_TOL, "logits of the imported model: rel %.3e", rl);
    CHECK(rloss < GOLDEN_TOL, "loss %.9g vs transformers' %.9g (rel %.3e)", loss, want_loss[0], rloss);
    if (rank == 0)
        printf("import %s on %d ranks: logits rel %.2e, loss %.9g vs transformers %.9g (rel %.2e)"
               " over %d targets\n", hf, topo.world_size, rl, loss, want_loss[0], rloss, valid);
    /* save it: a checkpoint whose weights are exactly the fixture's */
    job_config jc;
    memset(&jc, 0, sizeof jc);
    jc.model = shape;
    jc.text = "[test] test_ckpt_hf import";
    snprintf(jc.path, sizeof jc.path, "test_ckpt_hf");
    ckpt_state st = {.seed = 7, .global_batch = B, .seq_len = T, .steps = 1, .lr_decay_from = -1};
    CHECK(checkpoint_save(e, &topo, &jc, &st, NULL, ckdir, 0, err, sizeof err) == 0, "save: %s", err);
    free(ids);
    free(tg);
    free(want);
    free(want_loss);
    free(logits);
    decoder_destroy(m);
    fsdp_destroy(e);
    shard_plan_free(&plan);
    model_desc_close(&md);
    topology_free(&topo);
}

/* compare DIR: every parameter of the fixture is in DIR's safetensors (one file or an
 * index), F32, same shape, the same bytes; config.json describes the fixture's model. */
static void cmd_compare(const char *dir) {
    char err[1536] = "";
    hf_weights w;
    if (hf_weights_open(&w, dir, err, sizeof err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    int n = 0;
    for (int i = 0; i < fx.n_tensors; i++) {
        const safetensors_tensor *a = &fx.tensors[i];
        if (strncmp(a->name, "golden.", 7) == 0) continue;
        safetensors_file *f;
        const safetensors_tensor *b;
        if (hf_weights_find(&w, a->name, &f, &b, err, sizeof err) != 0) {
            CHECK(0, "%s", err);
            continue;
        }
        int same = b->dtype == SAFETENSORS_F32 && b->ndim == a->ndim && b->numel == a->numel;
        for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
        CHECK(same, "%s: dtype/shape differ", a->name);
        if (!same) continue;
        void *x = read_all(&fx, a->name, NULL), *y = read_all(f, b->name, NULL);
        CHECK(memcmp(x, y, a->end - a->begin) == 0, "%s: the bytes differ", a->name);
        free(x);
        free(y);
        n++;
    }
    model_shape hc;
    CHECK(family_shape_from_hf(dir, &hc, err, sizeof err) == 0, "%s", err);
    const decoder_config *h = model_shape_cdata(&hc);
    CHECK(hc.family == shape.family && h->dim == cfg.dim && h->n_layers == cfg.n_layers &&
              h->n_heads == cfg.n_heads && h->n_kv_heads == cfg.n_kv_heads &&
              h->ffn_dim == cfg.ffn_dim && h->vocab_size == cfg.vocab_size &&
              h->head_dim == cfg.head_dim && h->max_seq_len == cfg.max_seq_len &&
              h->norm_eps == cfg.norm_eps && h->rope_theta == cfg.rope_theta &&
              !h->tie_word_embeddings, "config.json does not describe the model");
    printf("compare %s: %d tensors in %d file(s) bit-identical to the fixture, config.json ok\n",
           dir, n, w.n_files);
    CHECK(n == 3 + 9 * cfg.n_layers, "%d tensors compared", n);
    hf_weights_close(&w);
}

/* weights OUT: the fixture's model tensors alone (not its golden.* inputs and outputs),
 * as they are stored, in a safetensors file OUT: a Hugging Face model.safetensors. */
static void cmd_weights(const char *out) {
    const char **names = calloc((size_t)fx.n_tensors, sizeof *names);
    safetensors_dtype *dts = calloc((size_t)fx.n_tensors, sizeof *dts);
    int *nds = calloc((size_t)fx.n_tensors, sizeof *nds);
    const int64_t **shapes = calloc((size_t)fx.n_tensors, sizeof *shapes);
    const void **data = calloc((size_t)fx.n_tensors, sizeof *data);
    int n = 0;
    for (int i = 0; i < fx.n_tensors; i++) {
        const safetensors_tensor *t = &fx.tensors[i];
        if (strncmp(t->name, "golden.", 7) == 0) continue;
        names[n] = t->name;
        dts[n] = t->dtype;
        nds[n] = t->ndim;
        shapes[n] = t->shape;
        data[n] = read_all(&fx, t->name, NULL);
        n++;
    }
    char err[512];
    CHECK(safetensors_write(out, n, names, dts, nds, shapes, data, 0, NULL, NULL, err,
                            sizeof err) == 0, "%s", err);
    printf("weights %s: %d tensors of the fixture\n", out, n);
    for (int i = 0; i < n; i++) free((void *)data[i]);
    free(names);
    free(dts);
    free(nds);
    free(shapes);
    free(data);
}

/* logits FILE...: `shardlm generate --dump-logits` files of the fixture's rows 0..n-1;
 * each row's logits match transformers', and their mean cross-entropy against the
 * golden targets is transformers' loss. */
static void cmd_logits(int n, char **files) {
    int32_t *ids = read_all(&fx, "golden.input_ids", NULL);
    int32_t *tg = read_all(&fx, "golden.targets", NULL);
    float *want = read_all(&fx, "golden.logits", NULL);
    float *want_loss = read_all(&fx, "golden.loss", NULL);
    const int V = cfg.vocab_size;
    float *all = malloc((size_t)B * T * V * sizeof(float));
    CHECK(n == B, "need %d files, one per row", B);
    for (int r = 0; r < n && r < B; r++) {
        safetensors_file f;
        char err[512];
        if (safetensors_open(&f, files[r], err, sizeof err) != 0) {
            CHECK(0, "%s", err);
            return;
        }
        size_t ni, nlg;
        int32_t *got_ids = read_all(&f, "input_ids", &ni);
        float *lg = read_all(&f, "logits", &nlg);
        CHECK(ni == (size_t)T && memcmp(got_ids, ids + (size_t)r * T, (size_t)T * 4) == 0,
              "%s: input ids are not row %d's", files[r], r);
        CHECK(nlg == (size_t)T * V, "%s: %zu logits", files[r], nlg);
        double rl = rel_diff(lg, want + (size_t)r * T * V, (size_t)T * V);
        CHECK(rl < GOLDEN_TOL, "%s: row %d logits rel %.3e", files[r], r, rl);
        printf("logits %s: row %d rel %.2e\n", files[r], r, rl);
        memcpy(all + (size_t)r * T * V, lg, (size_t)T * V * sizeof(float));
        free(got_ids);
        free(lg);
        safetensors_close(&f);
    }
    int valid;
    double loss = mean_xent(all, tg, B * T, V, &valid);
    double rloss = fabs(loss - want_loss[0]) / fabs(want_loss[0]);
    CHECK(rloss < GOLDEN_TOL, "loss %.9g vs transformers' %.9g", loss, want_loss[0]);
    printf("loss from shardlm's logits %.9g vs transformers' %.9g (rel %.2e, %d targets)\n",
           loss, want_loss[0], rloss, valid);
    free(all);
    free(ids);
    free(tg);
    free(want);
    free(want_loss);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    check_rank = rank;
    open_fixture();
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "import") == 0 && argc == 4) {
        cmd_import(argv[2], argv[3]);
    } else if (strcmp(mode, "compare") == 0 && argc == 3) {
        if (rank == 0) cmd_compare(argv[2]);
    } else if (strcmp(mode, "weights") == 0 && argc == 3) {
        if (rank == 0) cmd_weights(argv[2]);
    } else if (strcmp(mode, "logits") == 0 && argc >= 3) {
        if (rank == 0) cmd_logits(argc - 2, argv + 2);
    } else if (strcmp(mode, "ids") == 0 && argc == 3) {
        int r = atoi(argv[2]);
        int32_t *ids = read_all(&fx, "golden.input_ids", NULL);
        for (int t = 0; t < T; t++) printf("%s%d", t ? "," : "", ids[(size_t)r * T + t]);
        printf("\n");
        free(ids);
    } else if (strcmp(mode, "values") == 0 && argc == 3) {
        size_t n;
        float *x = read_all(&fx, argv[2], &n);
        for (size_t i = 0; i < n; i++) printf("%.9g\n", x[i]);
        free(x);
    } else if (strcmp(mode, "shapes") == 0 && argc == 2) {
        for (int i = 0; i < fx.n_tensors; i++) {
            const safetensors_tensor *t = &fx.tensors[i];
            if (strncmp(t->name, "golden.", 7) == 0) continue;
            if (t->ndim == 2) printf("%s {%lld, %lld}\n", t->name, (long long)t->shape[0], (long long)t->shape[1]);
            else printf("%s {%lld}\n", t->name, (long long)t->shape[0]);
        }
    } else {
        fprintf(stderr, "usage: test_ckpt_hf import HFDIR CKPTDIR | compare DIR | weights OUT | logits FILE... "
                "| ids ROW | values NAME | shapes\n");
        safetensors_close(&fx);
        MPI_Finalize();
        return 1;
    }
    /* the modes that print data (ids, values, shapes) check nothing: their output is
     * the data alone */
    const int data_mode = strcmp(mode, "ids") == 0 || strcmp(mode, "values") == 0 ||
                          strcmp(mode, "shapes") == 0;
    const int rc = data_mode ? 0 : check_exit_mpi(MPI_COMM_WORLD);
    safetensors_close(&fx);
    MPI_Finalize();
    return rc;
}
