/* The performance model: predicts one training step (time, exposed communication,
 * throughput, memory) of rank 0 of any world by running the real engine (src/engine/fsdp.c) and
 * model (src/model/decoder.c, through src/model/family.h) over the simulated backends of benchmarks/sim/ (sim.h: a virtual
 * clock, op costs from a measured op table, collective costs from a link model or
 * bench_comm curves). The step is src/run/loop.c's: zero_grad, the micro-batches (the last
 * announced), finish_grads, the loss-sum all-reduce, the optimizer step; the second of two
 * steps is reported.
 *
 * Modes (see --help): a sweep over rank or node counts for one job (default);
 * `--calibrate CSV` predicts every row of strong_scaling.sh's measurements and prints the
 * error; `--scenario h100|h200` is Llama-2 7B/13B/70B on 1-16 nodes of 8 GPUs;
 * `--measure-ops OUT` times every op a job calls, at its shapes, on the cpu backend
 * (the cpu counterpart of bench_kernels, in its output format). Every input is printed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "benchmarks/sim/sim.h"
#include "kernels/cpu/cpu.h"
#include "src/job/config.h"
#include "src/job/fit.h"
#include "src/engine/fsdp.h"
#include "src/families/families.h"
#include "src/watch/metrics.h"
#include "src/engine/topology.h"

/* ------------------------------------------------------------------ inputs */

typedef struct machine {
    int gpus_per_node;      /* ranks per node */
    sim_network net;
    const sim_op_table *table;
    shlm_dtype act;         /* the simulated backend's act dtype: cpu fp32, cuda bf16 */
    double mem_slowdown;    /* memory-bound ops' time x this (a GPU with less bandwidth
                             * than the one the table was measured on) */
    int cores, threads;     /* cpu: compute slows by ranks x threads / cores past 1 */
    double capacity_gib;    /* memory per GPU for the fit check (0: no check) */
    double overhead_gib;    /* beside what the engine and model allocate: CUDA context,
                             * NCCL buffers, op scratch */
    double peak_tflops;     /* MFU denominator (0: no MFU) */
} machine;

typedef struct job {
    char name[64];
    model_shape mc;
    int seq, micro, global;
    fsdp_strategy strategy;
    model_ac ac;
    shlm_dtype param, reduce;
    int prefetch, shard_group_size, ranks_per_node;
    int cpu; /* the job's runtime.backend is cpu */
} job;

typedef struct prediction {
    int ranks, S, R, accum;
    double step_ms, compute_ms, exposed_ms, comm_ms;
    double tokens_per_s_per_gpu, mfu, mem_gib;
    uint64_t shard_wire, replica_wire; /* bytes rank 0 sends per step */
    int fits;
} prediction;

static const char *ac_name(model_ac a) {
    return job_choice_name("fsdp.activation_checkpointing", (int)a);
}

/* --ac's word, as the job key fsdp.activation_checkpointing spells it; -1 for another */
static int ac_from_name(const char *name, model_ac *a) {
    for (int v = MODEL_AC_NONE; v <= MODEL_AC_SELECTIVE; v++)
        if (strcmp(job_choice_name("fsdp.activation_checkpointing", v), name) == 0) {
            *a = (model_ac)v;
            return 0;
        }
    return -1;
}

/* Shard and replica group sizes on `ranks` ranks, G per node, as topology_create makes
 * them. */
static void groups_of(const job *j, int ranks, int G, int *S, int *R) {
    const topology_options o = {.strategy = j->strategy, .ranks_per_node = G,
                                .shard_group_size = j->shard_group_size};
    topology_group_sizes(ranks, &o, S, R);
}

/* ------------------------------------------------------------------ one step */

/* Runs src/run/loop.c's step on the engine; the MPI reductions src/ issues itself (the norm's
 * over the shard group, the loss sums over the world) are charged as blocking. */
static void run_step(fsdp_engine *e, model *md, const job *j, int accum, int step,
                     const int32_t *tok, int S, sim_group_shape shard_g, sim_group_shape world) {
    const adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f};
    fsdp_zero_grad(e);
    fsdp_begin_pass(e, 1);
    for (int m = 0; m < accum; m++) {
        int valid = 0;
        if (m == accum - 1) fsdp_last_micro_batch(e);
        /* causal attention (no doc_mask): its cost is the table's causal rows' */
        const model_batch b = {tok, tok, NULL, j->micro, j->seq, NULL};
        model_forward_backward(md, &b, 1.0f, &valid);
    }
    fsdp_finish_grads(e);
    if (S > 1) sim_comm_blocking(SHLM_COMM_ALL_REDUCE, 8, shard_g);
    sim_comm_blocking(SHLM_COMM_ALL_REDUCE, 32, world); /* the step's four sums */
    fsdp_optimizer_step(e, 1e-4f, 1.0f, &hp, step);
    sim_comm_drain();
}

/* Predicts one step of job j on `ranks` ranks; record: collect the op shapes instead
 * (sim_ops_recorded). accum_override > 0: that many micro-batches per rank (weak
 * scaling), else the job's global batch. Returns -1 when the batch does not divide. */
static int predict(const job *j, const machine *m, int ranks, int accum_override, int record,
                   prediction *p) {
    const int G = m->gpus_per_node < ranks ? m->gpus_per_node : ranks;
    memset(p, 0, sizeof *p);
    p->ranks = ranks;
    groups_of(j, ranks, G, &p->S, &p->R);
    const int S = p->S, R = p->R;
    const int global = accum_override > 0 ? accum_override * j->micro * ranks : j->global;
    if (global % (j->micro * ranks) != 0 || global < j->micro * ranks) return -1;
    p->accum = global / (j->micro * ranks);
    /* shard groups are blocks of S consecutive ranks; replica groups take one of each */
    sim_group_shape shard_g = {S, S < G ? S : G, S < G ? G / S : 1, ranks};
    sim_group_shape replica_g = {R, S >= G ? 1 : G / S, S >= G ? G : S, ranks};
    sim_group_shape world = {ranks, G, 1, ranks};
    double slow = 1;
    if (m->cores > 0) {
        double want = (double)G * (m->threads > 0 ? m->threads : 1) / m->cores;
        if (want > 1) slow = want;
    }
    sim_compute c = {.table = m->table, .slowdown = slow, .mem_slowdown = m->mem_slowdown,
                     .record = record};
    sim_ops_setup(&c, m->act);
    sim_comm_setup(&m->net);
    MPI_Comm shard, replica;
    MPI_Comm_dup(MPI_COMM_SELF, &shard);
    MPI_Comm_dup(MPI_COMM_SELF, &replica);
    sim_comm_bind(shard, shard_g);
    sim_comm_bind(replica, replica_g);
    topology t = {.strategy = j->strategy, .world = MPI_COMM_SELF, .world_size = ranks,
                  .dp_size = ranks, .node = MPI_COMM_SELF, .n_nodes = ranks / G, .node_size = G,
                  .host_size = G, .shard = shard, .shard_size = S, .n_shard_groups = R,
                  .replica = replica, .replica_size = R};
    model_desc mdl;
    model_shape_desc_open(&mdl, &j->mc);
    shard_plan plan;
    shard_plan_build(&plan, &mdl, &(plan_params){.strategy = j->strategy, .S = S, .R = R,
                                                 .act = m->act, .param_dtype = j->param,
                                                 .reduce_dtype = j->reduce, .B = j->micro,
                                                 .T = j->seq, .ac = j->ac,
                                                 .ops = &shlm_ops_sim});
    fsdp_options fo = {.prefetch = j->prefetch, .defer_init = 1};
    fsdp_engine *e = fsdp_create(&mdl, &plan, &shlm_ops_sim, &shlm_comm_sim, &t, &fo, 0);
    const model_opts mo = {.ac = j->ac, .matmul = MODEL_MATMUL_BF16};
    model *md = model_create(&j->mc, &shlm_ops_sim, j->micro, j->seq, &mo, fsdp_param_source(e));
    int32_t *tok = calloc((size_t)j->micro * j->seq, sizeof *tok);
    if (!tok) {
        fprintf(stderr, "perf_model: error: out of memory\n");
        exit(1);
    }
    sim_clock before = {0};
    shlm_comm_stats s0[2], s1[2];
    memset(&sim_now, 0, sizeof sim_now);
    for (int step = 1; step <= 2; step++) { /* the second step is the steady one */
        before = sim_now;
        fsdp_comm_stats(e, &s0[0], &s0[1]);
        run_step(e, md, j, p->accum, step, tok, S, shard_g, world);
    }
    fsdp_comm_stats(e, &s1[0], &s1[1]);
    for (int op = 0; op < SHLM_COMM_N_OPS; op++) {
        p->shard_wire += s1[0].wire[op] - s0[0].wire[op];
        p->replica_wire += s1[1].wire[op] - s0[1].wire[op];
    }
    p->step_ms = 1e-3 * (sim_now.compute_us - before.compute_us);
    p->compute_ms = 1e-3 * (sim_now.op_us - before.op_us);
    p->exposed_ms = 1e-3 * (sim_now.blocked_us - before.blocked_us);
    p->comm_ms = 1e-3 * (sim_now.comm_us - before.comm_us);
    p->mem_gib = (double)sim_ops_peak() / 1073741824.0 + m->overhead_gib;
    p->fits = m->capacity_gib <= 0 || p->mem_gib <= m->capacity_gib;
    const double tok_step = (double)p->accum * j->micro * j->seq;
    p->tokens_per_s_per_gpu = p->step_ms > 0 ? tok_step / (1e-3 * p->step_ms) : 0;
    if (m->peak_tflops > 0)
        p->mfu = model_shape_flops_per_token(&j->mc, j->seq) * p->tokens_per_s_per_gpu / (m->peak_tflops * 1e12);
    free(tok);
    model_destroy(md);
    fsdp_destroy(e);
    shard_plan_free(&plan);
    model_desc_close(&mdl);
    MPI_Comm_free(&shard);
    MPI_Comm_free(&replica);
    return 0;
}

/* ------------------------------------------------------------------ jobs */

static int preset_job(job *j, const char *preset, int seq, int micro, int global) {
    memset(j, 0, sizeof *j);
    const model_preset *pr;
    const model_family *f = family_of_preset(preset, &pr);
    if (!f) return -1;
    j->mc.family = f;
    memcpy(model_shape_data(&j->mc), pr->shape, f->shape_size);
    snprintf(j->name, sizeof j->name, "%s", preset);
    j->seq = seq > 0 ? seq : model_shape_max_seq_len(&j->mc);
    j->micro = micro > 0 ? micro : 1;
    j->global = global;
    j->strategy = FSDP_FULL_SHARD;
    j->ac = MODEL_AC_NONE;
    j->param = SHLM_BF16;
    j->reduce = SHLM_F32;
    j->prefetch = 1;
    return 0;
}

/* Job from a job file and --set overrides, as `shardlm train` resolves it. */
static int file_job(job *j, const char *path, int n_sets, char **sets, char *err, size_t errlen) {
    job_config cfg;
    if (job_config_load(&cfg, path, n_sets, sets, err, errlen) != 0) return -1;
    memset(j, 0, sizeof *j);
    j->mc = cfg.model;
    snprintf(j->name, sizeof j->name, "%s", cfg.preset[0] ? cfg.preset : "custom");
    j->seq = cfg.seq_len;
    j->micro = cfg.micro_batch;
    j->global = cfg.global_batch;
    j->strategy = cfg.strategy;
    j->ac = cfg.activation_checkpointing;
    j->param = cfg.param_dtype;
    j->reduce = cfg.reduce_dtype;
    j->prefetch = cfg.prefetch;
    j->shard_group_size = cfg.shard_group_size;
    j->ranks_per_node = cfg.ranks_per_node;
    j->cpu = cfg.backend == SHLM_BACKEND_CPU;
    job_config_free(&cfg);
    return 0;
}

static void print_job(const job *j, const machine *m) {
    const model_family *f = j->mc.family;
    char shape[600] = "", v[64];
    for (int k = 0; k < f->n_keys; k++) {
        if (!(f->keys[k].flags & KF_LAYOUT)) continue;
        key_format(&f->keys[k], model_shape_cdata(&j->mc), v, sizeof v);
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ", %s %s", f->keys[k].key, v);
    }
    printf("# model %s (%s): %lld parameters%s; seq %d, micro-batch %d, global batch %d "
           "sequences\n", j->name, f->name, (long long)model_shape_param_count(&j->mc), shape,
           j->seq, j->micro, j->global);
    printf("# strategy %s, activation checkpointing %s, params %s, reduce %s, prefetch %s, "
           "act dtype %s\n", strategy_name(j->strategy), ac_name(j->ac), shlm_dtype_name(j->param),
           shlm_dtype_name(j->reduce), j->prefetch ? "on" : "off", shlm_dtype_name(m->act));
}

static void print_machine(const machine *m) {
    const sim_network *n = &m->net;
    printf("# ops: %s (%d rows; memory-bound ops without a row at %.0f GB/s; %.1f us floor)%s\n",
           m->table ? m->table->source : "-", m->table ? m->table->n : 0,
           m->table ? m->table->copy_gbs : 0, m->table ? m->table->launch_us : 0,
           m->mem_slowdown > 1 ? "; memory-bound ops slowed for the GPU's bandwidth" : "");
    printf("# links: in a node busbw %.0f GB/s, %.1f us per collective + %.1f us per ring step; "
           "across nodes %.0f GB/s per node (its links together), %.1f us + %.1f us per "
           "step; measured bench_comm curves replace these for the group sizes they cover\n",
           n->intra.busbw_gbs, n->intra.base_us, n->intra.hop_us, n->inter.busbw_gbs,
           n->inter.base_us, n->inter.hop_us);
    printf("# contention %.2f (share of each collective's time that also delays compute)",
           n->contention);
    if (m->gpus_per_node > 0) printf("; %d ranks per node", m->gpus_per_node);
    if (m->cores > 0) printf("; %d cores, %d thread(s) per rank", m->cores, m->threads);
    if (m->capacity_gib > 0) printf("; %.1f GiB per GPU, %.1f GiB of it for context, NCCL, scratch", m->capacity_gib, m->overhead_gib);
    printf("\n");
}

/* ------------------------------------------------------------------ sweep */

static void sweep_header(void) {
    printf("# %6s %5s %5s %5s %10s %10s %10s %10s %12s %7s %8s %4s %11s %11s\n", "ranks", "S",
           "R", "accum", "step", "compute", "comm", "exposed", "tokens/s", "MFU", "mem", "fits",
           "shard wire", "replica");
    printf("# %6s %5s %5s %5s %10s %10s %10s %10s %12s %7s %8s %4s %11s %11s\n", "", "", "", "",
           "(ms)", "(ms)", "(ms)", "(ms)", "(per GPU)", "(%)", "(GiB)", "", "(B/step)", "(B/step)");
}

static void sweep_row(const prediction *p) {
    printf("  %6d %5d %5d %5d %10.2f %10.2f %10.2f %10.2f %12.1f %7.2f %8.2f %4s %11llu %11llu\n",
           p->ranks, p->S, p->R, p->accum, p->step_ms, p->compute_ms, p->comm_ms, p->exposed_ms,
           p->tokens_per_s_per_gpu, 100 * p->mfu, p->mem_gib, p->fits ? "yes" : "no",
           (unsigned long long)p->shard_wire, (unsigned long long)p->replica_wire);
}

/* ------------------------------------------------------------------ calibration */

typedef struct point {
    int ranks, threads, cores;
    char backend[16], job[512], sets[1024];
    double step_ms, exposed_ms;
    job j;
} point;

enum { MAX_POINTS = 128 };

/* Splits one CSV line into fields (no quoting: the driver writes none). */
static int csv_fields(char *line, char **f, int max) {
    int n = 0;
    line[strcspn(line, "\r\n")] = 0;
    for (char *s = line; n < max;) {
        f[n++] = s;
        char *c = strchr(s, ',');
        if (!c) break;
        *c = 0;
        s = c + 1;
    }
    return n;
}

/* Appends the rows of one strong_scaling.sh CSV to pts; returns the new count or -1. */
static int read_csv(const char *path, point *pts, int n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "perf_model: error: cannot read %s\n", path);
        return -1;
    }
    char line[4096], hdr[4096], *fl[64];
    if (!fgets(hdr, sizeof hdr, f)) {
        fclose(f);
        return n;
    }
    int nh = csv_fields(hdr, fl, 64);
    enum { WS, ST, MS, EX, TH, CO, BE, JOB, SETS, GB, NC };
    static const char *const names[NC] = {"world_size", "strategy", "step_ms", "comm_exposed_ms",
                                          "threads", "host_cores", "backend", "job", "overrides",
                                          "global_batch"};
    int c[NC];
    for (int k = 0; k < NC; k++) {
        c[k] = -1;
        for (int i = 0; i < nh; i++)
            if (strcmp(fl[i], names[k]) == 0) c[k] = i;
    }
    if (c[WS] < 0 || c[ST] < 0 || c[MS] < 0 || c[JOB] < 0 || c[GB] < 0) {
        fprintf(stderr, "perf_model: error: %s is not a strong_scaling.sh CSV\n", path);
        fclose(f);
        return -1;
    }
    int row = 1;
    while (n < MAX_POINTS && fgets(line, sizeof line, f)) {
        row++;
        if (csv_fields(line, fl, 64) < nh) continue;
        point *p = &pts[n];
        memset(p, 0, sizeof *p);
        p->ranks = atoi(fl[c[WS]]);
        p->step_ms = atof(fl[c[MS]]);
        p->exposed_ms = c[EX] >= 0 ? atof(fl[c[EX]]) : 0;
        p->threads = c[TH] >= 0 ? atoi(fl[c[TH]]) : 0;
        p->cores = c[CO] >= 0 ? atoi(fl[c[CO]]) : 0;
        snprintf(p->backend, sizeof p->backend, "%s", c[BE] >= 0 ? fl[c[BE]] : "cuda");
        snprintf(p->job, sizeof p->job, "%s", fl[c[JOB]]);
        snprintf(p->sets, sizeof p->sets, "%s", c[SETS] >= 0 ? fl[c[SETS]] : "");
        /* the job as the run resolved it: its overrides, then the row's batch and strategy */
        char *sv[80], setbuf[1024], gb[64], st[64], err[1024];
        int ns = 0;
        snprintf(setbuf, sizeof setbuf, "%s", p->sets);
        for (char *save = NULL, *t = strtok_r(setbuf, " ", &save); t && ns < 70;
             t = strtok_r(NULL, " ", &save))
            if (strncmp(t, "train.global_batch=", 19) != 0 && strncmp(t, "fsdp.strategy=", 14) != 0)
                sv[ns++] = t;
        snprintf(gb, sizeof gb, "train.global_batch=%d", atoi(fl[c[GB]]));
        snprintf(st, sizeof st, "fsdp.strategy=%s", fl[c[ST]]);
        sv[ns++] = gb;
        sv[ns++] = st;
        if (file_job(&p->j, p->job, ns, sv, err, sizeof err) != 0) {
            fprintf(stderr, "perf_model: error: %s row %d: %s\n", path, row, err);
            fclose(f);
            return -1;
        }
        n++;
    }
    fclose(f);
    return n;
}

/* The machine of a measured row: one host (or the job's nodes), its cores shared. */
static machine point_machine(const point *p, const machine *m) {
    machine t = *m;
    t.gpus_per_node = p->j.ranks_per_node > 0 ? p->j.ranks_per_node : p->ranks;
    t.cores = strcmp(p->backend, "cpu") == 0 ? p->cores : 0;
    t.threads = p->threads > 0 ? p->threads : 1;
    t.act = strcmp(p->backend, "cpu") == 0 ? SHLM_F32 : SHLM_BF16;
    return t;
}

static int calibrate(const char *const *csv, int n_csv, const machine *m, double max_error) {
    static point pts[MAX_POINTS];
    int n = 0;
    for (int k = 0; k < n_csv; k++)
        if ((n = read_csv(csv[k], pts, n)) < 0) return 2;
    if (n == 0) {
        fprintf(stderr, "perf_model: error: no rows to predict\n");
        return 2;
    }
    printf("# shardlm perf_model: %d measured run(s), each predicted by the engine over the "
           "simulated backends (nothing fitted to them)\n", n);
    print_machine(m);
    printf("# %6s %14s %12s %10s %10s %8s %10s %10s\n", "ranks", "strategy", "model", "step",
           "step", "error", "exposed", "exposed");
    printf("# %6s %14s %12s %10s %10s %8s %10s %10s\n", "", "", "", "meas (ms)", "model (ms)",
           "(%)", "meas (ms)", "model (ms)");
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const point *p = &pts[i];
        machine t = point_machine(p, m);
        prediction q;
        if (predict(&p->j, &t, p->ranks, 0, 0, &q) != 0) {
            printf("  %6d %14s %12s  (global batch does not divide)\n", p->ranks,
                   strategy_name(p->j.strategy), p->j.name);
            continue;
        }
        double e = 100 * (q.step_ms - p->step_ms) / p->step_ms;
        if (fabs(e) > worst) worst = fabs(e);
        printf("  %6d %14s %12s %10.2f %10.2f %+8.1f %10.2f %10.2f\n", p->ranks,
               strategy_name(p->j.strategy), p->j.name, p->step_ms, q.step_ms, e, p->exposed_ms,
               q.exposed_ms);
    }
    printf("# largest step-time error: %.1f%%\n", worst);
    if (max_error > 0 && worst > max_error) {
        fprintf(stderr, "perf_model: FAILED: error %.1f%% is over --max-error %.1f%%\n", worst, max_error);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ op measurement */

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * ts.tv_sec + 1e-3 * ts.tv_nsec;
}

enum { N_BUFS = 6 };
static void *bufs[N_BUFS];
static size_t buf_bytes[N_BUFS];

/* Buffer k of the cpu backend, at least `bytes`; zeroed before each op is timed (an op's
 * time does not depend on the values but for non-finite ones, which zeros avoid). */
static void *buf(int k, size_t bytes) {
    if (buf_bytes[k] < bytes) {
        shlm_ops_cpu.free(bufs[k]);
        bufs[k] = shlm_ops_cpu.alloc(bytes);
        buf_bytes[k] = bytes;
    }
    return bufs[k];
}

/* RoPE's default frequencies (theta 10000) for heads of hd, as the model makes them */
static const shlm_rope *replay_rope(int hd) {
    static shlm_rope r;
    const shlm_rope_params p = {.type = SHLM_ROPE_DEFAULT, .theta = 10000.0};
    char why[256];
    if (r.head_dim != hd && shlm_rope_init(&r, hd, &p, why, sizeof why) != 0) {
        fprintf(stderr, "perf_model: error: %s\n", why);
        exit(1);
    }
    return &r;
}

/* One call of the op of shape s on the cpu backend (vocab V for the token ids). */
static void cpu_call(const sim_shape *s) {
    const shlm_ops *o = &shlm_ops_cpu;
    const long *d = s->d;
    const size_t f = sizeof(float);
    const int N = (int)d[0];
    switch (s->op) {
    case SIM_EMBEDDING_FWD:
        o->embedding_fwd(buf(0, N * d[1] * f), buf(1, N * sizeof(int32_t)), buf(2, d[1] * f), N, (int)d[1]);
        break;
    case SIM_EMBEDDING_BWD:
        o->embedding_bwd(buf(0, d[1] * f), buf(2, N * d[1] * f), buf(1, N * sizeof(int32_t)), N, (int)d[1]);
        break;
    case SIM_RMSNORM_FWD:
        o->rmsnorm_fwd(buf(0, N * d[1] * f), buf(1, N * f), buf(2, N * d[1] * f), buf(3, d[1] * f), N, (int)d[1], 1e-5f, NULL);
        break;
    case SIM_RMSNORM_BWD:
        o->rmsnorm_bwd(buf(0, N * d[1] * f), buf(1, d[1] * f), buf(2, N * d[1] * f), buf(3, N * d[1] * f),
                       buf(4, d[1] * f), buf(5, N * f), N, (int)d[1]);
        break;
    case SIM_MATMUL_FWD: {
        void *out = buf(0, N * d[2] * f);
        o->matmul_fwd(out, buf(1, N * d[1] * f), buf(2, d[2] * d[1] * f), N, (int)d[1], (int)d[2], d[3] ? out : NULL);
        break;
    }
    case SIM_MATMUL_BWD:
        o->matmul_bwd(d[3] & 1 ? buf(0, N * d[1] * f) : NULL, d[3] & 2 ? buf(3, d[2] * d[1] * f) : NULL,
                      buf(4, N * d[2] * f), buf(1, N * d[1] * f), buf(2, d[2] * d[1] * f), N, (int)d[1],
                      (int)d[2], SHLM_MM_SET_DINP | SHLM_MM_SET_DWEIGHT);
        break;
    case SIM_ROPE:
        o->rope(buf(0, N * d[1] * d[2] * f), N, N, (int)(d[1] * d[2]), (int)d[1], replay_rope((int)d[2]), NULL, 0);
        break;
    case SIM_ATTENTION_FWD: case SIM_ATTENTION_BWD: {
        const long B = d[0], T = d[1], nh = d[2], nkv = d[3], hd = d[4], Nt = B * T;
        const size_t qkv = Nt * (nh + 2 * nkv) * hd * f, out = Nt * nh * hd * f;
        if (s->op == SIM_ATTENTION_FWD)
            o->attention_fwd(buf(0, out), buf(1, B * nh * T * f), buf(2, qkv), NULL, (int)B, (int)T,
                             (int)nh, (int)nkv, (int)hd);
        else
            o->attention_bwd(buf(3, qkv), buf(4, out), buf(2, qkv), buf(0, out), buf(1, B * nh * T * f),
                             NULL, (int)B, (int)T, (int)nh, (int)nkv, (int)hd, d[5] ? replay_rope((int)hd) : NULL);
        break;
    }
    case SIM_SWIGLU_FWD: o->swiglu_fwd(buf(0, N * d[1] * f), buf(1, 2 * N * d[1] * f), N, (int)d[1], NULL); break;
    case SIM_SWIGLU_BWD:
        o->swiglu_bwd(buf(0, 2 * N * d[1] * f), buf(2, N * d[1] * f), buf(1, 2 * N * d[1] * f), N, (int)d[1], NULL);
        break;
    case SIM_XENT: {
        void *logits = buf(0, N * d[1] * f);
        o->xent_fwd_bwd(buf(1, N * f), logits, logits, buf(2, N * sizeof(int32_t)), N, (int)d[1], 1.0f);
        break;
    }
    case SIM_F32_TO_ACT: o->f32_to_act(buf(0, N * f), buf(1, N * f), (size_t)N); break;
    case SIM_ADAMW:
        o->adamw(buf(0, N * f), buf(1, N * f), buf(2, N * f), buf(3, N * f), (size_t)N, 1e-4f, 0.9f,
                 0.95f, 1e-8f, 0.1f, 1.0f, 1, NULL);
        break;
    case SIM_SUM_SQUARES: (void)o->sum_squares(buf(0, N * f), (size_t)N); break;
    case SIM_ACCUMULATE: o->accumulate(buf(0, N * f), buf(1, N * f), (size_t)N); break;
    case SIM_COPY: o->copy(buf(0, (size_t)N), buf(1, (size_t)N), (size_t)N); break;
    case SIM_ZERO: o->zero(buf(0, (size_t)N), (size_t)N); break;
    case SIM_ROUND_TO_BF16: o->round_to_bf16(buf(0, N * f), (size_t)N); break;
    case SIM_F32_TO_BF16: o->f32_to_bf16(buf(0, N * 2), buf(1, N * f), (size_t)N); break;
    case SIM_BF16_TO_F32: o->bf16_to_f32(buf(0, N * f), buf(1, N * 2), (size_t)N); break;
    case SIM_BIAS_ADD: o->bias_add(buf(0, N * d[1] * f), buf(1, d[1] * f), N, (int)d[1]); break;
    case SIM_BIAS_GRAD: o->bias_grad(buf(0, d[1] * f), buf(1, N * d[1] * f), N, (int)d[1], 1); break;
    default: break;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times every op shape the job calls on `ranks` (each count of the list) on the cpu
 * backend with `threads` threads: the median of at least 7 calls and 20 ms. */
static int measure_ops(const char *out_path, const job *j, const int *ranks, int n_ranks, int threads,
                       const machine *m) {
    machine rec = *m;
    rec.act = SHLM_F32;
    rec.table = NULL;
    rec.net.intra.busbw_gbs = rec.net.inter.busbw_gbs = 1; /* costs are not kept */
    for (int i = 0; i < n_ranks; i++) {
        rec.gpus_per_node = ranks[i];
        prediction p;
        predict(j, &rec, ranks[i], 0, 1, &p);
    }
    int n = 0;
    const sim_shape *shapes = sim_ops_recorded(&n);
    FILE *f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "perf_model: error: cannot write %s\n", out_path);
        return 2;
    }
    shlm_cpu_set_threads(threads);
    fprintf(f, "# perf_model --measure-ops: cpu backend, %d thread(s), the op shapes of %s (%d "
            "distinct) on", threads, j->name, n);
    for (int i = 0; i < n_ranks; i++) fprintf(f, " %d", ranks[i]);
    fprintf(f, " rank(s); median of >= 7 calls and >= 20 ms each\n");
    fprintf(f, "#  %-22s %-30s %10s %9s %9s %9s %7s\n", "op", "shape", "time(us)", "TFLOP/s", "GB/s",
            "%ceiling", "#wrong");
    for (int i = 0; i < n; i++) {
        double t[4096];
        int k = 0;
        cpu_call(&shapes[i]); /* allocates the buffers, warms the caches */
        for (int b = 0; b < N_BUFS; b++) /* zeros: token ids in range, finite values */
            if (bufs[b]) memset(bufs[b], 0, buf_bytes[b]);
        for (double t0 = now_us(), spent = 0; k < 4096 && (k < 7 || spent < 2e4); spent = now_us() - t0) {
            double a = now_us();
            cpu_call(&shapes[i]);
            t[k++] = now_us() - a;
        }
        qsort(t, (size_t)k, sizeof *t, cmp_double);
        char shape[128], name[48];
        sim_shape_format(&shapes[i], shape, sizeof shape);
        snprintf(name, sizeof name, "%s", sim_op_name(shapes[i].op));
        fprintf(f, "  %-22s %-30s %10.2f %9s %9s %9s %7d\n", name, shape, t[k / 2], "-", "-", "-", 0);
    }
    fclose(f);
    for (int k = 0; k < N_BUFS; k++) shlm_ops_cpu.free(bufs[k]);
    printf("perf_model: %d op shapes timed into %s\n", n, out_path);
    return 0;
}

/* ------------------------------------------------------------------ scenario */

/* 8-GPU nodes with 8 x 400 Gbit/s per node, NVLink inside (assumptions printed). */
static void scenario_machine(machine *m, const char *gpu) {
    m->gpus_per_node = 8;
    m->act = SHLM_BF16;
    /* NVLink: the 2-GPU NCCL reduce-scatter measured on H200 (RESULTS.md, copy-engine
     * table: 150 GB/s at 16 MiB, 273 at 1 GiB) fits 25 us + bytes / 276 GB/s; an 8-GPU
     * NVSwitch ring is taken at the same bus bandwidth (NVLink 4 on H100 and H200 alike) */
    m->net.intra = (sim_link){25, 3, 270};
    /* 8 x 400 Gbit/s = 400 GB/s per node, rings at 75% of line rate */
    m->net.inter = (sim_link){25, 12, 300};
    /* fitted: the value at which the model's 7B step ratio 2 GPUs / 1 GPU (mb 1, weak)
     * equals the measured one (RESULTS.md, the perf model's error table) */
    m->net.contention = 0.3;
    m->peak_tflops = 989;
    m->overhead_gib = 4;
    if (strcmp(gpu, "h100") == 0) {
        m->capacity_gib = 79.6;
        m->mem_slowdown = 4.8 / 3.35; /* HBM3 3.35 TB/s against the H200's 4.8 */
    } else {
        m->capacity_gib = 139.8;
        m->mem_slowdown = 1;
    }
}

static int scenario(const char *gpu, machine *m) {
    static const struct { const char *preset; int micro; } models[] = {
        {"llama2-7b", 2}, {"llama2-13b", 2}, {"llama2-70b", 1}};
    const int nodes[] = {1, 2, 4, 8, 16};
    scenario_machine(m, gpu);
    printf("# shardlm perf_model: scenario %s: Llama-2 on 1-16 nodes of 8x %s, global batch 1024 "
           "x 4096 tokens, FULL_SHARD over all GPUs, full activation checkpointing, bf16 params, "
           "fp32 reduce, prefetch on\n", gpu, strcmp(gpu, "h100") == 0 ? "H100 SXM 80 GB" : "H200 SXM 141 GB");
    print_machine(m);
    printf("# %12s %6s %6s %5s %10s %10s %12s %7s %8s %4s %11s\n", "model", "nodes", "GPUs",
           "accum", "step", "exposed", "tokens/s", "MFU", "mem", "fits", "efficiency");
    printf("# %12s %6s %6s %5s %10s %10s %12s %7s %8s %4s %11s\n", "", "", "", "", "(ms)", "(ms)",
           "(per GPU)", "(%)", "(GiB)", "", "(%)");
    for (int i = 0; i < 3; i++) {
        job j;
        preset_job(&j, models[i].preset, 4096, models[i].micro, 1024);
        j.ac = MODEL_AC_FULL;
        double base = 0;
        for (int k = 0; k < 5; k++) {
            prediction p;
            if (predict(&j, m, 8 * nodes[k], 0, 0, &p) != 0) continue;
            char eff[16] = "-";
            if (p.fits && base <= 0) base = p.tokens_per_s_per_gpu;
            if (p.fits) snprintf(eff, sizeof eff, "%.1f", 100 * p.tokens_per_s_per_gpu / base);
            printf("  %12s %6d %6d %5d %10.1f %10.2f %12.1f %7.2f %8.2f %4s %11s\n", j.name,
                   nodes[k], p.ranks, p.accum, p.step_ms, p.exposed_ms, p.tokens_per_s_per_gpu,
                   100 * p.mfu, p.mem_gib, p.fits ? "yes" : "no", eff);
        }
    }
    printf("# efficiency: tokens/s/GPU against the fewest nodes on which the job fits (strong "
           "scaling: the global batch is fixed, accumulation shrinks)\n");
    return 0;
}

/* ------------------------------------------------------------------ main */

static void usage(FILE *out) {
    fprintf(out,
            "usage: perf_model JOB MACHINE [--ranks LIST | --nodes LIST] [--weak [--accum A]]\n"
            "       perf_model --calibrate scaling.csv [...] MACHINE [--max-error PCT]\n"
            "       perf_model --scenario h100|h200 --ops TABLE\n"
            "       perf_model --measure-ops OUT JOB --ranks LIST [--threads T]\n"
            "JOB:     --job JOB.ini [--set section.key=value ...] | --model PRESET --seq T\n"
            "         --micro-batch B --global-batch G; then --strategy S --ac none|selective|full\n"
            "         --shard-group-size N --no-prefetch override\n"
            "MACHINE: --ops TABLE (bench_kernels output or --measure-ops') --backend cpu|cuda\n"
            "         --gpus-per-node G --cores C --threads T --comm-json FILE (bench_comm --json,\n"
            "         repeatable) --intra-gbs B --intra-base-us A --intra-hop-us A --inter-gbs B\n"
            "         --inter-base-us A --inter-hop-us A --contention F --mem-gib C --peak-tflops X\n");
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    char b[256];
    snprintf(b, sizeof b, "%s", s);
    for (char *save = NULL, *t = strtok_r(b, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save))
        if ((out[n++] = atoi(t)) < 1) return -1;
    return n;
}

static int fail(const char *msg) {
    fprintf(stderr, "perf_model: error: %s\n", msg);
    return 2;
}

static int run_main(int argc, char **argv) {
    const char *csv[8], *job_path = NULL, *model = NULL, *scen = NULL, *ops_path = NULL,
               *measure = NULL, *strategy = NULL, *ac = NULL, *backend = NULL;
    char *sets[64];
    int n_csv = 0, n_sets = 0, list[32], n_list = 0, per_node_list = 0, seq = 0, micro = 0,
        global = 0, weak = 0, accum = 1, no_prefetch = 0, sgs = 0;
    double max_error = 0;
    machine m = {.gpus_per_node = 0, .threads = 1, .mem_slowdown = 1,
                 .net = {.intra = {0, 0, 0}, .inter = {0, 0, 0}, .contention = 0}};
    char err[1536];
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(o, "--weak")) { weak = 1; continue; }
        if (!strcmp(o, "--no-prefetch")) { no_prefetch = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "perf_model: error: %s: unknown option or missing value (see --help)\n", o);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(o, "--job")) job_path = v;
        else if (!strcmp(o, "--set")) { if (n_sets < 64) sets[n_sets++] = (char *)v; }
        else if (!strcmp(o, "--model")) model = v;
        else if (!strcmp(o, "--calibrate")) { if (n_csv < 8) csv[n_csv++] = v; }
        else if (!strcmp(o, "--scenario")) scen = v;
        else if (!strcmp(o, "--ops")) ops_path = v;
        else if (!strcmp(o, "--measure-ops")) measure = v;
        else if (!strcmp(o, "--strategy")) strategy = v;
        else if (!strcmp(o, "--ac")) ac = v;
        else if (!strcmp(o, "--backend")) backend = v;
        else if (!strcmp(o, "--ranks") || !strcmp(o, "--nodes")) {
            per_node_list = !strcmp(o, "--nodes");
            if ((n_list = parse_list(v, list, 32)) < 1) return fail("--ranks/--nodes take a list like 1,2,4");
        } else if (!strcmp(o, "--seq")) seq = atoi(v);
        else if (!strcmp(o, "--micro-batch")) micro = atoi(v);
        else if (!strcmp(o, "--global-batch")) global = atoi(v);
        else if (!strcmp(o, "--accum")) accum = atoi(v);
        else if (!strcmp(o, "--shard-group-size")) sgs = atoi(v);
        else if (!strcmp(o, "--max-error")) max_error = atof(v);
        else if (!strcmp(o, "--gpus-per-node")) m.gpus_per_node = atoi(v);
        else if (!strcmp(o, "--cores")) m.cores = atoi(v);
        else if (!strcmp(o, "--threads")) m.threads = atoi(v);
        else if (!strcmp(o, "--intra-gbs")) m.net.intra.busbw_gbs = atof(v);
        else if (!strcmp(o, "--intra-base-us")) m.net.intra.base_us = atof(v);
        else if (!strcmp(o, "--intra-hop-us")) m.net.intra.hop_us = atof(v);
        else if (!strcmp(o, "--inter-gbs")) m.net.inter.busbw_gbs = atof(v);
        else if (!strcmp(o, "--inter-base-us")) m.net.inter.base_us = atof(v);
        else if (!strcmp(o, "--inter-hop-us")) m.net.inter.hop_us = atof(v);
        else if (!strcmp(o, "--contention")) m.net.contention = atof(v);
        else if (!strcmp(o, "--mem-gib")) m.capacity_gib = atof(v);
        else if (!strcmp(o, "--peak-tflops")) m.peak_tflops = atof(v);
        else if (!strcmp(o, "--comm-json")) {
            if (sim_comm_load_curves(v, err, sizeof err) != 0) return fail(err);
        } else {
            fprintf(stderr, "perf_model: error: unknown option %s (see --help)\n", o);
            return 2;
        }
    }
    if (m.net.contention < 0 || m.net.contention > 1) return fail("--contention is between 0 and 1");
    m.act = backend && strcmp(backend, "cpu") == 0 ? SHLM_F32 : SHLM_BF16;
    sim_op_table table;
    if (ops_path) {
        if (sim_table_load(&table, ops_path, err, sizeof err) != 0) return fail(err);
        m.table = &table;
    } else if (!measure) {
        return fail("give the op table: --ops FILE (bench_kernels' output, or --measure-ops')");
    }
    if (n_csv > 0) return calibrate(csv, n_csv, &m, max_error);
    if (scen) {
        if (strcmp(scen, "h100") != 0 && strcmp(scen, "h200") != 0)
            return fail("--scenario is h100 or h200");
        return scenario(scen, &m);
    }
    job j;
    if (job_path) {
        if (file_job(&j, job_path, n_sets, sets, err, sizeof err) != 0) return fail(err);
        if (!backend && j.cpu) m.act = SHLM_F32;
    } else if (!model || preset_job(&j, model, seq, micro, global) != 0) {
        fprintf(stderr, "perf_model: error: give --job JOB.ini or --model one of: %s\n", family_preset_names());
        return 2;
    }
    if (seq > 0) j.seq = seq;
    if (micro > 0) j.micro = micro;
    if (global > 0) j.global = global;
    if (strategy && strategy_from_name(strategy, &j.strategy, err, sizeof err) != 0) return fail(err);
    if (ac && ac_from_name(ac, &j.ac) != 0) return fail("--ac must be none, selective or full");
    if (no_prefetch) j.prefetch = 0;
    if (sgs > 0) j.shard_group_size = sgs;
    if (n_list == 0) return fail("give --ranks LIST or --nodes LIST");
    if (measure) return measure_ops(measure, &j, list, n_list, m.threads, &m);
    printf("# shardlm perf_model: %s\n", j.name);
    print_job(&j, &m);
    print_machine(&m);
    sweep_header();
    for (int i = 0; i < n_list; i++) {
        machine t = m;
        int ranks = list[i];
        if (per_node_list) ranks *= m.gpus_per_node > 0 ? m.gpus_per_node : 8;
        if (t.gpus_per_node <= 0) t.gpus_per_node = j.ranks_per_node > 0 ? j.ranks_per_node : ranks;
        prediction p;
        if (predict(&j, &t, ranks, weak ? accum : 0, 0, &p) != 0) {
            printf("  %6d  (global batch %d is not a multiple of micro-batch %d x %d ranks)\n",
                   ranks, j.global, j.micro, ranks);
            continue;
        }
        sweep_row(&p);
        if (n_list == 1) /* the line shardlm train prints, for comparison */
            printf("comm per step (rank 0, sent): shard_group_bytes=%llu replica_group_bytes=%llu\n",
                   (unsigned long long)p.shard_wire, (unsigned long long)p.replica_wire);
    }
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rc = run_main(argc, argv);
    MPI_Finalize();
    return rc;
}
