/* QLoRA's stored base (base_nf4.h): the layout of a unit's NF4 matrices and rest, a rank's
 * block made from the whole unit, the pieces a gathered block unpacks into, and its part of
 * the base fingerprint. */
#include "src/engine/base_nf4.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/check.h"
#include "src/base/rng.h"
#include "src/base/shard.h"

static size_t ceil_div(size_t a, size_t b) { return a / b + (a % b != 0); }
static size_t align4(size_t b) { return (b + 3) / 4 * 4; }

void base_nf4_unit_plan(const model_unit *lu, int S, int double_quant, size_t param_size,
                        base_nf4_unit *out) {
    memset(out, 0, sizeof *out);
    out->double_quant = double_quant;
    out->quantum = double_quant ? (size_t)SHLM_NF4_BLOCK * SHLM_NF4_DQ_GROUP : SHLM_NF4_BLOCK;
    /* the tensors lie in offset order: the rest is what lies between the NF4 matrices */
    size_t pos = 0;
    for (int k = 0; k < lu->n_tensors; k++) {
        const model_tensor *t = &lu->tensors[k];
        if (t->target < 0) continue;
        if (out->n_nf4 == MODEL_N_TARGETS)
            SHLM_FATAL("base_nf4_unit_plan: a unit with more than %d projection weights (%s)",
                       MODEL_N_TARGETS, t->name);
        if (t->offset > pos) {
            out->run_offset[out->n_runs] = pos;
            out->run_count[out->n_runs++] = t->offset - pos;
        }
        base_nf4_tensor *m = &out->t[out->n_nf4++];
        *m = (base_nf4_tensor){k, t->offset, t->numel, out->quanta, ceil_div(t->numel, out->quantum)};
        out->quanta += m->nq;
        pos = t->offset + t->numel;
    }
    if (lu->numel > pos) {
        out->run_offset[out->n_runs] = pos;
        out->run_count[out->n_runs++] = lu->numel - pos;
    }
    for (int i = 0; i < out->n_runs; i++) out->rest_numel += out->run_count[i];
    out->rest_shard = shard_numel(out->rest_numel, S);
    out->q_shard = ceil_div(out->quanta, (size_t)S);
    const size_t groups = double_quant ? SHLM_NF4_DQ_GROUP : 1; /* blocks a quantum */
    out->codes_at = align4(out->rest_shard * param_size);
    out->scales_at = out->codes_at + out->q_shard * out->quantum / 2;
    out->absmax2_at = out->scales_at + out->q_shard * (double_quant ? groups : 4);
    out->offsets_at = out->absmax2_at + (double_quant ? out->q_shard * 4 : 0);
    out->block_bytes = out->offsets_at + (double_quant ? (size_t)out->n_nf4 * 4 : 0);
}

/* Rank r's quanta of matrix m: [*j0, *j1) of the unit's numbering (empty: j0 >= j1). */
static void rank_quanta(const base_nf4_unit *nu, const base_nf4_tensor *m, int r, size_t *j0,
                        size_t *j1) {
    const size_t lo = (size_t)r * nu->q_shard, hi = lo + nu->q_shard;
    *j0 = m->q0 > lo ? m->q0 : lo;
    *j1 = m->q0 + m->nq < hi ? m->q0 + m->nq : hi;
}

/* Calls fn for each run of rank r's packed rest: `count` elements from packed place p
 * (relative to the rank's first) at unit element dst. */
typedef void (*rest_fn)(void *ctx, size_t p, size_t dst, size_t count);
static void rest_runs(const base_nf4_unit *nu, int r, rest_fn fn, void *ctx) {
    const size_t lo = (size_t)r * nu->rest_shard;
    const size_t hi = lo + nu->rest_shard < nu->rest_numel ? lo + nu->rest_shard : nu->rest_numel;
    size_t packed = 0; /* the run's first packed place */
    for (int i = 0; i < nu->n_runs && lo < hi; i++) {
        const size_t a = packed > lo ? packed : lo;
        const size_t b = packed + nu->run_count[i] < hi ? packed + nu->run_count[i] : hi;
        if (a < b) fn(ctx, a - lo, nu->run_offset[i] + (a - packed), b - a);
        packed += nu->run_count[i];
    }
}

typedef struct pack_ctx {
    const float *x;
    uint8_t *block;
    size_t param_size;
} pack_ctx;

static void pack_rest(void *ctx, size_t p, size_t dst, size_t count) {
    const pack_ctx *c = ctx;
    if (c->param_size == 4) {
        memcpy(c->block + p * 4, c->x + dst, count * 4);
        return;
    }
    uint16_t *o = (uint16_t *)(void *)c->block + p;
    for (size_t i = 0; i < count; i++) o[i] = shlm_f32_to_bf16(c->x[dst + i]);
}

int base_nf4_block_make(const base_nf4_unit *nu, int r, size_t param_size, const float *x,
                        uint8_t *block, int *bad_tensor, size_t *bad_index) {
    memset(block, 0, nu->block_bytes);
    rest_runs(nu, r, pack_rest, &(pack_ctx){x, block, param_size});
    for (int k = 0; k < nu->n_nf4; k++) {
        const base_nf4_tensor *m = &nu->t[k];
        size_t j0, j1;
        rank_quanta(nu, m, r, &j0, &j1);
        /* double quant: every rank keeps every matrix's offset, so quantizes all of them */
        if (j0 >= j1 && !nu->double_quant) continue;
        const size_t nb = shlm_nf4_blocks(m->numel), ng = shlm_nf4_groups(m->numel);
        const size_t cb = shlm_nf4_code_bytes(m->numel);
        float offset = 0;
        shlm_nf4 q = {.n = m->numel, .codes = malloc(cb)};
        if (nu->double_quant) {
            q.absmax_codes = malloc(nb);
            q.absmax2 = malloc(ng * sizeof(float));
            q.offset = &offset;
            SHLM_CHECK_ALLOC(q.absmax_codes);
            SHLM_CHECK_ALLOC(q.absmax2);
        } else {
            q.absmax = malloc(nb * sizeof(float));
            SHLM_CHECK_ALLOC(q.absmax);
        }
        SHLM_CHECK_ALLOC(q.codes);
        const int bad = shlm_nf4_quantize(&q, x + m->offset, bad_index);
        if (!bad && j0 < j1) {
            const size_t lq = j0 - (size_t)r * nu->q_shard, lj = j0 - m->q0, nq = j1 - j0;
            const size_t half = nu->quantum / 2, c0 = lj * half;
            memcpy(block + nu->codes_at + lq * half, q.codes + c0,
                   (c0 + nq * half < cb ? c0 + nq * half : cb) - c0);
            if (nu->double_quant) {
                const size_t b0 = lj * SHLM_NF4_DQ_GROUP;
                const size_t b1 = b0 + nq * SHLM_NF4_DQ_GROUP < nb ? b0 + nq * SHLM_NF4_DQ_GROUP : nb;
                memcpy(block + nu->scales_at + lq * SHLM_NF4_DQ_GROUP, q.absmax_codes + b0, b1 - b0);
                memcpy(block + nu->absmax2_at + lq * 4, q.absmax2 + lj, nq * 4);
            } else {
                memcpy(block + nu->scales_at + lq * 4, q.absmax + lj, nq * 4);
            }
        }
        if (nu->double_quant) memcpy(block + nu->offsets_at + (size_t)k * 4, &offset, 4);
        free(q.codes);
        free(q.absmax);
        free(q.absmax_codes);
        free(q.absmax2);
        if (bad) {
            *bad_tensor = m->tensor;
            return -1;
        }
    }
    return 0;
}

typedef struct piece_ctx {
    base_nf4_piece *out;
    int n;
    size_t param_size;
} piece_ctx;

static void rest_piece(void *ctx, size_t p, size_t dst, size_t count) {
    piece_ctx *c = ctx;
    c->out[c->n++] = (base_nf4_piece){.src = p * c->param_size, .count = count, .dst = dst};
}

int base_nf4_pieces(const base_nf4_unit *nu, int r, size_t param_size, uint8_t *block,
                    base_nf4_piece *out) {
    float *offsets = (float *)(void *)(block + nu->offsets_at);
    piece_ctx c = {out, 0, param_size};
    rest_runs(nu, r, rest_piece, &c);
    for (int k = 0; k < nu->n_nf4; k++) {
        const base_nf4_tensor *m = &nu->t[k];
        size_t j0, j1;
        rank_quanta(nu, m, r, &j0, &j1);
        if (j0 >= j1) continue;
        const size_t lq = j0 - (size_t)r * nu->q_shard, v0 = (j0 - m->q0) * nu->quantum;
        const size_t v1 = (j1 - m->q0) * nu->quantum < m->numel ? (j1 - m->q0) * nu->quantum : m->numel;
        base_nf4_piece *p = &out[c.n++];
        *p = (base_nf4_piece){.q = {.n = v1 - v0, .codes = block + nu->codes_at + lq * nu->quantum / 2},
                              .dst = m->offset + v0};
        if (nu->double_quant) {
            p->q.absmax_codes = block + nu->scales_at + lq * SHLM_NF4_DQ_GROUP;
            p->q.absmax2 = (float *)(void *)(block + nu->absmax2_at) + lq;
            p->q.offset = offsets + k;
        } else {
            p->q.absmax = (float *)(void *)(block + nu->scales_at) + lq;
        }
    }
    return c.n;
}

enum { SALT_CODE = 0, SALT_BLOCK = 1, SALT_GROUP = 2, SALT_OFFSET = 3 };

/* a term of the fingerprint: the thing at place `at` of kind `salt`, with bits */
static uint64_t term(uint64_t at, int salt, uint32_t bits) {
    return rng_hash64(rng_hash64(at) ^ ((uint64_t)salt << 32 | bits));
}

typedef struct print_ctx {
    const uint8_t *block;
    size_t param_size;
    uint64_t at, h;
} print_ctx;

static void print_rest(void *ctx, size_t p, size_t dst, size_t count) {
    print_ctx *c = ctx;
    for (size_t i = 0; i < count; i++) {
        float v;
        if (c->param_size == 4) {
            memcpy(&v, c->block + (p + i) * 4, 4);
        } else {
            uint16_t b;
            memcpy(&b, c->block + (p + i) * 2, 2);
            v = shlm_bf16_to_f32(b);
        }
        uint32_t bits;
        memcpy(&bits, &v, 4);
        c->h += rng_hash64(rng_hash64(c->at + dst + i) ^ bits); /* fsdp_base_fingerprint's */
    }
}

uint64_t base_nf4_fingerprint(const base_nf4_unit *nu, int r, size_t param_size,
                              const uint8_t *block, uint64_t at) {
    print_ctx c = {block, param_size, at, 0};
    rest_runs(nu, r, print_rest, &c);
    base_nf4_piece pc[BASE_NF4_MAX_PIECES];
    const float *offsets = (const float *)(const void *)(block + nu->offsets_at);
    const int n = base_nf4_pieces(nu, r, param_size, (uint8_t *)block, pc);
    for (int i = 0; i < n; i++) {
        const shlm_nf4 *q = &pc[i].q;
        if (!q->n) continue;
        const uint64_t first = at + pc[i].dst;
        uint64_t h = 0; /* a sum mod 2^64: the same over any split of the threads */
#pragma omp parallel for reduction(+ : h) schedule(static)
        for (size_t v = 0; v < q->n; v++) {
            const uint8_t byte = q->codes[v / 2];
            h += term(first + v, SALT_CODE, v % 2 ? byte & 15 : byte >> 4);
        }
        c.h += h;
        for (size_t b = 0; b < shlm_nf4_blocks(q->n); b++) {
            uint32_t bits = 0;
            if (q->absmax) memcpy(&bits, &q->absmax[b], 4);
            else bits = q->absmax_codes[b];
            c.h += term(first + b * SHLM_NF4_BLOCK, SALT_BLOCK, bits);
        }
        for (size_t g = 0; q->absmax2 && g < shlm_nf4_groups(q->n); g++) {
            uint32_t bits;
            memcpy(&bits, &q->absmax2[g], 4);
            c.h += term(first + g * SHLM_NF4_BLOCK * SHLM_NF4_DQ_GROUP, SALT_GROUP, bits);
        }
    }
    for (int k = 0; nu->double_quant && r == 0 && k < nu->n_nf4; k++) {
        uint32_t bits;
        memcpy(&bits, offsets + k, 4);
        c.h += term(at + nu->t[k].offset, SALT_OFFSET, bits);
    }
    return c.h;
}
