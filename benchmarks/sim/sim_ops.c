/* The simulated compute backend (sim.h): every op advances the compute timeline by its
 * cost from the op table and touches no data; memory is address space only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "benchmarks/sim/sim.h"

sim_clock sim_now;

static sim_compute cfg;
static size_t allocated, peak;

/* live allocations, for munmap's length */
typedef struct region {
    void *p;
    size_t bytes;
} region;
static region *regions;
static size_t n_regions, cap_regions;

static sim_shape *recorded;
static int n_recorded, cap_recorded;

static void die_oom(void) {
    fprintf(stderr, "perf_model: error: out of host memory in the simulated backend\n");
    exit(1);
}

/* Reserves address space that faults on any access: the engine and the model only pass
 * these pointers to ops, which read nothing. */
static void *sim_alloc(size_t bytes) {
    size_t len = bytes ? bytes : 1;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "perf_model: error: cannot reserve %zu bytes of address space\n", bytes);
        exit(1);
    }
    if (n_regions == cap_regions) {
        cap_regions = cap_regions ? 2 * cap_regions : 256;
        region *r = realloc(regions, cap_regions * sizeof *r);
        if (!r) die_oom();
        regions = r;
    }
    regions[n_regions++] = (region){p, len};
    allocated += bytes;
    if (allocated > peak) peak = allocated;
    return p;
}

static void sim_free(void *p) {
    if (!p) return;
    for (size_t i = 0; i < n_regions; i++) {
        if (regions[i].p != p) continue;
        munmap(p, regions[i].bytes);
        allocated -= regions[i].bytes;
        regions[i] = regions[--n_regions];
        return;
    }
    fprintf(stderr, "perf_model: error: free of a pointer the simulated backend did not allocate\n");
    exit(1);
}

size_t sim_ops_allocated(void) { return allocated; }
size_t sim_ops_peak(void) { return peak; }

const sim_shape *sim_ops_recorded(int *n) {
    *n = n_recorded;
    return recorded;
}

static void record(const sim_shape *s) {
    for (int i = 0; i < n_recorded; i++)
        if (recorded[i].op == s->op && memcmp(recorded[i].d, s->d, sizeof s->d) == 0) return;
    if (n_recorded == cap_recorded) {
        cap_recorded = cap_recorded ? 2 * cap_recorded : 64;
        sim_shape *r = realloc(recorded, (size_t)cap_recorded * sizeof *r);
        if (!r) die_oom();
        recorded = r;
    }
    recorded[n_recorded++] = *s;
}

/* One op call: its cost on the compute timeline. */
static void run(sim_op op, long d0, long d1, long d2, long d3, long d4, long d5) {
    sim_shape s = {op, {d0, d1, d2, d3, d4, d5}};
    if (cfg.record) {
        record(&s);
        return;
    }
    double us = cfg.slowdown * sim_table_us(cfg.table, &s);
    if (op != SIM_MATMUL_FWD && op != SIM_MATMUL_BWD && op != SIM_ATTENTION_FWD &&
        op != SIM_ATTENTION_BWD)
        us *= cfg.mem_slowdown;
    sim_now.compute_us += us;
    sim_now.op_us += us;
    sim_now.op_class_us[op] += us;
}

static int sim_available(void) { return 1; }
static void nothing(void) {}

static void sim_zero(void *p, size_t bytes) { (void)p, run(SIM_ZERO, (long)bytes, 0, 0, 0, 0, 0); }
static void sim_copy(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, run(SIM_COPY, (long)bytes, 0, 0, 0, 0, 0);
}
/* host transfers carry token ids in and losses out: small, and priced as nothing; the
 * host side reads zeros */
static void sim_to_device(void *dst, const void *src, size_t bytes) { (void)dst, (void)src, (void)bytes; }
static void sim_to_host(void *dst, const void *src, size_t bytes) { (void)src, memset(dst, 0, bytes); }

static void sim_f32_to_act(void *a, const float *f, size_t n) { (void)a, (void)f, run(SIM_F32_TO_ACT, (long)n, 0, 0, 0, 0, 0); }
static void sim_round_to_bf16(float *x, size_t n) { (void)x, run(SIM_ROUND_TO_BF16, (long)n, 0, 0, 0, 0, 0); }
static void sim_f32_to_bf16(uint16_t *b, const float *f, size_t n) { (void)b, (void)f, run(SIM_F32_TO_BF16, (long)n, 0, 0, 0, 0, 0); }
static void sim_bf16_to_f32(float *f, const uint16_t *b, size_t n) { (void)b, (void)f, run(SIM_BF16_TO_F32, (long)n, 0, 0, 0, 0, 0); }
static void sim_accumulate(float *y, const float *x, size_t n) { (void)y, (void)x, run(SIM_ACCUMULATE, (long)n, 0, 0, 0, 0, 0); }

static void sim_embedding_fwd(void *out, const int32_t *tok, const void *wte, int N, int C) {
    (void)out, (void)tok, (void)wte, run(SIM_EMBEDDING_FWD, N, C, 0, 0, 0, 0);
}
static void sim_embedding_bwd(float *dwte, const void *dout, const int32_t *tok, int N, int C) {
    (void)dwte, (void)dout, (void)tok, run(SIM_EMBEDDING_BWD, N, C, 0, 0, 0, 0);
}
static void sim_rmsnorm_fwd(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                            float eps, float *amax) {
    (void)out, (void)rstd, (void)inp, (void)w, (void)eps, (void)amax, run(SIM_RMSNORM_FWD, N, C, 0, 0, 0, 0);
}
static void sim_rmsnorm_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                            const float *rstd, int N, int C) {
    (void)dinp, (void)dw, (void)dout, (void)inp, (void)w, (void)rstd;
    run(SIM_RMSNORM_BWD, N, C, 0, 0, 0, 0);
}
static void sim_matmul_fwd(void *out, const void *inp, const void *w, int N, int C, int OC,
                           const void *res) {
    (void)out, (void)inp, (void)w, run(SIM_MATMUL_FWD, N, C, OC, res != NULL, 0, 0);
}
static void sim_matmul_bwd(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                           int N, int C, int OC, int flags) {
    (void)dout, (void)inp, (void)w, (void)flags;
    run(SIM_MATMUL_BWD, N, C, OC, (dinp != NULL) | (dw != NULL) << 1, 0, 0);
}
static void sim_bias_add(void *x, const void *b, int N, int C) {
    (void)x, (void)b, run(SIM_BIAS_ADD, N, C, 0, 0, 0, 0);
}
static void sim_bias_grad(float *db, const void *dout, int N, int C, int set) {
    (void)db, (void)dout, (void)set, run(SIM_BIAS_GRAD, N, C, 0, 0, 0, 0);
}
static void sim_rope(void *x, int N, int T, int stride, int nh, const shlm_rope *rope,
                     const int32_t *pos0, int inv) {
    (void)x, (void)T, (void)stride, (void)pos0, (void)inv;
    run(SIM_ROPE, N, nh, rope->head_dim, 0, 0, 0);
}
static void sim_attention_fwd(void *out, float *lse, const void *qkv, const int32_t *doc, int B,
                              int T, int nh, int nkv, int hd) {
    (void)out, (void)lse, (void)qkv, (void)doc, run(SIM_ATTENTION_FWD, B, T, nh, nkv, hd, 0);
}
static void sim_attention_bwd(void *dqkv, const void *dout, const void *qkv, const void *out,
                              const float *lse, const int32_t *doc, int B, int T, int nh, int nkv,
                              int hd, const shlm_rope *rope) {
    (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)doc;
    run(SIM_ATTENTION_BWD, B, T, nh, nkv, hd, rope != NULL);
}
static void sim_swiglu_fwd(void *out, const void *gu, int N, int F, float *amax) {
    (void)out, (void)gu, (void)amax, run(SIM_SWIGLU_FWD, N, F, 0, 0, 0, 0);
}
static void sim_swiglu_bwd(void *dgu, const void *dout, const void *gu, int N, int F,
                           float *amax) {
    (void)dgu, (void)dout, (void)gu, (void)amax, run(SIM_SWIGLU_BWD, N, F, 0, 0, 0, 0);
}
static void sim_xent(float *losses, void *dlogits, const void *logits, const int32_t *tg, int N,
                     int V, float dscale) {
    (void)losses, (void)dlogits, (void)logits, (void)tg, (void)dscale;
    run(SIM_XENT, N, V, 0, 0, 0, 0);
}
static void sim_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                      float b2, float eps, float wd, float gs, int step, float *amax) {
    (void)p, (void)g, (void)m, (void)v, (void)lr, (void)b1, (void)b2, (void)eps, (void)wd;
    (void)gs, (void)step, (void)amax;
    run(SIM_ADAMW, (long)n, 0, 0, 0, 0, 0);
}
static double sim_sum_squares(const float *x, size_t n) {
    (void)x, run(SIM_SUM_SQUARES, (long)n, 0, 0, 0, 0, 0);
    return 0;
}

shlm_ops shlm_ops_sim = {
    .name = "sim", .act_dtype = SHLM_F32, .available = sim_available,
    .alloc = sim_alloc, .free = sim_free, .zero = sim_zero, .copy = sim_copy,
    .to_device = sim_to_device, .to_host = sim_to_host, .sync = nothing,
    .f32_to_act = sim_f32_to_act, .round_to_bf16 = sim_round_to_bf16,
    .f32_to_bf16 = sim_f32_to_bf16, .bf16_to_f32 = sim_bf16_to_f32,
    .accumulate = sim_accumulate, .embedding_fwd = sim_embedding_fwd,
    .embedding_bwd = sim_embedding_bwd, .rmsnorm_fwd = sim_rmsnorm_fwd,
    .rmsnorm_bwd = sim_rmsnorm_bwd, .matmul_fwd = sim_matmul_fwd, .matmul_bwd = sim_matmul_bwd,
    .bias_add = sim_bias_add, .bias_grad = sim_bias_grad, .rope = sim_rope, .attention_fwd = sim_attention_fwd, .attention_bwd = sim_attention_bwd,
    .swiglu_fwd = sim_swiglu_fwd, .swiglu_bwd = sim_swiglu_bwd, .xent_fwd_bwd = sim_xent,
    .adamw = sim_adamw, .sum_squares = sim_sum_squares};

void sim_ops_setup(const sim_compute *c, shlm_dtype act_dtype) {
    cfg = *c;
    peak = allocated; /* what an earlier simulated run left allocated (nothing, after its teardown) */
    if (cfg.slowdown <= 0) cfg.slowdown = 1;
    if (cfg.mem_slowdown <= 0) cfg.mem_slowdown = 1;
    shlm_ops_sim.act_dtype = act_dtype;
}
