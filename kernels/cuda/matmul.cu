/* cuda backend linear layer without bias, Hugging Face weight layout (OC,C): forward
 * y = x·Wᵀ and the two backward products through cuBLASLt (bf16 operands, fp32 compute),
 * and the backend's one cuBLASLt handle, workspace and plan cache (shlm_cuda_lt_product,
 * which fp8.cu's scaled products go through too). */
#include "kernels/cuda/cuda_common.cuh"

#include <string.h>

/* No kernels of our own here: the launchers describe each product to cuBLASLt.
 *
 * Row-major to column-major: a row-major (R, K) matrix is a column-major (K, R) one, so
 * every product below is written for its transpose:
 *   out(N,OC)  = inp·Wᵀ      ->  outᵀ(OC,N)  = op_T(W as (C,OC)) · inpᵀ(C,N)
 *   dinp(N,C) += dout·W      ->  dinpᵀ(C,N) += W as (C,OC) · doutᵀ(OC,N)
 *   dW(OC,C)  += doutᵀ·inp   ->  dWᵀ(C,OC)  += inpᵀ(C,N) · op_T(doutᵀ as (OC,N))
 *
 * Accumulation (beta = 1) is cuBLASLt's own C input: D = A·B + C computed in fp32. For
 * the forward's residual, C is the bf16 residual stream and D the next one, so the
 * sum is rounded to bf16 once per layer: the same as the bf16 residual stream of other
 * FSDP implementations (PyTorch FSDP with bf16 params adds in bf16), and what lets the
 * GEMM replace a separate add kernel. dinp is bf16 the same way; dweight is fp32 (bf16
 * A and B with fp32 C/D is a supported cuBLASLt combination), so micro-batch gradient
 * sums do not lose bits. */

enum { LT_WORKSPACE_BYTES = 32 << 20, LT_MAX_PLANS = 128 };

/* Everything cuBLASLt needs for one product, made once: the operation and layout
 * descriptors and the heuristic's algorithm. The key includes the pointers' alignments
 * (capped at 256 bytes), because an algorithm chosen for aligned operands may reject a
 * pointer into the middle of a unit (a tensor of a gathered unit starts wherever the one
 * before it ended). Every member is an int, so the key has no padding for memcmp. */
typedef struct lt_key {
    int transa, transb;
    int m, n, k, lda, ldb, ldc;
    int atype, btype, ctype; /* cudaDataType_t of A, B and of C/D */
    int scale_mode;          /* -1: no scale pointers, else cublasLtMatmulMatrixScale_t */
    int fast_accum;
    int align_a, align_b, align_c;
} lt_key;

typedef struct lt_plan {
    lt_key key;
    int valid;
    int no_algo; /* the heuristic offered nothing, or the library refused the first call */
    int ran;     /* a call through this plan has been queued */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

static cublasLtHandle_t g_lt;
static cublasHandle_t g_blas;
static void *g_workspace;
static lt_plan g_plans[LT_MAX_PLANS];
static int g_next_plan; /* round-robin replacement once the table is full */

/* The handles are the library's own state (device memory the plan does not count, like
 * the context's), made when the process binds its device; the workspace is the plan's
 * (op scratch), allocated with the rest of it. */
static void lt_handles(void) {
    if (g_lt) return;
    CUBLAS_CHECK(cublasLtCreate(&g_lt));
    CUBLAS_CHECK(cublasCreate(&g_blas));
    CUBLAS_CHECK(cublasSetStream(g_blas, shlm_cuda_stream()));
}

static void lt_init(void) {
    lt_handles();
    if (g_workspace) return;
    CUDA_CHECK(cudaMalloc(&g_workspace, LT_WORKSPACE_BYTES));
    CUBLAS_CHECK(cublasSetWorkspace(g_blas, g_workspace, LT_WORKSPACE_BYTES));
}

extern "C" void shlm_cuda_matmul_handles(void) { lt_handles(); }

/* Creates the handles and the workspace ahead of the first product (before step 1). */
extern "C" void shlm_cuda_matmul_init(void) { lt_init(); }

extern "C" size_t shlm_cuda_matmul_workspace_bytes(void) { return LT_WORKSPACE_BYTES; }

static int align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (u & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

static void plan_destroy(lt_plan *p) {
    if (!p->valid) return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
    p->valid = 0;
}

static void set_scale_pointers(cublasLtMatmulDesc_t desc, const shlm_lt_product *g) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &g->a_scale, sizeof g->a_scale));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &g->b_scale, sizeof g->b_scale));
}

static lt_plan *plan_get(const lt_key *key, const shlm_lt_product *g) {
    for (int i = 0; i < LT_MAX_PLANS; i++)
        if (g_plans[i].valid && memcmp(&g_plans[i].key, key, sizeof *key) == 0) return &g_plans[i];
    lt_plan *p = &g_plans[g_next_plan];
    g_next_plan = (g_next_plan + 1) % LT_MAX_PLANS;
    plan_destroy(p);
    memset(p, 0, sizeof *p);
    p->key = *key;

    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (key->scale_mode >= 0) {
        /* the heuristic sees the scaling mode and the pointers; the pointers are set
         * again on every call (they change, the plan does not) */
        int32_t mode = key->scale_mode;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                    &mode, sizeof mode));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                    &mode, sizeof mode));
        set_scale_pointers(p->desc, g);
    }
    if (key->fast_accum) {
        int8_t on = 1;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                    &on, sizeof on));
    }
    /* stored shapes: op(A) is (m,k), op(B) is (k,n) */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, (cudaDataType_t)key->atype,
                                            key->transa ? key->k : key->m,
                                            key->transa ? key->m : key->k, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, (cudaDataType_t)key->btype,
                                            key->transb ? key->n : key->k,
                                            key->transb ? key->k : key->n, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, (cudaDataType_t)key->ctype, key->m, key->n,
                                            key->ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = LT_WORKSPACE_BYTES;
    uint32_t aa = (uint32_t)key->align_a, ab = (uint32_t)key->align_b, ac = (uint32_t)key->align_c;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->c, p->c,
                                                       pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS)
        p->algo = res.algo;
    else
        p->no_algo = 1;
    p->valid = 1;
    return p;
}

int shlm_cuda_lt_product(const shlm_lt_product *g) {
    lt_init();
    lt_key key;
    memset(&key, 0, sizeof key);
    key.transa = g->transa;
    key.transb = g->transb;
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.lda = g->lda;
    key.ldb = g->ldb;
    key.ldc = g->ldc;
    key.atype = (int)g->atype;
    key.btype = (int)g->btype;
    key.ctype = (int)g->ctype;
    key.scale_mode = g->scale_mode;
    key.fast_accum = g->fast_accum;
    key.align_a = align_of(g->A);
    key.align_b = align_of(g->B);
    key.align_c = align_of(g->D) < align_of(g->C) ? align_of(g->D) : align_of(g->C);
    lt_plan *p = plan_get(&key, g);
    if (p->no_algo) return 0;
    if (g->scale_mode >= 0) set_scale_pointers(p->desc, g);
    const float alpha = 1.0f;
    cublasStatus_t st = cublasLtMatmul(g_lt, p->desc, &alpha, g->A, p->a, g->B, p->b, &g->beta,
                                       g->C, p->c, g->D, p->c, &p->algo, g_workspace,
                                       LT_WORKSPACE_BYTES, shlm_cuda_stream());
    if (st == CUBLAS_STATUS_SUCCESS) {
        p->ran = 1;
        return 1;
    }
    /* Some combinations (a scaling mode on a device or library version without it) pass
     * the heuristic and are refused by the call itself, which then queues nothing. */
    if (!p->ran && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
        p->no_algo = 1;
        return 0;
    }
    SHLM_FATAL("cublasLtMatmul failed: cuBLAS status %d: %s (m=%d n=%d k=%d, transa=%d "
               "transb=%d, cudaDataType A %d B %d C/D %d, scale mode %d)",
               (int)st, cublasGetStatusString(st), g->m, g->n, g->k, g->transa, g->transb,
               (int)g->atype, (int)g->btype, (int)g->ctype, g->scale_mode);
}

/* D(m,n) = op(A)·op(B) + beta·C, column-major, A and B bf16, C and D (same layout) bf16
 * or fp32; C may be D. */
static void lt_matmul(int transa, int transb, int m, int n, int k, const void *A, int lda,
                      const void *B, int ldb, const void *C, void *D, int ldc, int c_f32,
                      float beta) {
    shlm_lt_product g;
    memset(&g, 0, sizeof g);
    g.transa = transa;
    g.transb = transb;
    g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
    g.atype = CUDA_R_16BF;
    g.btype = CUDA_R_16BF;
    g.ctype = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    g.scale_mode = -1;
    g.A = A, g.B = B, g.C = C, g.D = D;
    g.beta = beta;
    if (shlm_cuda_lt_product(&g)) return;
    /* odd shapes or 2-byte-aligned operands: plain cuBLAS takes anything; it has no
     * separate C, so D starts from it */
    cudaStream_t s = shlm_cuda_stream();
    if (beta != 0.0f && C != D)
        CUDA_CHECK(cudaMemcpyAsync(D, C, (size_t)ldc * n * (c_f32 ? 4 : 2),
                                   cudaMemcpyDeviceToDevice, s));
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(g_blas, transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                              transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A,
                              CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, D,
                              c_f32 ? CUDA_R_32F : CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

/* ------------------------------------------------------------------ launchers */

extern "C" void shlm_cuda_matmul_fwd(void *out, const void *inp, const void *weight, int N,
                                     int C, int OC, const void *residual) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) { /* an empty sum; cuBLAS would be handed a zero leading dimension */
        if (!residual) shlm_cuda_zero(out, (size_t)N * OC * sizeof(bf16));
        else if (residual != out) shlm_cuda_copy(out, residual, (size_t)N * OC * sizeof(bf16));
        return;
    }
    if (shlm_cuda_gemv(out, inp, weight, N, C, OC, residual)) return; /* a few rows */
    lt_matmul(1, 0, OC, N, C, weight, C, inp, C, residual ? residual : out, out, OC, 0,
              residual ? 1.0f : 0.0f);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_matmul_bwd(void *dinp, float *dweight, const void *dout,
                                     const void *inp, const void *weight, int N, int C, int OC,
                                     int flags) {
    const float beta_x = (flags & SHLM_MM_SET_DINP) ? 0.0f : 1.0f;
    const float beta_w = (flags & SHLM_MM_SET_DWEIGHT) ? 0.0f : 1.0f;
    if (C <= 0) return; /* both outputs are empty */
    if (dinp && N > 0) {
        if (OC > 0) lt_matmul(0, 0, C, N, OC, weight, C, dout, OC, dinp, dinp, C, 0, beta_x);
        else if (beta_x == 0.0f) shlm_cuda_zero(dinp, (size_t)N * C * sizeof(bf16));
    }
    if (dweight && OC > 0) {
        if (N > 0) lt_matmul(0, 1, C, OC, N, inp, C, dout, OC, dweight, dweight, C, 1, beta_w);
        else if (beta_w == 0.0f) shlm_cuda_zero(dweight, (size_t)OC * C * sizeof(float));
    }
    CUDA_CHECK_LAST();
}
