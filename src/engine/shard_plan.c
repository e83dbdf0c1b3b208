/* The shard plan of shard_plan.h: unit sizes, buffers, bytes per category, the schedule
 * tables and the bytes on the wire, from the model and the group sizes. */
#include "src/engine/shard_plan.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/base/shard.h"

const char *const plan_category_names[PLAN_N_CATEGORIES] = {
    "master_bytes", "grad_bytes", "moments_bytes", "frozen_bytes", "param_copy_bytes",
    "gathered_bytes",
    "grad_buffer_bytes", "activation_bytes", "op_scratch_bytes"};

static size_t round_up(size_t b, size_t align) { return (b + align - 1) / align * align; }

/* A rank's store of unit u's frozen base: its NF4 block, or its shard in param_dtype (ps
 * bytes an element). */
static size_t frozen_bytes(const shard_plan *plan, int u, size_t ps) {
    if (plan->nf4 && plan->nf4[u].n_nf4) return plan->nf4[u].block_bytes;
    return plan->units[u].shard * ps;
}

/* Whether unit u's base is gathered as NF4 blocks. */
static int nf4_unit(const shard_plan *plan, int u) { return plan->nf4 && plan->nf4[u].n_nf4 > 0; }

/* The schedule of pass `mp`: next unit after each use; a release keeps the unit when
 * NO_SHARD or generation's hold keeps every unit, or when SHARD_GRAD_OP in training will
 * use it again later in the pass (a block from its forward to its backward, a tied
 * embedding from its lookup to the head). */
static void make_pass(plan_pass *out, const model_pass *mp, int n_units, fsdp_strategy st,
                      int hold, int with_backward) {
    const size_t n = (size_t)n_units * 3;
    out->next = malloc(n * sizeof *out->next);
    out->keep = calloc(n, 1);
    SHLM_CHECK_ALLOC(out->next);
    SHLM_CHECK_ALLOC(out->keep);
    for (size_t i = 0; i < n; i++) out->next[i] = -1;
    for (int i = 0; i < mp->n; i++) {
        const model_use *a = &mp->uses[i];
        const size_t k = (size_t)a->unit * 3 + a->phase;
        if (i + 1 < mp->n) out->next[k] = mp->uses[i + 1].unit;
        int later = 0;
        for (int j = i + 1; j < mp->n; j++) later |= mp->uses[j].unit == a->unit;
        out->keep[k] = st == FSDP_NO_SHARD || hold ||
                       (st == FSDP_SHARD_GRAD_OP && with_backward && later);
    }
}

void shard_plan_build(shard_plan *plan, const model_desc *m, const plan_params *p) {
    memset(plan, 0, sizeof *plan);
    plan->p = *p;
    const int S = p->S, R = p->R, grads = !p->forward_only;
    const size_t es = shlm_dtype_size(p->act), rs = shlm_dtype_size(p->reduce_dtype);
    plan->n_units = m->lay.n_units;
    plan->units = calloc((size_t)plan->n_units, sizeof *plan->units);
    SHLM_CHECK_ALLOC(plan->units);
    plan->lora = model_desc_lora(m);
    const size_t ps = shlm_dtype_size(p->param_dtype);
    if (plan->lora && m->lora.base_nf4) {
        plan->nf4 = calloc((size_t)plan->n_units, sizeof *plan->nf4);
        SHLM_CHECK_ALLOC(plan->nf4);
        for (int u = 0; u < plan->n_units; u++) {
            base_nf4_unit_plan(&m->lay.units[u], S, m->lora.double_quant, ps, &plan->nf4[u]);
            if (S > 1 && plan->nf4[u].n_nf4 && (size_t)S * plan->nf4[u].block_bytes > plan->nf4_staging)
                plan->nf4_staging = (size_t)S * plan->nf4[u].block_bytes;
        }
    }
    /* gathered: both flat buffers of a unit; trained: the adapters' (LoRA) or the base's */
    size_t sum_gathered = 0, sum_trained = 0, sum_frozen = 0;
    for (int u = 0; u < plan->n_units; u++) {
        plan_unit *x = &plan->units[u];
        x->numel = m->lay.units[u].numel;
        x->padded = shard_padded_size(x->numel, S);
        x->shard = shard_numel(x->numel, S);
        if (plan->lora && m->adapters.units[u].numel > 0) {
            x->a_numel = m->adapters.units[u].numel;
            x->a_padded = shard_padded_size(x->a_numel, S);
            x->a_shard = shard_numel(x->a_numel, S);
        }
        size_t tn, tp, ts;
        shard_plan_trained(plan, u, &tn, &tp, &ts);
        sum_gathered += x->padded + x->a_padded;
        sum_trained += ts;
        if (plan->lora) sum_frozen += frozen_bytes(plan, u, ps);
        if (x->padded + x->a_padded > plan->max_padded) plan->max_padded = x->padded + x->a_padded;
        if (tp > plan->max_grad_padded) plan->max_grad_padded = tp;
        if (ts > plan->max_shard) plan->max_shard = ts;
    }
    plan->direct = S == 1 && p->act == SHLM_F32 && p->param_dtype == SHLM_F32 && !plan->nf4;
    plan->keep_gathered = p->strategy == FSDP_SHARD_GRAD_OP || p->strategy == FSDP_NO_SHARD ||
                          p->hold;
    plan->gather_slots = plan->keep_gathered || plan->direct ? 0 : PLAN_SLOTS;
    plan->grad_slots = S > 1 && grads ? PLAN_SLOTS : 0;
    plan->grad_staging = plan->grad_slots && p->reduce_dtype == SHLM_BF16;
    plan->replica_staging = R > 1 && grads && p->reduce_dtype == SHLM_BF16;
    for (int u = 0; !plan->lora && u < plan->n_units; u++) plan->n_fp8 += m->lay.units[u].n_fp8;
    plan->fp8_weights = p->fp8_all_gather && p->matmul == MODEL_MATMUL_FP8_TENSORWISE &&
                        plan->gather_slots > 0 && plan->n_fp8 > 0;
    for (int u = 0; plan->fp8_weights && S > 1 && u < plan->n_units; u++) {
        const model_unit *lu = &m->lay.units[u];
        for (int r = 0; lu->n_fp8 > 0 && r < S; r++) {
            size_t begin, end, rest = 0;
            shard_range(lu->numel, S, r, &begin, &end);
            plan_piece pc[PLAN_MAX_REST_PIECES];
            const int n = shard_plan_rest_pieces(lu, begin, end, pc);
            for (int i = 0; i < n; i++) rest += pc[i].count;
            if (rest > plan->fp8_rest) plan->fp8_rest = rest;
        }
    }
    plan->offload = p->offload && grads;
    plan->offload_dtype = plan->fp8_weights ? SHLM_F32 : p->param_dtype;
    make_pass(&plan->pass[0], &m->eval_pass, plan->n_units, p->strategy, p->hold, 0);
    make_pass(&plan->pass[1], &m->train_pass, plan->n_units, p->strategy, p->hold, 1);

    /* bytes per category, and the arena: each buffer as the backend rounds it */
    const size_t align = p->ops && p->ops->alloc_align ? p->ops->alloc_align : 1;
    size_t *b = plan->bytes, arena = 0, arena_state = 0, arena_frozen = 0, arena_copy = 0;
    const size_t os = shlm_dtype_size(plan->offload_dtype);
    for (int u = 0; u < plan->n_units; u++) {
        size_t tn, tp, ts;
        shard_plan_trained(plan, u, &tn, &tp, &ts);
        if (tn) arena_state += round_up(ts * 4, align);
        if (tn) arena_copy += round_up(ts * os, align);
        if (plan->lora) arena_frozen += round_up(frozen_bytes(plan, u, ps), align);
    }
    if (plan->offload) { /* the master and the moments live on the host */
        b[PLAN_GRAD] = sum_trained * 4;
        b[PLAN_PARAM_COPY] = sum_trained * os;
        arena += arena_state + arena_copy;
        plan->host_bytes = 3 * sum_trained * 4 + 2 * plan->max_shard * 4 +
                           (plan->offload_dtype == SHLM_F32 ? 0 : 2 * plan->max_shard * os);
    } else {
        b[PLAN_MASTER] = sum_trained * 4;
        arena += arena_state;
        if (grads) {
            b[PLAN_GRAD] = sum_trained * 4;
            b[PLAN_MOMENTS] = 2 * sum_trained * 4;
            arena += 3 * arena_state;
        }
    }
    b[PLAN_FROZEN] = sum_frozen;
    arena += arena_frozen;
    size_t gathered_arena = 0;
    if (plan->keep_gathered && !plan->direct) {
        b[PLAN_GATHERED] = sum_gathered * es;
        for (int u = 0; u < plan->n_units; u++)
            gathered_arena += round_up((plan->units[u].padded + plan->units[u].a_padded) * es, align);
    }
    b[PLAN_GATHERED] += (size_t)plan->gather_slots * plan->max_padded * es;
    gathered_arena += (size_t)plan->gather_slots * round_up(plan->max_padded * es, align);
    if (plan->fp8_weights) { /* each slot's codes and staging; every matrix's amax, scale_inv */
        const size_t amaxes = (size_t)plan->n_fp8 * sizeof(float);
        const size_t scales = amaxes * PLAN_FP8_SCALE_STRIDE;
        const size_t staging = (size_t)S * plan->fp8_rest * es;
        b[PLAN_GATHERED] += (size_t)plan->gather_slots * (plan->max_padded + staging) + amaxes + scales;
        gathered_arena += (size_t)plan->gather_slots * round_up(plan->max_padded, align) +
                          round_up(amaxes, align) + round_up(scales, align);
        if (staging) gathered_arena += (size_t)plan->gather_slots * round_up(staging, align);
    }
    if (plan->nf4_staging) { /* the gathers in flight (at most PLAN_SLOTS) land there */
        b[PLAN_GATHERED] += (size_t)PLAN_SLOTS * plan->nf4_staging;
        gathered_arena += (size_t)PLAN_SLOTS * round_up(plan->nf4_staging, align);
    }
    if (p->registered_gathers && S > 1) plan->registered = b[PLAN_GATHERED];
    else arena += gathered_arena;
    b[PLAN_GRAD_BUFFERS] = (size_t)plan->grad_slots * plan->max_grad_padded * 4;
    arena += (size_t)plan->grad_slots * round_up(plan->max_grad_padded * 4, align);
    if (plan->grad_staging) {
        b[PLAN_GRAD_BUFFERS] += (size_t)plan->grad_slots * plan->max_grad_padded * 2;
        arena += (size_t)plan->grad_slots * round_up(plan->max_grad_padded * 2, align);
    }
    if (plan->replica_staging) {
        b[PLAN_GRAD_BUFFERS] += plan->max_shard * 2;
        arena += round_up(plan->max_shard * 2, align);
    }
    const model_spec *f = m->spec;
    const lora_config *lc = plan->lora ? &m->lora : NULL;
    b[PLAN_ACTIVATIONS] = f->activation_bytes(m->cfg, p->act, p->B, p->T, p->ac, p->matmul, lc, 1);
    arena += f->activation_bytes(m->cfg, p->act, p->B, p->T, p->ac, p->matmul, lc, align);
    if (p->gen_rows > 0) {
        plan->gen_bytes = f->generator_bytes(m->cfg, p->act, p->gen_rows, p->gen_cap, 1);
        b[PLAN_ACTIVATIONS] += plan->gen_bytes;
        arena += f->generator_bytes(m->cfg, p->act, p->gen_rows, p->gen_cap, align);
    }
    b[PLAN_OP_SCRATCH] = f->op_scratch_bytes(m->cfg, p->ops, p->B, p->T);
    plan->arena = arena;
    plan->state = b[PLAN_MASTER] + b[PLAN_GRAD] + b[PLAN_MOMENTS] + b[PLAN_FROZEN] +
                  b[PLAN_PARAM_COPY];
    plan->buffers = b[PLAN_GATHERED] + b[PLAN_GRAD_BUFFERS];
    for (int c = 0; c < PLAN_N_CATEGORIES; c++) plan->total += b[c];

    /* the wire: every acquire of a training pass gathers the unit unless a release kept
     * it; each gradient part is reduce-scattered once */
    if (S > 1) {
        const model_pass *mp = &m->train_pass;
        unsigned char *held = calloc((size_t)plan->n_units, 1);
        SHLM_CHECK_ALLOC(held);
        size_t gathers = 0, reduced = 0;
        for (int i = 0; i < mp->n; i++) {
            const int u = mp->uses[i].unit;
            /* FP8 weights: a byte an element, and the staged rest in act dtype */
            if (!held[u] && plan->fp8_weights && m->lay.units[u].n_fp8 > 0)
                gathers += plan->units[u].padded + (size_t)S * plan->fp8_rest * es;
            else if (!held[u] && nf4_unit(plan, u)) /* NF4: the blocks, then the adapters */
                gathers += (size_t)S * plan->nf4[u].block_bytes + plan->units[u].a_padded * es;
            else if (!held[u])
                gathers += (plan->units[u].padded + plan->units[u].a_padded) * es;
            held[u] = shard_plan_keeps(plan, 1, u, mp->uses[i].phase);
        }
        free(held);
        const model_layout *tl = model_desc_trained(m);
        for (int u = 0; u < plan->n_units; u++) {
            size_t tn, tp, ts;
            shard_plan_trained(plan, u, &tn, &tp, &ts);
            reduced += tp * (size_t)tl->units[u].grad_writes;
        }
        plan->shard_wire_per_micro = (gathers + reduced * rs) / (size_t)S * (size_t)(S - 1);
    }
    if (R > 1) plan->replica_wire_per_step = 2 * sum_trained * rs / (size_t)R * (size_t)(R - 1);
}

void shard_plan_trained(const shard_plan *plan, int u, size_t *numel, size_t *padded,
                        size_t *shard) {
    const plan_unit *x = &plan->units[u];
    *numel = plan->lora ? x->a_numel : x->numel;
    *padded = plan->lora ? x->a_padded : x->padded;
    *shard = plan->lora ? x->a_shard : x->shard;
}

int shard_plan_rest_pieces(const model_unit *lu, size_t begin, size_t end, plan_piece *out) {
    if (end > lu->numel) end = lu->numel;
    int n = 0;
    size_t pos = begin; /* the matrices lie in offset order */
    for (int k = 0; k < lu->n_fp8 && pos < end; k++) {
        const size_t lo = lu->fp8[k].offset, hi = lo + (size_t)lu->fp8[k].rows * lu->fp8[k].cols;
        if (hi <= pos) continue;
        if (lo > pos) out[n++] = (plan_piece){pos, (lo < end ? lo : end) - pos};
        pos = hi;
    }
    if (pos < end) out[n++] = (plan_piece){pos, end - pos};
    return n;
}

void shard_plan_free(shard_plan *plan) {
    free(plan->units);
    free(plan->nf4);
    for (int k = 0; k < 2; k++) {
        free(plan->pass[k].next);
        free(plan->pass[k].keep);
    }
    memset(plan, 0, sizeof *plan);
}

int shard_plan_next(const shard_plan *plan, int with_backward, int u, model_phase phase) {
    return plan->pass[with_backward != 0].next[(size_t)u * 3 + phase];
}

int shard_plan_keeps(const shard_plan *plan, int with_backward, int u, model_phase phase) {
    return plan->pass[with_backward != 0].keep[(size_t)u * 3 + phase];
}
