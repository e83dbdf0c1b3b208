/* `shardlm train` and `shardlm eval`: set-up from the job file, the training loop
 * (micro-batches, accumulation, clipping, AdamW, schedule), validation, sampling. */
#include "src/run/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safe_file.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/ckpt/checkpoint.h"
#include "src/cli/commands.h"
#include "src/watch/metrics.h"
#include "src/engine/optim.h"
#include "src/run/sample.h"
#include "src/base/signals.h"
#include "src/base/startup.h"
#include "src/watch/watch.h"

/* Rank 0 prints every rank's topology line, in rank order. */
static void print_topology(const run *r, const char *device) {
    enum { LINE = 256 };
    char line[LINE];
    topology_describe(&r->topo, shlm_host(), device, line, LINE);
    char *all = r->rank == 0 ? malloc((size_t)LINE * r->world) : NULL;
    MPI_CHECK(MPI_Gather(line, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (r->rank == 0) {
        for (int i = 0; i < r->world; i++) printf("%s\n", all + (size_t)i * LINE);
        fflush(stdout);
        free(all);
    }
}

/* shlm_backend_pick's device_of: the GPU this rank binds (the topology's rule) */
static int bound_device(int n, void *topo) { return topology_device(topo, n); }

/* Opens the token file job key `key` names and checks its vocabulary against the model's.
 * A file that does not exist gets the command that makes it: from the text file of the same
 * name beside it where there is one (the demo's jobs/data holds the texts), else from one
 * the user names. */
static int open_job_tokens(token_file *tf, const char *path, const char *key,
                           const job_config *c, char *err, size_t errlen) {
    if (access(path, F_OK) != 0 && errno == ENOENT) {
        const char *tok = c->tokenizer[0] ? c->tokenizer : "bytes";
        char text[1100];
        const size_t n = strlen(path);
        const int bin = n > 4 && strcmp(path + n - 4, ".bin") == 0;
        snprintf(text, sizeof text, "%.*s.txt", (int)(bin ? n - 4 : n), path);
        if (bin && access(text, R_OK) == 0)
            snprintf(err, errlen, "%s: %.400s does not exist: make it with `shardlm data "
                     "prepare --tokenizer %.200s %.400s %.400s`", key, path, tok, text, path);
        else
            snprintf(err, errlen, "%s: %.400s does not exist: make it from a text or JSONL "
                     "file with `shardlm data prepare --tokenizer %.200s FILE %.400s`", key, path,
                     tok, path);
        return -1;
    }
    if (token_file_open(tf, path, err, errlen) != 0) return -1;
    if ((int)tf->vocab_size > model_shape_vocab_size(&c->model)) {
        snprintf(err, errlen, "%s: token vocab %u is larger than model.vocab_size %d", path,
                 tf->vocab_size, model_shape_vocab_size(&c->model));
        return -1;
    }
    return 0;
}

static int open_data(run *r, char *err, size_t errlen, int need_train) {
    const job_config *c = &r->cfg;
    if (need_train &&
        open_job_tokens(&r->train_tf, c->data_train, "[data] train", c, err, errlen) != 0)
        return -1;
    if (c->data_val[0]) {
        if (open_job_tokens(&r->val_tf, c->data_val, "[data] val", c, err, errlen) != 0)
            return -1;
        r->have_val = 1;
    }
    return 0;
}

/* The plan check at set-up: what each rank allocated per category against the plan
 * (`shardlm plan` prints the same plan), in one line of rank 0's figures and a verdict
 * over every rank. */
static void plan_check_setup(const run *r, const size_t measured[PLAN_N_CATEGORIES]) {
    const shard_plan *pl = &r->plan.plan;
    int bad = fit_check_allocated(pl, measured, r->rank);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (r->rank != 0) return;
    printf("memory per rank (allocated): sharded_state_bytes=%zu buffer_bytes=%zu "
           "activation_bytes=%zu\n", measured[PLAN_MASTER] + measured[PLAN_GRAD] + measured[PLAN_MOMENTS],
           measured[PLAN_GATHERED] + measured[PLAN_GRAD_BUFFERS], measured[PLAN_ACTIVATIONS]);
    printf("memory per rank by category (allocated):");
    for (int k = 0; k <= PLAN_ACTIVATIONS; k++) printf(" %s=%zu", plan_category_names[k], measured[k]);
    printf("\nplan check: %s (%s)\n", bad ? "allocated differs from the plan" : "allocated == plan",
           r->ops->allocated_bytes ? "the backend's count" : "bytes requested");
}

/* One micro-batch's rows as the data loader fills them: inputs, targets and (with
 * data.doc_mask) each token's document start; micro_batch x seq_len int32 each. */
typedef struct batch_rows {
    int32_t *inputs, *targets, *doc_start;
    size_t n; /* elements of each */
} batch_rows;

static void batch_rows_alloc(batch_rows *b, const job_config *c) {
    const size_t n = (size_t)c->micro_batch * c->seq_len;
    b->n = n;
    b->inputs = malloc(n * sizeof(int32_t));
    b->targets = malloc(n * sizeof(int32_t));
    b->doc_start = c->doc_mask ? malloc(n * sizeof(int32_t)) : NULL;
    SHLM_CHECK_ALLOC(b->inputs);
    SHLM_CHECK_ALLOC(b->targets);
    if (c->doc_mask) SHLM_CHECK_ALLOC(b->doc_start);
}

static void batch_rows_free(batch_rows *b) {
    free(b->inputs);
    free(b->targets);
    free(b->doc_start);
}

/* The plan check after training: nothing was allocated through the ops after set-up (the
 * cpu backend's count), and on a device the memory in use grew by the plan's total
 * (cudaMemGetInfo's drop: the arena, the op scratch and the library workspace). */
static void plan_check_end(const run *r, size_t device_peak) {
    const shard_plan *pl = &r->plan.plan;
    if (r->ops->allocated_bytes) {
        long long grew = (long long)r->ops->allocated_bytes() - (long long)r->allocated_at_setup;
        long long most = grew;
        MPI_CHECK(MPI_Allreduce(&grew, &most, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD));
        if (r->rank == 0)
            printf("plan check after the steps: %lld bytes allocated after set-up (most of any "
                   "rank)\n", most);
    }
    if (r->ops->mem_info && device_peak > r->device_base && r->rank == 0) {
        const double drop = (double)(device_peak - r->device_base);
        printf("plan check on the device: plan %zu bytes (arena %zu, op scratch %zu), memory in "
               "use grew by %.0f bytes: %+.3f%%\n", pl->total, pl->arena,
               pl->bytes[PLAN_OP_SCRATCH], drop, 100.0 * (drop - (double)pl->total) / (double)pl->total);
    }
}

/* An FP8 train.matmul needs a backend that runs FP8 matmuls on the bound device
 * (model_check_opts); 0, or -1 with one line naming the key, the recipe and the reason. */
static int check_matmul_recipe(const run *r, char *err, size_t errlen) {
    const job_config *c = &r->cfg;
    const model_opts mo = job_model_opts(c, c->activation_checkpointing);
    char why[512];
    if (model_check_opts(&mo, r->ops, why, sizeof why) == 0) return 0;
    snprintf(err, errlen, "%s: train.matmul = %s: %.400s (train.matmul = bf16 runs anywhere)",
             c->path, job_choice_name("train.matmul", c->matmul), why);
    return -1;
}

int run_setup(run *r, const char *job_path, int n_sets, char *const *sets, int need_train) {
    memset(r, 0, sizeof *r);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &r->world));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL,
                                  &node));
    MPI_CHECK(MPI_Comm_rank(node, &r->local_rank));
    MPI_CHECK(MPI_Comm_size(node, &r->local_size));
    MPI_CHECK(MPI_Comm_free(&node));

    char err[1536] = "";
    int ok = job_config_load_for(&r->cfg, job_path, n_sets, sets, need_train ? JOB_TRAIN : JOB_FORWARD,
                             err, sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;
    job_config *c = &r->cfg;
    ok = shlm_watchdog_init(MPI_COMM_WORLD, c->comm_timeout_s, err, sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;

    /* every rank must run the same job: compare the hash of the job text */
    unsigned long long h = job_config_hash(c), h0 = h;
    MPI_CHECK(MPI_Bcast(&h0, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD));
    snprintf(err, sizeof err, "job file %s differs from rank 0's (hash %016llx vs %016llx)",
             c->path, h, h0);
    if (any_rank_failed(h == h0, err)) return -1;

    /* the rank topology of the strategy */
    topology_options topt = {.strategy = c->strategy, .ranks_per_node = c->ranks_per_node,
                             .shard_group_size = c->shard_group_size};
    char terr[1024] = "";
    ok = topology_check(r->world, &topt, terr, sizeof terr) == 0;
    if (ok) ok = topology_create(&r->topo, MPI_COMM_WORLD, &topt, terr, sizeof terr) == 0;
    /* topology messages name the keys; say which job set them */
    snprintf(err, sizeof err, "%s: %s", c->path, terr);
    if (any_rank_failed(ok, err)) return -1;

    const int per_step = c->micro_batch * r->world;
    if (c->global_batch == 0) c->global_batch = per_step;
    ok = 1;
    if (c->global_batch % per_step != 0) {
        snprintf(err, sizeof err,
                 "%s: train.global_batch (%d) must be a multiple of train.micro_batch (%d) x "
                 "ranks (%d)", c->path, c->global_batch, c->micro_batch, r->world);
        ok = 0;
    }
    r->grad_accum = ok ? c->global_batch / per_step : 0;
    int threads = c->threads;
    if (threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cores / r->local_size);
        if (threads < 1) threads = 1;
    }
    const shlm_backend_options bopt = {
        .backend = c->backend,
        .threads = threads,
        .ops = {.attention = c->cuda_attention},
        .comm = {.nccl_cta_policy = c->nccl_cta_policy,
                 .nccl_copy_engine_allgather = c->nccl_copy_engine_allgather}};
    shlm_backend_pair pair = {0};
    char note[600] = "";
    if (ok) ok = shlm_backend_pick(&bopt, bound_device, &r->topo, &pair, note, sizeof note, err,
                                   sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;
    r->ops = pair.ops;
    r->comm = pair.comm;
    if (r->rank == 0 && note[0]) fprintf(stderr, "shardlm: warning: %s\n", note);

    ok = open_data(r, err, sizeof err, need_train) == 0;
    if (any_rank_failed(ok, err)) return -1;
    ok = tokenizer_open(&r->tok, c->tokenizer, err, sizeof err) == 0;
    if (ok && (c->tokenizer_given || strcmp(c->tokenizer, "bytes") != 0 ||
               (need_train && c->sample_tokens > 0)))
        ok = run_check_tokenizer(r, err, sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;
    /* what every checkpoint keeps for export: rank 0 reads it, the others get its copy */
    if (need_train) {
        ok = r->rank != 0 ||
             hf_files_collect(&r->hf, c->hf_model ? c->init_from : NULL, r->tok, err,
                              sizeof err) == 0;
        if (any_rank_failed(ok, err)) return -1;
        hf_files_bcast(&r->hf, 0, MPI_COMM_WORLD);
    }
    /* eval without train.seq_len: windows of the model's context (model.max_seq_len), or the
     * whole validation file as one window when it is shorter */
    if (!need_train && !c->seq_len_given && r->have_val && r->val_tf.count >= 2 &&
        r->val_tf.count - 1 < (uint64_t)c->seq_len)
        c->seq_len = (int)(r->val_tf.count - 1);
    if (need_train) {
        data_loader probe;
        ok = data_loader_init(&probe, &r->train_tf, c->seq_len, c->shuffle, c->seed, r->rank,
                              r->world, c->micro_batch, err, sizeof err) == 0;
        if (ok) data_loader_free(&probe);
        if (any_rank_failed(ok, err)) return -1;
    }
    if (r->have_val) {
        data_loader probe;
        ok = data_loader_init(&probe, &r->val_tf, c->seq_len, 0, c->seed, r->rank, r->world,
                              c->micro_batch, err, sizeof err) == 0;
        if (ok) data_loader_free(&probe);
        if (any_rank_failed(ok, err)) return -1;
    }

    startup_mark(STARTUP_JOB);
    char device[32] = "cpu";
    if (r->ops->set_device) {
        int dev = topology_device(&r->topo, r->ops->device_count());
        r->ops->set_device(dev);
        snprintf(device, sizeof device, "%s:%d", r->ops->name, dev);
    }
    ok = check_matmul_recipe(r, err, sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;
    if (r->rank == 0) job_config_print(c, r->world);
    print_topology(r, device);
    startup_mark(STARTUP_DEVICE);
    r->comm->set_delay_us(NULL, c->comm_delay_us);
    /* weights are set by the caller: imported, resumed, or from the seed (load_initial) */
    fsdp_options opt = {.prefetch = c->prefetch, .trace = c->trace, .defer_init = 1};
    /* the plan: what the engine, the model and the ops will allocate, built once */
    const job_point pt = job_point_of(c, r->topo.strategy, r->topo.shard_size,
                                      r->topo.replica_size);
    const int registered = r->comm->gather_buffers_enabled && r->comm->gather_buffers_enabled();
    job_plan_build(&r->plan, c, &pt, r->ops->act_dtype, r->ops, !need_train, registered);
    r->have_plan = 1;
    const shard_plan *pl = &r->plan.plan;
    /* the communicators before the fit check: on a device they take memory (NCCL's
     * channels), which must be in use when the free memory is read */
    opt.shard_group = r->comm->group_create(r->topo.shard);
    opt.replica_group = r->comm->group_create(r->topo.replica);
    startup_mark(STARTUP_COMM);
    /* refuse before allocating anything if the plan does not fit: a device's free memory,
     * or the host's available memory shared by the node's ranks */
    size_t used = 0, total = 0;
    double avail = -1;
    char where[256] = "";
    r->device_base = 0;
    if (r->ops->mem_info && r->ops->mem_info(&used, &total) == 0) {
        r->device_base = used;
        avail = (double)(total - used);
        snprintf(where, sizeof where, "free on its %s device of %.2f GiB", r->ops->name,
                 total / 1073741824.0);
    } else if (!r->ops->mem_info && fit_host_memory(r->local_size, &avail, where, sizeof where) != 0) {
        avail = -1;
    }
    ok = avail < 0 || fit_check_memory(pl, avail, where, c->path, r->world, err, sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;
    /* one device arena for everything the plan allocates through the ops; the ops' scratch
     * (attention's backward, the matmul library's workspace) is allocated before step 1
     * too, beside the arena */
    if (r->ops->reserve && pl->arena > 0) r->ops->reserve(pl->arena);
    if (r->ops->scratch_reserve && pl->bytes[PLAN_OP_SCRATCH] > 0)
        r->ops->scratch_reserve(pl->bytes[PLAN_OP_SCRATCH]);
    startup_mark(STARTUP_ALLOC);
    size_t measured[PLAN_N_CATEGORIES] = {0};
    r->engine = fsdp_create(&r->plan.md, pl, r->ops, r->comm, &r->topo, &opt, c->seed);
    fsdp_measured_bytes(r->engine, measured);
    const size_t before_model = r->ops->allocated_bytes ? r->ops->allocated_bytes() : 0;
    const model_opts mo = job_model_opts(c, pl->p.ac);
    r->model = model_create(&c->model, r->ops, c->micro_batch, c->seq_len, &mo,
                            fsdp_param_source(r->engine));
    measured[PLAN_ACTIVATIONS] = r->ops->allocated_bytes
                                     ? r->ops->allocated_bytes() - before_model
                                     : model_activation_bytes(r->model);
    startup_mark(STARTUP_ALLOC);
    r->allocated_at_setup = r->ops->allocated_bytes ? r->ops->allocated_bytes() : 0;
    plan_check_setup(r, measured);
    return 0;
}

int run_check_tokenizer(const run *r, char *err, size_t errlen) {
    const job_config *c = &r->cfg;
    const uint32_t n = tokenizer_vocab_size(r->tok);
    const int V = model_shape_vocab_size(&c->model);
    if (n <= (uint32_t)V) return 0;
    char model[1100];
    if (c->hf_model) snprintf(model, sizeof model, "%s/config.json", c->init_from);
    else snprintf(model, sizeof model, "%s", c->path);
    snprintf(err, errlen, "the tokenizer %s has %u ids but the model's vocab_size is %d (%s): "
             "its ids past %d have no embedding; data.tokenizer must be the model's",
             tokenizer_path(r->tok), n, V, model, V - 1);
    return -1;
}

void run_teardown(run *r) {
    hf_files_free(&r->hf);
    tokenizer_free(r->tok);
    model_destroy(r->model);
    fsdp_destroy(r->engine);
    if (r->have_plan) job_plan_free(&r->plan);
    topology_free(&r->topo);
    token_file_close(&r->train_tf);
    if (r->have_val) token_file_close(&r->val_tf);
    job_config_free(&r->cfg);
}

int run_validate(run *r, double *loss, double *scored) {
    const job_config *c = &r->cfg;
    data_loader dl;
    char err[512];
    if (data_loader_init(&dl, &r->val_tf, c->seq_len, 0, c->seed, r->rank, r->world,
                         c->micro_batch, err, sizeof err) != 0)
        SHLM_FATAL("%s", err);
    dl.doc_mask = c->doc_mask;
    /* the same windows whatever the world size, each scored once: the whole set, or its
     * first eval_batches global batches, split over ranks like training data; every rank
     * runs the same number of forward passes, a row past the last window scoring nothing */
    const uint64_t per_batch = (uint64_t)c->micro_batch * r->world;
    uint64_t windows = c->eval_batches > 0 ? (uint64_t)c->eval_batches * c->global_batch
                                           : dl.n_windows;
    if (windows > dl.n_windows) windows = dl.n_windows;
    const uint64_t batches = (windows + per_batch - 1) / per_batch;
    batch_rows br;
    batch_rows_alloc(&br, c);
    int32_t *in = br.inputs, *tg = br.targets, *ds = br.doc_start;
    /* token-weighted: the loss sums and target counts of all ranks, divided once */
    double sums[3] = {0, 0, 0}; /* loss sum, trained targets, ranks whose token file changed */
    char data_err[1536] = "";
    int data_failed = 0;
    fsdp_begin_pass(r->engine, 0);
    int stop_sig = 0; /* a stop signal on any rank: every rank ends the pass at the same batch */
    for (uint64_t b = 0; b < batches && !stop_sig; b++) {
        if (!data_failed &&
            data_loader_batch(&dl, b * per_batch, 0, in, tg, ds, data_err, sizeof data_err) != 0)
            data_failed = 1;
        for (int j = 0; j < c->micro_batch; j++) /* row j holds sample b·per_batch + j·W + r */
            if (b * per_batch + (uint64_t)j * r->world + (uint64_t)r->rank >= windows)
                for (int t = 0; t < c->seq_len; t++) tg[(size_t)j * c->seq_len + t] = -1;
        int valid = 0;
        const model_batch mb = {in, tg, ds, c->micro_batch, c->seq_len};
        sums[0] += model_forward(r->model, &mb, &valid, NULL, NULL);
        sums[1] += valid;
        if (b + 1 < batches) { /* one small reduction beside the pass's own collectives */
            double sig = shlm_signals_pending();
            MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, &sig, 1, MPI_DOUBLE, MPI_MAX,
                                           MPI_COMM_WORLD));
            stop_sig = (int)sig;
        }
    }
    sums[2] = data_failed;
    MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    batch_rows_free(&br);
    data_loader_free(&dl);
    if (sums[2] > 0) return any_rank_failed(!data_failed, data_err);
    if (stop_sig) { /* a part of the set is not its loss */
        *loss = NAN;
        return stop_sig;
    }
    *loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
    if (scored) *scored = sums[1];
    return 0;
}

/* The closing sample of a run (train.sample_*): the prompt encoded with the job's
 * tokenizer (bos as the model's configuration says), the continuation printed as it
 * comes, ending at an eos. */
static void print_sample(run *r) {
    const job_config *c = &r->cfg;
    const char *prompt = c->sample_prompt[0] ? c->sample_prompt : "\n";
    token_ids p = {0};
    char err[512];
    int ok = tokenizer_encode_with(r->tok, prompt, strlen(prompt),
                                   tokenizer_default_flags(r->tok) & TOKENIZER_ADD_BOS, &p, err,
                                   sizeof err) == 0;
    if (any_rank_failed(ok && p.n > 0, ok ? "train.sample_prompt encodes to no token" : err)) {
        free(p.ids);
        return;
    }
    int32_t *ids = malloc((p.n + (size_t)c->sample_tokens) * sizeof(int32_t));
    SHLM_CHECK_ALLOC(ids);
    int n_stop = 0;
    const int32_t *stop = tokenizer_eos_ids(r->tok, &n_stop);
    const sample_options so = {.temperature = c->sample_temperature, .top_p = c->sample_top_p,
                               .seed = c->seed, .stop_ids = stop, .n_stop = n_stop};
    fsdp_begin_pass(r->engine, 0);
    if (r->rank == 0)
        printf("--- sample: up to %d tokens, temperature %.2f, top_p %.2f ---\n",
               c->sample_tokens, c->sample_temperature, c->sample_top_p);
    const int show_ids = strcmp(tokenizer_kind(r->tok), "bytes") == 0 && model_shape_vocab_size(&c->model) != 256;
    sample_print(r->model, r->tok, show_ids, c->seq_len, p.ids, (int)p.n, c->sample_tokens, &so,
                 r->rank == 0 ? stdout : NULL, ids);
    if (r->rank == 0) {
        printf("\n---\n");
        fflush(stdout);
    }
    free(ids);
    free(p.ids);
}

/* Rank 0's time per step by op category (runtime.profile), each op timed between two
 * synchronisations, so the sum is a serialised step, longer than a normal one. */
static void print_profile(const model_family *f, const double *prof_s, double opt_s,
                          double step_s, int steps) {
    double sum = opt_s;
    for (int k = 0; k < f->n_prof; k++) sum += prof_s[k];
    printf("# profile (rank 0, mean of %d step(s) after the first; ops timed between syncs)\n", steps);
    printf("# %-36s %10s %7s\n", "category", "ms/step", "share");
    for (int k = 0; k < f->n_prof; k++)
        printf("  %-36s %10.2f %6.1f%%\n", f->prof_names[k], 1e3 * prof_s[k] / steps,
               100 * prof_s[k] / sum);
    printf("  %-36s %10.2f %6.1f%%\n", "grad finish + optimizer", 1e3 * opt_s / steps,
           100 * opt_s / sum);
    printf("  %-36s %10.2f\n", "sum of the above", 1e3 * sum / steps);
    printf("  %-36s %10.2f  (the rest: host work outside ops)\n", "measured step (profiled)",
           1e3 * step_s / steps);
}

/* Each rank writes its schedule trace to <run_dir>/trace.rank<R>.jsonl (replaced whole,
 * io/safe_file.h). Returns 0, or -1 with err. */
static int write_trace(run *r, char *err, size_t errlen) {
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); /* rank 0 created run_dir */
    char path[1200];
    snprintf(path, sizeof path, "%s/trace.rank%d.jsonl", r->cfg.run_dir, r->rank);
    safe_file out;
    if (safe_file_begin(&out, path, err, errlen) != 0) return -1;
    fsdp_trace_write(r->engine, out.fp);
    return safe_file_finish(&out, err, errlen);
}

/* What a resumed job may change (config.c's checkpoint.allow_*_change say what each
 * means): a training file other than the checkpoint's (by size and fingerprint; older
 * checkpoints keep none), or a train.seq_len, global_batch or steps other than its, is
 * refused unless allowed, naming both files or values and the key; an allowed change
 * adjusts *st (the data position in windows of the new length; the schedule's new
 * cosine). tf: the training file. Local: every rank reaches the same verdict. */
static int resume_rules(const job_config *c, const char *path, const token_file *tf,
                        ckpt_state *st, char *err, size_t errlen) {
    const uint64_t n_tokens = tf->count;
    if (st->data_bytes && !c->allow_data_change &&
        (st->data_bytes != tf->size || st->data_fingerprint != tf->fingerprint)) {
        snprintf(err, errlen, "%.200s was saved training on %.200s (%llu bytes, fingerprint "
                 "%016llx); this job's data.train %.200s is another file (%llu bytes, fingerprint "
                 "%016llx): the checkpoint's data position counts samples of its own; set "
                 "checkpoint.allow_data_change = true to continue at the same sample index in "
                 "this file, or resume with data.train = %.200s", path, st->data_train,
                 (unsigned long long)st->data_bytes, (unsigned long long)st->data_fingerprint,
                 c->data_train, (unsigned long long)tf->size,
                 (unsigned long long)tf->fingerprint, st->data_train);
        return -1;
    }
    if (st->seq_len != c->seq_len) {
        if (!c->allow_seq_len_change) {
            snprintf(err, errlen, "%s was saved with train.seq_len = %d, this job has %d: its "
                     "data position counts windows of %d tokens; set "
                     "checkpoint.allow_seq_len_change = true to continue at the same token, or "
                     "resume with train.seq_len = %d", path, st->seq_len, c->seq_len, st->seq_len,
                     st->seq_len);
            return -1;
        }
        if (st->shuffle) {
            snprintf(err, errlen, "%s: checkpoint.allow_seq_len_change cannot apply: its data is "
                     "shuffled (data.shuffle = true), and windows of %d tokens are permuted "
                     "otherwise than windows of %d, so its place in the epoch has no "
                     "equivalent; resume with train.seq_len = %d", path, st->seq_len,
                     c->seq_len, st->seq_len);
            return -1;
        }
        uint64_t pos;
        if (data_loader_reposition(st->data_position, n_tokens, st->seq_len, c->seq_len,
                                   &pos) != 0) {
            snprintf(err, errlen, "%s: data position %llu in windows of %d tokens has no "
                     "equivalent in windows of %d of this data", path,
                     (unsigned long long)st->data_position, st->seq_len, c->seq_len);
            return -1;
        }
        st->data_position = pos;
        st->seq_len = c->seq_len;
    }
    if (st->global_batch != c->global_batch) {
        if (!c->allow_global_batch_change) {
            snprintf(err, errlen, "%s was saved with train.global_batch = %d, this job has %d: "
                     "set checkpoint.allow_global_batch_change = true to take %d sequences per "
                     "step from the next sample on, or resume with train.global_batch = %d",
                     path, st->global_batch, c->global_batch, c->global_batch,
                     st->global_batch);
            return -1;
        }
        st->global_batch = c->global_batch;
    }
    if (st->steps != c->steps) {
        if (!c->allow_steps_change) {
            snprintf(err, errlen, "%s was saved with train.steps = %d, this job has %d: the "
                     "learning-rate schedule would be another one (lr %.3e at step %lld); set "
                     "checkpoint.allow_steps_change = true to continue from lr %.3e and decay to "
                     "train.min_lr at step %d, or resume with train.steps = %d", path, st->steps,
                     c->steps, st->lr_last, (long long)st->step, st->lr_last, c->steps,
                     st->steps);
            return -1;
        }
        lr_schedule ext = lr_schedule_extend(c->lr, c->min_lr, c->warmup_steps, c->steps,
                                             (int)st->step, (float)st->lr_last);
        st->lr_decay_from = ext.decay_from;
        st->lr_decay_lr = ext.decay_lr;
        st->steps = c->steps;
    }
    return 0;
}

/* The state a training run starts from: checkpoint.resume (weights, moments, step, data
 * position), else model.init_from (weights), else the seed's init and step 0. A resumed
 * job is checked against the checkpoint's state before any tensor is read
 * (resume_rules). Returns 0, or -1 with the message printed. */
static int load_initial_weights(run *r, ckpt_state *st);
static int load_initial(run *r, ckpt_state *st) {
    int rc = load_initial_weights(r, st);
    startup_mark(STARTUP_WEIGHTS);
    startup_set_drawn(r->cfg.model.family->init_count());
    return rc;
}
static int load_initial_weights(run *r, ckpt_state *st) {
    const job_config *c = &r->cfg;
    char err[1536] = "", path[2048];
    *st = (ckpt_state){.seed = c->seed, .shuffle = c->shuffle, .global_batch = c->global_batch,
                       .seq_len = c->seq_len, .steps = c->steps, .lr_decay_from = -1};
    if (checkpoint_resolve(c->ckpt_dir, c->ckpt_resume, path, sizeof path, err, sizeof err) != 0)
        return any_rank_failed(0, err);
    if (path[0]) {
        startup_set_weights(STARTUP_WEIGHTS_RESUME);
        if (r->rank == 0 && c->init_from[0])
            printf("checkpoint: resuming from %s; model.init_from = %s is not used\n", path,
                   c->init_from);
        ckpt_state peek;
        if (checkpoint_read_state(path, r->topo.world, &peek, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        int ok = resume_rules(c, path, &r->train_tf, &peek, err, sizeof err) == 0;
        if (any_rank_failed(ok, err)) return -1;
        if (checkpoint_load(r->engine, &r->topo, &c->model, path, CKPT_LOAD_ALL, st, err,
                            sizeof err) != 0 ||
            checkpoint_read_hf_path(path, r->topo.world, &r->hf, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        const ckpt_state saved = *st;
        if (resume_rules(c, path, &r->train_tf, st, err, sizeof err) != 0)
            return any_rank_failed(0, err); /* the file changed since it was first read */
        if (r->rank == 0 && st->data_bytes &&
            (st->data_bytes != r->train_tf.size || st->data_fingerprint != r->train_tf.fingerprint))
            printf("checkpoint: data.train is not the checkpoint's file %s "
                   "(checkpoint.allow_data_change): the next step takes sample %llu of %s\n",
                   st->data_train, (unsigned long long)st->data_position, c->data_train);
        if (r->rank == 0 && (st->seed != c->seed || st->shuffle != c->shuffle))
            printf("checkpoint: the data order continues from the checkpoint's train.seed = %llu, "
                   "data.shuffle = %d (the job says %llu, %d)\n", (unsigned long long)st->seed,
                   st->shuffle, (unsigned long long)c->seed, c->shuffle);
        if (r->rank == 0 && saved.seq_len != st->seq_len)
            printf("checkpoint: train.seq_len %d -> %d (checkpoint.allow_seq_len_change): data "
                   "position %llu -> %llu, the first window of %d tokens at or after the first "
                   "unread token\n", saved.seq_len, st->seq_len,
                   (unsigned long long)saved.data_position, (unsigned long long)st->data_position,
                   st->seq_len);
        if (r->rank == 0 && saved.global_batch != st->global_batch)
            printf("checkpoint: train.global_batch %d -> %d (checkpoint.allow_global_batch_change)"
                   ": the next step starts at sample %llu\n", saved.global_batch,
                   c->global_batch, (unsigned long long)st->data_position);
        if (r->rank == 0 && saved.steps != st->steps && st->step <= c->warmup_steps)
            printf("checkpoint: train.steps %d -> %d (checkpoint.allow_steps_change): the "
                   "warm-up continues, then the cosine decays to %.3e at step %d\n",
                   saved.steps, st->steps, c->min_lr, st->steps);
        else if (r->rank == 0 && saved.steps != st->steps)
            printf("checkpoint: train.steps %d -> %d (checkpoint.allow_steps_change): the "
                   "learning rate continues from %.3e and decays to %.3e at step %d\n",
                   saved.steps, st->steps, st->lr_last, c->min_lr, st->steps);
        return 0;
    }
    if (!c->init_from[0]) { /* run_setup deferred this: loads overwrite every shard */
        startup_set_weights(STARTUP_WEIGHTS_SEED);
        fsdp_init_weights(r->engine, c->seed);
        return 0;
    }
    startup_set_weights(STARTUP_WEIGHTS_IMPORT);
    if (checkpoint_init_from(r->engine, &r->topo, &c->model, c->init_from, err, sizeof err) != 0)
        return any_rank_failed(0, err);
    /* a checkpoint's weights bring the files it kept, where the job's sources lack them */
    if (!c->hf_model &&
        (checkpoint_resolve("", c->init_from, path, sizeof path, err, sizeof err) != 0 ||
         checkpoint_read_hf_path(path, r->topo.world, &r->hf, err, sizeof err) != 0))
        return any_rank_failed(0, err);
    return 0;
}

/* Test hook SHLM_TEST_NONFINITE=WHAT:FIRST[-LAST][:RANK], WHAT = loss | norm | weights:
 * on world rank RANK (default 0), in 1-based steps FIRST..LAST, the rank's loss or its
 * gradient norm reads NaN, or (weights) its shard of the embedding is set to NaN right
 * after the update, as if the arithmetic had overflowed there. For the tests of
 * train.on_nonfinite and of the save's refusal of non-finite tensors. */
typedef enum nonfinite_target { NF_NONE, NF_LOSS, NF_NORM, NF_WEIGHTS } nonfinite_target;
typedef struct nonfinite_hook {
    nonfinite_target what;
    int first, last;
} nonfinite_hook;

static int nonfinite_hook_get(int rank, nonfinite_hook *h, char *err, size_t errlen) {
    *h = (nonfinite_hook){NF_NONE, 0, -1};
    const char *v = getenv("SHLM_TEST_NONFINITE");
    if (!v || !*v) return 0;
    char what[8] = "", *p = NULL;
    int first = 0, last = 0, r = 0, n = 0;
    const int ok = sscanf(v, "%7[a-z]:%d%n", what, &first, &n) == 2;
    p = (char *)v + n;
    last = first;
    if (ok && *p == '-') last = (int)strtol(p + 1, &p, 10);
    if (ok && *p == ':') r = (int)strtol(p + 1, &p, 10);
    nonfinite_target t = !strcmp(what, "loss") ? NF_LOSS : !strcmp(what, "norm") ? NF_NORM
                         : !strcmp(what, "weights") ? NF_WEIGHTS : NF_NONE;
    if (!ok || *p || t == NF_NONE || first < 1 || last < first) {
        snprintf(err, errlen, "SHLM_TEST_NONFINITE=%.100s: expected loss|norm|weights:FIRST"
                 "[-LAST][:RANK]", v);
        return -1;
    }
    if (r == rank) *h = (nonfinite_hook){t, first, last};
    return 0;
}

static int nonfinite_hook_hits(const nonfinite_hook *h, nonfinite_target t, int step) {
    return h->what == t && step >= h->first && step <= h->last;
}

/* NF_WEIGHTS: every element of this rank's shard of the embedding becomes NaN. */
static void poison_embedding_shard(fsdp_engine *e) {
    size_t b, en;
    fsdp_shard_range(e, 0, &b, &en);
    float *x = malloc((en - b + 1) * sizeof(float));
    SHLM_CHECK_ALLOC(x);
    for (size_t i = 0; i < en - b; i++) x[i] = NAN;
    fsdp_set_state(e, 0, FSDP_STATE_MASTER, x);
    free(x);
}

static int train_loop(run *r, const ckpt_state *st0, watch *w) {
    const job_config *c = &r->cfg;
    char err[1536] = "";
    nonfinite_hook hook;
    int ok = nonfinite_hook_get(r->rank, &hook, err, sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;

    /* a resumed run continues the checkpoint's data stream: same order, next sample */
    data_loader dl;
    if (data_loader_init(&dl, &r->train_tf, c->seq_len, st0->shuffle, st0->seed, r->rank,
                         r->world, c->micro_batch, err, sizeof err) != 0)
        SHLM_FATAL("%s", err);
    dl.doc_mask = c->doc_mask;
    const int first = (int)st0->step, end = c->stop_after > 0 ? c->stop_after : c->steps;
    watch_set_range(w, first, end);
    batch_rows br;
    batch_rows_alloc(&br, c);
    int32_t *in = br.inputs, *tg = br.targets, *ds = br.doc_start;
    lr_schedule sch = lr_schedule_job(c->lr, c->min_lr, c->warmup_steps, c->steps);
    if (st0->lr_decay_from >= 0) { /* extended when a resume changed train.steps */
        sch.decay_from = (int)st0->lr_decay_from;
        sch.decay_lr = (float)st0->lr_decay_lr;
    }
    const int skip_nonfinite = c->on_nonfinite == NONFINITE_SKIP;
    int64_t adamw_step = st0->adamw_step, in_a_row = st0->skipped_in_a_row;
    const adamw_hparams hp = {c->beta1, c->beta2, c->eps, c->weight_decay};
    const double flops_tok = model_shape_flops_per_token(&c->model, c->seq_len);
    const long long tokens_per_step = (long long)c->global_batch * c->seq_len;
    size_t device_peak = 0; /* all allocations are made at set-up: sampled after each step */
    if (r->rank == 0) {
        printf("model: %lld parameters, %.3g FLOP/token; %d micro-batch(es) of %d x %d per rank "
               "per step; run dir %s\n",
               (long long)model_shape_param_count(&c->model), flops_tok, r->grad_accum,
               c->micro_batch, c->seq_len, c->run_dir);
        metrics_print_header(stdout);
    }
    if (r->rank == 0 && first >= end)
        printf("checkpoint: step %d reached already (train.%s = %d): nothing to train\n", first,
               c->stop_after > 0 ? "stop_after" : "steps", end);
    uint64_t wire[2] = {0, 0}; /* bytes sent in the shard, replica group by training steps */
    /* runtime.profile: per-op seconds summed over the steps after the first */
    enum { PROF_MAX = 32 };
    double prof_s[PROF_MAX] = {0}, prof_opt_s = 0, prof_opt_t0 = 0, prof_step_s = 0;
    const int n_prof = model_family_of(r->model)->n_prof;
    int prof_steps = 0;
    model_set_profile(r->model, c->profile);
    int rc = 0, stopped_at = 0; /* the step after which a stop signal ended the loop */
    for (int s = first; s < end; s++) {
        shlm_watchdog_test_stop(r->rank, s + 1);
        shlm_comm_stats before[2], after[2];
        fsdp_comm_stats(r->engine, &before[0], &before[1]);
        double t0 = MPI_Wtime();
        fsdp_zero_grad(r->engine);
        fsdp_begin_pass(r->engine, 1);
        /* loss sum, trained targets, ranks whose loss or norm is not finite, ranks whose
         * token file changed */
        double sums[4] = {0, 0, 0, 0};
        int data_failed = 0; /* this rank's token file changed: see the step-end check */
        /* The step's loss is the token-weighted mean over all its micro-batches and ranks:
         * the loss sum over N trained targets, divided by N. Every rank counts N itself
         * from the file (the step's G samples), so the scale is known before the first
         * backward without a collective; each trained target's loss gradient is then
         * W / N, which the reductions' average over the W ranks turns into 1 / N. */
        const uint64_t step_start = st0->data_position + (uint64_t)(s - first) * c->global_batch;
        int64_t n_step = 0;
        if (data_loader_count_targets(&dl, step_start, (uint64_t)c->global_batch, &n_step, err,
                                      sizeof err) != 0) {
            data_failed = 1; /* zeroed rows (what a failed batch leaves) keep this rank in the
                              * step's collectives; the step-end check ends the run */
            memset(in, 0, br.n * sizeof *in);
            memset(tg, 0, br.n * sizeof *tg);
            if (ds) memset(ds, 0, br.n * sizeof *ds);
        } else if (n_step == 0 && r->rank == 0) {
            fprintf(stderr, "shardlm: warning: step %d: no target of its %d sequences is "
                    "trained (all masked): its gradient is zero\n", s + 1, c->global_batch);
        }
        const float scale = n_step > 0 ? (float)r->world / (float)n_step : 0.0f;
        for (int m = 0; m < r->grad_accum; m++) {
            if (!data_failed &&
                data_loader_batch(&dl, step_start, m, in, tg, ds, err, sizeof err) != 0)
                data_failed = 1;
            int valid = 0;
            if (m == r->grad_accum - 1) fsdp_last_micro_batch(r->engine);
            const model_batch mb = {in, tg, ds, c->micro_batch, c->seq_len};
            sums[0] += model_forward_backward(r->model, &mb, scale, &valid);
            sums[1] += valid;
        }
        if (nonfinite_hook_hits(&hook, NF_LOSS, s + 1)) sums[0] = NAN;
        if (c->profile) r->ops->sync(), prof_opt_t0 = MPI_Wtime();
        double norm = fsdp_finish_grads(r->engine);
        if (nonfinite_hook_hits(&hook, NF_NORM, s + 1)) norm = NAN;
        /* the step's loss sums and whether this rank's loss or gradient norm is not finite,
         * in one reduction before the update: every rank, replicas included, then takes the
         * same decision (the norm is the shard group's, its NaN spread by the reductions) */
        sums[2] = isfinite(sums[0]) && isfinite(norm) ? 0 : 1;
        sums[3] = data_failed;
        MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, sums, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
        /* the ranks' batches hold exactly the targets counted for the scale */
        if (sums[3] == 0 && sums[1] != (double)n_step)
            SHLM_FATAL("step %d: the batches hold %.0f trained targets, %lld were counted",
                       s + 1, sums[1], (long long)n_step);
        const int nonfinite = sums[2] > 0;
        float lr = lr_at(&sch, s);
        if (!nonfinite) {
            fsdp_optimizer_step(r->engine, lr, clip_factor(norm, c->grad_clip), &hp,
                                (int)++adamw_step);
            in_a_row = 0;
            if (nonfinite_hook_hits(&hook, NF_WEIGHTS, s + 1)) poison_embedding_shard(r->engine);
        } else {
            in_a_row++; /* the update is dropped: weights, moments and step count stay */
        }
        const int nonfinite_stop = nonfinite && (!skip_nonfinite || in_a_row > c->max_skipped);
        if (c->profile) {
            r->ops->sync();
            double step_prof[PROF_MAX];
            model_take_profile(r->model, step_prof);
            if (s > first) { /* the first step warms caches and cuBLASLt plans */
                for (int k = 0; k < n_prof; k++) prof_s[k] += step_prof[k];
                prof_opt_s += MPI_Wtime() - prof_opt_t0;
                prof_steps++;
            }
        }
        /* poll until every collective has finished: the comm watchdog turns a stuck or
         * failed one into an abort instead of a hang in sync() */
        while (r->comm->progress() > 0) usleep(20);
        r->ops->sync();
        size_t used = 0, total = 0;
        if (r->ops->mem_info && r->ops->mem_info(&used, &total) == 0 && used > device_peak)
            device_peak = used;
        const size_t mem_peak = r->ops->mem_info ? device_peak : peak_rss_bytes();
        const double local_s = MPI_Wtime() - t0;
        double comm_ms[2]; /* exposed comm of the shard, replica group in this step */
        fsdp_comm_stats(r->engine, &after[0], &after[1]);
        for (int g = 0; g < 2; g++) {
            comm_ms[g] = 1e-6 * (double)(after[g].blocked_ns - before[g].blocked_ns);
            for (int op = 0; op < SHLM_COMM_N_OPS; op++) wire[g] += after[g].wire[op] - before[g].wire[op];
        }
        /* the step-end reduction: a stop signal (SIGUSR1/SIGTERM) seen by any rank stops
         * all after this same step, and so does a token file that changed under the run;
         * the slowest rank's time is the step's */
        step_record rec;
        watch_step_end(w, (double)shlm_signals_pending(), (double)data_failed, local_s, comm_ms,
                       mem_peak, &rec);
        if (rec.data_failed > 0) { /* a rank trained on zeroed rows: log and save nothing */
            any_rank_failed(!data_failed, err);
            rc = -1;
            break;
        }
        double step_s = rec.slow_ms / 1000;
        if (c->profile && s > first) prof_step_s += step_s;

        int last = s == end - 1;
        /* stopping early on a signal: log this step, skip validation (or end it at the
         * batch where the signal is seen), save, exit */
        int stop_sig = last ? 0 : (int)rec.stop_signal;
        double val = NAN;
        if (r->have_val && !stop_sig && !nonfinite_stop &&
            (last || (c->eval_every > 0 && (s + 1) % c->eval_every == 0))) {
            const int v = run_validate(r, &val, NULL);
            if (v < 0) {
                rc = -1;
                break;
            }
            if (v > 0 && r->rank == 0)
                printf("validation after step %d stopped by %s: no validation loss for it\n",
                       s + 1, shlm_signal_name(v));
            if (v > 0) stop_sig = v;
        }
        const double loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
        step_metrics sm = {.step = s + 1, .loss = loss, .val_loss = val, .lr = lr,
                           .grad_norm = norm, .mem_peak_bytes = mem_peak,
                           .tokens_seen = st0->tokens_seen + tokens_per_step * (s + 1 - first),
                           .skipped = nonfinite};
        watch_step(w, &sm, &rec, last || stop_sig || nonfinite || (s + 1) % c->log_every == 0 ||
                                     !isnan(val));
        if (nonfinite_stop) {
            /* nothing of this step reaches the weights or a checkpoint */
            char what[160];
            snprintf(what, sizeof what, "step %d: the loss or the gradient norm is not finite "
                     "on %d of %d ranks (mean loss %g, rank 0's gradient norm %g)", s + 1,
                     (int)sums[2], r->world, loss, norm);
            if (r->rank == 0 && !skip_nonfinite)
                fprintf(stderr, "shardlm: error: %s; stopping before the update, nothing more "
                        "saved (train.on_nonfinite = abort; skip drops such steps)\n", what);
            else if (r->rank == 0)
                fprintf(stderr, "shardlm: error: %s, %lld steps in a row, more than "
                        "train.max_skipped = %d; stopping, nothing more saved\n", what,
                        (long long)in_a_row, c->max_skipped);
            fflush(stderr);
            rc = -1;
            break;
        }
        /* checkpoint every N steps, at the end and on a stop signal (a failed save ends
         * the run) */
        if (c->ckpt_dir[0] &&
            (last || stop_sig || (c->ckpt_every > 0 && (s + 1) % c->ckpt_every == 0))) {
            ckpt_state st = *st0;
            st.step = s + 1;
            st.adamw_step = adamw_step;
            st.skipped_in_a_row = in_a_row;
            st.steps = c->steps;
            st.tokens_seen = st0->tokens_seen + tokens_per_step * (s + 1 - first);
            st.data_position = st0->data_position + (uint64_t)(s + 1 - first) * c->global_batch;
            st.global_batch = c->global_batch;
            st.seq_len = c->seq_len;
            st.lr_last = lr;
            snprintf(st.data_train, sizeof st.data_train, "%s", c->data_train);
            st.data_bytes = r->train_tf.size;
            st.data_fingerprint = r->train_tf.fingerprint;
            if (checkpoint_save(r->engine, &r->topo, c, &st, &r->hf, c->ckpt_dir, c->ckpt_keep, err,
                                sizeof err) != 0) {
                any_rank_failed(0, err);
                rc = -1;
                break;
            }
        }
        if (stop_sig) {
            /* without checkpoint.dir there is nowhere to save: stop all the same (cleanly,
             * not killed mid-step), but exit non-zero since the work since start is lost */
            if (r->rank == 0 && c->ckpt_dir[0])
                printf("shardlm: caught %s at step %d: saved %s/step_%d.h5, exiting\n",
                       shlm_signal_name(stop_sig), s + 1, c->ckpt_dir, s + 1);
            else if (r->rank == 0)
                fprintf(stderr, "shardlm: error: caught %s at step %d, but checkpoint.dir is "
                        "not set: nothing saved, exiting\n", shlm_signal_name(stop_sig), s + 1);
            fflush(stdout);
            fflush(stderr);
            if (!c->ckpt_dir[0]) rc = -1;
            shlm_signals_stop_handled();
            stopped_at = s + 1;
            break;
        }
    }
    const int done = stopped_at > 0 ? stopped_at : end;
    const uint64_t ran = done > first ? (uint64_t)(done - first) : 1;
    if (c->profile && r->rank == 0 && prof_steps > 0)
        print_profile(model_family_of(r->model), prof_s, prof_opt_s, prof_step_s, prof_steps);
    if (r->rank == 0 && rc == 0)
        printf("comm per step (rank 0, sent): shard_group_bytes=%llu replica_group_bytes=%llu\n",
               (unsigned long long)(wire[0] / ran), (unsigned long long)(wire[1] / ran));
    plan_check_end(r, device_peak);
    batch_rows_free(&br);
    data_loader_free(&dl);
    watch_summary(w, rc == 0);
    if (rc != 0) return rc;
    if (c->trace && any_rank_failed(write_trace(r, err, sizeof err) == 0, err)) return -1;
    if (c->sample_tokens > 0 && stopped_at == 0) print_sample(r);
    return 0;
}

static const char train_usage[] =
    "usage: shardlm train JOB.ini [--set section.key=value ...]\n"
    "  Trains the job on every rank of the MPI job (mpirun -np N shardlm train ...):\n"
    "  model.init_from (a Hugging Face directory or a checkpoint) or the seed's init, or\n"
    "  checkpoint.resume (auto: checkpoint.dir's latest). `shardlm keys` lists every job\n"
    "  key; --set overrides one. Without checkpoint.dir the trained weights are not kept.\n";
static const char eval_usage[] =
    "usage: shardlm eval JOB.ini [--ckpt CKPT] [--set section.key=value ...]\n"
    "  Mean loss and perplexity over [data] val (masked targets are not scored), and the\n"
    "  number of tokens scored. Weights: --ckpt (a step_<N>.h5 file, a checkpoint\n"
    "  directory, or a Hugging Face directory), else checkpoint.resume (auto: checkpoint.dir's\n"
    "  latest), else model.init_from, else the seed's initialisation (said so). No [train]\n"
    "  schedule keys are needed; train.seq_len defaults to model.max_seq_len, or the whole\n"
    "  validation file as one window when it is shorter.\n";

/* Splits "JOB.ini [--ckpt CKPT] [--set section.key=value ...]" (--ckpt only where ckpt is
 * not NULL); returns 0, 1 for --help, or -1 with err. */
static int parse_job_args(int argc, char **argv, const char **job, const char **ckpt,
                          int *n_sets, char ***sets, char *err, size_t errlen) {
    *job = NULL;
    *n_sets = 0;
    *sets = calloc((size_t)argc + 1, sizeof(char *));
    SHLM_CHECK_ALLOC(*sets);
    const char *usage = ckpt ? "JOB.ini [--ckpt CKPT] [--set section.key=value ...]"
                             : "JOB.ini [--set section.key=value ...]";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
        if (strcmp(argv[i], "--set") == 0 || (ckpt && strcmp(argv[i], "--ckpt") == 0)) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "%s needs an argument (usage: shardlm %s %s)", argv[i],
                         argv[0], usage);
                return -1;
            }
            if (argv[i][2] == 'c') *ckpt = argv[++i];
            else (*sets)[(*n_sets)++] = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            (*sets)[(*n_sets)++] = argv[i] + 6;
        } else if (argv[i][0] == '-') {
            snprintf(err, errlen, "unknown option '%s' (usage: shardlm %s %s)", argv[i],
                     argv[0], usage);
            return -1;
        } else if (*job) {
            snprintf(err, errlen, "more than one job file given ('%s' and '%s')", *job, argv[i]);
            return -1;
        } else {
            *job = argv[i];
        }
    }
    if (!*job) {
        snprintf(err, errlen, "no job file given (usage: shardlm %s %s)", argv[0], usage);
        return -1;
    }
    return 0;
}

static int load_forward_weights(run *r, const char *ckpt, char *what, size_t whatlen);
int run_load_weights(run *r, const char *ckpt, char *what, size_t whatlen) {
    int rc = load_forward_weights(r, ckpt, what, whatlen);
    startup_mark(STARTUP_WEIGHTS);
    startup_set_drawn(r->cfg.model.family->init_count());
    return rc;
}
static int load_forward_weights(run *r, const char *ckpt, char *what, size_t whatlen) {
    const job_config *c = &r->cfg;
    char err[1536] = "", path[2048] = "";
    if (!ckpt) {
        if (checkpoint_resolve(c->ckpt_dir, c->ckpt_resume, path, sizeof path, err, sizeof err) != 0)
            return any_rank_failed(0, err);
        if (path[0]) ckpt = path;
        else if (c->init_from[0]) ckpt = c->init_from;
    }
    if (!ckpt) {
        snprintf(what, whatlen, "freshly initialised weights (train.seed = %llu)",
                 (unsigned long long)c->seed);
        if (r->rank == 0)
            printf("note: %s: no --ckpt, checkpoint (checkpoint.resume, checkpoint.dir) or "
                   "model.init_from: the model has %s\n", c->path, what);
        startup_set_weights(STARTUP_WEIGHTS_SEED); /* run_setup deferred it */
        fsdp_init_weights(r->engine, c->seed);
        return 0;
    }
    startup_set_weights(ckpt == path ? STARTUP_WEIGHTS_RESUME : STARTUP_WEIGHTS_IMPORT);
    snprintf(what, whatlen, "%s", ckpt);
    if (checkpoint_init_from(r->engine, &r->topo, &c->model, ckpt, err, sizeof err) != 0)
        return any_rank_failed(0, err);
    return 0;
}

static int job_command(int argc, char **argv, int training) {
    /* SIGUSR1/SIGTERM: train finishes its step, saves and exits 0 (src/base/signals.h);
     * installed before MPI_Init by the CLI, again here for other callers (idempotent);
     * eval keeps the default action */
    if (training) shlm_signals_install();
    const char *job, *ckpt = NULL;
    int n_sets;
    char **sets;
    char err[1536] = "";
    int parsed = parse_job_args(argc, argv, &job, training ? NULL : &ckpt, &n_sets, &sets, err,
                                sizeof err);
    if (parsed == 1) {
        if (shlm_rank() <= 0) fputs(training ? train_usage : eval_usage, stdout);
        free(sets);
        return 0;
    }
    if (any_rank_failed(parsed == 0, err)) {
        free(sets);
        return 2;
    }
    run r;
    if (run_setup(&r, job, n_sets, sets, training) != 0) {
        free(sets);
        return 1;
    }
    free(sets);
    int rc = 0, lock_fd = -1;
    ckpt_state st;
    char what[2100];
    if (training && r.rank == 0 && !r.cfg.ckpt_dir[0])
        printf("note: checkpoint.dir is not set: the weights this run trains will not be kept "
               "(set checkpoint.dir to save them)\n");
    /* the step line, metrics.jsonl, Prometheus, telemetry, the summary: a bad log.* key is
     * refused before any weight is read */
    watch *w = NULL;
    const watch_run wr = {.cfg = &r.cfg, .ops = r.ops, .rank = r.rank, .world = r.world};
    if (training && watch_open(&w, &wr) != 0) {
        rc = 1;
    } else if (training &&
               checkpoint_dir_open(r.engine, &r.topo, &r.cfg, &r.hf, &lock_fd, err, sizeof err) != 0) {
        /* checkpoint.dir problems (lock, links, writability, space) before step 1 */
        any_rank_failed(0, err);
        rc = 1;
    } else if (training) {
        rc = load_initial(&r, &st) != 0 ? 1 : train_loop(&r, &st, w) == 0 ? 0 : 1;
        if (rc == 0 && r.rank == 0 && !r.cfg.ckpt_dir[0])
            printf("note: the trained weights were not kept: checkpoint.dir is not set\n");
    } else if (!r.have_val) {
        snprintf(err, sizeof err, "%s: eval needs [data] val", r.cfg.path);
        rc = any_rank_failed(0, err) ? 1 : 0;
    } else if (run_load_weights(&r, ckpt, what, sizeof what) != 0) {
        rc = 1;
    } else {
        double loss = NAN, scored = 0;
        if (r.rank == 0) startup_print(stdout, "the evaluation");
        if (run_validate(&r, &loss, &scored) != 0) rc = 1;
        else if (r.rank == 0)
            printf("eval: %s: %.0f tokens scored (windows of %d), mean loss %.6f nats/token, "
                   "perplexity %.4f; weights: %s\n", r.cfg.data_val, scored, r.cfg.seq_len, loss,
                   exp(loss), what);
    }
    watch_close(w);
    checkpoint_dir_close(&lock_fd);
    run_teardown(&r);
    return rc;
}

int cmd_train(int argc, char **argv) { return job_command(argc, argv, 1); }
int cmd_eval(int argc, char **argv) { return job_command(argc, argv, 0); }
