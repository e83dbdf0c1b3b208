/* MPI test of the MPI comm backend (kernels/comm/comm_mpi.c), 4 ranks: every collective,
 * blocking and not, fp32 and bf16, in place and not, delays, progress and counters. */
#include <mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/check.h"
#include "kernels/comm.h"
#include "src/engine/topology.h"
#include "tests/check.h"

static const shlm_comm *C = &shlm_comm_mpi;
static int world_rank, world_size;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(double ms) {
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(fmod(ms, 1000) * 1e6)};
    nanosleep(&ts, NULL);
}

/* ---- element access: values are kept as float here, stored as fp32 or bf16 ---- */

static uint16_t to_bf16(float f) { /* round to nearest even, as the backend must */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void put(void *buf, shlm_dtype dt, size_t i, float x) {
    if (dt == SHLM_F32) ((float *)buf)[i] = x;
    else ((uint16_t *)buf)[i] = to_bf16(x);
}
static float get(const void *buf, shlm_dtype dt, size_t i) {
    return dt == SHLM_F32 ? ((const float *)buf)[i] : from_bf16(((const uint16_t *)buf)[i]);
}
static void *alloc_poisoned(size_t n, shlm_dtype dt) {
    size_t bytes = (n ? n : 1) * shlm_dtype_size(dt);
    void *p = malloc(bytes);
    SHLM_CHECK_ALLOC(p);
    memset(p, 0xff, bytes); /* NaN in both dtypes: an element never written fails */
    return p;
}
static const char *dt_name(shlm_dtype dt) { return dt == SHLM_F32 ? "fp32" : "bf16"; }

/* Small integers: every partial sum of up to 4 of them is exact in bf16 and fp32, and
 * so is a division by a group size of 1, 2 or 4, so results compare bit for bit
 * whatever order MPI adds in. */
static float val(int r, size_t i) { return (float)((int)((r * 7 + i * 3) % 17) - 8); }

/* mode 0: blocking; 1: non-blocking + wait; 2: non-blocking, test()/progress() until
 * done, then wait */
static void complete(shlm_comm_req *req, int mode) {
    if (mode == 2)
        while (!C->test(req)) C->progress();
    C->wait(req);
}

typedef struct tcase {
    shlm_comm_group *g;
    const char *gname;
    shlm_dtype dt;
    size_t count;
    int mode, inplace;
    char label[128]; /* for messages */
} tcase;

static void check_all_gather(const tcase *tc) {
    int r = C->group_rank(tc->g), S = C->group_size(tc->g);
    size_t n = tc->count, es = shlm_dtype_size(tc->dt);
    void *recv = alloc_poisoned((size_t)S * n, tc->dt);
    void *send = alloc_poisoned(n, tc->dt);
    void *own = (char *)recv + (size_t)r * n * es;
    for (size_t i = 0; i < n; i++) put(tc->inplace ? own : send, tc->dt, i, val(r, i));
    /* in place: the rank's slice of recv, or NULL (inplace == 2) */
    const void *s = tc->inplace == 1 ? own : tc->inplace == 2 ? NULL : send;
    if (tc->mode == 0) C->all_gather(tc->g, s, recv, n, tc->dt);
    else complete(C->iall_gather(tc->g, s, recv, n, tc->dt), tc->mode);
    int bad = 0;
    for (int q = 0; q < S; q++)
        for (size_t i = 0; i < n; i++) bad += get(recv, tc->dt, (size_t)q * n + i) != val(q, i);
    CHECK(bad == 0, "all_gather: %d wrong; %s", bad, tc->label);
    free(recv);
    free(send);
}

static void check_reduce_scatter(const tcase *tc, shlm_comm_redop op) {
    int r = C->group_rank(tc->g), S = C->group_size(tc->g);
    size_t n = tc->count, es = shlm_dtype_size(tc->dt);
    void *send = alloc_poisoned((size_t)S * n, tc->dt);
    void *recv = alloc_poisoned(n, tc->dt);
    for (size_t j = 0; j < (size_t)S * n; j++) put(send, tc->dt, j, val(r, j));
    void *out = tc->inplace ? (char *)send + (size_t)r * n * es : recv;
    if (tc->mode == 0) C->reduce_scatter(tc->g, send, out, n, tc->dt, op);
    else complete(C->ireduce_scatter(tc->g, send, out, n, tc->dt, op), tc->mode);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < S; q++) want += val(q, (size_t)r * n + i);
        if (op == SHLM_COMM_AVG) want /= (float)S;
        bad += get(out, tc->dt, i) != want;
    }
    CHECK(bad == 0, "reduce_scatter %s: %d wrong; %s", op == SHLM_COMM_AVG ? "avg" : "sum",
           bad, tc->label);
    free(send);
    free(recv);
}

static void check_all_reduce(const tcase *tc, shlm_comm_redop op) {
    int r = C->group_rank(tc->g), S = C->group_size(tc->g);
    size_t n = tc->count;
    void *send = alloc_poisoned(n, tc->dt), *recv = alloc_poisoned(n, tc->dt);
    for (size_t i = 0; i < n; i++) put(tc->inplace ? recv : send, tc->dt, i, val(r, i));
    const void *s = tc->inplace == 1 ? recv : tc->inplace == 2 ? NULL : send;
    if (tc->mode == 0) C->all_reduce(tc->g, s, recv, n, tc->dt, op);
    else complete(C->iall_reduce(tc->g, s, recv, n, tc->dt, op), tc->mode);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < S; q++) want += val(q, i);
        if (op == SHLM_COMM_AVG) want /= (float)S;
        bad += get(recv, tc->dt, i) != want;
    }
    CHECK(bad == 0, "all_reduce %s: %d wrong; %s", op == SHLM_COMM_AVG ? "avg" : "sum", bad,
           tc->label);
    free(send);
    free(recv);
}

static void check_broadcast(const tcase *tc) {
    int r = C->group_rank(tc->g), S = C->group_size(tc->g), root = S - 1;
    size_t n = tc->count;
    void *buf = alloc_poisoned(n, tc->dt);
    if (r == root)
        for (size_t i = 0; i < n; i++) put(buf, tc->dt, i, val(root, i));
    if (tc->mode == 0) C->broadcast(tc->g, buf, n, tc->dt, root);
    else complete(C->ibroadcast(tc->g, buf, n, tc->dt, root), tc->mode);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += get(buf, tc->dt, i) != val(root, i);
    CHECK(bad == 0, "broadcast: %d wrong; %s", bad, tc->label);
    free(buf);
}

static void check_every_collective(shlm_comm_group *g, const char *gname) {
    const size_t counts[] = {0, 37, 4096};
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
            for (int mode = 0; mode < 3; mode++)
                for (int inplace = 0; inplace < 3; inplace++) {
                    tcase tc = {g, gname, d ? SHLM_BF16 : SHLM_F32, counts[k], mode, inplace,
                                {0}};
                    snprintf(tc.label, sizeof tc.label, "%s %s count=%zu mode=%d inplace=%d",
                             gname, dt_name(tc.dt), tc.count, mode, inplace);
                    check_all_gather(&tc);
                    check_all_reduce(&tc, SHLM_COMM_SUM);
                    check_all_reduce(&tc, SHLM_COMM_AVG);
                    if (inplace == 2) continue; /* no NULL form for these */
                    check_reduce_scatter(&tc, SHLM_COMM_SUM);
                    check_reduce_scatter(&tc, SHLM_COMM_AVG);
                    if (inplace == 0) check_broadcast(&tc);
                }
}

/* bf16 rounding: in a group of 2, a + b is rounded once, so the result is known exactly.
 * Ties go to the even mantissa. */
static void check_bf16_rounding(shlm_comm_group *g2) {
    int r = C->group_rank(g2);
    /* rank 0's values, rank 1's values, expected bits */
    const float a[6] = {1.0f, 1.0f + 0x1p-7f, 1.0f, 1.0f, -1.0f, 256.0f};
    const float b[6] = {0x1p-8f, 0x1p-8f, 3 * 0x1p-9f, 0x1p-9f, -0x1p-8f, 1.0f};
    const uint16_t want[6] = {0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf80, 0x4380};
    uint16_t x[6], y[12];
    for (int i = 0; i < 6; i++) x[i] = to_bf16(r == 0 ? a[i] : b[i]);
    C->all_reduce(g2, NULL, x, 6, SHLM_BF16, SHLM_COMM_SUM);
    for (int i = 0; i < 6; i++)
        CHECK(x[i] == want[i], "bf16 all_reduce %d: 0x%04x, expected 0x%04x", i, x[i], want[i]);
    for (int i = 0; i < 12; i++) y[i] = to_bf16(r == 0 ? a[i % 6] : b[i % 6]);
    C->reduce_scatter(g2, y, y + 6 * r, 6, SHLM_BF16, SHLM_COMM_SUM);
    for (int i = 0; i < 6; i++)
        CHECK(y[6 * r + i] == want[i], "bf16 reduce_scatter %d: 0x%04x, expected 0x%04x", i,
               y[6 * r + i], want[i]);
}

/* Random values: close to the exact sum, and bit-identical on every rank of the group
 * (replicas that drift apart by one bit would diverge over a run). */
static void check_random_all_reduce(shlm_comm_group *g, const char *gname) {
    const size_t n = 10007;
    int r = C->group_rank(g), S = C->group_size(g);
    for (int d = 0; d < 2; d++) {
        shlm_dtype dt = d ? SHLM_BF16 : SHLM_F32;
        size_t es = shlm_dtype_size(dt);
        void *x = alloc_poisoned(n, dt);
        double *exact = calloc(n, sizeof *exact), *mag = calloc(n, sizeof *mag);
        for (int q = 0; q < S; q++) {
            srand(1234 + q);
            for (size_t i = 0; i < n; i++) {
                float v = (float)((double)rand() / RAND_MAX * 2 - 1);
                if (dt == SHLM_BF16) v = from_bf16(to_bf16(v)); /* inputs exact in bf16 */
                if (q == r) put(x, dt, i, v);
                exact[i] += v;
                mag[i] += fabs(v);
            }
        }
        complete(C->iall_reduce(g, NULL, x, n, dt, SHLM_COMM_SUM), 2);
        double ulp = dt == SHLM_BF16 ? 0x1p-8 : 0x1p-23;
        int bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += fabs(get(x, dt, i) - exact[i]) > S * ulp * mag[i];
        CHECK(bad == 0, "%s %s random all_reduce: %d beyond tolerance", gname, dt_name(dt),
               bad);
        /* every rank of the group holds the same bits: compare with the group's rank 0 */
        char *first = malloc(n * es);
        memcpy(first, x, n * es);
        C->broadcast(g, first, n, dt, 0);
        CHECK(memcmp(first, x, n * es) == 0, "%s %s all_reduce differs from rank 0's", gname,
               dt_name(dt));
        free(first);
        free(x);
        free(exact);
        free(mag);
    }
}

/* Several collectives in flight at once on different groups, as prefetch does: waited
 * for in another order than issued. */
static void check_concurrent(shlm_comm_group *shard, shlm_comm_group *replica,
                             shlm_comm_group *world) {
    const size_t n = 1000;
    int rs = C->group_rank(shard), S = C->group_size(shard);
    int rr = C->group_rank(replica), R = C->group_size(replica);
    int rw = C->group_rank(world), W = C->group_size(world);
    float *ag = malloc(sizeof(float) * S * n), *rsb = malloc(sizeof(float) * S * n);
    float *ar = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) ag[rs * n + i] = val(rs, i);
    for (size_t j = 0; j < S * n; j++) rsb[j] = val(rr, j);
    for (size_t i = 0; i < n; i++) ar[i] = val(rw, i);
    shlm_comm_req *q1 = C->iall_gather(shard, ag + rs * n, ag, n, SHLM_F32);
    shlm_comm_req *q2 = C->ireduce_scatter(replica, rsb, rsb + rr * n, n, SHLM_F32,
                                           SHLM_COMM_SUM);
    shlm_comm_req *q3 = C->iall_reduce(world, ar, ar, n, SHLM_F32, SHLM_COMM_AVG);
    C->progress();
    C->wait(q3);
    C->wait(q1);
    C->wait(q2);
    int bad = 0;
    for (int q = 0; q < S; q++)
        for (size_t i = 0; i < n; i++) bad += ag[q * n + i] != val(q, i);
    for (size_t i = 0; i < n; i++) {
        float s2 = 0, s3 = 0;
        for (int q = 0; q < R; q++) s2 += val(q, rr * n + i);
        for (int q = 0; q < W; q++) s3 += val(q, i);
        bad += rsb[rr * n + i] != s2;
        bad += ar[i] != s3 / (float)W;
    }
    CHECK(bad == 0, "concurrent collectives: %d wrong", bad);
    free(ag);
    free(rsb);
    free(ar);
}

/* progress() alone drives a non-blocking collective to completion, without wait(). */
static void check_progress(shlm_comm_group *g) {
    const size_t n = 1 << 20;
    int r = C->group_rank(g), S = C->group_size(g);
    float *buf = malloc(sizeof(float) * S * n);
    for (size_t i = 0; i < n; i++) buf[r * n + i] = (float)r;
    MPI_Barrier(MPI_COMM_WORLD);
    shlm_comm_req *q = C->iall_gather(g, NULL, buf, n, SHLM_F32);
    double t0 = now_s();
    int pending = 1;
    while (pending && now_s() - t0 < 60) {
        pending = C->progress();
        sleep_ms(0.2); /* "compute" */
    }
    CHECK(pending == 0, "progress() did not complete a 4 MiB all_gather in 60 s");
    CHECK(C->test(q) == 1, "test() after progress() reported completion");
    C->wait(q);
    int bad = 0;
    for (int p = 0; p < S; p++) bad += buf[p * n] != (float)p || buf[p * n + n - 1] != (float)p;
    CHECK(bad == 0, "progress-driven all_gather wrong");
    free(buf);
}

/* The delay: no completion before issue + delay; compute longer than the delay hides it. */
static void check_delay(shlm_comm_group *g, shlm_comm_group *other) {
    const long delay_us = 200000;
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = 1;
    C->set_delay_us(g, delay_us);

    /* blocking: returns no earlier than the delay */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    C->all_reduce(g, NULL, x, 64, SHLM_F32, SHLM_COMM_SUM);
    double dt = now_s() - t0;
    CHECK(dt >= 0.2, "blocking all_reduce with 200 ms delay took %.1f ms", dt * 1e3);

    /* non-blocking, waited for at once: test() says no, wait() sleeps out the delay, and
     * the whole delay counts as blocked (exposed) time */
    shlm_comm_stats s0, s1;
    C->stats(g, &s0);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_s();
    shlm_comm_req *q = C->iall_gather(g, NULL, x, 64 / C->group_size(g), SHLM_F32);
    CHECK(C->test(q) == 0, "test() right after issue with a 200 ms delay said complete");
    C->wait(q);
    dt = now_s() - t0;
    C->stats(g, &s1);
    double blocked = (double)(s1.blocked_ns - s0.blocked_ns) * 1e-9;
    CHECK(dt >= 0.2, "wait() returned %.1f ms after issue, before the 200 ms delay", dt * 1e3);
    CHECK(blocked >= 0.19, "exposed time %.1f ms, expected about 200", blocked * 1e3);

    /* prefetch: issue, compute 400 ms (calling progress), then wait: the 200 ms delay is
     * hidden, wait() returns at once */
    MPI_Barrier(MPI_COMM_WORLD);
    C->stats(g, &s0);
    t0 = now_s();
    q = C->iall_reduce(g, NULL, x, 64, SHLM_F32, SHLM_COMM_SUM);
    while (now_s() - t0 < 0.4) {
        sleep_ms(5);
        C->progress();
    }
    CHECK(C->test(q) == 1, "after 400 ms of compute a 200 ms-delayed all_reduce is not done");
    double tw = now_s();
    C->wait(q);
    double waited = now_s() - tw;
    C->stats(g, &s1);
    blocked = (double)(s1.blocked_ns - s0.blocked_ns) * 1e-9;
    CHECK(waited < 0.1 && blocked < 0.1,
           "wait() after 400 ms of compute blocked %.1f ms: the 200 ms delay was not hidden",
           blocked * 1e3);
    if (world_rank == 0)
        printf("  delay 200 ms: exposed %.1f ms when waited at once, %.1f ms after 400 ms of "
               "compute\n", (dt) * 1e3, blocked * 1e3);

    /* the backend-wide default reaches groups without their own delay, not g's 0 */
    C->set_delay_us(g, 0);
    C->set_delay_us(NULL, 100000);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_s();
    C->all_reduce(other, NULL, x, 64, SHLM_F32, SHLM_COMM_SUM);
    dt = now_s() - t0;
    CHECK(dt >= 0.1, "the 100 ms default delay did not apply (%.1f ms)", dt * 1e3);
    C->set_delay_us(NULL, 0);
    C->set_delay_us(g, -1);
}

/* Counters: exact bytes per op, blocking and non-blocking alike. */
static void check_stats(shlm_comm_group *g, const char *gname) {
    uint64_t S = (uint64_t)C->group_size(g);
    int r = C->group_rank(g);
    C->stats_reset(g);
    float *f = calloc(S * 100, sizeof(float));
    uint16_t *h = calloc(S * 50, sizeof(uint16_t));
    for (int nb = 0; nb < 2; nb++) {
        if (!nb) {
            C->all_gather(g, NULL, f, 100, SHLM_F32);
            C->reduce_scatter(g, h, h + r * 50, 50, SHLM_BF16, SHLM_COMM_SUM);
            C->all_reduce(g, NULL, f, 64, SHLM_F32, SHLM_COMM_SUM);
            C->broadcast(g, h, 10, SHLM_BF16, 0);
        } else {
            C->wait(C->iall_gather(g, NULL, f, 100, SHLM_F32));
            C->wait(C->ireduce_scatter(g, h, h + r * 50, 50, SHLM_BF16, SHLM_COMM_AVG));
            C->wait(C->iall_reduce(g, NULL, f, 64, SHLM_F32, SHLM_COMM_AVG));
            C->wait(C->ibroadcast(g, h, 10, SHLM_BF16, 0));
        }
    }
    shlm_comm_stats s;
    C->stats(g, &s);
    const uint64_t bytes[4] = {2 * S * 400, 2 * S * 100, 2 * 256, 2 * 20};
    const uint64_t wire[4] = {2 * (S - 1) * 400, 2 * (S - 1) * 100, 2 * (2 * (S - 1) * 256 / S),
                              S > 1 ? 2 * 20 : 0};
    for (int op = 0; op < SHLM_COMM_N_OPS; op++) {
        CHECK(s.calls[op] == 2, "%s %s calls %llu, expected 2", gname,
               shlm_comm_op_name(op), (unsigned long long)s.calls[op]);
        CHECK(s.bytes[op] == bytes[op], "%s %s bytes %llu, expected %llu", gname,
               shlm_comm_op_name(op), (unsigned long long)s.bytes[op],
               (unsigned long long)bytes[op]);
        CHECK(s.wire[op] == wire[op], "%s %s wire bytes %llu, expected %llu", gname,
               shlm_comm_op_name(op), (unsigned long long)s.wire[op],
               (unsigned long long)wire[op]);
    }
    C->stats_reset(g);
    C->stats(g, &s);
    CHECK(s.calls[0] == 0 && s.bytes[0] == 0 && s.blocked_ns == 0, "stats_reset");
    free(f);
    free(h);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    check_rank = world_rank;
    if (world_rank == 0) printf("# reproduce: tests/mpi_test.sh 4 %s\n", argv[0]);
    if (world_size != 4) {
        const int rc = world_rank == 0 ? check_skip("needs 4 ranks, got %d", world_size) : 77;
        MPI_Finalize();
        return rc;
    }
    CHECK(C->available(), "the mpi backend is always available");

    /* groups as the FSDP engine makes them: HYBRID_SHARD over two 2-rank "nodes" gives a
     * shard group of 2 (the node) and a replica group of 2; the world; and NO_SHARD's
     * shard group of 1 */
    char err[256];
    topology th, tn;
    topology_options hy = {.strategy = FSDP_HYBRID_SHARD, .ranks_per_node = 2};
    topology_options no = {.strategy = FSDP_NO_SHARD, .ranks_per_node = 2};
    if (topology_create(&th, MPI_COMM_WORLD, &hy, err, sizeof err) ||
        topology_create(&tn, MPI_COMM_WORLD, &no, err, sizeof err))
        SHLM_FATAL("topology: %s", err);
    shlm_comm_group *world = C->group_create(th.world);
    shlm_comm_group *shard = C->group_create(th.shard);
    shlm_comm_group *replica = C->group_create(th.replica);
    shlm_comm_group *single = C->group_create(tn.shard);
    CHECK(C->group_size(world) == 4 && C->group_size(shard) == 2 &&
               C->group_size(replica) == 2 && C->group_size(single) == 1, "group sizes");
    CHECK(C->group_rank(shard) == th.shard_rank && C->group_rank(replica) == th.replica_rank,
           "group ranks follow the topology");

    struct { shlm_comm_group *g; const char *name; } groups[] = {
        {world, "world(4)"}, {shard, "shard(2)"}, {replica, "replica(2)"}, {single, "single(1)"}};
    for (int i = 0; i < 4; i++) check_every_collective(groups[i].g, groups[i].name);
    if (world_rank == 0) printf("  every collective x {fp32,bf16} x 3 modes x in-place: done\n");

    check_bf16_rounding(shard);
    check_random_all_reduce(world, "world(4)");
    check_random_all_reduce(replica, "replica(2)");
    check_concurrent(shard, replica, world);
    check_progress(world);
    for (int i = 0; i < 4; i++) check_stats(groups[i].g, groups[i].name);
    check_delay(world, replica);

    CHECK(C->progress() == 0, "requests left in flight");
    for (int i = 0; i < 4; i++) C->group_free(groups[i].g);
    topology_free(&th);
    topology_free(&tn);

    const int rc = check_exit_mpi(MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
