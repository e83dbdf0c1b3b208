/* The host AdamW (kernels/host_adamw.h) against the memory system: its rate over N fp32
 * elements on all OpenMP threads, per instruction set and as host_adamw runs it, beside a
 * STREAM-style copy of the same machine and threads. AdamW reads the gradient, the weight
 * and both moments and writes the last three: 28 bytes of traffic an element (7 x 4), of
 * which 12 are state updated (weight, exp_avg, exp_avg_sq); the copy moves 8 (STREAM's
 * count, read + write). Each row is the best of REPS timed repeats after one untimed.
 * The instruction sets must give the same bits (exit 1 when not: a wrong benchmark fails).
 *   bench_host_adamw [MIB_PER_ARRAY (default 256)] [REPS (default 5)]
 * benchmarks/bench_host_adamw.sh runs it and prints the verdict against its target. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/host_adamw.h"

static double best_of(int reps, void (*fn)(void *), void *ctx) {
    fn(ctx); /* untimed: first touch, frequency */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = omp_get_wtime();
        fn(ctx);
        const double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    return best;
}

typedef struct bench {
    float *p, *g, *m, *v, *dst;
    size_t n;
    int isa; /* HOST_ADAMW_N: host_adamw itself */
    int step;
} bench;

static void run_copy(void *ctx) {
    bench *b = ctx;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < b->n; i++) b->dst[i] = b->p[i];
}

static void run_adamw(void *ctx) {
    bench *b = ctx;
    /* a tiny lr keeps the values where they are over the repeats */
    const int t = ++b->step;
    if (b->isa == HOST_ADAMW_N) {
        host_adamw(b->p, b->g, b->m, b->v, b->n, 1e-8f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t, NULL, NULL);
        return;
    }
#pragma omp parallel
    {
        const size_t nt = (size_t)omp_get_num_threads(), k = (size_t)omp_get_thread_num();
        const size_t per = (b->n + nt - 1) / nt, i0 = k * per < b->n ? k * per : b->n;
        const size_t i1 = i0 + per < b->n ? i0 + per : b->n;
        host_adamw_isa_run((host_adamw_isa)b->isa, b->p + i0, b->g + i0, b->m + i0, b->v + i0,
                           i1 - i0, 1e-8f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, t, NULL);
    }
}

/* the four arrays from one seed, the same for every row */
static void fill(bench *b) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < b->n; i++) {
        const unsigned h = (unsigned)(i * 2654435761u);
        b->p[i] = (float)(h % 2001) * 1e-3f - 1.0f;
        b->g[i] = (float)(h % 997) * 1e-4f - 0.05f;
        b->m[i] = 0.0f;
        b->v[i] = 0.0f;
    }
}

int main(int argc, char **argv) {
    const double mib = argc > 1 ? atof(argv[1]) : 256;
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    bench b = {.n = (size_t)(mib * 1048576 / 4)};
    if (b.n == 0 || reps < 1) {
        fprintf(stderr, "usage: bench_host_adamw [MIB_PER_ARRAY] [REPS]\n");
        return 2;
    }
    float **arrays[] = {&b.p, &b.g, &b.m, &b.v, &b.dst};
    for (int k = 0; k < 5; k++) {
        *arrays[k] = aligned_alloc(64, (b.n * 4 + 63) / 64 * 64);
        if (!*arrays[k]) {
            fprintf(stderr, "bench_host_adamw: no memory for 5 x %.0f MiB\n", mib);
            return 2;
        }
    }
    fill(&b);
    printf("# host AdamW: %zu elements (%.0f MiB an array), %d threads, best of %d; widest here: %s\n",
           b.n, mib, omp_get_max_threads(), reps, host_adamw_isa_name(host_adamw_isa_best()));
    printf("# %-22s %10s %14s %14s %10s\n", "kernel", "ms", "traffic_GB/s", "state_GB/s",
           "vs_copy");
    const double tc = best_of(reps, run_copy, &b);
    const double copy_gbs = 8.0 * b.n / tc / 1e9;
    printf("  %-22s %10.2f %14.2f %14s %10s\n", "stream copy", tc * 1e3, copy_gbs, "-", "1.00");
    float *want = malloc(b.n * 4);
    int wrong = 0;
    for (int isa = 0; isa <= HOST_ADAMW_N; isa++) {
        if (isa < HOST_ADAMW_N && !host_adamw_isa_supported((host_adamw_isa)isa)) continue;
        char name[48];
        snprintf(name, sizeof name, "%s%s", isa == HOST_ADAMW_N ? "host_adamw " : "adamw ",
                 isa == HOST_ADAMW_N ? host_adamw_isa_name(host_adamw_isa_best())
                                     : host_adamw_isa_name((host_adamw_isa)isa));
        fill(&b);
        b.isa = isa;
        b.step = 0;
        const double t = best_of(reps, run_adamw, &b);
        /* the same steps from the same start: the same bits on every instruction set */
        if (isa == 0) memcpy(want, b.p, b.n * 4);
        const int same = memcmp(want, b.p, b.n * 4) == 0;
        wrong += !same;
        printf("  %-22s %10.2f %14.2f %14.2f %10.2f%s\n", name, t * 1e3, 28.0 * b.n / t / 1e9,
               12.0 * b.n / t / 1e9, 28.0 * b.n / t / 1e9 / copy_gbs,
               same ? "" : "  WRONG: differs from scalar");
    }
    free(want);
    for (int k = 0; k < 5; k++) free(*arrays[k]);
    return wrong ? 1 : 0;
}
