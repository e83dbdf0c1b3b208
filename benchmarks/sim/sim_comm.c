/* The simulated comm backend (sim.h): collectives occupy their group's timeline for a
 * modelled time and move no data; counters follow comm.h's definitions exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "benchmarks/sim/sim.h"

struct shlm_comm_group {
    sim_group_shape shape;
    double free_us; /* when this group's timeline is next free */
    long delay_us;  /* set_delay_us: -1 follows the backend-wide value */
    shlm_comm_stats stats;
};

struct shlm_comm_req {
    double end_us;
    shlm_comm_group *g; /* whose blocked_ns the wait adds to */
};

static sim_network net;
static long delay_all_us;

enum { MAX_BOUND = 16, MAX_CURVES = 64, MAX_POINTS = 64 };
static struct {
    MPI_Comm comm;
    sim_group_shape shape;
} bound[MAX_BOUND];
static int n_bound;

/* every group is tracked so drain() can find the last end */
static shlm_comm_group *groups[MAX_BOUND];
static int n_groups;

/* ------------------------------------------------------------------ measured curves */

/* bench_comm --json: one op, dtype and group size, measured with `ranks` ranks running */
typedef struct curve {
    shlm_comm_op op;
    shlm_dtype dt;
    int S, ranks, n;
    double size[MAX_POINTS], us[MAX_POINTS];
} curve;
static curve curves[MAX_CURVES];
static int n_curves;

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (txt && fread(txt, 1, (size_t)len, f) != (size_t)len) {
        free(txt);
        txt = NULL;
    }
    fclose(f);
    if (txt) txt[len] = 0;
    return txt;
}

int sim_comm_load_curves(const char *path, char *err, size_t errlen) {
    char *txt = read_text(path);
    if (!txt) {
        snprintf(err, errlen, "cannot read %s", path);
        return -1;
    }
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *res = cJSON_GetObjectItem(root, "results"), *gs = cJSON_GetObjectItem(root, "group_size");
    cJSON *rk = cJSON_GetObjectItem(root, "ranks");
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
        for (int k = 0; k < SHLM_COMM_N_OPS; k++)
            if (strcmp(op, shlm_comm_op_name((shlm_comm_op)k)) == 0) o = k;
        if (o < 0) continue;
        shlm_dtype d = strcmp(dt, "bf16") == 0 ? SHLM_BF16 : SHLM_F32;
        int ranks = cJSON_IsNumber(rk) ? rk->valueint : gs->valueint;
        curve *c = NULL;
        for (int k = 0; k < n_curves && !c; k++)
            if (curves[k].op == (shlm_comm_op)o && curves[k].dt == d && curves[k].S == gs->valueint &&
                curves[k].ranks == ranks)
                c = &curves[k];
        if (!c) {
            if (n_curves == MAX_CURVES) break;
            c = &curves[n_curves++];
            *c = (curve){.op = (shlm_comm_op)o, .dt = d, .S = gs->valueint, .ranks = ranks};
        }
        if (c->n < MAX_POINTS) {
            c->size[c->n] = sz->valuedouble;
            c->us[c->n] = us->valuedouble;
            c->n++;
        }
    }
    cJSON_Delete(root);
    return 0;
}

/* The curve for (op, dt, S), preferring one measured with the job's rank count (groups
 * that share the machine shared it in the benchmark too). */
static const curve *find_curve(shlm_comm_op op, shlm_dtype dt, int S, int ranks) {
    const curve *best = NULL;
    for (int k = 0; k < n_curves; k++) {
        const curve *c = &curves[k];
        if (c->op != op || c->dt != dt || c->S != S || c->n == 0) continue;
        if (!best || (c->ranks == ranks && best->ranks != ranks)) best = c;
    }
    return best;
}

/* Log-log interpolation; below the smallest size its time (latency-bound), above the
 * largest the largest point's bandwidth. Sizes are ascending in the file. */
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

/* ------------------------------------------------------------------ cost */

/* comm.h's bus factor: the share of `bytes` a rank sends under a ring algorithm */
static double bus_factor(shlm_comm_op op, int S) {
    if (S <= 1) return 0;
    if (op == SHLM_COMM_ALL_REDUCE) return 2.0 * (S - 1) / S;
    if (op == SHLM_COMM_BROADCAST) return 1;
    return (double)(S - 1) / S;
}

double sim_comm_us(shlm_comm_op op, shlm_dtype dt, double bytes, sim_group_shape g) {
    if (g.size <= 1 || bytes <= 0) return 0;
    const curve *c = find_curve(op, dt, g.size, g.ranks);
    if (c) return curve_us(c, bytes);
    /* a ring: with p of the group's ranks per node, (p-1) of every p hops stay inside the
     * node, and the node's network links are shared by the groups that cross from it */
    const int crosses = g.size > g.per_node;
    double bw = net.intra.busbw_gbs, hop = net.intra.hop_us, base = net.intra.base_us;
    if (crosses) {
        double nic = net.inter.busbw_gbs / (g.sharing > 0 ? g.sharing : 1);
        bw = nic < bw ? nic : bw;
        hop = ((g.per_node - 1) * net.intra.hop_us + net.inter.hop_us) / g.per_node;
        base = net.inter.base_us;
    }
    if (bw <= 0) {
        fprintf(stderr, "perf_model: error: no bandwidth for a group of %d ranks (%s): give link "
                "figures or a bench_comm curve of that group size\n", g.size, crosses ? "across nodes" : "in a node");
        exit(1);
    }
    double steps = op == SHLM_COMM_ALL_REDUCE ? 2.0 * (g.size - 1) : g.size - 1;
    if (op == SHLM_COMM_ALL_REDUCE && bytes < 1048576) steps = 2.0 * ceil(log2((double)g.size)); /* a tree */
    return base + steps * hop + bytes * bus_factor(op, g.size) / (bw * 1e3);
}

/* ------------------------------------------------------------------ the table */

void sim_comm_setup(const sim_network *n) {
    net = *n;
    n_bound = 0;
    n_groups = 0;
    delay_all_us = 0;
}

void sim_comm_bind(MPI_Comm comm, sim_group_shape shape) {
    if (n_bound == MAX_BOUND) {
        fprintf(stderr, "perf_model: error: more than %d simulated groups\n", MAX_BOUND);
        exit(1);
    }
    bound[n_bound].comm = comm;
    bound[n_bound].shape = shape;
    n_bound++;
}

static int sim_available(void) { return 1; }

static shlm_comm_group *sim_group_create(MPI_Comm comm) {
    for (int i = 0; i < n_bound; i++) {
        if (bound[i].comm != comm) continue;
        shlm_comm_group *g = calloc(1, sizeof *g);
        if (!g || n_groups == MAX_BOUND) {
            fprintf(stderr, "perf_model: error: cannot make a simulated group\n");
            exit(1);
        }
        g->shape = bound[i].shape;
        g->delay_us = -1;
        groups[n_groups++] = g;
        return g;
    }
    fprintf(stderr, "perf_model: error: group_create on a communicator not bound by sim_comm_bind\n");
    exit(1);
}

static void sim_group_free(shlm_comm_group *g) {
    for (int i = 0; i < n_groups; i++)
        if (groups[i] == g) groups[i] = groups[--n_groups];
    free(g);
}

static int sim_group_rank(const shlm_comm_group *g) { (void)g; return 0; }
static int sim_group_size(const shlm_comm_group *g) { return g->shape.size; }

/* Starts a collective: counted as comm.h says, placed on the group's timeline. */
static shlm_comm_req *issue(shlm_comm_group *g, shlm_comm_op op, size_t count, shlm_dtype dt) {
    const int S = g->shape.size;
    const uint64_t es = shlm_dtype_size(dt);
    const uint64_t bytes = (op == SHLM_COMM_ALL_GATHER || op == SHLM_COMM_REDUCE_SCATTER)
                               ? (uint64_t)S * count * es : count * es;
    uint64_t wire = 0;
    if (S > 1) {
        if (op == SHLM_COMM_ALL_REDUCE) wire = bytes / (uint64_t)S * 2 * (uint64_t)(S - 1);
        else if (op == SHLM_COMM_BROADCAST) wire = bytes;
        else wire = bytes / (uint64_t)S * (uint64_t)(S - 1);
    }
    g->stats.calls[op]++;
    g->stats.bytes[op] += bytes;
    g->stats.wire[op] += wire;
    double us = sim_comm_us(op, dt, (double)bytes, g->shape);
    double start = sim_now.compute_us > g->free_us ? sim_now.compute_us : g->free_us;
    double end = start + us;
    long delay = g->delay_us >= 0 ? g->delay_us : delay_all_us;
    if (delay > 0 && end < sim_now.compute_us + delay) end = sim_now.compute_us + delay;
    g->free_us = end;
    sim_now.comm_us += us;
    sim_now.compute_us += net.contention * us; /* what the collective takes from compute */
    shlm_comm_req *r = malloc(sizeof *r);
    if (!r) {
        fprintf(stderr, "perf_model: error: out of memory\n");
        exit(1);
    }
    r->end_us = end;
    r->g = g;
    return r;
}

static void sim_wait(shlm_comm_req *r) {
    if (!r) return;
    if (r->end_us > sim_now.compute_us) {
        double gap = r->end_us - sim_now.compute_us;
        sim_now.blocked_us += gap;
        r->g->stats.blocked_ns += (uint64_t)(1e3 * gap);
        sim_now.compute_us = r->end_us;
    }
    free(r);
}

static void blocking(shlm_comm_group *g, shlm_comm_op op, size_t count, shlm_dtype dt) {
    sim_wait(issue(g, op, count, dt));
}

static shlm_comm_req *sim_iall_gather(shlm_comm_group *g, const void *s, void *r, size_t n, shlm_dtype dt) {
    (void)s, (void)r;
    return issue(g, SHLM_COMM_ALL_GATHER, n, dt);
}
static shlm_comm_req *sim_ireduce_scatter(shlm_comm_group *g, const void *s, void *r, size_t n,
                                          shlm_dtype dt, shlm_comm_redop op) {
    (void)s, (void)r, (void)op;
    return issue(g, SHLM_COMM_REDUCE_SCATTER, n, dt);
}
static shlm_comm_req *sim_iall_reduce(shlm_comm_group *g, const void *s, void *r, size_t n,
                                      shlm_dtype dt, shlm_comm_redop op) {
    (void)s, (void)r, (void)op;
    return issue(g, SHLM_COMM_ALL_REDUCE, n, dt);
}
static shlm_comm_req *sim_ibroadcast(shlm_comm_group *g, void *b, size_t n, shlm_dtype dt, int root) {
    (void)b, (void)root;
    return issue(g, SHLM_COMM_BROADCAST, n, dt);
}
static void sim_all_gather(shlm_comm_group *g, const void *s, void *r, size_t n, shlm_dtype dt) {
    (void)s, (void)r, blocking(g, SHLM_COMM_ALL_GATHER, n, dt);
}
static void sim_reduce_scatter(shlm_comm_group *g, const void *s, void *r, size_t n, shlm_dtype dt,
                               shlm_comm_redop op) {
    (void)s, (void)r, (void)op, blocking(g, SHLM_COMM_REDUCE_SCATTER, n, dt);
}
static void sim_all_reduce(shlm_comm_group *g, const void *s, void *r, size_t n, shlm_dtype dt,
                           shlm_comm_redop op) {
    (void)s, (void)r, (void)op, blocking(g, SHLM_COMM_ALL_REDUCE, n, dt);
}
static void sim_broadcast(shlm_comm_group *g, void *b, size_t n, shlm_dtype dt, int root) {
    (void)b, (void)root, blocking(g, SHLM_COMM_BROADCAST, n, dt);
}

static int sim_test(shlm_comm_req *r) { return !r || r->end_us <= sim_now.compute_us; }
static int sim_progress(void) { return 0; } /* the clock alone decides completion */

static void sim_set_delay_us(shlm_comm_group *g, long us) {
    if (g) g->delay_us = us;
    else delay_all_us = us;
}
static void sim_stats(const shlm_comm_group *g, shlm_comm_stats *out) { *out = g->stats; }
static void sim_stats_reset(shlm_comm_group *g) { memset(&g->stats, 0, sizeof g->stats); }

void sim_comm_blocking(shlm_comm_op op, double bytes, sim_group_shape shape) {
    double us = sim_comm_us(op, SHLM_F32, bytes, shape);
    sim_now.compute_us += us;
    sim_now.blocked_us += us;
    sim_now.comm_us += us;
}

void sim_comm_drain(void) {
    for (int i = 0; i < n_groups; i++)
        if (groups[i]->free_us > sim_now.compute_us) {
            sim_now.blocked_us += groups[i]->free_us - sim_now.compute_us;
            sim_now.compute_us = groups[i]->free_us;
        }
}

const shlm_comm shlm_comm_sim = {
    .name = "sim", .available = sim_available, .group_create = sim_group_create,
    .group_free = sim_group_free, .group_rank = sim_group_rank, .group_size = sim_group_size,
    .all_gather = sim_all_gather, .reduce_scatter = sim_reduce_scatter,
    .all_reduce = sim_all_reduce, .broadcast = sim_broadcast, .iall_gather = sim_iall_gather,
    .ireduce_scatter = sim_ireduce_scatter, .iall_reduce = sim_iall_reduce,
    .ibroadcast = sim_ibroadcast, .wait = sim_wait, .test = sim_test,
    .progress = sim_progress, .set_delay_us = sim_set_delay_us, .stats = sim_stats,
    .stats_reset = sim_stats_reset};
