/* The FSDP engine (see fsdp.h): flat padded units, shard ranges, gathered-buffer slots
 * with prefetch, gradient reduce-scatter and replica all-reduce, AdamW on shards (on the
 * device, or offloaded to the host: offload.h). */
#include "src/engine/fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/bf16.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/rng.h"
#include "src/base/shard.h"
#include "src/base/startup.h"
#include "kernels/host_adamw.h"
#include "src/engine/adapters.h"
#include "src/engine/offload.h"

enum { N_SLOTS = PLAN_SLOTS }; /* at most two gathered units (FULL_SHARD, HYBRID_SHARD) */

typedef enum trace_kind {
    EV_GATHER_ISSUE, EV_GATHER_WAIT, EV_COMPUTE, EV_RELEASE, EV_FREE, EV_REDUCE_ISSUE,
    EV_REDUCE_DONE, EV_N
} trace_kind;
static const char *const trace_names[EV_N] = {"gather_issue", "gather_wait", "compute",
                                              "release", "free", "reduce_issue", "reduce_done"};

typedef struct trace_event {
    double t_us;
    int unit;
    trace_kind kind;
} trace_event;

/* A gathered-parameter buffer: a whole padded unit in the act dtype, base then adapters. */
typedef struct gather_slot {
    void *buf;
    shlm_comm_req *areq;  /* the adapters' gather in flight */
    int buf_from_comm;    /* buf came from comm->gather_buffer_alloc */
    uint8_t *codes;       /* plan->fp8_weights: the unit's FP8 matrices' codes, element i of
                           * the unit at byte i (max_padded bytes) */
    int codes_from_comm;
    void *rest;           /* plan->fp8_weights, S > 1: every rank's elements outside the FP8
                           * matrices (plan->fp8_rest act elements a rank), all-gathered */
    int rest_from_comm;
    shlm_comm_req *rest_req; /* its all-gather in flight: buf needs them unpacked */
    uint8_t *nf4;         /* plan->nf4_staging: an NF4 unit's gathered blocks (S of them) */
    int nf4_from_comm;
    int nf4_pending;      /* req gathers NF4 blocks into nf4: the unit's buffer needs them
                           * unpacked (finish_nf4_gather) */
    int unit;             /* unit held, -1 when free */
    shlm_comm_req *req;   /* gather in flight */
} gather_slot;

/* A full-unit gradient buffer whose reduce-scatter may be in flight. */
typedef struct grad_slot {
    float *buf;           /* (padded) fp32, the model writes the micro-batch's gradient here */
    uint16_t *bf16;       /* (padded) staging when reduce_dtype is bf16 */
    int unit;             /* -1 when free */
    int into_shard;       /* the reduction lands in the unit's grad shard itself (fresh) */
    int final;            /* the unit's last part in the step's last backward: the shard is
                           * final after it */
    int issued;           /* its reduction has been started (grad_ready) */
    shlm_comm_req *req;
} grad_slot;

/* One flat buffer of a unit (shard_plan.h plan_unit): its model tensors (the base) or its
 * adapters (LoRA). Trained: fp32 master, gradient and moments (offloaded: master and
 * moments in host memory, and store the device's copy the gather reads, in the plan's
 * offload_dtype); frozen: its values in fsdp.param_dtype (store), nothing else. */
typedef struct flat_state {
    size_t numel, padded;           /* logical and padded flat length */
    size_t begin, end, n;           /* this rank's shard [begin, end), n = end - begin */
    float *master, *grad, *m, *v;   /* (n) fp32 shards (trained) */
    void *store;                    /* (n) param_dtype shard (frozen), the offloaded master's
                                     * device copy, or with NF4 the rank's block (base_nf4.h) */
} flat_state;

typedef struct unit_state {
    flat_state base;                /* the model's tensors: trained, or frozen (LoRA) */
    flat_state adapter;             /* LoRA: the unit's adapters (numel 0: none) */
    flat_state *trained;            /* base, adapter, or NULL (nothing of it trains) */
    void *own;                      /* SHARD_GRAD_OP / NO_SHARD: the unit's own gathered buffer */
    int own_from_comm;              /* own came from comm->gather_buffer_alloc */
    int gathered;                   /* own buffer / slot holds current parameters */
    int slot;                       /* slot index holding it, -1 if none (FULL/HYBRID) */
    int grad_slot;                  /* grad slot in use this micro-batch, -1 if none */
    int grad_fresh;                 /* the grad shard holds nothing yet this step */
    int grad_parts;                 /* grad_ready calls so far this micro-batch (a tied
                                     * embedding unit has two: the head's, the lookup's) */
    shlm_comm_req *replica_req;     /* the shard's replica all-reduce, started in the backward */
    int fp8_base;                   /* index of its first FP8 matrix in the engine's scales */
    shlm_fp8_matrix fp8[MODEL_MAX_FP8_WEIGHTS]; /* its FP8 matrices while in a slot */
} unit_state;

struct fsdp_engine {
    const model_desc *md;
    const shard_plan *plan;         /* what to allocate, and the schedule */
    const plan_params *pp;          /* its dtypes and forward_only */
    const shlm_ops *ops;
    const shlm_comm *comm;
    fsdp_options opt;
    fsdp_strategy strategy;
    shlm_comm_group *shard_g, *replica_g;
    MPI_Comm shard_mpi;             /* the topology's shard communicator (not owned) */
    int S, R, shard_rank;
    size_t esz;                     /* act element size */
    unit_state *units;
    int n_units;
    int keep_gathered;              /* SHARD_GRAD_OP and NO_SHARD: per-unit buffers */
    int direct;                     /* one shard, fp32 everywhere: master is the gathered unit */
    int lora;                       /* the base is frozen, the adapters train (plan->lora) */
    shlm_dtype pdt;                 /* fsdp.param_dtype: a frozen base's store */
    int offload;                    /* plan->offload: master and moments on the host */
    shlm_dtype odt;                 /* plan->offload_dtype: the device copy's dtype */
    offload_host *off;              /* offload: the host buffers and copies */
    gather_slot slots[N_SLOTS];
    grad_slot gslots[N_SLOTS];
    int gslot_next;                 /* round-robin victim */
    int with_backward;
    int last_micro_batch;           /* the backward under way is the step's last */
    size_t measured[PLAN_N_ENGINE]; /* bytes allocated per category, as the backend counts
                                     * them (ops->allocated_bytes) where it can */
    size_t requested;               /* bytes asked for so far, registered ones included */
    uint16_t *replica_bf16;         /* staging for bf16 replica all-reduce (max shard) */
    /* plan->fp8_weights: every FP8 matrix's amax over its whole tensor (all shards) and
     * scale_inv (PLAN_FP8_SCALE_STRIDE floats apart), from the master as it is now unless
     * fp8_stale (the master changed) */
    float *fp8_amax, *fp8_scale_inv;
    int fp8_from_comm[2];
    int fp8_stale;
    int fp8_round;                  /* the gathered parameters are bf16 (rounded) */
    trace_event *trace;
    size_t n_trace, cap_trace;
    double t0;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void trace(fsdp_engine *e, int unit, trace_kind k) {
    if (!e->opt.trace) return;
    if (e->n_trace == e->cap_trace) {
        e->cap_trace = e->cap_trace ? 2 * e->cap_trace : 1024;
        e->trace = realloc(e->trace, e->cap_trace * sizeof *e->trace);
        SHLM_CHECK_ALLOC(e->trace);
    }
    e->trace[e->n_trace++] = (trace_event){1e6 * (now_s() - e->t0), unit, k};
}

/* Names a profiler range after a unit: "all-gather unit 3". */
static void range(const fsdp_engine *e, const char *what, int u) {
    if (!e->ops->range_push) return;
    char name[48];
    snprintf(name, sizeof name, "%s %d", what, u);
    e->ops->range_push(name);
}

static void *balloc(fsdp_engine *e, size_t bytes) {
    e->requested += bytes;
    return e->ops->alloc(bytes);
}

/* A buffer all-gathers land in: from the comm backend when it offers registered memory
 * (copy-engine all-gathers on NCCL), else a plain allocation. Collective over the shard
 * group: every rank allocates the same buffers in the same order. */
static void *gather_buffer_alloc(fsdp_engine *e, size_t bytes, int *from_comm) {
    *from_comm = 0;
    if (e->S > 1 && e->comm->gather_buffer_alloc) {
        void *p = e->comm->gather_buffer_alloc(e->shard_g, bytes);
        if (p) {
            e->requested += bytes;
            *from_comm = 1;
            return p;
        }
    }
    return balloc(e, bytes);
}

/* n fp32 of a trained shard's master or moment: the backend's memory, or offloaded the
 * host's. */
static float *state_alloc(fsdp_engine *e, size_t n) {
    return e->offload ? offload_alloc(e->off, n) : balloc(e, n * sizeof(float));
}

/* Bytes allocated so far: the backend's count plus what the comm backend registered,
 * or (a backend that counts nothing) what was asked for. */
typedef struct alloc_mark {
    size_t backend, requested;
} alloc_mark;

static alloc_mark mark(const fsdp_engine *e) {
    return (alloc_mark){e->ops->allocated_bytes ? e->ops->allocated_bytes() : 0, e->requested};
}

static size_t since(const fsdp_engine *e, alloc_mark m, size_t registered) {
    if (!e->ops->allocated_bytes) return e->requested - m.requested;
    return e->ops->allocated_bytes() - m.backend + registered;
}

static void registered_free(fsdp_engine *e, void *p, int from_comm) {
    if (from_comm) e->comm->registered_free(e->shard_g, p);
    else e->ops->free(p);
}

/* Waits on a request (the comm backend counts the blocked time). */
static void wait_req(fsdp_engine *e, shlm_comm_req **req) {
    if (!*req) return;
    e->comm->wait(*req);
    *req = NULL;
}

/* Whether unit u's frozen base is stored as NF4 blocks (plan->nf4). */
static int nf4_unit(const fsdp_engine *e, int u) {
    return e->plan->nf4 && e->plan->nf4[u].n_nf4 > 0;
}

/* A flat buffer of numel elements padded to `padded`, and this rank's shard of it. */
static void flat_init(const fsdp_engine *e, flat_state *f, size_t numel, size_t padded) {
    f->numel = numel;
    f->padded = padded;
    shard_range(numel, e->S, e->shard_rank, &f->begin, &f->end);
    f->n = f->end - f->begin;
}

fsdp_engine *fsdp_create(const model_desc *md, const shard_plan *plan, const shlm_ops *ops,
                         const shlm_comm *comm, const topology *topo, const fsdp_options *opt,
                         uint64_t seed) {
    if (plan->p.S != topo->shard_size || plan->p.R != topo->replica_size ||
        plan->p.strategy != topo->strategy || plan->p.act != ops->act_dtype ||
        plan->n_units != md->lay.n_units)
        SHLM_FATAL("fsdp_create: the plan (%s, S=%d, R=%d, %s) is not this run's (%s, S=%d, "
                   "R=%d, %s)", strategy_name(plan->p.strategy), plan->p.S, plan->p.R,
                   shlm_dtype_name(plan->p.act), strategy_name(topo->strategy),
                   topo->shard_size, topo->replica_size, shlm_dtype_name(ops->act_dtype));
    fsdp_engine *e = calloc(1, sizeof *e);
    SHLM_CHECK_ALLOC(e);
    e->md = md;
    e->plan = plan;
    e->pp = &plan->p;
    e->ops = ops;
    e->comm = comm;
    e->opt = *opt;
    e->strategy = topo->strategy;
    e->t0 = now_s();
    e->esz = shlm_dtype_size(ops->act_dtype);
    e->n_units = plan->n_units;
    if (opt->shard_group && opt->replica_group) {
        e->shard_g = opt->shard_group;
        e->replica_g = opt->replica_group;
    } else {
        e->shard_g = comm->group_create(topo->shard);
        e->replica_g = comm->group_create(topo->replica);
        startup_mark(STARTUP_COMM);
    }
    e->shard_mpi = topo->shard;
    e->S = topo->shard_size;
    e->R = topo->replica_size;
    e->shard_rank = topo->shard_rank;
    e->keep_gathered = plan->keep_gathered;
    e->direct = plan->direct;
    e->lora = plan->lora;
    e->pdt = plan->p.param_dtype;
    e->offload = plan->offload;
    e->odt = plan->offload_dtype;
    if (e->offload) e->off = offload_create(ops, e->odt, plan->max_shard);
    e->units = calloc((size_t)e->n_units, sizeof(unit_state));
    SHLM_CHECK_ALLOC(e->units);
    for (int u = 0; u < e->n_units; u++) {
        unit_state *s = &e->units[u];
        flat_init(e, &s->base, plan->units[u].numel, plan->units[u].padded);
        flat_init(e, &s->adapter, plan->units[u].a_numel, plan->units[u].a_padded);
        s->trained = !e->lora ? &s->base : s->adapter.numel > 0 ? &s->adapter : NULL;
        s->slot = -1;
        s->grad_slot = -1;
    }
    /* category by category, as the plan counts them */
    const int grads = !plan->p.forward_only;
    alloc_mark m0 = mark(e);
    for (int u = 0; u < e->n_units; u++)
        if (e->units[u].trained) e->units[u].trained->master = state_alloc(e, e->units[u].trained->n);
    e->measured[PLAN_MASTER] = since(e, m0, 0);
    m0 = mark(e);
    for (int u = 0; u < e->n_units && grads; u++)
        if (e->units[u].trained) e->units[u].trained->grad = balloc(e, e->units[u].trained->n * sizeof(float));
    e->measured[PLAN_GRAD] = since(e, m0, 0);
    m0 = mark(e);
    for (int u = 0; u < e->n_units && grads; u++) {
        flat_state *t = e->units[u].trained;
        if (!t) continue;
        t->m = state_alloc(e, t->n);
        t->v = state_alloc(e, t->n);
    }
    e->measured[PLAN_MOMENTS] = since(e, m0, 0);
    m0 = mark(e);
    for (int u = 0; u < e->n_units && e->lora; u++)
        e->units[u].base.store = balloc(e, nf4_unit(e, u) ? plan->nf4[u].block_bytes
                                                        : e->units[u].base.n * shlm_dtype_size(e->pdt));
    e->measured[PLAN_FROZEN] = since(e, m0, 0);
    m0 = mark(e);
    for (int u = 0; u < e->n_units && e->offload; u++)
        if (e->units[u].trained)
            e->units[u].trained->store = balloc(e, e->units[u].trained->n * shlm_dtype_size(e->odt));
    e->measured[PLAN_PARAM_COPY] = since(e, m0, 0);
    m0 = mark(e);
    size_t registered = 0;
    for (int u = 0; u < e->n_units && e->keep_gathered && !e->direct; u++) {
        unit_state *s = &e->units[u];
        const size_t bytes = (s->base.padded + s->adapter.padded) * e->esz;
        s->own = gather_buffer_alloc(e, bytes, &s->own_from_comm);
        if (s->own_from_comm) registered += bytes;
    }
    for (int k = 0; k < N_SLOTS; k++) {
        e->slots[k].unit = -1;
        e->gslots[k].unit = -1;
    }
    for (int k = 0; k < plan->gather_slots; k++) {
        e->slots[k].buf = gather_buffer_alloc(e, plan->max_padded * e->esz, &e->slots[k].buf_from_comm);
        if (e->slots[k].buf_from_comm) registered += plan->max_padded * e->esz;
    }
    for (int k = 0; k < N_SLOTS && plan->nf4_staging; k++) {
        gather_slot *g = &e->slots[k];
        g->nf4 = gather_buffer_alloc(e, plan->nf4_staging, &g->nf4_from_comm);
        if (g->nf4_from_comm) registered += plan->nf4_staging;
    }
    if (plan->fp8_weights) {
        const size_t staging = (size_t)e->S * plan->fp8_rest * e->esz;
        for (int k = 0; k < plan->gather_slots; k++) {
            gather_slot *g = &e->slots[k];
            g->codes = gather_buffer_alloc(e, plan->max_padded, &g->codes_from_comm);
            if (g->codes_from_comm) registered += plan->max_padded;
            if (!staging) continue;
            g->rest = gather_buffer_alloc(e, staging, &g->rest_from_comm);
            if (g->rest_from_comm) registered += staging;
        }
        const size_t amaxes = (size_t)plan->n_fp8 * sizeof(float);
        const size_t scales = amaxes * PLAN_FP8_SCALE_STRIDE;
        e->fp8_amax = gather_buffer_alloc(e, amaxes, &e->fp8_from_comm[0]);
        e->fp8_scale_inv = gather_buffer_alloc(e, scales, &e->fp8_from_comm[1]);
        registered += e->fp8_from_comm[0] * amaxes + e->fp8_from_comm[1] * scales;
        for (int u = 0, base = 0; u < e->n_units; u++) {
            e->units[u].fp8_base = base;
            base += md->lay.units[u].n_fp8;
        }
        e->fp8_stale = 1;
        e->fp8_round = ops->act_dtype == SHLM_BF16 || plan->p.param_dtype == SHLM_BF16;
    }
    e->measured[PLAN_GATHERED] = since(e, m0, registered);
    m0 = mark(e);
    for (int k = 0; k < plan->grad_slots; k++) {
        e->gslots[k].buf = balloc(e, plan->max_grad_padded * sizeof(float));
        if (plan->grad_staging) e->gslots[k].bf16 = balloc(e, plan->max_grad_padded * 2);
    }
    if (plan->replica_staging) e->replica_bf16 = balloc(e, plan->max_shard * 2);
    e->measured[PLAN_GRAD_BUFFERS] = since(e, m0, 0);
    e->with_backward = 1;
    if (!opt->defer_init) fsdp_init_weights(e, seed);
    return e;
}

/* Host fp32 values of a frozen flat buffer's shard into its store (param_dtype): bf16 rounds
 * to nearest even, as the gather of a trained master rounds (the same values). */
static void store_from_host(fsdp_engine *e, flat_state *f, const float *host) {
    if (e->pdt == SHLM_F32) {
        e->ops->to_device(f->store, host, f->n * sizeof(float));
        return;
    }
    uint16_t *h = malloc((f->n ? f->n : 1) * sizeof(uint16_t));
    SHLM_CHECK_ALLOC(h);
    host_bf16_copy(h, host, f->n); /* a 7B base is 6.7e9 values: SIMD on every thread */
    e->ops->to_device(f->store, h, f->n * sizeof(uint16_t));
    free(h);
}

/* A frozen flat buffer's shard as host fp32 (bf16 widened exactly). */
static void store_to_host(fsdp_engine *e, const flat_state *f, float *host) {
    if (e->pdt == SHLM_F32) {
        e->ops->to_host(host, f->store, f->n * sizeof(float));
        return;
    }
    uint16_t *h = malloc((f->n ? f->n : 1) * sizeof(uint16_t));
    SHLM_CHECK_ALLOC(h);
    e->ops->to_host(h, f->store, f->n * sizeof(uint16_t));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < f->n; i++) host[i] = shlm_bf16_to_f32(h[i]);
    free(h);
}

/* The whole unit u of an NF4 base, host fp32 (the unit's values, every rank): its block
 * made from it (base_nf4_block_make) into the store. */
static void nf4_store_from_host(fsdp_engine *e, int u, const float *host) {
    const base_nf4_unit *nu = &e->plan->nf4[u];
    uint8_t *block = malloc(nu->block_bytes);
    SHLM_CHECK_ALLOC(block);
    int bad_tensor;
    size_t bad_index;
    if (base_nf4_block_make(nu, e->shard_rank, shlm_dtype_size(e->pdt), host, block, &bad_tensor,
                            &bad_index) != 0)
        SHLM_FATAL("NF4 base: %s holds a NaN or an infinity at value %zu: nothing to quantize it "
                   "by", e->md->lay.units[u].tensors[bad_tensor].name, bad_index);
    e->ops->to_device(e->units[u].base.store, block, nu->block_bytes);
    free(block);
}

/* The elements of unit u's base that fsdp_set_base_shard takes on this rank: its shard, or
 * (NF4) the whole unit. */
static size_t base_host_numel(const fsdp_engine *e, int u) {
    return nf4_unit(e, u) ? e->units[u].base.numel : e->units[u].base.n;
}

/* A trained shard's master to and from host fp32; offloaded it is host memory, and setting
 * it refreshes the device copy. */
static void master_to_host(fsdp_engine *e, const flat_state *f, float *out) {
    if (!f->n) return;
    if (e->offload) memcpy(out, f->master, f->n * sizeof(float));
    else e->ops->to_host(out, f->master, f->n * sizeof(float));
}

static void master_from_host(fsdp_engine *e, flat_state *f, const float *in) {
    if (!f->n) return;
    if (!e->offload) {
        e->ops->to_device(f->master, in, f->n * sizeof(float));
        return;
    }
    memcpy(f->master, in, f->n * sizeof(float));
    offload_upload(e->off, f->store, f->master, f->n);
}

/* The largest shard of any flat buffer of the engine, or whole NF4 unit (host staging). */
static size_t max_flat_shard(const fsdp_engine *e) {
    size_t m = 1;
    for (int u = 0; u < e->n_units; u++) {
        if (base_host_numel(e, u) > m) m = base_host_numel(e, u);
        if (e->units[u].adapter.n > m) m = e->units[u].adapter.n;
    }
    return m;
}

void fsdp_init_weights(fsdp_engine *e, uint64_t seed) {
    float *host = malloc(max_flat_shard(e) * sizeof(float));
    SHLM_CHECK_ALLOC(host);
    for (int u = 0; u < e->n_units; u++) {
        flat_state *b = &e->units[u].base;
        if (nf4_unit(e, u)) { /* quantized from the whole unit */
            e->md->spec->init_slice(&e->md->lay, e->md->cfg, seed, u, 0, b->numel, host);
            nf4_store_from_host(e, u, host);
            e->units[u].gathered = 0;
            continue;
        }
        e->md->spec->init_slice(&e->md->lay, e->md->cfg, seed, u, b->begin, b->end, host);
        if (e->lora) store_from_host(e, b, host);
        else master_from_host(e, b, host);
        e->units[u].gathered = 0;
    }
    free(host);
    if (e->lora) fsdp_init_adapters(e, seed);
    e->fp8_stale = 1;
}

void fsdp_init_adapters(fsdp_engine *e, uint64_t seed) {
    if (!e->lora) return;
    float *host = malloc(max_flat_shard(e) * sizeof(float));
    SHLM_CHECK_ALLOC(host);
    for (int u = 0; u < e->n_units; u++) {
        flat_state *a = &e->units[u].adapter;
        if (!a->numel) continue;
        adapters_init_slice(&e->md->adapters, seed, u, a->begin, a->end, host);
        master_from_host(e, a, host);
        e->units[u].gathered = 0;
    }
    free(host);
}

static void flat_free(fsdp_engine *e, flat_state *f, int trained) {
    if (e->offload && trained) {
        offload_free(e->off, f->master);
        offload_free(e->off, f->m);
        offload_free(e->off, f->v);
    } else {
        e->ops->free(f->master);
        e->ops->free(f->m);
        e->ops->free(f->v);
    }
    e->ops->free(f->grad);
    e->ops->free(f->store);
}

void fsdp_destroy(fsdp_engine *e) {
    if (!e) return;
    for (int k = 0; k < N_SLOTS; k++) {
        wait_req(e, &e->slots[k].req);
        wait_req(e, &e->slots[k].areq);
        wait_req(e, &e->gslots[k].req);
        registered_free(e, e->slots[k].buf, e->slots[k].buf_from_comm);
        wait_req(e, &e->slots[k].rest_req);
        registered_free(e, e->slots[k].codes, e->slots[k].codes_from_comm);
        registered_free(e, e->slots[k].rest, e->slots[k].rest_from_comm);
        registered_free(e, e->slots[k].nf4, e->slots[k].nf4_from_comm);
        e->ops->free(e->gslots[k].buf);
        e->ops->free(e->gslots[k].bf16);
    }
    for (int u = 0; u < e->n_units; u++) {
        unit_state *s = &e->units[u];
        wait_req(e, &s->replica_req); /* a step abandoned midway */
        flat_free(e, &s->base, s->trained == &s->base);
        flat_free(e, &s->adapter, s->trained == &s->adapter);
        registered_free(e, s->own, s->own_from_comm);
    }
    e->ops->free(e->replica_bf16);
    registered_free(e, e->fp8_amax, e->fp8_from_comm[0]);
    registered_free(e, e->fp8_scale_inv, e->fp8_from_comm[1]);
    offload_destroy(e->off);
    e->comm->group_free(e->shard_g);
    e->comm->group_free(e->replica_g);
    free(e->units);
    free(e->trace);
    free(e);
}

/* ---------------------------------------------------------------- gathering */

/* The buffer unit u's gathered parameters live in (own buffer, slot, or the master / a
 * frozen base's store: direct, fp32, one shard). */
static void *gathered_buf(fsdp_engine *e, int u) {
    unit_state *s = &e->units[u];
    if (s->own) return s->own;
    if (s->slot >= 0) return e->slots[s->slot].buf;
    return e->lora || e->offload ? s->base.store : s->base.master;
}

/* Its gathered adapters: after the base's padded elements, or (direct) their master. */
static void *gathered_adapter(fsdp_engine *e, int u) {
    unit_state *s = &e->units[u];
    if (!s->own && s->slot < 0) return e->offload ? s->adapter.store : s->adapter.master;
    return (char *)gathered_buf(e, u) + s->base.padded * e->esz;
}

/* n master elements cast to the gathered dtype at dst (act) */
static void cast_params(fsdp_engine *e, void *dst, const float *master, size_t n) {
    if (e->ops->act_dtype == SHLM_F32) {
        e->ops->copy(dst, master, n * sizeof(float));
        if (e->pp->param_dtype == SHLM_BF16) e->ops->round_to_bf16(dst, n);
    } else {
        e->ops->f32_to_act(dst, master, n);
    }
}

/* n elements of a store in dtype dt (a frozen base's, param_dtype; an offloaded master's
 * device copy, offload_dtype) at dst in act: the values a trained master rounded to
 * param_dtype would gather as. */
static void cast_store(fsdp_engine *e, void *dst, const void *store, shlm_dtype dt, size_t n) {
    if (dt == e->ops->act_dtype) e->ops->copy(dst, store, n * e->esz);
    else if (dt == SHLM_BF16) e->ops->bf16_to_f32(dst, store, n); /* fp32 act */
    else e->ops->f32_to_act(dst, store, n);                       /* bf16 act */
}

/* The device fp32 values of a trained flat buffer's shard: its master, or offloaded its
 * device copy (fp32 where a caller needs floats: shard_plan's offload_dtype). */
static const float *trained_values(const fsdp_engine *e, const flat_state *f) {
    return e->offload ? (const float *)f->store : f->master;
}

/* A trained shard cast to the gathered dtype at dst: from the master as cast_params does,
 * or from a bf16 device copy, which holds those values already. */
static void cast_trained(fsdp_engine *e, void *dst, const flat_state *f) {
    if (e->offload && e->odt != SHLM_F32) cast_store(e, dst, f->store, e->odt, f->n);
    else cast_params(e, dst, trained_values(e, f), f->n);
}

/* The index among every unit's FP8 matrices of unit u's holding element `offset` of it,
 * or -1: the amax it adds to. */
static int fp8_index_of(const fsdp_engine *e, int u, size_t offset) {
    const model_unit *lu = &e->md->lay.units[u];
    for (int k = 0; e->plan->fp8_weights && k < lu->n_fp8; k++)
        if (offset >= lu->fp8[k].offset &&
            offset < lu->fp8[k].offset + (size_t)lu->fp8[k].rows * lu->fp8[k].cols)
            return e->units[u].fp8_base + k;
    return -1;
}

static float *fp8_amax_of(fsdp_engine *e, int u, size_t offset) {
    const int k = fp8_index_of(e, u, offset);
    return k >= 0 ? &e->fp8_amax[k] : NULL;
}

/* From the amaxes of this rank's parts of every FP8 matrix: the largest over the shard
 * group (one all-reduce for all of them) and each scale_inv. */
static void fp8_finish_scales(fsdp_engine *e) {
    const int n = e->plan->n_fp8;
    if (e->S > 1) { /* a host vector over MPI, once per step: the amaxes are exact maxima */
        float *h = malloc((size_t)n * sizeof(float));
        SHLM_CHECK_ALLOC(h);
        e->ops->to_host(h, e->fp8_amax, (size_t)n * sizeof(float));
        MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, h, n, MPI_FLOAT, MPI_MAX, e->shard_mpi));
        e->ops->to_device(e->fp8_amax, h, (size_t)n * sizeof(float));
        free(h);
    }
    for (int i = 0; i < n; i++)
        e->ops->fp8_param_scale(&e->fp8_scale_inv[i * PLAN_FP8_SCALE_STRIDE], &e->fp8_amax[i],
                                e->fp8_round);
    e->fp8_stale = 0;
}

/* Where this rank's shard of unit u meets the unit's FP8 matrix k (0: nowhere). */
static size_t fp8_part(const fsdp_engine *e, int u, int k, shard_overlap *ov) {
    const flat_state *s = &e->units[u].base;
    const model_fp8_weight *w = &e->md->lay.units[u].fp8[k];
    return shard_intersect(s->begin, s->end, w->offset, (size_t)w->rows * w->cols, ov);
}

/* Every FP8 matrix's amax and scale_inv from the master as it is (after a load or an
 * initialisation; the optimizer step makes them as it writes the master). */
static void fp8_refresh_scales(fsdp_engine *e) {
    e->ops->zero(e->fp8_amax, (size_t)e->plan->n_fp8 * sizeof(float));
    for (int u = 0; u < e->n_units; u++) {
        const unit_state *s = &e->units[u];
        shard_overlap ov;
        for (int k = 0; k < e->md->lay.units[u].n_fp8; k++)
            if (fp8_part(e, u, k, &ov))
                e->ops->fp8_param_amax(&e->fp8_amax[s->fp8_base + k],
                                       trained_values(e, &s->base) + ov.shard_offset, ov.count);
    }
    fp8_finish_scales(e);
}

/* This rank's shard of unit u into the gathered buffers: its FP8 matrices' elements as
 * codes at their offsets of `codes`, the rest cast to act at theirs of buf. */
static void cast_shard_fp8(fsdp_engine *e, int u, void *buf, uint8_t *codes) {
    const unit_state *us = &e->units[u];
    const flat_state *s = &us->base;
    const model_unit *lu = &e->md->lay.units[u];
    shard_overlap ov;
    for (int k = 0; k < lu->n_fp8; k++)
        if (fp8_part(e, u, k, &ov))
            e->ops->fp8_param_cast(codes + ov.flat_offset, trained_values(e, s) + ov.shard_offset, ov.count,
                                   &e->fp8_amax[us->fp8_base + k], e->fp8_round);
    plan_piece pc[PLAN_MAX_REST_PIECES];
    const int n = shard_plan_rest_pieces(lu, s->begin, s->end, pc);
    for (int i = 0; i < n; i++)
        cast_params(e, (char *)buf + pc[i].offset * e->esz,
                    trained_values(e, s) + (pc[i].offset - s->begin), pc[i].count);
}

/* Copies shard group rank r's elements of unit u outside its FP8 matrices between buf (at
 * their offsets) and the staging (packed, at rank r's plan->fp8_rest elements): to_staging
 * packs, else unpacks. */
static void move_rest(fsdp_engine *e, int u, int r, void *buf, void *staging, int to_staging) {
    size_t begin, end, at = (size_t)r * e->plan->fp8_rest;
    shard_range(e->units[u].base.numel, e->S, r, &begin, &end);
    plan_piece pc[PLAN_MAX_REST_PIECES];
    const int n = shard_plan_rest_pieces(&e->md->lay.units[u], begin, end, pc);
    for (int i = 0; i < n; i++) {
        char *b = (char *)buf + pc[i].offset * e->esz, *st = (char *)staging + at * e->esz;
        e->ops->copy(to_staging ? st : b, to_staging ? b : st, pc[i].count * e->esz);
        at += pc[i].count;
    }
}

/* Rank r's NF4 block of unit u (backend memory) into the unit's gathered buffer buf (act):
 * the rest cast from param_dtype, the matrices dequantized (with bf16 param_dtype on an fp32
 * act rounded to bf16: what a bf16 gather gives). */
static void unpack_nf4(fsdp_engine *e, int u, int r, uint8_t *block, void *buf) {
    base_nf4_piece pc[BASE_NF4_MAX_PIECES];
    const int n = base_nf4_pieces(&e->plan->nf4[u], r, shlm_dtype_size(e->pdt), block, pc);
    for (int i = 0; i < n; i++) {
        char *dst = (char *)buf + pc[i].dst * e->esz;
        if (!pc[i].q.n) {
            cast_store(e, dst, block + pc[i].src, e->pdt, pc[i].count);
            continue;
        }
        e->ops->nf4_dequantize(dst, &pc[i].q, 0, pc[i].q.n);
        if (e->ops->act_dtype == SHLM_F32 && e->pdt == SHLM_BF16)
            e->ops->round_to_bf16((float *)(void *)dst, pc[i].q.n);
    }
}

/* After slot g's all-gather of an NF4 unit's blocks: every rank's unpacked into the unit's
 * buffer. */
static void finish_nf4_gather(fsdp_engine *e, gather_slot *g) {
    if (!g->nf4_pending) return;
    g->nf4_pending = 0;
    const size_t bytes = e->plan->nf4[g->unit].block_bytes;
    for (int r = 0; r < e->S; r++) unpack_nf4(e, g->unit, r, g->nf4 + (size_t)r * bytes, gathered_buf(e, g->unit));
}

/* After slot g's all-gathers: the other ranks' rest unpacked into its buffer. */
static void finish_fp8_gather(fsdp_engine *e, gather_slot *g) {
    if (!g->rest_req) return;
    wait_req(e, &g->rest_req);
    for (int r = 0; r < e->S; r++)
        if (r != e->shard_rank) move_rest(e, g->unit, r, g->buf, g->rest, 0);
}

/* Writes this rank's shard, cast to the gathered dtype (and FP8 codes, plan->fp8_weights),
 * at its offset of buf and starts the all-gather of the rest (nothing to gather when
 * S == 1); with adapters, their shard at theirs after the base's padded elements and its
 * all-gather (*areq). */
static shlm_comm_req *start_gather(fsdp_engine *e, int u, void *buf, gather_slot *g,
                                   shlm_comm_req **areq) {
    flat_state *s = &e->units[u].base, *a = &e->units[u].adapter;
    void *abuf = (char *)buf + s->padded * e->esz;
    const int fp8 = g && g->codes && e->md->lay.units[u].n_fp8 > 0;
    if (fp8) {
        if (e->fp8_stale) fp8_refresh_scales(e);
        cast_shard_fp8(e, u, buf, g->codes);
    } else if (nf4_unit(e, u)) { /* S == 1: the block unpacks at once */
        if (e->S == 1) unpack_nf4(e, u, 0, s->store, buf);
    } else if (e->lora) {
        cast_store(e, (char *)buf + s->begin * e->esz, s->store, e->pdt, s->n);
    } else {
        cast_trained(e, (char *)buf + s->begin * e->esz, s);
    }
    if (a->numel) cast_trained(e, (char *)abuf + a->begin * e->esz, a);
    trace(e, u, EV_GATHER_ISSUE);
    if (e->S == 1) return NULL;
    range(e, "all-gather unit", u);
    if (a->numel) *areq = e->comm->iall_gather(e->shard_g, NULL, abuf, a->n, e->ops->act_dtype);
    shlm_comm_req *req;
    if (fp8) { /* the codes, a byte an element (n is even: SHARD_ALIGN_ELEMS), and the rest */
        req = e->comm->iall_gather(e->shard_g, NULL, g->codes, s->n / 2, SHLM_BF16);
        if (e->plan->fp8_rest) {
            move_rest(e, u, e->shard_rank, buf, g->rest, 1);
            g->rest_req = e->comm->iall_gather(e->shard_g, NULL, g->rest, e->plan->fp8_rest,
                                               e->ops->act_dtype);
        }
    } else if (nf4_unit(e, u)) { /* the blocks, as bytes (block_bytes is a multiple of 4) */
        const size_t bytes = e->plan->nf4[u].block_bytes;
        e->ops->copy(g->nf4 + (size_t)e->shard_rank * bytes, s->store, bytes);
        req = e->comm->iall_gather(e->shard_g, NULL, g->nf4, bytes / 2, SHLM_BF16);
        g->nf4_pending = 1;
    } else {
        req = e->comm->iall_gather(e->shard_g, NULL, buf, s->n, e->ops->act_dtype);
    }
    shlm_range_pop(e->ops);
    return req;
}

static int free_slot(fsdp_engine *e) {
    for (int k = 0; k < N_SLOTS; k++)
        if (e->slots[k].unit < 0) return k;
    return -1;
}

/* Issues unit u's gather if it is neither gathered nor in flight and a buffer is free. */
static void issue_gather(fsdp_engine *e, int u) {
    unit_state *s = &e->units[u];
    if (u < 0 || u >= e->n_units || s->gathered || s->slot >= 0) return;
    if (s->own) {
        /* per-unit buffers (SHARD_GRAD_OP, NO_SHARD): reuse the slot's request field */
        int k = free_slot(e);
        if (k < 0) return;
        e->slots[k].unit = u;
        s->slot = k;
        e->slots[k].req = start_gather(e, u, s->own, &e->slots[k], &e->slots[k].areq);
        return;
    }
    int k = free_slot(e);
    if (k < 0) return;
    gather_slot *g = &e->slots[k];
    g->unit = u;
    s->slot = k;
    const model_unit *lu = &e->md->lay.units[u];
    for (int j = 0; g->codes && j < lu->n_fp8; j++) {
        const model_fp8_weight *w = &lu->fp8[j];
        float *scale_inv = &e->fp8_scale_inv[(s->fp8_base + j) * PLAN_FP8_SCALE_STRIDE];
        s->fp8[j] = (shlm_fp8_matrix){g->codes + w->offset, scale_inv,
                                      w->rows, w->cols, SHLM_FP8_E4M3, SHLM_FP8_TENSORWISE};
    }
    g->req = start_gather(e, u, g->buf, g, &g->areq);
}

/* The unit the model will ask for after (u, phase) in this pass, or -1 (the plan's
 * schedule). */
static int next_unit(const fsdp_engine *e, int u, model_phase phase) {
    return shard_plan_next(e->plan, e->with_backward, u, phase);
}

/* Waits for every gather in flight and drops what the slots hold (a pass abandoned midway,
 * or a walk over the units outside a pass that left a prefetch behind). */
static void drop_slots(fsdp_engine *e) {
    for (int k = 0; k < N_SLOTS; k++) {
        gather_slot *g = &e->slots[k];
        wait_req(e, &g->req);
        wait_req(e, &g->areq);
        wait_req(e, &g->rest_req);
        g->nf4_pending = 0;
        if (g->unit >= 0) {
            e->units[g->unit].slot = -1;
            e->units[g->unit].gathered = 0;
        }
        g->unit = -1;
    }
}

static const void *src_acquire(void *ctx, int u, model_phase phase) {
    fsdp_engine *e = ctx;
    unit_state *s = &e->units[u];
    if (e->direct) {
        trace(e, u, EV_COMPUTE);
        return gathered_buf(e, u);
    }
    if (!s->gathered) {
        if (s->slot < 0) issue_gather(e, u);
        if (s->slot < 0) {
            /* both slots busy with units other than the one asked for: a pass was
             * abandoned midway; drop what is gathered */
            drop_slots(e);
            issue_gather(e, u);
        }
        if (s->slot >= 0) {
            range(e, "wait gather unit", u);
            wait_req(e, &e->slots[s->slot].req);
            wait_req(e, &e->slots[s->slot].areq);
            finish_fp8_gather(e, &e->slots[s->slot]);
            finish_nf4_gather(e, &e->slots[s->slot]);
            shlm_range_pop(e->ops);
            if (s->own) { /* own buffer: the slot only carried the request */
                e->slots[s->slot].unit = -1;
                s->slot = -1;
            }
        }
        s->gathered = 1;
        trace(e, u, EV_GATHER_WAIT);
    }
    if (e->opt.prefetch) issue_gather(e, next_unit(e, u, phase));
    trace(e, u, EV_COMPUTE);
    return gathered_buf(e, u);
}

static void src_release(void *ctx, int u, model_phase phase) {
    fsdp_engine *e = ctx;
    unit_state *s = &e->units[u];
    trace(e, u, EV_RELEASE);
    /* NO_SHARD keeps every unit; SHARD_GRAD_OP keeps a unit from a forward use to its next
     * use in the pass (own buffers: keeping costs no memory and saves a gather) */
    if (shard_plan_keeps(e->plan, e->with_backward, u, phase) || e->direct) return;
    s->gathered = 0;
    if (s->slot >= 0) {
        e->slots[s->slot].unit = -1;
        s->slot = -1;
    }
    trace(e, u, EV_FREE);
    /* the freed slot can take the prefetch that found none free */
    if (e->opt.prefetch) issue_gather(e, next_unit(e, u, phase));
}

/* ---------------------------------------------------------------- gradients */

/* On the step's last micro-batch a unit's shard is final once its own reduction is in:
 * its all-reduce across replicas (HYBRID_SHARD, NO_SHARD) starts right away and overlaps
 * the rest of the backward instead of waiting for the end of the step. fp32 only: a bf16
 * reduction goes through the one staging buffer at the end of the step. */
static void start_replica_reduce(fsdp_engine *e, unit_state *us) {
    if (e->R == 1 || !e->last_micro_batch || e->pp->reduce_dtype != SHLM_F32 || us->replica_req)
        return;
    const flat_state *s = us->trained;
    us->replica_req = e->comm->iall_reduce(e->replica_g, NULL, s->grad, s->n, SHLM_F32,
                                           SHLM_COMM_AVG);
}

/* Adds the reduced slice of grad slot k into its unit's gradient shard, frees it. */
static void complete_grad_slot(fsdp_engine *e, int k) {
    grad_slot *g = &e->gslots[k];
    if (g->unit < 0) return;
    wait_req(e, &g->req);
    unit_state *us = &e->units[g->unit];
    flat_state *s = us->trained;
    if (e->pp->reduce_dtype == SHLM_BF16) {
        /* widen the bf16 result: straight into a fresh shard, else into the fp32
         * buffer's slice and accumulate */
        if (g->into_shard) {
            e->ops->bf16_to_f32(s->grad, g->bf16 + s->begin, s->n);
        } else {
            e->ops->bf16_to_f32(g->buf + s->begin, g->bf16 + s->begin, s->n);
            e->ops->accumulate(s->grad, g->buf + s->begin, s->n);
        }
    } else if (!g->into_shard) {
        e->ops->accumulate(s->grad, g->buf + s->begin, s->n);
    }
    trace(e, g->unit, EV_REDUCE_DONE);
    us->grad_slot = -1;
    g->unit = -1;
    /* a slot of an earlier micro-batch completed during the last one is not final */
    if (g->final) start_replica_reduce(e, us);
}

/* The padding past the flat buffer's last tensor, which the model never writes: zero, so
 * the reduced padding (and the gradient norm over the shard) stays zero. */
static void zero_padding(fsdp_engine *e, const flat_state *s, float *buf) {
    if (s->padded > s->numel) e->ops->zero(buf + s->numel, (s->padded - s->numel) * sizeof(float));
}

static float *src_grad(void *ctx, int u, int *overwrite) {
    fsdp_engine *e = ctx;
    unit_state *s = &e->units[u];
    if (e->pp->forward_only) SHLM_FATAL("a backward pass on an engine made forward-only");
    if (!s->trained) SHLM_FATAL("a gradient of unit %d, which has nothing to train", u);
    if (e->S == 1) { /* nothing to scatter: the shard is the whole unit */
        *overwrite = s->grad_fresh;
        if (s->grad_fresh) zero_padding(e, s->trained, s->trained->grad);
        s->grad_fresh = 0;
        return s->trained->grad;
    }
    /* a slot holds one micro-batch's gradient (or one part of a tied unit's): the model
     * writes it, never adds to it */
    *overwrite = 1;
    if (s->grad_slot >= 0) {
        if (!e->gslots[s->grad_slot].issued) return e->gslots[s->grad_slot].buf;
        complete_grad_slot(e, s->grad_slot); /* the unit's earlier part, still in flight */
    }
    int k = -1;
    for (int i = 0; i < N_SLOTS; i++)
        if (e->gslots[i].unit < 0) k = i;
    if (k < 0) { /* both in flight: finish the older one */
        k = e->gslot_next;
        complete_grad_slot(e, k);
    }
    e->gslot_next = (k + 1) % N_SLOTS;
    grad_slot *g = &e->gslots[k];
    g->unit = u;
    g->issued = 0;
    s->grad_slot = k;
    zero_padding(e, s->trained, g->buf);
    return g->buf;
}

static void src_grad_ready(void *ctx, int u) {
    fsdp_engine *e = ctx;
    unit_state *us = &e->units[u];
    /* the unit's gradient is complete for this micro-batch after its last part */
    const int last_part = ++us->grad_parts >= model_desc_trained(e->md)->units[u].grad_writes;
    if (last_part) us->grad_parts = 0;
    if (e->S == 1) { /* the model wrote the shard itself */
        if (last_part) start_replica_reduce(e, us);
        return;
    }
    if (us->grad_slot < 0) return;
    flat_state *s = us->trained;
    grad_slot *g = &e->gslots[us->grad_slot];
    trace(e, u, EV_REDUCE_ISSUE);
    range(e, "reduce-scatter unit", u);
    /* the first micro-batch of a step reduces straight into the shard (no accumulate
     * pass, no zeroing); later ones in place, the rank's slice at its own offset */
    g->into_shard = us->grad_fresh;
    g->final = e->last_micro_batch && last_part;
    g->issued = 1;
    us->grad_fresh = 0;
    if (e->pp->reduce_dtype == SHLM_BF16) {
        e->ops->f32_to_bf16(g->bf16, g->buf, s->padded);
        g->req = e->comm->ireduce_scatter(e->shard_g, g->bf16, g->bf16 + s->begin, s->n,
                                          SHLM_BF16, SHLM_COMM_AVG);
    } else {
        g->req = e->comm->ireduce_scatter(e->shard_g, g->buf,
                                          g->into_shard ? s->grad : g->buf + s->begin, s->n,
                                          SHLM_F32, SHLM_COMM_AVG);
    }
    shlm_range_pop(e->ops);
}

static void src_progress(void *ctx) {
    fsdp_engine *e = ctx;
    e->comm->progress();
}

static const void *src_adapter(void *ctx, int u) {
    fsdp_engine *e = ctx;
    return e->units[u].adapter.numel ? gathered_adapter(e, u) : NULL;
}

static const shlm_fp8_matrix *src_fp8_weight(void *ctx, int u, int k) {
    fsdp_engine *e = ctx;
    if (!e->plan->fp8_weights || k >= e->md->lay.units[u].n_fp8) return NULL;
    return &e->units[u].fp8[k];
}

static int src_held(void *ctx) {
    const fsdp_engine *e = ctx;
    if (e->direct) return 1;
    if (!e->pp->hold) return 0;
    for (int u = 0; u < e->n_units; u++)
        if (!e->units[u].gathered || e->units[u].slot >= 0) return 0;
    return 1;
}

model_param_source fsdp_param_source(fsdp_engine *e) {
    return (model_param_source){.ctx = e, .acquire = src_acquire, .release = src_release,
                                .adapter = e->lora ? src_adapter : NULL, .grad = src_grad,
                                .grad_ready = src_grad_ready, .progress = src_progress,
                                .held = src_held, .fp8_weight = src_fp8_weight};
}

void fsdp_begin_pass(fsdp_engine *e, int with_backward) { e->with_backward = with_backward; }

void fsdp_last_micro_batch(fsdp_engine *e) { e->last_micro_batch = 1; }

/* Nothing is zeroed here: the step's first micro-batch overwrites each shard (the
 * model writes instead of adding, the reduce-scatter lands in the shard). */
void fsdp_zero_grad(fsdp_engine *e) {
    for (int u = 0; u < e->n_units; u++) e->units[u].grad_fresh = 1, e->units[u].grad_parts = 0;
    e->last_micro_batch = 0;
}

double fsdp_finish_grads(fsdp_engine *e) {
    shlm_range_push(e->ops, "finish gradients");
    for (int k = 0; k < N_SLOTS; k++) complete_grad_slot(e, k);
    /* a unit no micro-batch reached this step (none does in training) has a zero gradient */
    for (int u = 0; u < e->n_units; u++)
        if (e->units[u].grad_fresh && e->units[u].trained) {
            e->ops->zero(e->units[u].trained->grad, e->units[u].trained->n * sizeof(float));
            e->units[u].grad_fresh = 0;
        }
    if (e->R > 1) {
        /* replicas hold the same shard position: average their shards. In bf16 the
         * shards go one at a time through the staging buffer. */
        shlm_comm_req **reqs = calloc((size_t)e->n_units, sizeof *reqs);
        SHLM_CHECK_ALLOC(reqs);
        for (int u = 0; u < e->n_units; u++) {
            unit_state *us = &e->units[u];
            const flat_state *s = us->trained;
            if (!s) continue;
            if (us->replica_req) { /* started during the backward */
                reqs[u] = us->replica_req;
                us->replica_req = NULL;
            } else if (e->pp->reduce_dtype == SHLM_BF16) {
                e->ops->f32_to_bf16(e->replica_bf16, s->grad, s->n);
                e->comm->all_reduce(e->replica_g, NULL, e->replica_bf16, s->n, SHLM_BF16,
                                    SHLM_COMM_AVG);
                e->ops->bf16_to_f32(s->grad, e->replica_bf16, s->n);
            } else {
                reqs[u] = e->comm->iall_reduce(e->replica_g, NULL, s->grad, s->n, SHLM_F32,
                                               SHLM_COMM_AVG);
            }
        }
        for (int u = 0; u < e->n_units; u++) wait_req(e, &reqs[u]);
        free(reqs);
    }
    /* every replica now holds the same shard: count each shard once (shard group) */
    double sq = 0;
    for (int u = 0; u < e->n_units; u++)
        if (e->units[u].trained) sq += e->ops->sum_squares(e->units[u].trained->grad, e->units[u].trained->n);
    /* a host double over MPI whatever the comm backend: exact to the last bits */
    if (e->S > 1)
        MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, e->shard_mpi));
    shlm_range_pop(e->ops);
    return sqrt(sq);
}

/* The next unit after u with a trained shard, or -1. */
static int next_trained(const fsdp_engine *e, int u) {
    for (u++; u < e->n_units; u++)
        if (e->units[u].trained) return u;
    return -1;
}

/* fsdp.offload: the step on the host after the backward's last reduction (the global norm,
 * so the clipping factor, is known), unit by unit: each unit's gradient shard comes over
 * while the unit before is updated, and each unit's device copy goes back while the next
 * is updated (the next forward's gathers wait for it on the device).
 * The AdamW is the cpu backend's own function, tensor by tensor as the device path splits
 * it: the same bits. */
static void offload_optimizer_step(fsdp_engine *e, float lr, float grad_scale,
                                   const adamw_hparams *h, int step) {
    const model_layout *tl = model_desc_trained(e->md);
    float *amax = NULL; /* the FP8 matrices' amaxes, made on the host as the master changes */
    if (e->plan->fp8_weights) {
        amax = calloc((size_t)e->plan->n_fp8, sizeof(float));
        SHLM_CHECK_ALLOC(amax);
    }
    int next = next_trained(e, -1);
    if (next >= 0) offload_grad_queue(e->off, e->units[next].trained->grad, e->units[next].trained->n);
    for (int u = next; u >= 0; u = next) {
        flat_state *s = e->units[u].trained;
        const float *g = offload_grad_take(e->off);
        next = next_trained(e, u);
        if (next >= 0)
            offload_grad_queue(e->off, e->units[next].trained->grad, e->units[next].trained->n);
        const model_unit *lu = &tl->units[u];
        /* the bf16 copy written by the update, tensor by tensor in the shard's order, and
         * rounded from the master between tensors (the shard's padding) */
        uint16_t *copy = offload_upload_staging(e->off);
        size_t done = 0;
        for (int k = 0; k < lu->n_tensors; k++) {
            const model_tensor *t = &lu->tensors[k];
            shard_overlap ov;
            if (!shard_intersect(s->begin, s->end, t->offset, t->numel, &ov)) continue;
            const size_t o = ov.shard_offset;
            if (o < done) SHLM_FATAL("offload: unit %d's tensors overlap or are out of order", u);
            if (copy && o > done) host_bf16_copy(copy + done, s->master + done, o - done);
            const int a = e->lora ? -1 : fp8_index_of(e, u, t->offset);
            host_adamw(s->master + o, g + o, s->m + o, s->v + o, ov.count, lr, h->beta1,
                       h->beta2, h->eps, t->weight_decay ? h->weight_decay : 0.0f, grad_scale,
                       step, a >= 0 ? &amax[a] : NULL, copy ? copy + o : NULL);
            done = o + ov.count;
        }
        if (copy && s->n > done) host_bf16_copy(copy + done, s->master + done, s->n - done);
        offload_upload_queue(e->off, s->store, s->master, s->n);
    }
    if (amax) e->ops->to_device(e->fp8_amax, amax, (size_t)e->plan->n_fp8 * sizeof(float));
    free(amax);
}

void fsdp_optimizer_step(fsdp_engine *e, float lr, float grad_scale, const adamw_hparams *h,
                         int step) {
    shlm_range_push(e->ops, "optimizer");
    /* the FP8 matrices' amaxes come out of the step that writes them */
    if (e->plan->fp8_weights) e->ops->zero(e->fp8_amax, (size_t)e->plan->n_fp8 * sizeof(float));
    if (e->offload) offload_optimizer_step(e, lr, grad_scale, h, step);
    const model_layout *tl = model_desc_trained(e->md);
    for (int u = 0; u < e->n_units; u++) {
        unit_state *us = &e->units[u];
        const flat_state *s = us->trained;
        const model_unit *lu = &tl->units[u];
        for (int k = 0; s && !e->offload && k < lu->n_tensors; k++) {
            const model_tensor *t = &lu->tensors[k];
            shard_overlap ov;
            if (!shard_intersect(s->begin, s->end, t->offset, t->numel, &ov)) continue;
            size_t o = ov.shard_offset;
            e->ops->adamw(s->master + o, s->grad + o, s->m + o, s->v + o, ov.count, lr,
                          h->beta1, h->beta2, h->eps, t->weight_decay ? h->weight_decay : 0.0f,
                          grad_scale, step, e->lora ? NULL : fp8_amax_of(e, u, t->offset));
        }
        /* gathered copies are stale now */
        if (us->own || us->slot >= 0) us->gathered = 0;
    }
    if (e->plan->fp8_weights) fp8_finish_scales(e);
    shlm_range_pop(e->ops);
}

void fsdp_measured_bytes(const fsdp_engine *e, size_t out[PLAN_N_ENGINE]) {
    memcpy(out, e->measured, sizeof e->measured);
}

size_t fsdp_host_bytes(const fsdp_engine *e) { return e->off ? offload_host_bytes(e->off) : 0; }


void fsdp_comm_stats(const fsdp_engine *e, shlm_comm_stats *shard, shlm_comm_stats *replica) {
    e->comm->stats(e->shard_g, shard);
    e->comm->stats(e->replica_g, replica);
}

void fsdp_shard_range(const fsdp_engine *e, int u, size_t *begin, size_t *end) {
    const flat_state *t = e->units[u].trained;
    *begin = t ? t->begin : 0;
    *end = t ? t->end : 0;
}

static float *state_ptr(fsdp_engine *e, int u, fsdp_state_kind kind) {
    flat_state *s = e->units[u].trained;
    if (kind != FSDP_STATE_MASTER && e->pp->forward_only)
        SHLM_FATAL("the AdamW moments of an engine made forward-only");
    if (!s) return NULL;
    return kind == FSDP_STATE_EXP_AVG ? s->m : kind == FSDP_STATE_EXP_AVG_SQ ? s->v : s->master;
}

void fsdp_get_state(fsdp_engine *e, int u, fsdp_state_kind kind, float *out) {
    const flat_state *s = e->units[u].trained;
    if (!s || !s->n) return;
    if (e->offload) memcpy(out, state_ptr(e, u, kind), s->n * sizeof(float));
    else e->ops->to_host(out, state_ptr(e, u, kind), s->n * sizeof(float));
}

void fsdp_get_state_async(fsdp_engine *e, int u, fsdp_state_kind kind, float *out) {
    if (!e->ops->to_host_async || e->offload) { /* offloaded: host memory already */
        fsdp_get_state(e, u, kind, out);
        return;
    }
    const flat_state *s = e->units[u].trained;
    if (s && s->n) e->ops->to_host_async(out, state_ptr(e, u, kind), s->n * sizeof(float));
}

void fsdp_get_state_wait(fsdp_engine *e) {
    if (e->ops->to_host_wait) e->ops->to_host_wait();
}

void fsdp_set_state(fsdp_engine *e, int u, fsdp_state_kind kind, const float *in) {
    unit_state *us = &e->units[u];
    flat_state *s = us->trained;
    if (kind == FSDP_STATE_MASTER && s) master_from_host(e, s, in);
    else if (s && s->n && e->offload) memcpy(state_ptr(e, u, kind), in, s->n * sizeof(float));
    else if (s && s->n) e->ops->to_device(state_ptr(e, u, kind), in, s->n * sizeof(float));
    if (kind == FSDP_STATE_MASTER && (us->own || us->slot >= 0)) us->gathered = 0;
    if (kind == FSDP_STATE_MASTER) e->fp8_stale = 1;
}

void fsdp_get_shard(fsdp_engine *e, int u, float *out) { fsdp_get_state(e, u, FSDP_STATE_MASTER, out); }
void fsdp_set_shard(fsdp_engine *e, int u, const float *in) { fsdp_set_state(e, u, FSDP_STATE_MASTER, in); }
const model_layout *fsdp_layout(const fsdp_engine *e) { return model_desc_trained(e->md); }

/* ---------------------------------------------------------------- the base */

const model_layout *fsdp_base_layout(const fsdp_engine *e) { return &e->md->lay; }

void fsdp_base_shard_range(const fsdp_engine *e, int u, size_t *begin, size_t *end) {
    *begin = nf4_unit(e, u) ? 0 : e->units[u].base.begin;
    *end = nf4_unit(e, u) ? e->units[u].base.numel : e->units[u].base.end;
}

void fsdp_get_base_shard(fsdp_engine *e, int u, float *out) {
    const flat_state *b = &e->units[u].base;
    if (nf4_unit(e, u))
        SHLM_FATAL("fsdp_get_base_shard: unit %d of the base is stored as NF4 blocks, which a "
                   "rank cannot read back as an fp32 range (gather it)", u);
    if (e->lora) store_to_host(e, b, out);
    else master_to_host(e, b, out);
}

void fsdp_set_base_shard(fsdp_engine *e, int u, const float *in) {
    unit_state *us = &e->units[u];
    if (nf4_unit(e, u)) nf4_store_from_host(e, u, in);
    else if (e->lora) store_from_host(e, &us->base, in);
    else master_from_host(e, &us->base, in);
    if (us->own || us->slot >= 0) us->gathered = 0;
    e->fp8_stale = 1;
}

int fsdp_lora(const fsdp_engine *e) { return e->lora; }

/* DoRA's magnitudes of unit u from its gathered base p (act, host copy of each weight):
 * each row's L2 norm, summed in double in row order (the same on every rank and at every
 * world size), for the elements of this rank's adapter shard. */
static void unit_magnitudes(fsdp_engine *e, int u, const void *p, float *host, void *wbuf) {
    flat_state *a = &e->units[u].adapter;
    const model_unit *bu = &e->md->lay.units[u], *au = &e->md->adapters.units[u];
    master_to_host(e, a, host);
    for (int k = 0; k < bu->n_fp8; k++) {
        const lora_product *pr = &e->md->lora_products[u][k];
        for (int j = 0; j < pr->n_sites; j++) {
            const lora_site *st = &pr->sites[j];
            const model_tensor *w = &bu->tensors[st->tensor], *m = &au->tensors[st->m];
            shard_overlap ov;
            if (!shard_intersect(a->begin, a->end, m->offset, m->numel, &ov)) continue;
            const size_t cols = (size_t)w->shape[1];
            e->ops->to_host(wbuf, (const char *)p + w->offset * e->esz, w->numel * e->esz);
            for (size_t i = 0; i < ov.count; i++) {
                const size_t row = ov.flat_offset - m->offset + i;
                double sq = 0;
                for (size_t c = 0; c < cols; c++) {
                    const size_t at = row * cols + c;
                    const double x = e->esz == 4 ? ((const float *)wbuf)[at]
                                                 : shlm_bf16_to_f32(((const uint16_t *)wbuf)[at]);
                    sq += x * x;
                }
                host[ov.shard_offset + i] = (float)sqrt(sq);
            }
        }
    }
    master_from_host(e, a, host);
}

void fsdp_lora_magnitudes(fsdp_engine *e) {
    if (!e->lora || !e->md->lora.dora) return;
    size_t most = 1;
    for (int u = 0; u < e->n_units; u++)
        for (int k = 0; k < e->md->lay.units[u].n_tensors; k++)
            if (e->md->lay.units[u].tensors[k].target >= 0 &&
                e->md->lay.units[u].tensors[k].numel > most)
                most = e->md->lay.units[u].tensors[k].numel;
    float *host = malloc(max_flat_shard(e) * sizeof(float));
    void *wbuf = malloc(most * e->esz);
    SHLM_CHECK_ALLOC(host);
    SHLM_CHECK_ALLOC(wbuf);
    const int was = e->with_backward;
    e->with_backward = 0;
    for (int u = 0; u < e->n_units; u++) {
        if (!e->units[u].adapter.numel) continue;
        const void *p = src_acquire(e, u, MODEL_FWD);
        unit_magnitudes(e, u, p, host, wbuf);
        src_release(e, u, MODEL_FWD);
        e->units[u].gathered = 0; /* the adapters it holds are stale */
    }
    /* a prefetch the last acquire issued holds adapters from before this walk: the first
     * pass gathers every unit afresh */
    drop_slots(e);
    e->with_backward = was;
    free(host);
    free(wbuf);
}

uint64_t fsdp_base_fingerprint(fsdp_engine *e) {
    float *host = malloc(max_flat_shard(e) * sizeof(float));
    SHLM_CHECK_ALLOC(host);
    uint64_t h = 0, at = 0; /* at: the unit's first element in the whole model */
    for (int u = 0; u < e->n_units; u++) {
        const flat_state *b = &e->units[u].base;
        if (nf4_unit(e, u)) { /* its codes and scales as stored (base_nf4_fingerprint) */
            const base_nf4_unit *nu = &e->plan->nf4[u];
            uint8_t *block = malloc(nu->block_bytes);
            SHLM_CHECK_ALLOC(block);
            e->ops->to_host(block, b->store, nu->block_bytes);
            h += base_nf4_fingerprint(nu, e->shard_rank, shlm_dtype_size(e->pdt), block, at);
            free(block);
            at += b->numel;
            continue;
        }
        fsdp_get_base_shard(e, u, host);
        const size_t end = b->end < b->numel ? b->end : b->numel;
        if (end > b->begin) h += rng_fingerprint_f32(at + b->begin, host, end - b->begin);
        at += b->numel;
    }
    free(host);
    if (e->S > 1)
        MPI_CHECK(shlm_timed_allreduce(MPI_IN_PLACE, &h, 1, MPI_UINT64_T, MPI_SUM, e->shard_mpi));
    return h;
}

void fsdp_trace_write(const fsdp_engine *e, FILE *out) {
    for (size_t i = 0; i < e->n_trace; i++)
        fprintf(out, "{\"seq\": %zu, \"t_us\": %.1f, \"unit\": %d, \"event\": \"%s\"}\n", i,
                e->trace[i].t_us, e->trace[i].unit, trace_names[e->trace[i].kind]);
}
