/* The set-up a job's commands share (run.h): the job, its ranks and topology, the
 * backends, the data and tokenizer, the plan and its fit check, the engine and the model. */
#include "src/run/run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/startup.h"

/* Rank 0 prints every rank's topology line, in rank order. */
static void print_topology(const run *r, const char *device) {
    enum { LINE = 256 };
    char line[LINE];
    topology_describe(&r->topo, shlm_host(), device, line, LINE);
    char *all = r->rank == 0 ? malloc((size_t)LINE * r->world) : NULL;
    if (r->rank == 0) SHLM_CHECK_ALLOC(all);
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

/* data.train's files (job_config_load checked the list), each against the model, and a
 * mixture's against each other: their ids must be of one vocabulary. */
static int open_train(run *r, char *err, size_t errlen) {
    const job_config *c = &r->cfg;
    data_mix_list *l = &r->train_list;
    char why[700];
    if (data_mix_parse(c->data_train, l, why, sizeof why) != 0) {
        snprintf(err, errlen, "[data] train: %s", why);
        return -1;
    }
    for (int i = 0; i < l->n; i++) {
        if (open_job_tokens(&r->train_tf[i], l->e[i].path, "[data] train", c, err, errlen) != 0) {
            l->n = i; /* the ones open, for run_teardown */
            return -1;
        }
        const token_file *a = &r->train_tf[0], *b = &r->train_tf[i];
        if (b->vocab_size != a->vocab_size) {
            snprintf(err, errlen, "[data] train: %.400s has a vocabulary of %u ids, %.400s of %u: "
                     "the files of a mixture must come from one tokenizer (shardlm data info "
                     "shows each file's)", a->path, a->vocab_size, b->path, b->vocab_size);
            l->n = i + 1;
            return -1;
        }
    }
    return 0;
}

static int open_data(run *r, char *err, size_t errlen, int need_train) {
    const job_config *c = &r->cfg;
    if (need_train && open_train(r, err, errlen) != 0) return -1;
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
    const size_t host = fsdp_host_bytes(r->engine); /* fsdp.offload's host memory */
    if (host != pl->host_bytes) {
        printf("plan check: rank %d: host_bytes allocated %zu bytes, the plan says %zu\n",
               r->rank, host, pl->host_bytes);
        bad++;
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (r->rank != 0) return;
    printf("memory per rank (allocated): sharded_state_bytes=%zu buffer_bytes=%zu "
           "activation_bytes=%zu\n", measured[PLAN_MASTER] + measured[PLAN_GRAD] + measured[PLAN_MOMENTS] +
           measured[PLAN_PARAM_COPY],
           measured[PLAN_GATHERED] + measured[PLAN_GRAD_BUFFERS], measured[PLAN_ACTIVATIONS]);
    printf("memory per rank by category (allocated):");
    for (int k = 0; k <= PLAN_ACTIVATIONS; k++) printf(" %s=%zu", plan_category_names[k], measured[k]);
    if (pl->offload) printf(" host_bytes=%zu", host);
    printf("\nplan check: %s (%s)\n", bad ? "allocated differs from the plan" : "allocated == plan",
           r->ops->allocated_bytes ? "the backend's count" : "bytes requested");
}

/* The plan check after training: nothing was allocated through the ops after set-up (the
 * cpu backend's count), and on a device the memory in use grew by the plan's total
 * (cudaMemGetInfo's drop: the arena, the op scratch and the library workspace). */
void run_plan_check_end(const run *r, size_t device_peak) {
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

/* The job on every rank: the ranks, the job file (the same on every rank), the collective
 * deadline, the topology, the micro-batches per step. */
static int setup_job(run *r, const char *job_path, int n_sets, char *const *sets,
                     int need_train) {
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
    return any_rank_failed(ok, err) ? -1 : 0;
}

/* The compute and comm backends, the threads of this rank. */
static int setup_backend(run *r) {
    job_config *c = &r->cfg;
    char err[1536] = "";
    int ok;
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
    ok = shlm_backend_pick(&bopt, bound_device, &r->topo, &pair, note, sizeof note, err,
                                   sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;
    r->ops = pair.ops;
    r->comm = pair.comm;
    if (r->rank == 0 && note[0]) fprintf(stderr, "shardlm: warning: %s\n", note);
    return 0;
}

/* The token files, the tokenizer and the Hugging Face files a checkpoint keeps, each
 * checked against the model before anything is allocated. */
static int setup_data(run *r, int need_train) {
    job_config *c = &r->cfg;
    char err[1536] = "";
    int ok;
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
        for (int i = 0; i < r->train_list.n; i++) {
            data_loader probe;
            ok = data_loader_init(&probe, &r->train_tf[i], c->seq_len, c->shuffle, c->seed,
                                  r->rank, r->world, c->micro_batch, err, sizeof err) == 0;
            if (ok) data_loader_free(&probe);
            if (any_rank_failed(ok, err)) return -1;
        }
    }
    if (r->have_val) {
        data_loader probe;
        ok = data_loader_init(&probe, &r->val_tf, c->seq_len, 0, c->seed, r->rank, r->world,
                              c->micro_batch, err, sizeof err) == 0;
        if (ok) data_loader_free(&probe);
        if (any_rank_failed(ok, err)) return -1;
    }
    return 0;
}

/* The host memory a rank may allocate for fsdp.offload: fit_host_memory's share of the
 * node's (avail, < 0 when unknown) and where the figure comes from. */
typedef struct host_room {
    double avail;
    char what[256];
} host_room;

/* The plan of the first of the set-up's choices that fits in `avail` bytes (< 0: unknown,
 * the first choice) and whose offloaded state fits host->avail (< 0: unknown; on the cpu
 * backend the same memory as avail, so the two are summed): a generation's held weights
 * before unit-by-unit gathers, and its rows halved down to 1 when it may have fewer. 0, or
 * -1 with the last choice's refusal in err (r->plan is that choice's). */
static int plan_that_fits(run *r, int need_train, const run_gen_request *gen,
                          const job_point *pt, int registered, double avail, const char *where,
                          const host_room *host, char *err, size_t errlen) {
    const job_config *c = &r->cfg;
    const int rows = gen ? gen->rows : 0;
    for (int hold = rows > 0 && gen->hold; hold >= 0; hold--)
        for (int n = rows;; n /= 2) {
            const job_gen g = {n, n > 0 ? gen->cap : 0, hold};
            if (r->have_plan) job_plan_free(&r->plan);
            job_plan_build(&r->plan, c, pt, r->ops->act_dtype, r->ops, !need_train, registered,
                           &g);
            r->have_plan = 1;
            const double also = r->ops->mem_info ? 0 : (double)r->plan.plan.total;
            if ((host->avail < 0 || fit_check_host(&r->plan.plan, also, host->avail, host->what,
                                                   c->path, err, errlen) == 0) &&
                (avail < 0 || fit_check_memory(&r->plan.plan, avail, where, c->path, r->world,
                                               err, errlen) == 0))
                return 0;
            if (n <= 1 || !gen->shrink) break;
        }
    return -1;
}

/* The device, the plan, the fit check, then the engine, the model and a generation's
 * generator: what the plan says, allocated once and checked against it. */
static int setup_engine(run *r, int need_train, const run_gen_request *gen) {
    job_config *c = &r->cfg;
    char err[1536] = "";
    int ok;
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
    const job_point pt = job_point_of(c, r->topo.strategy, r->topo.shard_size,
                                      r->topo.replica_size);
    const int registered = r->comm->gather_buffers_enabled && r->comm->gather_buffers_enabled();
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
    host_room host = {-1, ""};
    if (c->offload && fit_host_memory(r->local_size, &host.avail, host.what, sizeof host.what) != 0)
        host.avail = -1;
    /* the plan: what the engine, the model and the ops will allocate, built once */
    ok = plan_that_fits(r, need_train, gen, &pt, registered, avail, where, &host, err,
                        sizeof err) == 0;
    if (any_rank_failed(ok, err)) return -1;
    const shard_plan *pl = &r->plan.plan;
    r->gen_held = pl->direct || pl->p.hold || pl->p.strategy == FSDP_NO_SHARD;
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
    if (pl->p.gen_rows > 0) r->gen = model_gen_create(r->model, pl->p.gen_rows, pl->p.gen_cap);
    measured[PLAN_ACTIVATIONS] = r->ops->allocated_bytes
                                     ? r->ops->allocated_bytes() - before_model
                                     : model_activation_bytes(r->model) +
                                           (r->gen ? model_gen_bytes(r->gen) : 0);
    startup_mark(STARTUP_ALLOC);
    r->allocated_at_setup = r->ops->allocated_bytes ? r->ops->allocated_bytes() : 0;
    plan_check_setup(r, measured);
    return 0;
}

int run_setup_begin(run *r, const char *job_path, int n_sets, char *const *sets,
                    int need_train) {
    memset(r, 0, sizeof *r);
    if (setup_job(r, job_path, n_sets, sets, need_train) != 0) return -1;
    if (setup_backend(r) != 0) return -1;
    return setup_data(r, need_train);
}

int run_setup_end(run *r, int need_train, const run_gen_request *gen) {
    return setup_engine(r, need_train, gen);
}

int run_setup(run *r, const char *job_path, int n_sets, char *const *sets, int need_train) {
    if (run_setup_begin(r, job_path, n_sets, sets, need_train) != 0) return -1;
    const job_gen sample = need_train ? job_sample_gen(&r->cfg) : (job_gen){0, 0, 0};
    const run_gen_request gen = {sample.rows, 0, sample.cap, 0};
    return run_setup_end(r, need_train, &gen);
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
    model_gen_destroy(r->gen);
    model_destroy(r->model);
    fsdp_destroy(r->engine);
    if (r->have_plan) job_plan_free(&r->plan);
    topology_free(&r->topo);
    for (int i = 0; i < r->train_list.n; i++) token_file_close(&r->train_tf[i]);
    if (r->have_val) token_file_close(&r->val_tf);
    job_config_free(&r->cfg);
}

