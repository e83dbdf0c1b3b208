/* The comm-table benchmark: all-gather, reduce-scatter and all-reduce at FSDP unit
 * sizes over the mpi or nccl backend, printed like nccl-tests, every result checked. */
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/check.h"
#include "kernels/comm.h"
#include "kernels/ops.h"
#include "src/engine/topology.h"

enum { MAX_ITEMS = 8 };

typedef struct options {
    const char *backend;        /* mpi | nccl */
    size_t min_bytes, max_bytes;
    double factor;
    int ops[MAX_ITEMS], n_ops;  /* shlm_comm_op */
    shlm_dtype dts[MAX_ITEMS];
    int n_dts;
    shlm_comm_redop redop;
    int iters, warmup;
    int nonblocking;
    int registered;   /* recv from the comm's gather_buffer_alloc (copy-engine all-gathers) */
    int check;
    const char *group;          /* world | node | replica */
    int ranks_per_node;
    const char *json;
    double min_busbw;           /* GB/s; 0: no threshold */
    int corrupt;                /* tests only: the last rank spoils one result before checking */
} options;

/* One measured row, both placements (0: out of place, 1: in place). */
typedef struct result {
    shlm_comm_op op;
    shlm_dtype dt;
    size_t size, count;
    double time_us[2], algbw[2], busbw[2];
    long long wrong[2];
} result;

static int world_rank, world_size;

static void usage(FILE *out) {
    fprintf(out,
            "usage: bench_comm [options]   (run on every rank: mpirun -np N bench_comm ...)\n"
            "  --backend mpi|nccl        comm backend (nccl: device buffers, rank -> GPU local_rank %% n)\n"
            "  -b, --min-bytes SIZE      smallest collective size, nccl-tests' \"size\" (default 1M)\n"
            "  -e, --max-bytes SIZE      largest (default 1G); SIZE takes K, M, G (powers of 2)\n"
            "  -f, --step-factor F       multiply the size by F each row (default 2)\n"
            "  --op LIST                 all_gather,reduce_scatter,all_reduce (default: all three)\n"
            "  --dtype LIST              fp32,bf16 (default: both)\n"
            "  --redop sum|avg           reduction (default sum)\n"
            "  -n, --iters N             timed iterations (default 20)\n"
            "  -w, --warmup N            untimed iterations first (default 5)\n"
            "  --nonblocking             issue the i* members and wait(), as the FSDP engine does\n"
            "  --registered              receive into the comm's registered gather buffer, as the\n"
            "                            FSDP engine does (nccl: all-gathers on the copy engines)\n"
            "  --group world|node|replica  which groups run (node/replica: every group at once)\n"
            "  --ranks-per-node M        blocks of M ranks are a node (default: real nodes)\n"
            "  -c, --check 0|1           check every result (default 1)\n"
            "  --json FILE               also write the results as JSON (rank 0)\n"
            "  --min-busbw GBPS          exit 1 when the average bus bandwidth is lower\n"
            "  --corrupt                 tests only: spoil one received value on the last rank,\n"
            "                            so the check must count it and the exit status fail\n"
            "Exit status: 0; 1 when a result is wrong or the bandwidth is under --min-busbw;\n"
            "2 on bad arguments.\n");
}

/* Every rank parses the same argv, so every rank fails the same way. */
static int bad_arg(const char *msg, const char *arg) {
    if (world_rank == 0) {
        fprintf(stderr, "bench_comm: error: %s%s%s\n", msg, arg ? " " : "", arg ? arg : "");
        usage(stderr);
    }
    return -1;
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v < 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end != 0) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int parse_int(const char *s, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < lo || v > INT_MAX) return -1;
    *out = (int)v;
    return 0;
}

static int op_from_name(const char *s) {
    for (int op = 0; op <= SHLM_COMM_ALL_REDUCE; op++)
        if (strcmp(s, shlm_comm_op_name((shlm_comm_op)op)) == 0) return op;
    return -1;
}

/* Splits a comma list into items (at most MAX_ITEMS), calling one(item) on each. */
static int parse_list(const char *list, int (*one)(const char *, void *), void *ctx) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (one(t, ctx) != 0) return -1;
    return 0;
}

static int add_op(const char *s, void *ctx) {
    options *o = ctx;
    int op = op_from_name(s);
    if (op < 0 || o->n_ops == MAX_ITEMS) return -1;
    o->ops[o->n_ops++] = op;
    return 0;
}

static int add_dtype(const char *s, void *ctx) {
    options *o = ctx;
    if (o->n_dts == MAX_ITEMS) return -1;
    if (strcmp(s, "fp32") == 0) o->dts[o->n_dts++] = SHLM_F32;
    else if (strcmp(s, "bf16") == 0) o->dts[o->n_dts++] = SHLM_BF16;
    else return -1;
    return 0;
}

/* Returns 0, 1 for --help, -1 on a bad argument. */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.backend = "mpi", .min_bytes = 1u << 20, .max_bytes = 1u << 30, .factor = 2,
                   .redop = SHLM_COMM_SUM, .iters = 20, .warmup = 5, .check = 1,
                   .group = "world"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
        if (strcmp(a, "--registered") == 0) {
            o->registered = 1;
            continue;
        }
        if (strcmp(a, "--nonblocking") == 0 || strcmp(a, "--corrupt") == 0) {
            if (a[2] == 'n') o->nonblocking = 1;
            else o->corrupt = 1;
            continue;
        }
        if (i + 1 >= argc) return bad_arg("missing value after", a);
        const char *v = argv[++i];
        if (strcmp(a, "--backend") == 0) o->backend = v;
        else if (strcmp(a, "-b") == 0 || strcmp(a, "--min-bytes") == 0) {
            if (parse_size(v, &o->min_bytes) != 0) return bad_arg("not a size:", v);
        } else if (strcmp(a, "-e") == 0 || strcmp(a, "--max-bytes") == 0) {
            if (parse_size(v, &o->max_bytes) != 0) return bad_arg("not a size:", v);
        } else if (strcmp(a, "-f") == 0 || strcmp(a, "--step-factor") == 0) {
            o->factor = strtod(v, NULL);
            if (!(o->factor > 1)) return bad_arg("--step-factor must be > 1, not", v);
        } else if (strcmp(a, "--op") == 0) {
            o->n_ops = 0;
            if (parse_list(v, add_op, o) != 0 || o->n_ops == 0)
                return bad_arg("--op takes all_gather,reduce_scatter,all_reduce, not", v);
        } else if (strcmp(a, "--dtype") == 0) {
            o->n_dts = 0;
            if (parse_list(v, add_dtype, o) != 0 || o->n_dts == 0)
                return bad_arg("--dtype takes fp32,bf16, not", v);
        } else if (strcmp(a, "--redop") == 0) {
            if (strcmp(v, "sum") == 0) o->redop = SHLM_COMM_SUM;
            else if (strcmp(v, "avg") == 0) o->redop = SHLM_COMM_AVG;
            else return bad_arg("--redop takes sum or avg, not", v);
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "--iters") == 0) {
            if (parse_int(v, 1, &o->iters) != 0) return bad_arg("--iters needs N >= 1, not", v);
        } else if (strcmp(a, "-w") == 0 || strcmp(a, "--warmup") == 0) {
            if (parse_int(v, 0, &o->warmup) != 0) return bad_arg("--warmup needs N >= 0, not", v);
        } else if (strcmp(a, "-c") == 0 || strcmp(a, "--check") == 0) {
            if (parse_int(v, 0, &o->check) != 0 || o->check > 1) return bad_arg("--check takes 0 or 1, not", v);
        } else if (strcmp(a, "--group") == 0) {
            if (strcmp(v, "world") != 0 && strcmp(v, "node") != 0 && strcmp(v, "replica") != 0)
                return bad_arg("--group takes world, node or replica, not", v);
            o->group = v;
        } else if (strcmp(a, "--ranks-per-node") == 0) {
            if (parse_int(v, 1, &o->ranks_per_node) != 0) return bad_arg("--ranks-per-node needs M >= 1, not", v);
        } else if (strcmp(a, "--json") == 0) o->json = v;
        else if (strcmp(a, "--min-busbw") == 0) o->min_busbw = strtod(v, NULL);
        else return bad_arg("unknown option", a);
    }
    if (o->n_ops == 0)
        for (int op = 0; op <= SHLM_COMM_ALL_REDUCE; op++) o->ops[o->n_ops++] = op;
    if (o->n_dts == 0) {
        o->dts[o->n_dts++] = SHLM_F32;
        o->dts[o->n_dts++] = SHLM_BF16;
    }
    if (o->min_bytes == 0 || o->max_bytes < o->min_bytes)
        return bad_arg("need 0 < --min-bytes <= --max-bytes", NULL);
    return 0;
}

/* ---- data: small integers, so sums are exact in fp32 and in bf16 (to 256 ranks) ---- */

/* What rank r contributes at element i of its send buffer: -1, 0 or 1. */
static float value(int r, size_t i) { return (float)((unsigned)((r + 2 * (i % 3)) % 3)) - 1.0f; }

enum { CHUNK = 1 << 22 }; /* elements staged on the host at a time */

/* Writes value(r, first + k) for k < n into dev (backend memory) at element offset off. */
static void fill(const shlm_ops *ops, void *dev, size_t off, shlm_dtype dt, int r, size_t first,
                 size_t n, void *stage) {
    const size_t es = shlm_dtype_size(dt);
    for (size_t done = 0; done < n; done += CHUNK) {
        size_t m = n - done < CHUNK ? n - done : CHUNK;
        for (size_t k = 0; k < m; k++) {
            float x = value(r, first + done + k);
            if (dt == SHLM_F32) ((float *)stage)[k] = x;
            else ((uint16_t *)stage)[k] = shlm_f32_to_bf16(x);
        }
        ops->to_device((char *)dev + (off + done) * es, stage, m * es);
    }
}

/* The expected result at element j of a reduction's input over S ranks: the sum (or
 * average) of value(q, j), which depends only on j % 3. */
typedef struct reduced { float v[3]; } reduced;
static reduced reduced_values(int S, shlm_comm_redop op, shlm_dtype dt) {
    reduced red;
    for (int m = 0; m < 3; m++) {
        float s = 0;
        for (int q = 0; q < S; q++) s += value(q, (size_t)m);
        if (op == SHLM_COMM_AVG) s /= (float)S; /* fp32 division, as the backends */
        red.v[m] = dt == SHLM_BF16 ? shlm_bf16_to_f32(shlm_f32_to_bf16(s)) : s;
    }
    return red;
}

/* Counts elements of dev[off, off+n) that differ from the expectation: for a gather,
 * value(src_rank, first + k); for a reduction, red[(first + k) % 3]. */
static long long count_wrong(const shlm_ops *ops, const void *dev, size_t off, shlm_dtype dt,
                             size_t n, int src_rank, size_t first, const reduced *red, float tol,
                             void *stage) {
    const size_t es = shlm_dtype_size(dt);
    long long wrong = 0;
    for (size_t done = 0; done < n; done += CHUNK) {
        size_t m = n - done < CHUNK ? n - done : CHUNK;
        ops->to_host(stage, (const char *)dev + (off + done) * es, m * es);
        for (size_t k = 0; k < m; k++) {
            size_t j = first + done + k;
            float want = red ? red->v[j % 3] : value(src_rank, j);
            float got = dt == SHLM_F32 ? ((float *)stage)[k] : shlm_bf16_to_f32(((uint16_t *)stage)[k]);
            float diff = got > want ? got - want : want - got;
            if (!(diff <= tol)) wrong++;
        }
    }
    return wrong;
}

/* ---- one collective ---- */

typedef struct bench {
    const shlm_comm *comm;
    const shlm_ops *ops;
    shlm_comm_group *g;
    int rank, S;            /* within the group */
    void *send, *recv;      /* backend memory, max_bytes each */
    void *stage;            /* host, CHUNK elements of 4 bytes */
    const options *o;
} bench;

/* Issues one collective of `count` elements per rank (in place or not) and waits. */
static void run_once(const bench *b, shlm_comm_op op, shlm_dtype dt, size_t count, int inplace) {
    const size_t es = shlm_dtype_size(dt);
    const shlm_comm *c = b->comm;
    char *send = b->send, *recv = b->recv;
    shlm_comm_req *req = NULL;
    switch (op) {
    case SHLM_COMM_ALL_GATHER: {
        const void *s = inplace ? recv + (size_t)b->rank * count * es : send;
        if (b->o->nonblocking) req = c->iall_gather(b->g, s, recv, count, dt);
        else c->all_gather(b->g, s, recv, count, dt);
        break;
    }
    case SHLM_COMM_REDUCE_SCATTER: {
        char *s = inplace ? recv : send;
        void *r = inplace ? recv + (size_t)b->rank * count * es : recv;
        if (b->o->nonblocking) req = c->ireduce_scatter(b->g, s, r, count, dt, b->o->redop);
        else c->reduce_scatter(b->g, s, r, count, dt, b->o->redop);
        break;
    }
    default: {
        const void *s = inplace ? recv : send;
        if (b->o->nonblocking) req = c->iall_reduce(b->g, s, recv, count, dt, b->o->redop);
        else c->all_reduce(b->g, s, recv, count, dt, b->o->redop);
        break;
    }
    }
    if (req) c->wait(req);
}

/* --corrupt: the last rank overwrites element 0 of its result with a value no
 * collective here produces, as a broken transport would. */
static void spoil(const bench *b, void *dev, size_t off, shlm_dtype dt) {
    if (!b->o->corrupt || b->rank != b->S - 1) return;
    float bad = 1000.0f;
    uint16_t badh = shlm_f32_to_bf16(bad);
    const size_t es = shlm_dtype_size(dt);
    b->ops->to_device((char *)dev + off * es, dt == SHLM_F32 ? (void *)&bad : (void *)&badh, es);
}

/* Fills the inputs, runs once and counts wrong elements on this rank. */
static long long check_once(const bench *b, shlm_comm_op op, shlm_dtype dt, size_t count,
                            int inplace) {
    const int S = b->S, r = b->rank;
    /* bf16 partial sums of integers stay exact to 256; past that allow the rounding */
    const float tol = dt == SHLM_BF16 && S > 256 ? (float)S / 128.0f : 0.0f;
    const reduced red = reduced_values(S, b->o->redop, dt);
    void *stage = b->stage;
    switch (op) {
    case SHLM_COMM_ALL_GATHER: {
        fill(b->ops, inplace ? b->recv : b->send, inplace ? (size_t)r * count : 0, dt, r, 0,
             count, stage);
        run_once(b, op, dt, count, inplace);
        spoil(b, b->recv, 0, dt);
        long long wrong = 0;
        for (int q = 0; q < S; q++)
            wrong += count_wrong(b->ops, b->recv, (size_t)q * count, dt, count, q, 0, NULL, tol,
                                 stage);
        return wrong;
    }
    case SHLM_COMM_REDUCE_SCATTER:
        fill(b->ops, inplace ? b->recv : b->send, 0, dt, r, 0, (size_t)S * count, stage);
        run_once(b, op, dt, count, inplace);
        spoil(b, b->recv, inplace ? (size_t)r * count : 0, dt);
        return count_wrong(b->ops, b->recv, inplace ? (size_t)r * count : 0, dt, count, 0,
                           (size_t)r * count, &red, tol, stage);
    default:
        fill(b->ops, inplace ? b->recv : b->send, 0, dt, r, 0, count, stage);
        run_once(b, op, dt, count, inplace);
        spoil(b, b->recv, 0, dt);
        return count_wrong(b->ops, b->recv, 0, dt, count, 0, 0, &red, tol, stage);
    }
}

/* Mean time of one collective in microseconds, the slowest rank's. */
static double time_op(const bench *b, shlm_comm_op op, shlm_dtype dt, size_t count, int inplace) {
    for (int i = 0; i < b->o->warmup; i++) run_once(b, op, dt, count, inplace);
    b->ops->sync();
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();
    for (int i = 0; i < b->o->iters; i++) run_once(b, op, dt, count, inplace);
    /* nccl: collectives are ordered on the compute stream, so its sync covers them */
    b->ops->sync();
    double us = 1e6 * (MPI_Wtime() - t0) / b->o->iters;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return us;
}

/* nccl-tests' bus factor: what each rank's link carries relative to the size. */
static double bus_factor(shlm_comm_op op, int S) {
    if (S <= 1) return 0;
    if (op == SHLM_COMM_ALL_REDUCE) return 2.0 * (S - 1) / S;
    return (double)(S - 1) / S;
}

static void measure(const bench *b, shlm_comm_op op, shlm_dtype dt, size_t size, result *res) {
    const size_t es = shlm_dtype_size(dt);
    const int S = b->S;
    /* size is the whole buffer for gathers and scatters, one rank's for all-reduce */
    size_t count = op == SHLM_COMM_ALL_REDUCE ? size / es : size / es / (size_t)S;
    size = op == SHLM_COMM_ALL_REDUCE ? count * es : count * es * (size_t)S;
    *res = (result){.op = op, .dt = dt, .size = size, .count = count};
    for (int inplace = 0; inplace < 2; inplace++) {
        long long wrong = 0;
        if (b->o->check) {
            wrong = check_once(b, op, dt, count, inplace);
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
        }
        /* time on zeros: repeated in-place sums then cannot grow to inf */
        b->ops->zero(b->send, size);
        b->ops->zero(b->recv, size);
        double us = time_op(b, op, dt, count, inplace);
        res->time_us[inplace] = us;
        res->algbw[inplace] = (double)size / (us * 1e-6) / 1e9;
        res->busbw[inplace] = res->algbw[inplace] * bus_factor(op, S);
        res->wrong[inplace] = b->o->check ? wrong : -1;
    }
}

/* ---- output ---- */

static void print_header(const options *o, const bench *b, const char *gname, int n_groups,
                         const char *device) {
    enum { LINE = 160 };
    char line[LINE];
    snprintf(line, LINE, "#  rank %3d group %3d/%-3d host %-20s device %s", world_rank, b->rank,
             b->S, shlm_host(), device);
    char *all = world_rank == 0 ? malloc((size_t)LINE * world_size) : NULL;
    MPI_CHECK(MPI_Gather(line, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (world_rank != 0) return;
    printf("# shardlm bench_comm: comm backend %s (compute backend %s), %d ranks, group %s: "
           "%d group(s) of %d ranks at once\n", o->backend, b->ops->name, world_size, gname,
           n_groups, b->S);
    printf("# sizes %zu..%zu bytes x%g, iters %d, warmup %d, %s, redop %s, check %s%s\n",
           o->min_bytes, o->max_bytes, o->factor, o->iters, o->warmup,
           o->nonblocking ? "non-blocking (i* + wait)" : "blocking", o->redop ? "avg" : "sum",
           o->check ? "on" : "off",
           o->registered ? ", receive buffer registered" : "");
    printf("# size: whole buffer (all_gather, reduce_scatter) or one rank's (all_reduce), as "
           "nccl-tests; count: elements per rank passed to the call\n");
    printf("# time: mean of the timed iterations, slowest rank; busbw = algbw x (n-1)/n "
           "(all_gather, reduce_scatter) or 2(n-1)/n (all_reduce)\n");
    for (int i = 0; i < world_size; i++) printf("%s\n", all + (size_t)i * LINE);
    free(all);
    printf("#\n");
    printf("# %14s %5s %12s %12s  %38s  %38s\n", "", "", "", "", "out-of-place", "in-place");
    printf("# %14s %5s %12s %12s  %9s %9s %9s %8s  %9s %9s %9s %8s\n", "op", "type", "size",
           "count", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %14s %5s %12s %12s  %9s %9s %9s %8s  %9s %9s %9s %8s\n", "", "", "(B)",
           "(elements)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    fflush(stdout);
}

static void print_row(const result *r) {
    char w[2][24];
    for (int k = 0; k < 2; k++) {
        if (r->wrong[k] < 0) snprintf(w[k], sizeof w[k], "N/A");
        else snprintf(w[k], sizeof w[k], "%lld", r->wrong[k]);
    }
    printf("  %14s %5s %12zu %12zu  %9.1f %9.3f %9.3f %8s  %9.1f %9.3f %9.3f %8s\n",
           shlm_comm_op_name(r->op), shlm_dtype_name(r->dt), r->size, r->count, r->time_us[0],
           r->algbw[0], r->busbw[0], w[0], r->time_us[1], r->algbw[1], r->busbw[1], w[1]);
    fflush(stdout);
}

static int write_json(const char *path, const options *o, const bench *b, const char *device,
                      const result *res, int n, double avg_busbw, long long wrong) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_comm: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"benchmark\": \"bench_comm\", \"backend\": \"%s\", \"compute_backend\": \"%s\", "
            "\"device\": \"%s\", \"ranks\": %d, \"group\": \"%s\", \"group_size\": %d, "
            "\"nonblocking\": %d, \"redop\": \"%s\", \"iters\": %d, \"warmup\": %d, "
            "\"check\": %d,\n \"results\": [\n", o->backend, b->ops->name, device, world_size,
            o->group, b->S, o->nonblocking, o->redop ? "avg" : "sum", o->iters, o->warmup,
            o->check);
    for (int i = 0; i < n; i++) {
        const result *r = &res[i];
        fprintf(f, "  {\"op\": \"%s\", \"dtype\": \"%s\", \"size_bytes\": %zu, \"count\": %zu",
                shlm_comm_op_name(r->op), shlm_dtype_name(r->dt), r->size, r->count);
        static const char *const place[2] = {"out_of_place", "in_place"};
        for (int k = 0; k < 2; k++)
            fprintf(f, ", \"%s\": {\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, "
                    "\"wrong\": %lld}", place[k], r->time_us[k], r->algbw[k], r->busbw[k],
                    r->wrong[k]);
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, " ],\n \"avg_busbw_gbs\": %.4f, \"wrong\": %lld}\n", avg_busbw, wrong);
    return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    MPI_CHECK(MPI_Init(&argc, &argv));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 0) {
        if (pr > 0 && world_rank == 0) usage(stdout);
        MPI_CHECK(MPI_Finalize());
        return pr > 0 ? 0 : 2;
    }

    /* the comm backend and the memory it works on: host (cpu) for mpi, device for nccl */
    bench b = {.o = &o};
    b.comm = shlm_comm_find(o.backend);
    const char *why = NULL;
    if (!b.comm) why = "this build has no such comm backend (mpi, or nccl with CUDA)";
    else if (!b.comm->available()) why = "the backend cannot run here (no GPU or no NCCL)";
    else {
        b.ops = shlm_ops_find(strcmp(o.backend, "nccl") == 0 ? "cuda" : "cpu");
        if (!b.ops || !b.ops->available()) why = "its compute backend (for memory) is missing";
    }
    if (why) {
        if (world_rank == 0) fprintf(stderr, "bench_comm: error: --backend %s: %s\n", o.backend, why);
        MPI_CHECK(MPI_Finalize());
        return 2;
    }

    /* groups: the world, or every node group / replica group at once, as HYBRID_SHARD */
    topology topo;
    topology_options topt = {.strategy = FSDP_HYBRID_SHARD, .ranks_per_node = o.ranks_per_node};
    char err[512];
    if (topology_check(world_size, &topt, err, sizeof err) != 0 ||
        topology_create(&topo, MPI_COMM_WORLD, &topt, err, sizeof err) != 0) {
        if (world_rank == 0) fprintf(stderr, "bench_comm: error: %s\n", err);
        MPI_CHECK(MPI_Finalize());
        return 2;
    }
    MPI_Comm gcomm = strcmp(o.group, "node") == 0      ? topo.shard
                     : strcmp(o.group, "replica") == 0 ? topo.replica
                                                       : MPI_COMM_WORLD;
    int n_groups = strcmp(o.group, "node") == 0      ? topo.n_shard_groups
                   : strcmp(o.group, "replica") == 0 ? topo.shard_size
                                                     : 1;
    char device[32] = "cpu";
    if (b.ops->set_device) {
        int dev = topology_device(&topo, b.ops->device_count());
        b.ops->set_device(dev);
        snprintf(device, sizeof device, "%s:%d", b.ops->name, dev);
    }
    b.g = b.comm->group_create(gcomm);
    b.rank = b.comm->group_rank(b.g);
    b.S = b.comm->group_size(b.g);
    b.send = NULL;
    b.recv = NULL;
    if (o.registered) {
        if (!b.comm->gather_buffer_alloc || !b.comm->gather_buffers_enabled ||
            !b.comm->gather_buffers_enabled()) {
            if (world_rank == 0)
                fprintf(stderr, "bench_comm: error: --registered: the %s backend has no "
                                "registered gather buffers (or they are turned off)\n",
                        b.comm->name);
            MPI_CHECK(MPI_Finalize());
            return 2;
        }
        b.recv = b.comm->gather_buffer_alloc(b.g, o.max_bytes);
        if (!b.recv && world_rank == 0)
            fprintf(stderr, "bench_comm: --registered: registration failed, plain buffers\n");
    }
    const int recv_registered = b.recv != NULL;
    b.send = b.ops->alloc(o.max_bytes);
    if (!b.recv) b.recv = b.ops->alloc(o.max_bytes);
    b.stage = malloc((size_t)CHUNK * 4);
    SHLM_CHECK_ALLOC(b.stage);

    print_header(&o, &b, o.group, n_groups, device);
    int cap = 64, n = 0;
    result *res = malloc((size_t)cap * sizeof *res);
    SHLM_CHECK_ALLOC(res);
    long long wrong = 0;
    double busbw_sum = 0;
    int busbw_n = 0;
    for (int i = 0; i < o.n_ops; i++) {
        for (int j = 0; j < o.n_dts; j++) {
            for (double sz = (double)o.min_bytes; sz <= (double)o.max_bytes * 1.0000001; sz *= o.factor) {
                const size_t es = shlm_dtype_size(o.dts[j]);
                size_t per = o.ops[i] == SHLM_COMM_ALL_REDUCE ? es : es * (size_t)b.S;
                if ((size_t)sz < per) continue; /* less than one element per rank */
                if ((size_t)sz / es > (size_t)INT_MAX * (o.ops[i] == SHLM_COMM_ALL_REDUCE ? 1 : b.S))
                    continue; /* the comm table takes at most INT_MAX elements per rank */
                if (n == cap) {
                    cap *= 2;
                    res = realloc(res, (size_t)cap * sizeof *res);
                    SHLM_CHECK_ALLOC(res);
                }
                measure(&b, (shlm_comm_op)o.ops[i], o.dts[j], (size_t)sz, &res[n]);
                for (int k = 0; k < 2; k++) {
                    if (res[n].wrong[k] > 0) wrong += res[n].wrong[k];
                    busbw_sum += res[n].busbw[k];
                    busbw_n++;
                }
                if (world_rank == 0) print_row(&res[n]);
                n++;
            }
        }
    }
    double avg = busbw_n ? busbw_sum / busbw_n : 0;
    int rc = 0;
    if (world_rank == 0) {
        printf("# wrong values         : %lld %s\n", wrong, o.check ? (wrong ? "FAILED" : "OK") : "(not checked)");
        printf("# avg bus bandwidth    : %.3f GB/s\n", avg);
        if (o.min_busbw > 0)
            printf("# bus bandwidth floor  : %.3f GB/s %s\n", o.min_busbw,
                   avg >= o.min_busbw ? "OK" : "FAILED");
        printf("#\n");
        fflush(stdout);
        if (o.json && write_json(o.json, &o, &b, device, res, n, avg, wrong) != 0) rc = 1;
    }
    if (wrong > 0) {
        if (world_rank == 0) fprintf(stderr, "bench_comm: FAILED: %lld wrong values\n", wrong);
        rc = 1;
    }
    if (o.min_busbw > 0 && avg < o.min_busbw) {
        if (world_rank == 0)
            fprintf(stderr, "bench_comm: FAILED: average bus bandwidth %.3f GB/s is under "
                    "--min-busbw %.3f\n", avg, o.min_busbw);
        rc = 1;
    }
    MPI_CHECK(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
    free(res);
    free(b.stage);
    b.ops->free(b.send);
    if (recv_registered) b.comm->registered_free(b.g, b.recv);
    else b.ops->free(b.recv);
    b.comm->group_free(b.g);
    topology_free(&topo);
    MPI_CHECK(MPI_Finalize());
    return rc;
}
