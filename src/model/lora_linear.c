/* LoRA's adapters at a model's products (lora_linear.h): buffers, forward, backward. */
#include "src/model/lora_linear.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "src/engine/adapters.h"

enum { NK = MODEL_MAX_FP8_WEIGHTS };

/* What the walk over the buffers counts: bytes, each buffer rounded up to align. */
typedef struct walk {
    lora_linear *ll; /* NULL: count only */
    size_t bytes, align;
} walk;

static void *take(walk *w, size_t bytes) {
    w->bytes += (bytes + w->align - 1) / w->align * w->align;
    return w->ll ? w->ll->ops->alloc(bytes) : NULL;
}

/* The largest product widths over the layers' adapted products. */
typedef struct widths {
    size_t C, OC, R, rows;
    size_t OCk[NK], Rk[NK]; /* per product index, over the layers */
    int dora_k[NK];          /* product k has DoRA sites in some layer */
} widths;

static widths widths_of(const model_layout *lay, lora_product (*pr)[NK], const lora_config *lc,
                        int first, int n) {
    widths z;
    memset(&z, 0, sizeof z);
    for (int l = 0; l < n; l++) {
        const model_unit *u = &lay->units[first + l];
        for (int k = 0; k < u->n_fp8; k++) {
            const lora_product *p = &pr[first + l][k];
            if (!p->n_sites) continue;
            const size_t C = (size_t)u->fp8[k].cols, OC = (size_t)u->fp8[k].rows;
            const size_t R = (size_t)p->n_sites * (size_t)lc->rank;
            if (C > z.C) z.C = C;
            if (OC > z.OC) z.OC = OC;
            if (R > z.R) z.R = R;
            if (OC > z.OCk[k]) z.OCk[k] = OC;
            if (R > z.Rk[k]) z.Rk[k] = R;
            for (int j = 0; j < p->n_sites; j++)
                if ((size_t)p->sites[j].rows > z.rows) z.rows = (size_t)p->sites[j].rows;
            if (lc->dora) z.dora_k[k] = 1;
        }
    }
    return z;
}

size_t lora_linear_init(lora_linear *ll, const shlm_ops *ops, const model_layout *lay,
                        const lora_config *lc, int first_unit, int n_layers, int B, int T,
                        int keep, size_t esz, size_t align) {
    model_layout adapters;
    lora_product (*pr)[NK];
    adapters_layout(lay, lc, &adapters, &pr);
    walk w = {ll, 0, align > 0 ? align : 1};
    const size_t N = (size_t)B * T, r = (size_t)lc->rank;
    const widths z = widths_of(lay, pr, lc, first_unit, n_layers);
    if (ll) {
        memset(ll, 0, sizeof *ll);
        ll->ops = ops;
        ll->cfg = *lc;
        ll->scale = lora_scale(lc);
        ll->esz = esz;
        ll->adapters = adapters;
        ll->products = pr;
        ll->lay = lay;
        ll->first_unit = first_unit;
        ll->n_layers = n_layers;
        ll->N = (int)N;
        ll->keep = keep;
        ll->zs = calloc((size_t)n_layers * NK, sizeof(void *));
        ll->u = calloc((size_t)n_layers * NK, sizeof(void *));
        ll->n2 = calloc((size_t)n_layers * NK, sizeof(float *));
        SHLM_CHECK_ALLOC(ll->zs);
        SHLM_CHECK_ALLOC(ll->u);
        SHLM_CHECK_ALLOC(ll->n2);
    }
    /* zs, and DoRA's u and n2: per layer when kept, else one of each per product index */
    for (int k = 0; k < NK; k++) {
        void *zs = NULL, *u = NULL;
        float *n2 = NULL;
        if (!keep && z.Rk[k]) zs = take(&w, N * z.Rk[k] * esz);
        if (!keep && z.dora_k[k]) {
            u = take(&w, N * z.OCk[k] * esz);
            n2 = take(&w, z.OCk[k] * sizeof(float));
        }
        for (int l = 0; l < n_layers; l++) {
            const lora_product *p = &pr[first_unit + l][k];
            if (k >= lay->units[first_unit + l].n_fp8 || !p->n_sites) continue;
            const model_fp8_weight *f = &lay->units[first_unit + l].fp8[k];
            const size_t R = (size_t)p->n_sites * r, OC = (size_t)f->rows;
            void *zl = keep ? take(&w, N * R * esz) : zs;
            void *ul = lc->dora ? (keep ? take(&w, N * OC * esz) : u) : NULL;
            float *nl = lc->dora ? (keep ? take(&w, OC * sizeof(float)) : n2) : NULL;
            if (ll) ll->zs[l * NK + k] = zl, ll->u[l * NK + k] = ul, ll->n2[l * NK + k] = nl;
        }
    }
    void *p;
#define ONE(field, bytes)                   \
    do {                                    \
        p = take(&w, bytes);                \
        if (ll) ll->field = p;              \
    } while (0)
    if (lc->dropout > 0) ONE(xd, N * z.C * esz);
    ONE(bbd, z.OC * z.R * esz);
    ONE(dbbd, z.OC * z.R * sizeof(float));
    ONE(dz, N * z.R * esz);
    if (lc->dora) {
        ONE(du, N * z.OC * esz);
        ONE(p, z.rows * r * esz);
        ONE(bg, z.rows * r * esz);
        ONE(g, r * r * esz);
    }
    ONE(keys_dev, (size_t)B * sizeof(uint64_t));
#undef ONE
    if (!ll) {
        model_layout_free(&adapters);
        free(pr);
    }
    return w.bytes;
}

void lora_linear_free(lora_linear *ll) {
    if (!ll || !ll->ops) return;
    const shlm_ops *o = ll->ops;
    /* kept: one buffer per layer; else the layers share one per product index */
    for (int k = 0; k < NK; k++)
        for (int l = 0; l < (ll->keep ? ll->n_layers : 1); l++) {
            void *zs = ll->zs[l * NK + k], *u = ll->u[l * NK + k];
            float *n2 = ll->n2[l * NK + k];
            for (int m = l + 1; !ll->keep && m < ll->n_layers && !zs; m++)
                zs = ll->zs[m * NK + k], u = ll->u[m * NK + k], n2 = ll->n2[m * NK + k];
            o->free(zs);
            o->free(u);
            o->free(n2);
        }
    void *p[] = {ll->xd, ll->bbd, ll->dbbd, ll->dz, ll->du, ll->p, ll->bg, ll->g, ll->keys_dev};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) o->free(p[i]);
    free(ll->zs);
    free(ll->u);
    free(ll->n2);
    model_layout_free(&ll->adapters);
    free(ll->products);
    memset(ll, 0, sizeof *ll);
}

static const lora_product *product(const lora_linear *ll, int l, int k) {
    return &ll->products[ll->first_unit + l][k];
}

int lora_linear_on(const lora_linear *ll, int l, int k) {
    return ll->ops && product(ll, l, k)->n_sites > 0;
}

int lora_linear_dora(const lora_linear *ll, int l, int k) {
    return lora_linear_on(ll, l, k) && ll->cfg.dora;
}

void *lora_linear_base_out(const lora_linear *ll, int l, int k) {
    return lora_linear_dora(ll, l, k) ? ll->u[l * NK + k] : NULL;
}

void lora_linear_begin(lora_linear *ll, const uint64_t *row_keys, int B) {
    ll->keys = NULL;
    if (!row_keys || ll->cfg.dropout <= 0) return;
    ll->ops->to_device(ll->keys_dev, row_keys, (size_t)B * sizeof(uint64_t));
    ll->keys = ll->keys_dev;
}

/* Adapter tensor i of layer l: its element offset in the adapter unit. */
static size_t at(const lora_linear *ll, int l, int i) {
    return ll->adapters.units[ll->first_unit + l].tensors[i].offset;
}
static const void *ap_at(const lora_linear *ll, const void *ap, int l, int i) {
    return (const char *)ap + at(ll, l, i) * ll->esz;
}

/* The product's shape: OC x C, R = sites · r. */
static void dims(const lora_linear *ll, int l, int k, int *OC, int *C, int *R) {
    const model_fp8_weight *f = &ll->lay->units[ll->first_unit + l].fp8[k];
    *OC = f->rows;
    *C = f->cols;
    *R = product(ll, l, k)->n_sites * ll->cfg.rank;
}

/* Bbd (OC x R): zero, then B_j (rows_j x r) at rows row0_j, columns j·r. */
static void build_bbd(lora_linear *ll, int l, int k, const void *ap) {
    const lora_product *p = product(ll, l, k);
    int OC, C, R;
    dims(ll, l, k, &OC, &C, &R);
    const int r = ll->cfg.rank;
    ll->ops->zero(ll->bbd, (size_t)OC * R * ll->esz);
    for (int j = 0; j < p->n_sites; j++)
        ll->ops->copy2d((char *)ll->bbd + ((size_t)p->sites[j].row0 * R + (size_t)j * r) * ll->esz,
                        (size_t)R, ap_at(ll, ap, l, p->sites[j].b), (size_t)r, p->sites[j].rows, r);
}

/* The salt of layer l's product k in the dropout mask. */
static uint64_t salt_of(int l, int k) { return ((uint64_t)l << 8 | (uint64_t)k) + 1; }

/* The adapters' input: dropout(inp) into xd in training with dropout, else inp. */
static const void *adapter_input(lora_linear *ll, int l, int k, const void *inp, int N, int T,
                                 int C) {
    if (!ll->keys) return inp;
    ll->ops->dropout(ll->xd, inp, N, T, C, ll->cfg.dropout, ll->keys, salt_of(l, k), 0);
    return ll->xd;
}

/* DoRA's n2 of every site of product k: ||W_j||² + 2s·<B_j, W_j·A_jᵀ> + s²·<B_j, B_j·A_j·A_jᵀ>
 * by rows, ||W + s·B·A||² without forming B·A (out x in). */
static void dora_norms(lora_linear *ll, int l, int k, const void *w, const void *ap) {
    const shlm_ops *o = ll->ops;
    const lora_product *p = product(ll, l, k);
    int OC, C, R;
    dims(ll, l, k, &OC, &C, &R);
    const int r = ll->cfg.rank;
    const float s = ll->scale;
    float *n2 = ll->n2[l * NK + k];
    for (int j = 0; j < p->n_sites; j++) {
        const lora_site *st = &p->sites[j];
        const void *wj = (const char *)w + (size_t)st->row0 * C * ll->esz;
        const void *aj = ap_at(ll, ap, l, st->a), *bj = ap_at(ll, ap, l, st->b);
        o->row_dot(n2 + st->row0, wj, wj, st->rows, C, 1.0f, 0);
        o->matmul_fwd(ll->p, wj, aj, st->rows, C, r, NULL);
        o->row_dot(n2 + st->row0, bj, ll->p, st->rows, r, 2.0f * s, 1);
        o->matmul_fwd(ll->g, aj, aj, r, C, r, NULL);
        o->matmul_fwd(ll->bg, bj, ll->g, st->rows, r, r, NULL);
        o->row_dot(n2 + st->row0, bj, ll->bg, st->rows, r, s * s, 1);
    }
}

/* The columns of product k that belong to no site, as runs [c0, c0 + n): fn on each. */
static void gaps(const lora_linear *ll, int l, int k,
                 void (*fn)(lora_linear *, void *, const void *, int, int, int, int),
                 void *dst, const void *src, int N) {
    const lora_product *p = product(ll, l, k);
    int OC, C, R;
    dims(ll, l, k, &OC, &C, &R);
    int c = 0;
    for (int j = 0; j <= p->n_sites; j++) {
        const int next = j < p->n_sites ? p->sites[j].row0 : OC;
        if (next > c) fn((lora_linear *)ll, dst, src, OC, N, c, next - c);
        if (j < p->n_sites) c = p->sites[j].row0 + p->sites[j].rows;
    }
}

static void copy_cols(lora_linear *ll, void *dst, const void *src, int ld, int N, int c0, int n) {
    ll->ops->copy2d((char *)dst + (size_t)c0 * ll->esz, (size_t)ld,
                    (const char *)src + (size_t)c0 * ll->esz, (size_t)ld, N, n);
}

void lora_linear_fwd(lora_linear *ll, int l, int k, const void *w, const void *ap, void *out,
                     const void *inp, int N, int T, const void *residual) {
    const shlm_ops *o = ll->ops;
    const lora_product *p = product(ll, l, k);
    int OC, C, R;
    dims(ll, l, k, &OC, &C, &R);
    void *zs = ll->zs[l * NK + k];
    const void *x = adapter_input(ll, l, k, inp, N, T, C);
    o->matmul_fwd(zs, x, ap_at(ll, ap, l, p->sites[0].a), N, C, R, NULL);
    o->scale(zs, (size_t)N * R, ll->scale);
    build_bbd(ll, l, k, ap);
    if (!ll->cfg.dora) { /* out (base + residual) += zs·Bbdᵀ */
        o->matmul_fwd(out, zs, ll->bbd, N, R, OC, out);
        return;
    }
    void *u = ll->u[l * NK + k];
    o->matmul_fwd(u, zs, ll->bbd, N, R, OC, u);
    dora_norms(ll, l, k, w, ap);
    const float *n2 = ll->n2[l * NK + k];
    for (int j = 0; j < p->n_sites; j++) {
        const lora_site *st = &p->sites[j];
        const size_t c0 = (size_t)st->row0 * ll->esz;
        o->dora_scale((char *)out + c0, (const char *)u + c0,
                      residual ? (const char *)residual + c0 : NULL, OC, ap_at(ll, ap, l, st->m),
                      n2 + st->row0, N, st->rows);
    }
    if (residual && p->n_sites && (p->sites[0].row0 != 0 || p->sites[p->n_sites - 1].row0 +
                                                               p->sites[p->n_sites - 1].rows != OC))
        SHLM_FATAL("lora_linear: a DoRA product with a residual must be adapted whole");
    gaps(ll, l, k, copy_cols, out, u, N);
}

const void *lora_linear_bwd_dout(lora_linear *ll, int l, int k, const void *ap, float *ag,
                                 int ag_set, void *dout, int writable, int N) {
    if (!lora_linear_dora(ll, l, k)) return dout;
    const shlm_ops *o = ll->ops;
    const lora_product *p = product(ll, l, k);
    int OC, C, R;
    dims(ll, l, k, &OC, &C, &R);
    const void *u = ll->u[l * NK + k];
    const float *n2 = ll->n2[l * NK + k];
    void *dy = writable ? dout : ll->du;
    for (int j = 0; j < p->n_sites; j++) {
        const lora_site *st = &p->sites[j];
        const size_t c0 = (size_t)st->row0 * ll->esz;
        o->col_dot(ag + at(ll, l, st->m), (const char *)dout + c0, (const char *)u + c0, OC,
                   n2 + st->row0, N, st->rows, ag_set);
        o->dora_scale((char *)dy + c0, (const char *)dout + c0, NULL, OC, ap_at(ll, ap, l, st->m),
                      n2 + st->row0, N, st->rows);
    }
    if (!writable) gaps(ll, l, k, copy_cols, dy, dout, N);
    return dy;
}

void lora_linear_bwd(lora_linear *ll, int l, int k, const void *ap, float *ag, int ag_set,
                     void *dinp, const void *dy, const void *inp, int N, int T) {
    const shlm_ops *o = ll->ops;
    const lora_product *p = product(ll, l, k);
    int OC, C, R;
    dims(ll, l, k, &OC, &C, &R);
    const int r = ll->cfg.rank;
    const void *zs = ll->zs[l * NK + k];
    build_bbd(ll, l, k, ap);
    /* dzs = dy·Bbd; dBbd = dyᵀ·zs, whose diagonal blocks are the B's gradients */
    o->matmul_bwd(ll->dz, NULL, dy, NULL, ll->bbd, N, R, OC, SHLM_MM_SET_DINP);
    o->matmul_bwd(NULL, ll->dbbd, dy, zs, NULL, N, R, OC, SHLM_MM_SET_DWEIGHT);
    for (int j = 0; j < p->n_sites; j++)
        o->f32_add2d(ag + at(ll, l, p->sites[j].b), (size_t)r,
                     ll->dbbd + (size_t)p->sites[j].row0 * R + (size_t)j * r, (size_t)R,
                     p->sites[j].rows, r, ag_set);
    o->scale(ll->dz, (size_t)N * R, ll->scale);
    /* dA = dzᵀ·dropout(x) (every A of the product at once); dx += dropout(dz·A) */
    const void *x = adapter_input(ll, l, k, inp, N, T, C);
    const size_t a0 = at(ll, l, p->sites[0].a);
    o->matmul_bwd(NULL, ag + a0, ll->dz, x, NULL, N, C, R, ag_set ? SHLM_MM_SET_DWEIGHT : 0);
    if (!ll->keys) {
        o->matmul_bwd(dinp, NULL, ll->dz, NULL, ap_at(ll, ap, l, p->sites[0].a), N, C, R, 0);
        return;
    }
    o->matmul_bwd(ll->xd, NULL, ll->dz, NULL, ap_at(ll, ap, l, p->sites[0].a), N, C, R,
                  SHLM_MM_SET_DINP);
    o->dropout(dinp, ll->xd, N, T, C, ll->cfg.dropout, ll->keys, salt_of(l, k), 1);
}
