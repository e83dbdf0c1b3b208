/* LoRA's adapters at a model's products (src/engine/model.h "LoRA"): their forward and
 * backward around the frozen base product that the model computes itself (in any matmul
 * recipe: FP8 applies to the base product, the adapters stay in act dtype), the buffers
 * they need, the seeded dropout and DoRA. A family's model holds one lora_linear and calls
 * it at each of its products (the decoder's linear layers), so every family that lays out
 * its products in its layout (model_unit.fp8, model_tensor.target) gets LoRA.
 *
 * Per adapted product (all its sites, PEFT's layout: each projection its own A and B):
 *   forward   xd = dropout(x) (training with lora.dropout > 0, else x)
 *             zs = scale · xd·[A_1; ..; A_n]ᵀ          one GEMM for every A of the product
 *             y += zs · Bbdᵀ                           one GEMM: Bbd the block-diagonal of
 *                                                      the B's at their rows of y
 *   DoRA      u = x·Wᵀ + zs·Bbdᵀ (kept), y = residual + g ⊙ u per site, g = m / ||W + s·B·A||
 *             by rows (the norm detached, as PEFT does: no gradient flows through it)
 *   backward  (DoRA: dm = Σ dy·u / ||·||, dy ← g ⊙ dy)
 *             dzs = dy·Bbd, dBbd = dyᵀ·zs (its diagonal blocks are the B's gradients),
 *             dz = scale · dzs, dA = dzᵀ·xd, dx += dropout(dz·A)
 * The base product's weight gradient is never computed: the base is frozen. */
#ifndef SHLM_LORA_LINEAR_H
#define SHLM_LORA_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "src/engine/model.h"

typedef struct lora_linear {
    const shlm_ops *ops;
    lora_config cfg;
    float scale;             /* lora_scale */
    size_t esz;              /* act element bytes */
    model_layout adapters;   /* the adapter units (adapters_layout over the model's) */
    lora_product (*products)[MODEL_MAX_FP8_WEIGHTS];
    const model_layout *lay; /* the model's layout (not owned) */
    int first_unit, n_layers;/* layer l is unit first_unit + l */
    int N;                   /* rows of a micro-batch at capacity */
    int keep;                /* zs and DoRA's u, n2 kept per layer (else recomputed) */
    void **zs;               /* [l·4 + k] (N, R_k) act */
    void **u;                /* [l·4 + k] DoRA: (N, OC_k) act */
    float **n2;              /* [l·4 + k] DoRA: (OC_k) the squared norms ||W + s·B·A||² */
    void *xd;                /* (N, max C) dropout(x) (lora.dropout > 0) */
    void *bbd;               /* (max OC, max R) act: Bbd */
    float *dbbd;             /* (max OC, max R) fp32 */
    void *dz;                /* (N, max R) act */
    void *du;                /* DoRA: (N, max OC) act: g ⊙ dy of a product with a residual */
    void *p, *bg, *g;        /* DoRA: (max rows, r), (max rows, r), (r, r) act */
    uint64_t *keys_dev;      /* (B) the rows' dropout keys */
    const uint64_t *keys;    /* this pass's (keys_dev), or NULL: no dropout */
} lora_linear;

/* Allocates ll's buffers for micro-batches of B x T over layout lay (units first_unit ..
 * first_unit + n_layers - 1 are the layers whose products get adapters; lc->rank > 0),
 * keeping zs and DoRA's intermediates per layer when keep (a backward without full
 * recomputation); ll NULL only counts. Returns the bytes, each buffer rounded up to align
 * (the plan's arena rule). */
size_t lora_linear_init(lora_linear *ll, const shlm_ops *ops, const model_layout *lay,
                        const lora_config *lc, int first_unit, int n_layers, int B, int T,
                        int keep, size_t esz, size_t align);
void lora_linear_free(lora_linear *ll);

/* Whether product k of layer l has adapters, and whether they are DoRA's. */
int lora_linear_on(const lora_linear *ll, int l, int k);
int lora_linear_dora(const lora_linear *ll, int l, int k);
/* The buffer a DoRA product's base output goes to (u: no residual), NULL without DoRA. */
void *lora_linear_base_out(const lora_linear *ll, int l, int k);

/* The pass's dropout keys: B host keys (one per sequence: the training sample's), or NULL
 * (evaluation: no dropout). */
void lora_linear_begin(lora_linear *ll, const uint64_t *row_keys, int B);

/* Product k of layer l after its base product: out = base + adapters (out holding the
 * base product with its residual), or DoRA's out = residual + g ⊙ (u + adapters) (u holding
 * the base product alone). w: the product's base weight (act, OC x C, as gathered), ap: the
 * layer's gathered adapters, inp: the product's input (N x C), N = sequences · T. */
void lora_linear_fwd(lora_linear *ll, int l, int k, const void *w, const void *ap, void *out,
                     const void *inp, int N, int T, const void *residual);

/* The first half of product k's backward: DoRA's magnitude gradient (into ag, the layer's
 * adapter gradient; "=" when ag_set) and the gradient through its scale, returned (in
 * dout itself when writable, else in a scratch); without DoRA dout as it is. */
const void *lora_linear_bwd_dout(lora_linear *ll, int l, int k, const void *ap, float *ag,
                                 int ag_set, void *dout, int writable, int N);
/* The rest, after the base product's input gradient went into dinp: the A's and B's
 * gradients into ag ("=" when ag_set) and dinp += the adapters' input gradient. dy: what
 * lora_linear_bwd_dout returned. */
void lora_linear_bwd(lora_linear *ll, int l, int k, const void *ap, float *ag, int ag_set,
                     void *dinp, const void *dy, const void *inp, int N, int T);

#endif
