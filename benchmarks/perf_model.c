/* The performance model: predicts one FSDP training step (time, exposed communication,
 * throughput, memory) for 1-16 nodes by replaying src/fsdp.c's schedule.
 *
 * The replay runs a compute clock and one FIFO queue per comm group, from a measured
 * single-GPU compute rate and link figures (given, or bench_comm's measured curves).
 * Why a replay and not a formula: what hides behind compute depends on the engine's
 * exact order (two gather slots, prefetch issued only once the current unit's gather
 * has landed, reduce-scatters queued behind gathers on the same group, two gradient
 * slots, the first gather of a micro-batch and the last reduce-scatters left bare).
 * Replaying those rules gives exposed = max(0, comm - compute) per unit and the
 * non-overlapped head and tail without special cases.
 *
 * Modes (see --help): a sweep over node counts for one model (default), `--calibrate
 * CSV` against strong_scaling.sh's measurements (error on every point), and
 * `--scenario p5-h100` (Llama-2 7B/13B/70B on 1-16 nodes of 8x H100, 3200 Gbit/s per
 * node, next to AWS's published 87%). Every input and assumption is printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kernels/comm.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"
#include "src/config.h"
#include "src/device_table.h"
#include "src/fsdp.h"
#include "src/llama.h"
#include "src/metrics.h"
#include "src/shard.h"
#include "src/topology.h"

/* ------------------------------------------------------------------ inputs */

/* The machine. Bandwidths are achievable bus bandwidths (nccl-tests' busbw), GB/s. */
typedef struct machine {
    int gpus_per_node;
    double tflops;          /* model TFLOP/s of one GPU at the job's shape and AC (or 0) */
    double tokens_per_s;    /* or: tokens/s of one GPU at that shape (used when > 0) */
    double intra_gbs;       /* bus bandwidth of a group inside one node */
    double inter_gbs;       /* what one node's NICs carry together, achievable */
    double intra_lat_us;    /* per ring step inside a node */
    double inter_lat_us;    /* per ring step that crosses nodes */
    double overlap;         /* fraction of a collective's time that runs beside compute;
                             * the rest is charged to compute (SMs taken by NCCL, CPU
                             * copies by MPI) */
    double mem_gbs;         /* device memory bandwidth for casts, zeroing, accumulation */
    double opt_ns;          /* optimizer ns per parameter of the shard (0: 28 B at mem_gbs) */
    double capacity_gib;    /* memory per GPU for the fit check (0: no check) */
    int cores, threads;     /* CPU ranks: compute slows by ranks x threads / cores past 1 */
    int host_ranks;         /* ranks sharing those cores (0: gpus_per_node) */
    double peak_tflops;     /* MFU denominator */
} machine;

/* One job shape. */
typedef struct job {
    char name[64];
    llama_config mc;
    int seq, micro, global;  /* global batch in sequences (strong scaling keeps it) */
    fsdp_strategy strategy;
    llama_ac ac;
    shlm_dtype act, reduce;  /* gathered-parameter dtype (the backend's act dtype), reduce dtype */
    int param_bf16;          /* param_dtype = bf16: an fp32 act rounds, a bf16 act casts */
    int prefetch;
    int shard_group_size;    /* fsdp.shard_group_size (0: the strategy's own group) */
    int ranks_per_node;      /* runtime.ranks_per_node (0: real nodes) */
} job;

/* A measured curve from bench_comm --json: one op, dtype and group size. */
typedef struct curve {
    shlm_comm_op op;
    shlm_dtype dt;
    int S, ranks, nonblocking, n; /* group size, ranks of the bench run */
    double size[64], us[64];
    char file[256];
} curve;

static curve curves[64];
static int n_curves;

static const char *ac_name(llama_ac a) {
    return a == LLAMA_AC_FULL ? "full" : a == LLAMA_AC_SELECTIVE ? "selective" : "none";
}

/* ------------------------------------------------------------------ collectives */

static int load_comm_json(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read %s", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = malloc((size_t)len + 1);
    if (!txt || fread(txt, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(txt);
        snprintf(err, errlen, "cannot read %s", path);
        return -1;
    }
    fclose(f);
    txt[len] = 0;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *res = root ? cJSON_GetObjectItem(root, "results") : NULL;
    cJSON *gs = root ? cJSON_GetObjectItem(root, "group_size") : NULL;
    cJSON *nb = root ? cJSON_GetObjectItem(root, "nonblocking") : NULL;
    cJSON *rk = root ? cJSON_GetObjectItem(root, "ranks") : NULL;
    if (!cJSON_IsArray(res) || !cJSON_IsNumber(gs)) {
        cJSON_Delete(root);
        snprintf(err, errlen, "%s: not a bench_comm --json file", path);
        return -1;
    }
    cJSON *r;
    cJSON_ArrayForEach(r, res) {
        const char *op = cJSON_GetStringValue(cJSON_GetObjectItem(r, "op"));
        const char *dt = cJSON_GetStringValue(cJSON_GetObjectItem(r, "dtype"));
        cJSON *ip = cJSON_GetObjectItem(r, "in_place"); /* the engine works in place */
        cJSON *sz = cJSON_GetObjectItem(r, "size_bytes");
        cJSON *us = ip ? cJSON_GetObjectItem(ip, "time_us") : NULL;
        if (!op || !dt || !cJSON_IsNumber(sz) || !cJSON_IsNumber(us)) continue;
        int o = -1;
        for (int k = 0; k <= SHLM_COMM_ALL_REDUCE; k++)
            if (strcmp(op, shlm_comm_op_name((shlm_comm_op)k)) == 0) o = k;
        if (o < 0) continue;
        shlm_dtype d = strcmp(dt, "bf16") == 0 ? SHLM_BF16 : SHLM_F32;
        curve *c = NULL;
        for (int k = 0; k < n_curves; k++)
            if (curves[k].op == (shlm_comm_op)o && curves[k].dt == d && curves[k].S == gs->valueint &&
                strcmp(curves[k].file, path) == 0)
                c = &curves[k];
        if (!c) {
            if (n_curves == 64) break;
            c = &curves[n_curves++];
            memset(c, 0, sizeof *c);
            c->op = (shlm_comm_op)o;
            c->dt = d;
            c->S = gs->valueint;
            c->nonblocking = cJSON_IsNumber(nb) ? nb->valueint : 0;
            c->ranks = cJSON_IsNumber(rk) ? rk->valueint : c->S;
            snprintf(c->file, sizeof c->file, "%s", path);
        }
        if (c->n < 64) {
            c->size[c->n] = sz->valuedouble;
            c->us[c->n] = us->valuedouble;
            c->n++;
        }
    }
    cJSON_Delete(root);
    return 0;
}

/* The measured curve for (op, dt, S): measured with `ranks` ranks running (so groups
 * that share the machine shared it in the benchmark too) first, then non-blocking (the
 * engine's calls). */
static const curve *find_curve(shlm_comm_op op, shlm_dtype dt, int S, int ranks) {
    const curve *best = NULL;
    int best_score = -1;
    for (int k = 0; k < n_curves; k++) {
        const curve *c = &curves[k];
        if (c->op != op || c->dt != dt || c->S != S || c->n == 0) continue;
        int score = 2 * (c->ranks == ranks) + c->nonblocking;
        if (score > best_score) {
            best = c;
            best_score = score;
        }
    }
    return best;
}

/* Log-log interpolation; below the smallest size the smallest time (latency-bound),
 * above the largest the largest point's bandwidth. Sizes are ascending in the file. */
static double curve_us(const curve *c, double size) {
    if (size <= c->size[0]) return c->us[0];
    for (int i = 1; i < c->n; i++) {
        if (size <= c->size[i]) {
            double a = log(size / c->size[i - 1]) / log(c->size[i] / c->size[i - 1]);
            return exp(log(c->us[i - 1]) + a * (log(c->us[i]) - log(c->us[i - 1])));
        }
    }
    return c->us[c->n - 1] * size / c->size[c->n - 1];
}

/* Where a group's ranks sit: how many per node, and how many such groups share a node
 * (their inter-node traffic shares its NICs). */
typedef struct group_shape {
    int S, per_node, sharing;
    int ranks; /* of the whole job */
} group_shape;

static int measured_only; /* calibration on one host: every group must be measured */

/* Time of one collective of nccl-tests "size" bytes over group g: measured when a
 * bench_comm curve of that size of group exists, else ring latency + bandwidth. */
static double coll_us(const machine *m, shlm_comm_op op, shlm_dtype dt, double size,
                      group_shape g) {
    if (g.S <= 1 || size <= 0) return 0;
    const curve *c = find_curve(op, dt, g.S, g.ranks);
    if (c) return curve_us(c, size);
    if (measured_only) {
        fprintf(stderr, "perf_model: error: no measured %s %s curve for a group of %d ranks "
                "(give its bench_comm --json with --comm-json, or link figures)\n",
                shlm_comm_op_name(op), shlm_dtype_name(dt), g.S);
        exit(1);
    }
    int crosses = g.S > g.per_node;
    /* a ring over nodes: each ring hop between nodes uses a NIC share; with p ranks of
     * the group per node, (p-1) of every p hops stay inside the node */
    double bw = m->intra_gbs, lat = m->intra_lat_us;
    if (crosses) {
        double nic = m->inter_gbs / (g.sharing > 0 ? g.sharing : 1);
        bw = nic < m->intra_gbs ? nic : m->intra_gbs;
        lat = ((g.per_node - 1) * m->intra_lat_us + m->inter_lat_us) / g.per_node;
    }
    double factor = op == SHLM_COMM_ALL_REDUCE ? 2.0 * (g.S - 1) / g.S : (double)(g.S - 1) / g.S;
    double steps = op == SHLM_COMM_ALL_REDUCE ? 2.0 * (g.S - 1) : g.S - 1;
    if (op == SHLM_COMM_ALL_REDUCE && size < 1048576) /* small: a tree, not a ring */
        steps = 2.0 * ceil(log2((double)g.S));
    return steps * lat + size * factor / (bw * 1e3);
}

/* ------------------------------------------------------------------ the replay */

enum { SLOTS = 2 }; /* as src/fsdp.c: two gathered units, two gradient buffers */

typedef struct unit_sim {
    double padded, n;        /* elements: padded unit, this rank's shard */
    double fwd_us, bwd_us;   /* compute (bwd includes recomputation) */
    int gathered, slot, gslot;
} unit_sim;

typedef struct sim {
    const machine *m;
    const job *j;
    int S, R, n_units, head, direct, keep, with_backward;
    group_shape shard_g, replica_g;
    unit_sim *u;
    struct { int unit; double end; } slots[SLOTS], gslots[SLOTS];
    int gslot_next;
    double t, q_shard, q_rep; /* compute clock, and when each group's queue frees (us) */
    double exposed, comm_busy, slow; /* waited, comm time issued, compute slowdown */
} sim;

static double mem_us(const sim *s, double bytes) { return s->slow * bytes / (s->m->mem_gbs * 1e3); }

/* A collective issued now: it starts when its group's queue is free; the part that
 * cannot run beside compute is charged to the compute clock. Returns its end. */
static double issue(sim *s, double *queue, double us) {
    double start = s->t > *queue ? s->t : *queue;
    *queue = start + us;
    s->comm_busy += us;
    s->t += (1.0 - s->m->overlap) * us;
    return *queue;
}

static void wait_until(sim *s, double end) {
    if (end > s->t) {
        s->exposed += end - s->t;
        s->t = end;
    }
}

static void compute(sim *s, double us) { s->t += s->slow * us; }

static void sim_issue_gather(sim *s, int u) {
    if (u < 0 || u >= s->n_units || s->u[u].gathered || s->u[u].slot >= 0) return;
    int k = -1;
    for (int i = 0; i < SLOTS && k < 0; i++)
        if (s->slots[i].unit < 0) k = i;
    if (k < 0) return;
    unit_sim *x = &s->u[u];
    s->slots[k].unit = u;
    x->slot = k;
    /* the rank's shard cast into the buffer: fp32 copy (+ bf16 rounding) or a cast */
    double es = shlm_dtype_size(s->j->act);
    s->t += mem_us(s, x->n * (s->j->act == SHLM_F32 ? (s->j->param_bf16 ? 16 : 8) : 4 + es));
    double us = coll_us(s->m, SHLM_COMM_ALL_GATHER, s->j->act, x->padded * es, s->shard_g);
    s->slots[k].end = s->S > 1 ? issue(s, &s->q_shard, us) : s->t;
}

static int sim_next(const sim *s, int u, llama_phase ph) {
    if (ph == LLAMA_FWD) {
        if (u < s->head) return u + 1;
        return s->with_backward && s->head - 1 >= 1 ? s->head - 1 : -1;
    }
    return u - 1 >= 1 ? u - 1 : -1;
}

static void sim_acquire(sim *s, int u, llama_phase ph) {
    if (s->direct) return;
    unit_sim *x = &s->u[u];
    if (!x->gathered) {
        if (x->slot < 0) sim_issue_gather(s, u);
        if (x->slot >= 0) {
            wait_until(s, s->slots[x->slot].end);
            if (s->keep) { /* own buffer: the slot only carried the request */
                s->slots[x->slot].unit = -1;
                x->slot = -1;
            }
        }
        x->gathered = 1;
    }
    if (s->j->prefetch) sim_issue_gather(s, sim_next(s, u, ph));
}

static void sim_release(sim *s, int u, llama_phase ph) {
    unit_sim *x = &s->u[u];
    int keep = s->j->strategy == FSDP_NO_SHARD ||
               (s->j->strategy == FSDP_SHARD_GRAD_OP && ph == LLAMA_FWD && s->with_backward &&
                u != 0 && u != s->head);
    if (keep || s->direct) return;
    x->gathered = 0;
    if (x->slot >= 0) {
        s->slots[x->slot].unit = -1;
        x->slot = -1;
    }
    if (s->j->prefetch) sim_issue_gather(s, sim_next(s, u, ph));
}

static void sim_complete_grad(sim *s, int k) {
    if (s->gslots[k].unit < 0) return;
    wait_until(s, s->gslots[k].end);
    unit_sim *x = &s->u[s->gslots[k].unit];
    s->t += mem_us(s, x->n * (12 + (s->j->reduce == SHLM_BF16 ? 6 : 0)));
    x->gslot = -1;
    s->gslots[k].unit = -1;
}

static void sim_grad(sim *s, int u) {
    unit_sim *x = &s->u[u];
    if (s->S == 1 || x->gslot >= 0) return;
    int k = -1;
    for (int i = 0; i < SLOTS; i++)
        if (s->gslots[i].unit < 0) k = i;
    if (k < 0) {
        k = s->gslot_next;
        sim_complete_grad(s, k);
    }
    s->gslot_next = (k + 1) % SLOTS;
    s->gslots[k].unit = u;
    x->gslot = k;
    s->t += mem_us(s, x->padded * 4); /* the full-unit buffer is zeroed */
}

static void sim_grad_ready(sim *s, int u) {
    unit_sim *x = &s->u[u];
    if (s->S == 1 || x->gslot < 0) return;
    if (s->j->reduce == SHLM_BF16) s->t += mem_us(s, x->padded * 6);
    double us = coll_us(s->m, SHLM_COMM_REDUCE_SCATTER, s->j->reduce,
                        x->padded * shlm_dtype_size(s->j->reduce), s->shard_g);
    s->gslots[x->gslot].end = issue(s, &s->q_shard, us);
}

/* One micro-batch in llama_forward_backward's order. */
static void sim_micro(sim *s) {
    const int L = s->j->mc.n_layers, H = s->head;
    sim_acquire(s, 0, LLAMA_FWD);
    compute(s, s->u[0].fwd_us);
    sim_release(s, 0, LLAMA_FWD);
    for (int u = 1; u <= L; u++) {
        sim_acquire(s, u, LLAMA_FWD);
        compute(s, s->u[u].fwd_us);
        sim_release(s, u, LLAMA_FWD);
    }
    sim_acquire(s, H, LLAMA_FWD);
    sim_grad(s, H);
    compute(s, s->u[H].fwd_us + s->u[H].bwd_us); /* the head's backward runs right there */
    sim_release(s, H, LLAMA_FWD);
    sim_grad_ready(s, H);
    for (int u = L; u >= 1; u--) {
        sim_acquire(s, u, LLAMA_BWD);
        sim_grad(s, u);
        compute(s, s->u[u].bwd_us);
        sim_release(s, u, LLAMA_BWD);
        sim_grad_ready(s, u);
    }
    sim_grad(s, 0);
    compute(s, s->u[0].bwd_us);
    sim_grad_ready(s, 0);
}

/* What predict() returns for one node count. */
typedef struct prediction {
    int nodes, ranks, S, R, accum;
    double step_ms, compute_ms, exposed_ms, comm_ms, opt_ms;
    double tokens_per_s, tokens_per_s_per_gpu, mfu;
    double mem_bytes;
    int fits;
} prediction;

/* Group geometry of the strategy on `ranks` ranks, `G` per node. */
static void groups_of(const job *j, int ranks, int G, int *S, int *R) {
    *S = j->shard_group_size > 0        ? j->shard_group_size
         : j->strategy == FSDP_NO_SHARD ? 1
         : j->strategy == FSDP_HYBRID_SHARD ? (G < ranks ? G : ranks)
                                            : ranks;
    *R = ranks / *S;
}

/* Compute of one micro-batch at one GPU's rate, in microseconds. */
static double micro_us(const job *j, const machine *m) {
    double tok = (double)j->micro * j->seq;
    if (m->tokens_per_s > 0) return 1e6 * tok / m->tokens_per_s;
    return 1e6 * tok * model_flops_per_token(&j->mc, j->seq) / (m->tflops * 1e12);
}

static void predict(const job *j, const machine *m, int nodes, int accum_override,
                    prediction *p) {
    const int G = m->gpus_per_node, ranks = nodes * G;
    memset(p, 0, sizeof *p);
    p->nodes = nodes;
    p->ranks = ranks;
    groups_of(j, ranks, G, &p->S, &p->R);
    const int S = p->S, R = p->R;
    int global = accum_override > 0 ? accum_override * j->micro * ranks : j->global;
    p->accum = global / (j->micro * ranks);
    if (p->accum < 1 || global % (j->micro * ranks) != 0) {
        p->accum = 0; /* the batch does not divide: no prediction */
        return;
    }
    llama_layout lay;
    llama_layout_init(&lay, &j->mc);
    sim s = {.m = m, .j = j, .S = S, .R = R, .n_units = lay.n_units, .head = lay.n_units - 1,
             .with_backward = 1};
    s.direct = S == 1 && j->act == SHLM_F32 && !j->param_bf16;
    s.keep = j->strategy == FSDP_SHARD_GRAD_OP || j->strategy == FSDP_NO_SHARD;
    /* shard groups are blocks of S consecutive ranks; replica groups take one rank of each */
    s.shard_g = (group_shape){S, S < G ? S : G, S < G ? G / S : 1, ranks};
    s.replica_g = (group_shape){R, S >= G ? 1 : G / S, S >= G ? G : S, ranks};
    s.slow = 1;
    if (m->cores > 0) {
        int host = m->host_ranks > 0 ? m->host_ranks : G;
        double want = (double)host * (m->threads > 0 ? m->threads : 1) / m->cores;
        if (want > 1) s.slow = want;
    }
    /* compute per unit, in proportion to its FLOPs (recomputation included) */
    const double d = j->mc.dim, T = j->seq, V = j->mc.vocab_size;
    const double Pb = (double)lay.units[1].numel;
    const double fwd_b = 2 * Pb + 4 * d * T;
    const double re = j->ac == LLAMA_AC_FULL ? fwd_b : j->ac == LLAMA_AC_SELECTIVE ? 4 * d * T : 0;
    const double bwd_b = 2 * fwd_b + re, head = 6 * V * d;
    const double total = j->mc.n_layers * (fwd_b + bwd_b) + head;
    const double t_mb = micro_us(j, m);
    s.u = calloc((size_t)lay.n_units, sizeof *s.u);
    double P_shard = 0, maxn = 0;
    for (int u = 0; u < lay.n_units; u++) {
        unit_sim *x = &s.u[u];
        x->padded = (double)shard_padded_size(lay.units[u].numel, S);
        x->n = (double)shard_numel(lay.units[u].numel, S);
        x->slot = x->gslot = -1;
        P_shard += x->n;
        if (x->n > maxn) maxn = x->n;
        if (u >= 1 && u <= j->mc.n_layers) {
            x->fwd_us = t_mb * fwd_b / total;
            x->bwd_us = t_mb * bwd_b / total;
        } else if (u == s.head) {
            x->fwd_us = t_mb * head / 3 / total;
            x->bwd_us = t_mb * head * 2 / 3 / total;
        }
    }
    for (int k = 0; k < SLOTS; k++) s.slots[k].unit = s.gslots[k].unit = -1;

    /* one optimizer step, as train.c times it */
    s.t += mem_us(&s, P_shard * 4); /* zero_grad */
    for (int mb = 0; mb < p->accum; mb++) sim_micro(&s);
    for (int k = 0; k < SLOTS; k++) sim_complete_grad(&s, k);
    if (R > 1) {
        if (j->reduce == SHLM_BF16) { /* blocking, one shard at a time through staging */
            for (int u = 0; u < lay.n_units; u++) {
                s.t += mem_us(&s, s.u[u].n * 12);
                double us = coll_us(m, SHLM_COMM_ALL_REDUCE, SHLM_BF16, s.u[u].n * 2, s.replica_g);
                wait_until(&s, issue(&s, &s.q_rep, us));
            }
        } else { /* all issued, then waited */
            double end = s.t;
            for (int u = 0; u < lay.n_units; u++)
                end = issue(&s, &s.q_rep, coll_us(m, SHLM_COMM_ALL_REDUCE, SHLM_F32, s.u[u].n * 4,
                                                 s.replica_g));
            wait_until(&s, end);
        }
    }
    s.t += mem_us(&s, P_shard * 4); /* sum of squares for the norm */
    if (S > 1) s.t += coll_us(m, SHLM_COMM_ALL_REDUCE, SHLM_F32, 8, s.shard_g);
    double opt_ns = m->opt_ns > 0 ? m->opt_ns : 28.0 / m->mem_gbs;
    p->opt_ms = s.slow * P_shard * opt_ns * 1e-6;
    s.t += 1e3 * p->opt_ms;
    /* the loop's own world all-reduce of the loss sums and times */
    group_shape world = {ranks, ranks < G ? ranks : G, 1, ranks};
    s.t += 2 * coll_us(m, SHLM_COMM_ALL_REDUCE, SHLM_F32, 16, world);

    p->step_ms = s.t * 1e-3;
    p->exposed_ms = s.exposed * 1e-3;
    p->comm_ms = s.comm_busy * 1e-3;
    p->compute_ms = s.slow * t_mb * p->accum * 1e-3;
    p->tokens_per_s = (double)global * j->seq / (p->step_ms * 1e-3);
    p->tokens_per_s_per_gpu = p->tokens_per_s / ranks;
    p->mfu = model_flops_per_token(&j->mc, j->seq) * p->tokens_per_s_per_gpu / (m->peak_tflops * 1e12);

    /* memory: what fsdp_create and the model allocate (shardlm plan's figures) */
    model md;
    model_open(&md, &llama_family, &j->mc);
    shard_plan plan;
    shard_plan_build(&plan, &md, &(plan_params){.strategy = j->strategy, .S = S, .R = R,
                                                .act = j->act,
                                                .param_dtype = j->param_bf16 ? SHLM_BF16 : SHLM_F32,
                                                .reduce_dtype = j->reduce, .B = j->micro,
                                                .T = j->seq, .ac = j->ac});
    p->mem_bytes = (double)plan.total;
    shard_plan_free(&plan);
    model_close(&md);
    p->fits = m->capacity_gib <= 0 || p->mem_bytes <= m->capacity_gib * 1073741824.0;
    free(s.u);
    llama_layout_free(&lay);
}

/* ------------------------------------------------------------------ output */

static void print_inputs(const job *j, const machine *m) {
    printf("# model %s: %lld parameters, %d layers, d=%d, ffn %d, %d/%d heads; seq %d, "
           "micro-batch %d, global batch %d sequences (%.2fM tokens)\n", j->name,
           (long long)llama_param_count(&j->mc), j->mc.n_layers, j->mc.dim, j->mc.ffn_dim,
           j->mc.n_heads, j->mc.n_kv_heads, j->seq, j->micro, j->global,
           (double)j->global * j->seq / 1e6);
    printf("# strategy %s, activation checkpointing %s, gathered params %s, reduce %s, "
           "prefetch %s; FLOPs/token 6P+12LdT = %.4g\n", strategy_name(j->strategy),
           ac_name(j->ac), shlm_dtype_name(j->act), shlm_dtype_name(j->reduce),
           j->prefetch ? "on" : "off", model_flops_per_token(&j->mc, j->seq));
    if (m->tokens_per_s > 0)
        printf("# compute: one GPU runs %.1f tokens/s at this shape (measured) = %.2f ms per "
               "micro-batch\n", m->tokens_per_s, 1e-3 * micro_us(j, m));
    else
        printf("# compute: one GPU at %.1f model TFLOP/s at this shape = %.2f ms per "
               "micro-batch\n", m->tflops, 1e-3 * micro_us(j, m));
    if (m->intra_gbs <= 0)
        printf("# links: measured bench_comm curves only (%d curve(s) from --comm-json)\n", n_curves);
    else
        printf("# links: intra-node busbw %.1f GB/s, %.1f us/ring step; inter-node %.1f GB/s per "
               "node (all NICs, achievable), %.1f us/ring step%s\n", m->intra_gbs,
               m->intra_lat_us, m->inter_gbs, m->inter_lat_us,
               n_curves ? "; measured bench_comm curves override these for their group sizes" : "");
    printf("# overlap %.2f (share of a collective that runs beside compute; the rest is "
           "charged to compute); memory %.0f GB/s; optimizer %.4f ns/param%s\n", m->overlap,
           m->mem_gbs, m->opt_ns > 0 ? m->opt_ns : 28.0 / m->mem_gbs,
           m->opt_ns > 0 ? "" : " (28 B/param at that bandwidth)");
    if (m->cores > 0)
        printf("# host: %d cores, %d thread(s) per rank: compute slows by ranks x threads / "
               "cores past 1\n", m->cores, m->threads > 0 ? m->threads : 1);
}

static void print_table_header(void) {
    printf("# %5s %6s %5s %5s %5s %10s %10s %10s %10s %12s %12s %7s %9s %4s %10s\n", "nodes",
           "ranks", "S", "R", "accum", "step", "compute", "comm", "exposed", "tokens/s",
           "tokens/s/GPU", "MFU", "mem/GPU", "fits", "efficiency");
    printf("# %5s %6s %5s %5s %5s %10s %10s %10s %10s %12s %12s %7s %9s %4s %10s\n", "", "", "",
           "", "", "(ms)", "(ms)", "(ms)", "(ms)", "(1/s)", "(1/s)", "(%)", "(GiB)", "", "(%)");
}

/* Sweeps node counts; efficiency against the smallest node count that fits. Returns
 * the efficiency at the largest count (or -1). */
static double sweep(const job *j, const machine *m, const int *nodes, int n_nodes, int weak_accum) {
    prediction base = {0};
    int have_base = 0;
    double last = -1;
    print_table_header();
    for (int i = 0; i < n_nodes; i++) {
        prediction p;
        predict(j, m, nodes[i], weak_accum, &p);
        if (p.accum == 0) {
            printf("  %5d %6d  (global batch %d is not a multiple of micro-batch %d x %d ranks)\n",
                   nodes[i], nodes[i] * m->gpus_per_node, j->global, j->micro, p.ranks);
            continue;
        }
        double eff = -1;
        if (p.fits && !have_base) {
            base = p;
            have_base = 1;
        }
        if (p.fits && have_base)
            eff = weak_accum > 0 ? base.step_ms / p.step_ms
                                 : base.step_ms * base.ranks / (p.ranks * p.step_ms);
        char effs[16];
        if (eff < 0) snprintf(effs, sizeof effs, "-");
        else snprintf(effs, sizeof effs, "%.1f", 100 * eff);
        printf("  %5d %6d %5d %5d %5d %10.2f %10.2f %10.2f %10.2f %12.0f %12.1f %7.2f %9.2f %4s %10s\n",
               p.nodes, p.ranks, p.S, p.R, p.accum, p.step_ms, p.compute_ms, p.comm_ms,
               p.exposed_ms, p.tokens_per_s, p.tokens_per_s_per_gpu, 100 * p.mfu,
               p.mem_bytes / 1073741824.0, p.fits ? "yes" : "no", effs);
        last = eff;
    }
    if (have_base && base.nodes != nodes[0])
        printf("# efficiency is relative to %d nodes, the fewest on which the job fits\n", base.nodes);
    return last;
}

/* ------------------------------------------------------------------ arguments */

typedef struct args {
    const char *csv[8];
    int n_csv;
    const char *job_path, *model, *scenario, *strategy, *ac, *param_dtype,
        *reduce_dtype, *backend;
    char *sets[64];
    int n_sets;
    int nodes[32], n_nodes;
    int seq, micro, global, weak, accum, no_prefetch, shard_group_size;
    int measure_host, fit_at;
    double max_error;
} args;

static void usage(FILE *out) {
    fprintf(out,
            "usage: perf_model [job] [machine] [--nodes LIST]      predict 1..N nodes\n"
            "       perf_model --calibrate scaling.csv [...] [machine]  error on every measured point\n"
            "       perf_model --scenario p5-h100 [overrides]       7B/13B/70B on 16x8 H100 vs AWS\n"
            "job:     --job JOB.ini [--set section.key=value ...] | --model PRESET\n"
            "         --seq T --micro-batch B --global-batch G (sequences) --strategy S\n"
            "         --ac none|selective|full --param-dtype fp32|bf16 --reduce-dtype fp32|bf16\n"
            "         --backend cpu|cuda (gathered dtype fp32|bf16) --no-prefetch\n"
            "         --weak [--accum A]   weak scaling: A micro-batches per rank per step\n"
            "machine: --gpus-per-node G --tflops X | --tokens-per-s X (one GPU, this shape)\n"
            "         --intra-gbs B --inter-gbit LINE|--inter-gbs B --inter-eff E\n"
            "         --intra-lat-us A --inter-lat-us A --overlap F --mem-gbs B\n"
            "         --opt-ns-per-param X --mem-gib C --cores C --threads T --peak-tflops X\n"
            "         --comm-json FILE (bench_comm --json; repeatable: measured collectives)\n"
            "calibration: --measure-host (time this host's AdamW and memory bandwidth)\n"
            "         --overlap F (else fitted on the --fit-at N rank rows, default 2)\n"
            "         --max-error PCT (exit 1 when a point is off by more)\n");
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) {
        out[n] = atoi(t);
        if (out[n] < 1) return -1;
        n++;
    }
    return n;
}

/* Model TFLOP/s of one H100 without activation checkpointing (the scenario's no-AC column). */
#define NO_AC_TFLOPS 515.0

/* The p5.48xlarge assumptions (printed with the results). */
static void scenario_p5(machine *m) {
    m->gpus_per_node = 8;
    /* H100 SXM: the same 989 TFLOP/s dense bf16 peak as the H200 of the anchors, 3.35 vs
     * 4.8 TB/s HBM. The anchors measured PyTorch FSDP on one H200 at 406 model TFLOP/s
     * (7B, seq 4096, full AC, mb 8); H100 loses a few % on the memory-bound share: 385. */
    m->tflops = 385;
    /* NVSwitch NVLink4: 450 GB/s per direction per GPU; nccl-tests all-gather busbw
     * within one 8-GPU node reaches ~360 at hundreds of MB */
    m->intra_gbs = 360;
    /* 32 x 100 Gbit/s EFA = 3200 Gbit/s = 400 GB/s per node; ring collectives over EFA
     * reach ~75% of line rate */
    m->inter_gbs = 400 * 0.75;
    m->intra_lat_us = 3;
    m->inter_lat_us = 12;
    /* NCCL kernels take SMs from the GEMMs they overlap. Fitted on shardlm's own 7B
     * points on H200 (1 -> 2 GPUs, mb 1, benchmarks/results/gpu-h200-overlap-fit.csv):
     * 0.61, i.e. ~40% of the collectives' time is lost to compute */
    m->overlap = 0.6;
    m->mem_gbs = 3350 * 0.8;
    m->capacity_gib = 76; /* 79.6 GiB usable, minus CUDA context, NCCL buffers, slack */
    m->peak_tflops = 989;
}

static int preset_job(job *j, const char *preset, int seq, int micro, int global) {
    memset(j, 0, sizeof *j);
    if (llama_preset(preset, &j->mc) != 0) return -1;
    snprintf(j->name, sizeof j->name, "%s", preset);
    j->seq = seq > 0 ? seq : j->mc.max_seq_len;
    j->micro = micro > 0 ? micro : 1;
    j->global = global;
    j->strategy = FSDP_FULL_SHARD;
    j->ac = LLAMA_AC_NONE;
    j->act = SHLM_BF16;
    j->reduce = SHLM_F32;
    j->param_bf16 = 1;
    j->prefetch = 1;
    return 0;
}

/* Job from a job file and --set overrides, as `shardlm train` resolves it. */
static int file_job(job *j, const char *path, int n_sets, char **sets, const char *backend,
                    char *err, size_t errlen) {
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
    const char *b = backend ? backend : shlm_backend_choice_name(cfg.backend);
    j->act = strcmp(b, "cpu") == 0 ? SHLM_F32 : SHLM_BF16; /* auto: a GPU machine */
    j->param_bf16 = cfg.param_dtype == SHLM_BF16;
    j->reduce = cfg.reduce_dtype;
    j->prefetch = cfg.prefetch;
    j->shard_group_size = cfg.shard_group_size;
    j->ranks_per_node = cfg.ranks_per_node;
    job_config_free(&cfg);
    return 0;
}

static void apply_job_flags(job *j, const args *a) {
    if (a->seq > 0) j->seq = a->seq;
    if (a->micro > 0) j->micro = a->micro;
    if (a->global > 0) j->global = a->global;
    if (a->strategy) strategy_from_name(a->strategy, &j->strategy, NULL, 0);
    if (a->ac) j->ac = strcmp(a->ac, "full") == 0        ? LLAMA_AC_FULL
                       : strcmp(a->ac, "selective") == 0 ? LLAMA_AC_SELECTIVE
                                                         : LLAMA_AC_NONE;
    if (a->param_dtype) j->param_bf16 = strcmp(a->param_dtype, "bf16") == 0;
    if (a->reduce_dtype) j->reduce = strcmp(a->reduce_dtype, "bf16") == 0 ? SHLM_BF16 : SHLM_F32;
    if (a->backend) j->act = strcmp(a->backend, "cpu") == 0 ? SHLM_F32 : SHLM_BF16;
    if (a->no_prefetch) j->prefetch = 0;
    if (a->shard_group_size > 0) j->shard_group_size = a->shard_group_size;
}

/* ------------------------------------------------------------------ host measurement */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* AdamW ns/param and streaming GB/s of this host's cpu backend on one thread: what the
 * 1-thread ranks of the CPU suite pay for their optimizer and buffer traffic. */
static void measure_host(double *opt_ns, double *mem_gbs) {
    const size_t n = (size_t)8 << 20;
    float *p = calloc(n, 4), *g = calloc(n, 4), *m1 = calloc(n, 4), *v = calloc(n, 4);
    if (!p || !g || !m1 || !v) {
        fprintf(stderr, "perf_model: error: out of memory measuring the host\n");
        exit(1);
    }
    shlm_cpu_set_threads(1);
    for (size_t i = 0; i < n; i++) g[i] = 1e-3f * (float)(i % 97);
    double best = 1e30, bestm = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        shlm_ops_cpu.adamw(p, g, m1, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, r + 1);
        double t1 = now_s();
        shlm_ops_cpu.accumulate(p, g, n);
        double t2 = now_s();
        if (t1 - t0 < best) best = t1 - t0;
        if (t2 - t1 < bestm) bestm = t2 - t1;
    }
    *opt_ns = 1e9 * best / (double)n;
    *mem_gbs = 12.0 * (double)n / bestm / 1e9; /* y += x: read 8, write 4 bytes */
    free(p);
    free(g);
    free(m1);
    free(v);
}

/* ------------------------------------------------------------------ calibration */

typedef struct point {
    int ranks, threads, cores, global;
    char strategy[32], backend[16], job[512], sets[1024], file[256];
    double step_ms, exposed_ms, tokens_per_s;
    double rate;            /* tokens/s of one rank, from its 1-rank row */
    const struct point *one; /* that row */
    job j;
    prediction p;
} point;

enum { MAX_POINTS = 128 };

/* A measured run replayed: all its ranks on one host unless the job splits them into
 * nodes (runtime.ranks_per_node); every rank shares that host's cores. */
static void predict_point(const point *p, machine *m, prediction *out) {
    int G = p->j.ranks_per_node > 0 ? p->j.ranks_per_node : p->ranks;
    m->gpus_per_node = G;
    m->host_ranks = p->ranks;
    m->cores = strcmp(p->backend, "cpu") == 0 ? p->cores : 0;
    m->threads = p->threads;
    m->tokens_per_s = p->rate;
    predict(&p->j, m, p->ranks / G, 0, out);
}

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
    enum { WS, ST, MS, EX, TPS, TH, CO, BE, JOB, SETS, GB, NC };
    static const char *const names[NC] = {"world_size", "strategy", "step_ms", "comm_exposed_ms",
                                          "tokens_per_s", "threads", "host_cores", "backend",
                                          "job", "overrides", "global_batch"};
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
    while (n < MAX_POINTS && fgets(line, sizeof line, f)) {
        if (csv_fields(line, fl, 64) < nh) continue;
        point *p = &pts[n];
        memset(p, 0, sizeof *p);
        p->ranks = atoi(fl[c[WS]]);
        snprintf(p->strategy, sizeof p->strategy, "%s", fl[c[ST]]);
        p->step_ms = atof(fl[c[MS]]);
        p->exposed_ms = c[EX] >= 0 ? atof(fl[c[EX]]) : 0;
        p->tokens_per_s = c[TPS] >= 0 ? atof(fl[c[TPS]]) : 0;
        p->threads = c[TH] >= 0 ? atoi(fl[c[TH]]) : 0;
        p->cores = c[CO] >= 0 ? atoi(fl[c[CO]]) : 0;
        p->global = atoi(fl[c[GB]]);
        snprintf(p->backend, sizeof p->backend, "%s", c[BE] >= 0 ? fl[c[BE]] : "cuda");
        snprintf(p->job, sizeof p->job, "%s", fl[c[JOB]]);
        snprintf(p->sets, sizeof p->sets, "%s", c[SETS] >= 0 ? fl[c[SETS]] : "");
        snprintf(p->file, sizeof p->file, "%s", path);
        /* the job as the run resolved it: its overrides, then batch and strategy */
        char *sv[80], setbuf[1024], gb[64], st[64], err[1024];
        int ns = 0;
        snprintf(setbuf, sizeof setbuf, "%s", p->sets);
        for (char *save = NULL, *t = strtok_r(setbuf, " ", &save); t && ns < 70;
             t = strtok_r(NULL, " ", &save))
            if (strncmp(t, "train.global_batch=", 19) != 0 && strncmp(t, "fsdp.strategy=", 14) != 0)
                sv[ns++] = t; /* set below from the row's own columns */
        snprintf(gb, sizeof gb, "train.global_batch=%d", p->global);
        snprintf(st, sizeof st, "fsdp.strategy=%s", p->strategy);
        sv[ns++] = gb;
        sv[ns++] = st;
        if (file_job(&p->j, p->job, ns, sv, strcmp(p->backend, "cpu") == 0 ? "cpu" : "cuda", err,
                     sizeof err) != 0) {
            fprintf(stderr, "perf_model: error: %s row %d: %s\n", path, n + 1, err);
            fclose(f);
            return -1;
        }
        n++;
    }
    fclose(f);
    return n;
}

/* Sum of squared relative step errors over the rows at `ranks` ranks. */
static double fit_error(point *pts, int n, int ranks, machine *m, int *used) {
    double e2 = 0;
    *used = 0;
    for (int i = 0; i < n; i++) {
        if (pts[i].ranks != ranks || !pts[i].one) continue;
        prediction p;
        predict_point(&pts[i], m, &p);
        double e = (p.step_ms - pts[i].step_ms) / pts[i].step_ms;
        e2 += e * e;
        (*used)++;
    }
    return e2;
}

static int calibrate(const args *a, machine *m) {
    static point pts[MAX_POINTS];
    int n = 0;
    for (int k = 0; k < a->n_csv; k++)
        if ((n = read_csv(a->csv[k], pts, n)) < 0) return 2;
    if (n == 0) {
        fprintf(stderr, "perf_model: error: no rows to calibrate against\n");
        return 2;
    }
    if (a->measure_host) {
        measure_host(&m->opt_ns, &m->mem_gbs);
        printf("# host measured: AdamW %.3f ns/param, y += x %.1f GB/s (cpu backend, 1 thread)\n",
               m->opt_ns, m->mem_gbs);
    }
    /* without link figures only measured collectives can be replayed */
    measured_only = m->intra_gbs <= 0;
    printf("# shardlm perf_model: calibration against %d measured run(s)\n", n);

    /* each job's 1-rank row gives its compute rate: one rank has no communication, so
     * its step is accum x micro-batch + the fixed costs the replay knows */
    for (int i = 0; i < n; i++) {
        point *p = &pts[i];
        for (int k = 0; k < n; k++) {
            const point *q = &pts[k];
            if (q->ranks != 1 || strcmp(q->job, p->job) != 0 || strcmp(q->sets, p->sets) != 0)
                continue;
            if (!p->one || (strcmp(q->strategy, p->strategy) == 0 &&
                            strcmp(p->one->strategy, p->strategy) != 0))
                p->one = q;
        }
    }
    for (int i = 0; i < n; i++) {
        point *p = &pts[i];
        if (p->ranks != 1 || p->one != p) continue;
        machine z = *m;
        z.overlap = 1;
        point probe = *p;
        probe.rate = 1e30; /* compute ~ 0: what remains is the fixed part */
        prediction p0;
        predict_point(&probe, &z, &p0);
        double t_mb = (p->step_ms - p0.step_ms) / p0.accum;
        p->rate = (double)p->j.micro * p->j.seq / (t_mb * 1e-3);
        printf("# rate of %s %s [%s]: 1-rank step %.3f ms = %d micro-batch(es) x %.3f ms + %.3f "
               "ms fixed (zeroing, norm, optimizer) -> %.1f tokens/s per rank\n", p->j.name,
               p->strategy, p->sets, p->step_ms, p0.accum, t_mb, p0.step_ms, p->rate);
    }
    for (int i = 0; i < n; i++)
        if (pts[i].one) pts[i].rate = pts[i].one->rate;

    /* overlap: given, or the value that best fits the rows at --fit-at ranks */
    int fit = m->overlap < 0;
    if (fit) {
        double best = 1e30, best_f = 1;
        int used = 0;
        for (int k = 0; k <= 100; k++) {
            machine t = *m;
            t.overlap = k / 100.0;
            double e2 = fit_error(pts, n, a->fit_at, &t, &used);
            if (used && e2 < best) {
                best = e2;
                best_f = t.overlap;
            }
        }
        m->overlap = best_f;
        if (used)
            printf("# overlap fitted on the %d-rank rows: %.2f (least squares of the step-time "
                   "error, 0.01 grid)\n", a->fit_at, m->overlap);
        else
            printf("# no %d-rank rows to fit the overlap on: overlap 1\n", a->fit_at);
        fit = used > 0;
    }
    machine shown = *m;
    const point *first = NULL;
    for (int i = 0; i < n && !first; i++)
        if (pts[i].one) first = &pts[i];
    if (first) {
        prediction tmp;
        predict_point(first, &shown, &tmp); /* sets the machine fields of that run */
        print_inputs(&first->j, &shown);
    }
    printf("#\n# %6s %14s %12s %10s %10s %8s %10s %10s %10s %12s %12s %8s %9s\n", "ranks",
           "strategy", "model", "step", "step", "error", "exposed", "exposed", "comm",
           "tokens/s", "tokens/s", "error", "role");
    printf("# %6s %14s %12s %10s %10s %8s %10s %10s %10s %12s %12s %8s %9s\n", "(N)", "", "",
           "meas (ms)", "model (ms)", "(%)", "meas (ms)", "model (ms)", "model (ms)",
           "meas (1/s)", "model (1/s)", "(%)", "");
    double worst = 0;
    for (int i = 0; i < n; i++) {
        point *p = &pts[i];
        if (!p->one) {
            printf("  %6d %14s %12s  (no 1-rank row of this job: no compute rate)\n", p->ranks,
                   p->strategy, p->j.name);
            continue;
        }
        machine t = *m;
        predict_point(p, &t, &p->p);
        double e = 100 * (p->p.step_ms - p->step_ms) / p->step_ms;
        double et = p->tokens_per_s > 0 ? 100 * (p->p.tokens_per_s - p->tokens_per_s) / p->tokens_per_s : 0;
        const char *role = p == p->one ? "rate" : (fit && p->ranks == a->fit_at) ? "fit" : "predicted";
        if (p != p->one && fabs(e) > worst) worst = fabs(e);
        printf("  %6d %14s %12s %10.2f %10.2f %+8.1f %10.2f %10.2f %10.2f %12.1f %12.1f %+8.1f %9s\n",
               p->ranks, p->strategy, p->j.name, p->step_ms, p->p.step_ms, e, p->exposed_ms,
               p->p.exposed_ms, p->p.comm_ms, p->tokens_per_s, p->p.tokens_per_s, et, role);
    }
    printf("# rate: the row a job's compute rate comes from (0 by construction); fit: rows the "
           "overlap was fitted on; predicted: held out\n");
    printf("# largest step-time error outside the rate rows: %.1f%%\n", worst);
    if (a->max_error > 0 && worst > a->max_error) {
        fprintf(stderr, "perf_model: FAILED: error %.1f%% is over --max-error %.1f%%\n", worst,
                a->max_error);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ scenario */

/* Efficiency at `nodes` against the fewest nodes of {1,2,4,8,16} that fit, or -1. */
static double efficiency_at(const job *j, const machine *m, int nodes, int weak) {
    const int counts[] = {1, 2, 4, 8, 16};
    prediction base = {0}, p;
    int have = 0;
    for (int k = 0; k < 5 && !have; k++) {
        predict(j, m, counts[k], weak, &base);
        have = base.accum > 0 && base.fits;
    }
    predict(j, m, nodes, weak, &p);
    if (!have || !p.fits || p.accum == 0) return -1;
    return weak ? base.step_ms / p.step_ms : base.step_ms * base.ranks / (p.ranks * p.step_ms);
}

static void print_pct(double e) {
    if (e < 0) printf(" %12s", "(no fit)");
    else printf(" %12.1f", 100 * e);
}

static int scenario(const args *a, machine *m) {
    static const struct { const char *preset; int micro; } models[] = {
        {"llama2-7b", 2}, {"llama2-13b", 2}, {"llama2-70b", 1}};
    const int nodes[] = {1, 2, 4, 8, 16};
    printf("# shardlm perf_model: scenario p5-h100 — Llama-2 on 1-16 nodes of 8x H100 SXM 80GB,"
           " 3200 Gbit/s EFA per node\n");
    printf("# assumptions: compute %.0f model TFLOP/s per GPU at seq 4096 with full activation "
           "checkpointing (PyTorch FSDP2 measured 406 on one H200, 7B mb 8 full AC; shardlm's "
           "micro-batch compute measured 543 without AC on one H200, i.e. ~410 with AC's +33%%;\n"
           "#   H100 has the H200's bf16 peak and 70%% of its HBM bandwidth: a few %% less); "
           "without AC %.0f (shardlm's 543 less 5%%);\n"
           "#   intra-node busbw %.0f GB/s (NVSwitch, 450 GB/s/direction line); "
           "inter-node %.0f GB/s per node (400 GB/s line x 0.75); ring step %.0f us in a node, "
           "%.0f us across;\n#   overlap %.2f (fitted on shardlm's 7B 1 -> 2 H200 points: the "
           "SM share NCCL takes from compute); %.0f GiB usable per GPU;\n#   global batch 1024 x "
           "4096 tokens (4M, Llama-2's batch), bf16 params, fp32 gradient reduction, FULL_SHARD "
           "over all GPUs, prefetch on\n", m->tflops, NO_AC_TFLOPS, m->intra_gbs, m->inter_gbs,
           m->intra_lat_us, m->inter_lat_us, m->overlap, m->capacity_gib);
    double eff16[3][2];
    for (int i = 0; i < 3; i++) {
        job j;
        preset_job(&j, models[i].preset, 4096, models[i].micro, 1024);
        j.ac = LLAMA_AC_FULL;
        apply_job_flags(&j, a);
        printf("#\n# ---- %s, strong scaling (fixed global batch) ----\n", j.name);
        print_inputs(&j, m);
        eff16[i][0] = sweep(&j, m, nodes, 5, 0);
        printf("# ---- %s, weak scaling (1 micro-batch per GPU per step) ----\n", j.name);
        eff16[i][1] = sweep(&j, m, nodes, 5, 1);
    }
    printf("#\n# 16 nodes (128 GPUs): predicted scaling efficiency vs the AWS figure (strong: "
           "against the fewest nodes that fit, global batch fixed; weak: one micro-batch per GPU)\n");
    printf("# %12s %12s %12s %12s %12s %26s\n", "model", "strong AC", "weak AC", "strong noAC",
           "weak noAC", "AWS PyTorch FSDP, p5");
    printf("# %12s %12s %12s %12s %12s %26s\n", "", "(%)", "(%)", "(%)", "(%)", "(%)");
    for (int i = 0; i < 3; i++) {
        job j;
        preset_job(&j, models[i].preset, 4096, models[i].micro, 1024);
        apply_job_flags(&j, a);
        j.ac = LLAMA_AC_NONE;
        machine t = *m;
        t.tflops = NO_AC_TFLOPS;
        printf("  %12s", models[i].preset);
        print_pct(eff16[i][0]);
        print_pct(eff16[i][1]);
        print_pct(efficiency_at(&j, &t, 16, 0));
        print_pct(efficiency_at(&j, &t, 16, 1));
        printf(" %26s\n", "87 (16 nodes, Llama-2)");
    }
    printf("# AWS: \"Scale LLMs with PyTorch 2.0 FSDP on Amazon EKS - Part 2\" (AWS ML blog with "
           "Meta's PyTorch team): 87%% scaling efficiency for FSDP Llama-2 fine-tuning on 16 "
           "p5.48xlarge;\n#   its model size, batch and baseline are not given with that "
           "figure, so the comparison is of kind, not of configuration\n");

    /* what the answer depends on: tokens per micro-batch set the compute each gather
     * hides behind (fine-tuning runs often use short sequences and one per GPU) */
    printf("#\n# sensitivity at 16 nodes: llama2-7b efficiency (%%) by tokens per micro-batch "
           "(strong: global batch 1024 sequences; weak: one micro-batch per GPU)\n");
    printf("# %8s %8s %10s %12s %12s %14s\n", "micro", "seq", "tokens/mb", "strong (%)",
           "weak (%)", "exposed@16 (ms)");
    const int shapes[][2] = {{2, 4096}, {1, 4096}, {1, 2048}, {1, 1024}, {1, 512}};
    for (int i = 0; i < 5; i++) {
        job j;
        preset_job(&j, "llama2-7b", shapes[i][1], shapes[i][0], 1024);
        j.ac = LLAMA_AC_FULL;
        double e[2], ex = 0;
        for (int w = 0; w < 2; w++) {
            prediction b, p;
            predict(&j, m, 1, w, &b);
            predict(&j, m, 16, w, &p);
            e[w] = w ? b.step_ms / p.step_ms : b.step_ms * b.ranks / (p.ranks * p.step_ms);
            if (w) ex = p.exposed_ms;
        }
        printf("  %8d %8d %10d %12.1f %12.1f %14.2f\n", shapes[i][0], shapes[i][1],
               shapes[i][0] * shapes[i][1], 100 * e[0], 100 * e[1], ex);
    }
    printf("# (the compute rate is kept at the seq-4096 figure, so shorter rows are optimistic "
           "about compute and the efficiency they show is an upper bound)\n");

    /* how much the answer depends on the two least certain inputs */
    printf("#\n# sensitivity at 16 nodes, strong scaling: efficiency (%%) by inter-node "
           "efficiency (rows) x overlap (columns)\n");
    const double effs[] = {0.5, 0.75, 1.0}, ovs[] = {0.2, 0.6, 1.0};
    printf("# %12s %9s %8s %8s %8s\n", "model", "inter-eff", "ov 0.2", "ov 0.6", "ov 1.0");
    for (int i = 0; i < 3; i++) {
        job j;
        preset_job(&j, models[i].preset, 4096, models[i].micro, 1024);
        j.ac = LLAMA_AC_FULL;
        apply_job_flags(&j, a);
        for (int r = 0; r < 3; r++) {
            printf("  %12s %9.2f", models[i].preset, effs[r]);
            for (int c = 0; c < 3; c++) {
                machine t = *m;
                t.inter_gbs = 400 * effs[r];
                t.overlap = ovs[c];
                prediction base = {0}, p16;
                int bn = 0;
                for (int k = 0; k < 5 && !bn; k++) {
                    predict(&j, &t, nodes[k], 0, &base);
                    if (base.fits && base.accum > 0) bn = nodes[k];
                }
                predict(&j, &t, 16, 0, &p16);
                double e = bn ? base.step_ms * base.ranks / (p16.ranks * p16.step_ms) : NAN;
                printf(" %8.1f", 100 * e);
            }
            printf("\n");
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    args a = {.fit_at = 2};
    machine m = {.gpus_per_node = 8, .intra_lat_us = 3, .inter_lat_us = 12, .overlap = -1,
                 .mem_gbs = 2680, .peak_tflops = device_table_by_short_name("h200")->bf16_tflops};
    double inter_gbit = 0, inter_eff = 0.75;
    int overlap_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(o, "--weak")) { a.weak = 1; continue; }
        if (!strcmp(o, "--no-prefetch")) { a.no_prefetch = 1; continue; }
        if (!strcmp(o, "--measure-host")) { a.measure_host = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "perf_model: error: %s: unknown option or missing value (see --help)\n", o);
            return 2;
        }
        const char *v = argv[++i];
        char err[512];
        if (!strcmp(o, "--job")) a.job_path = v;
        else if (!strcmp(o, "--set")) { if (a.n_sets < 64) a.sets[a.n_sets++] = (char *)v; }
        else if (!strcmp(o, "--model")) a.model = v;
        else if (!strcmp(o, "--calibrate")) { if (a.n_csv < 8) a.csv[a.n_csv++] = v; }
        else if (!strcmp(o, "--scenario")) a.scenario = v;
        else if (!strcmp(o, "--strategy")) {
            fsdp_strategy s;
            if (strategy_from_name(v, &s, err, sizeof err) != 0) {
                fprintf(stderr, "perf_model: error: %s\n", err);
                return 2;
            }
            a.strategy = v;
        } else if (!strcmp(o, "--ac")) a.ac = v;
        else if (!strcmp(o, "--param-dtype")) a.param_dtype = v;
        else if (!strcmp(o, "--reduce-dtype")) a.reduce_dtype = v;
        else if (!strcmp(o, "--backend")) a.backend = v;
        else if (!strcmp(o, "--nodes")) {
            a.n_nodes = parse_list(v, a.nodes, 32);
            if (a.n_nodes < 1) {
                fprintf(stderr, "perf_model: error: --nodes takes a list like 1,2,4\n");
                return 2;
            }
        } else if (!strcmp(o, "--seq")) a.seq = atoi(v);
        else if (!strcmp(o, "--micro-batch")) a.micro = atoi(v);
        else if (!strcmp(o, "--global-batch")) a.global = atoi(v);
        else if (!strcmp(o, "--accum")) a.accum = atoi(v);
        else if (!strcmp(o, "--shard-group-size")) a.shard_group_size = atoi(v);
        else if (!strcmp(o, "--fit-at")) a.fit_at = atoi(v);
        else if (!strcmp(o, "--max-error")) a.max_error = atof(v);
        else if (!strcmp(o, "--gpus-per-node")) m.gpus_per_node = atoi(v);
        else if (!strcmp(o, "--tflops")) m.tflops = atof(v);
        else if (!strcmp(o, "--tokens-per-s")) m.tokens_per_s = atof(v);
        else if (!strcmp(o, "--intra-gbs")) m.intra_gbs = atof(v);
        else if (!strcmp(o, "--inter-gbs")) m.inter_gbs = atof(v);
        else if (!strcmp(o, "--inter-gbit")) inter_gbit = atof(v);
        else if (!strcmp(o, "--inter-eff")) inter_eff = atof(v);
        else if (!strcmp(o, "--intra-lat-us")) m.intra_lat_us = atof(v);
        else if (!strcmp(o, "--inter-lat-us")) m.inter_lat_us = atof(v);
        else if (!strcmp(o, "--overlap")) { m.overlap = atof(v); overlap_given = 1; }
        else if (!strcmp(o, "--mem-gbs")) m.mem_gbs = atof(v);
        else if (!strcmp(o, "--opt-ns-per-param")) m.opt_ns = atof(v);
        else if (!strcmp(o, "--mem-gib")) m.capacity_gib = atof(v);
        else if (!strcmp(o, "--cores")) m.cores = atoi(v);
        else if (!strcmp(o, "--threads")) m.threads = atoi(v);
        else if (!strcmp(o, "--peak-tflops")) m.peak_tflops = atof(v);
        else if (!strcmp(o, "--comm-json")) {
            if (load_comm_json(v, err, sizeof err) != 0) {
                fprintf(stderr, "perf_model: error: %s\n", err);
                return 2;
            }
        } else {
            fprintf(stderr, "perf_model: error: unknown option %s (see --help)\n", o);
            return 2;
        }
    }
    if (m.gpus_per_node < 1 || (overlap_given && (m.overlap < 0 || m.overlap > 1))) {
        fprintf(stderr, "perf_model: error: --gpus-per-node >= 1 and 0 <= --overlap <= 1\n");
        return 2;
    }
    if (a.n_csv > 0) return calibrate(&a, &m);

    if (a.scenario) {
        if (strcmp(a.scenario, "p5-h100") != 0) {
            fprintf(stderr, "perf_model: error: the only scenario is p5-h100\n");
            return 2;
        }
        machine d = m;
        scenario_p5(&m);
        /* flags given on the command line still win */
        if (d.tflops > 0) m.tflops = d.tflops;
        if (d.intra_gbs > 0) m.intra_gbs = d.intra_gbs;
        if (d.inter_gbs > 0) m.inter_gbs = d.inter_gbs;
        if (inter_gbit > 0) m.inter_gbs = inter_gbit / 8 * inter_eff;
        if (overlap_given) m.overlap = d.overlap;
        if (d.capacity_gib > 0) m.capacity_gib = d.capacity_gib;
        return scenario(&a, &m);
    }

    if (inter_gbit > 0) m.inter_gbs = inter_gbit / 8 * inter_eff;
    if (!overlap_given) m.overlap = 1;
    if (m.tflops <= 0 && m.tokens_per_s <= 0) {
        fprintf(stderr, "perf_model: error: give the single-GPU compute rate (--tflops or "
                "--tokens-per-s), or use --calibrate or --scenario\n");
        return 2;
    }
    if ((m.intra_gbs <= 0 || m.inter_gbs <= 0) && n_curves == 0) {
        fprintf(stderr, "perf_model: error: give --intra-gbs and --inter-gbs (or --inter-gbit), "
                "or measured curves with --comm-json\n");
        return 2;
    }
    job j;
    char err[1536];
    if (a.job_path) {
        if (file_job(&j, a.job_path, a.n_sets, a.sets, a.backend, err, sizeof err) != 0) {
            fprintf(stderr, "perf_model: error: %s\n", err);
            return 2;
        }
    } else if (!a.model || preset_job(&j, a.model, a.seq, a.micro, a.global) != 0) {
        fprintf(stderr, "perf_model: error: give --job JOB.ini or --model one of: %s\n",
                llama_preset_names());
        return 2;
    }
    apply_job_flags(&j, &a);
    if (j.global <= 0) j.global = j.micro * m.gpus_per_node * (a.n_nodes ? a.nodes[a.n_nodes - 1] : 16);
    if (a.n_nodes == 0) {
        const int def[] = {1, 2, 4, 8, 16};
        memcpy(a.nodes, def, sizeof def);
        a.n_nodes = 5;
    }
    printf("# shardlm perf_model: %s on %d GPU(s) per node\n", j.name, m.gpus_per_node);
    print_inputs(&j, &m);
    sweep(&j, &m, a.nodes, a.n_nodes, a.weak ? (a.accum > 0 ? a.accum : 1) : 0);
    return 0;
}
