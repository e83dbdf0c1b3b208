/* cuda backend memory: device allocations (cudaMalloc for now; one up-front arena later),
 * copies, the backend's single stream, and a growable scratch buffer shared by the ops. */
#include "kernels/cuda/cuda_common.cuh"

#include <time.h>

#include <nvtx3/nvToolsExt.h>

/* One process drives one GPU (the rank binds it with cudaSetDevice before the first op),
 * so the stream and the scratch buffer are process-wide and created on first use. */
static cudaStream_t g_stream;
static bool g_stream_made;
static int g_stream_device = -1;
static void *g_scratch;
static size_t g_scratch_bytes;
static int g_sm_count;
static void (*g_host_wait_hook)(void);

cudaStream_t shlm_cuda_stream(void) {
    if (!g_stream_made) {
        /* non-blocking: the legacy default stream (which other libraries may use
         * implicitly) must never serialise against the compute stream */
        CUDA_CHECK(cudaGetDevice(&g_stream_device));
        CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
        g_stream_made = true;
    }
    return g_stream;
}

extern "C" void *shlm_cuda_stream_handle(void) { return (void *)shlm_cuda_stream(); }

extern "C" void shlm_cuda_set_host_wait_hook(void (*hook)(void)) { g_host_wait_hook = hook; }

static double host_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

void shlm_cuda_host_wait(cudaStream_t s) {
    if (!g_host_wait_hook) {
        CUDA_CHECK(cudaStreamSynchronize(s));
        return;
    }
    /* a query costs about a microsecond: the spin notices the end as soon as a
     * synchronize would, and the hook runs every 0.2 ms */
    double next_hook = host_now_s() + 2e-4;
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) CUDA_CHECK(e);
        double t = host_now_s();
        if (t >= next_hook) {
            g_host_wait_hook();
            next_hook = t + 2e-4;
        }
    }
}

int shlm_cuda_sm_count(void) {
    if (g_sm_count == 0) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&g_sm_count, cudaDevAttrMultiProcessorCount, dev));
    }
    return g_sm_count;
}

void *shlm_cuda_scratch(size_t bytes) {
    if (bytes <= g_scratch_bytes) return g_scratch;
    cudaStream_t s = shlm_cuda_stream();
    /* the old buffer may still be read by queued kernels */
    shlm_cuda_host_wait(s);
    CUDA_CHECK(cudaFree(g_scratch));
    /* grow geometrically so that a few small sizes seen in turn do not reallocate every
     * time; a large request (attention's dS, hundreds of MB) gets exactly its size */
    size_t want = bytes < 2 * g_scratch_bytes && bytes < ((size_t)64 << 20) ? 2 * g_scratch_bytes
                                                                            : bytes;
    want = (want + 4095) / 4096 * 4096;
    g_scratch = NULL;
    g_scratch_bytes = 0;
    cudaError_t rc = cudaMalloc(&g_scratch, want);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        SHLM_FATAL("out of device memory: scratch buffer of %zu bytes (%s)", want,
                   cudaGetErrorString(rc));
    }
    g_scratch_bytes = want;
    return g_scratch;
}

extern "C" size_t shlm_cuda_step_scratch_bytes(int B, int T, int dim, int n_heads,
                                               int n_kv_heads, int head_dim) {
    size_t need = shlm_cuda_attention_bwd_scratch(B, T, n_heads, n_kv_heads, head_dim);
    const size_t rms = shlm_cuda_rmsnorm_bwd_scratch(B * T, dim);
    const size_t ss = shlm_cuda_sum_squares_scratch();
    if (rms > need) need = rms;
    if (ss > need) need = ss;
    return need + shlm_cuda_matmul_workspace_bytes();
}

/* bytes as scratch_bytes returned them: the scratch and cuBLASLt's workspace */
extern "C" void shlm_cuda_scratch_reserve(size_t bytes) {
    const size_t ws = shlm_cuda_matmul_workspace_bytes();
    shlm_cuda_matmul_init();
    if (bytes > ws) (void)shlm_cuda_scratch(bytes - ws);
}

/* ------------------------------------------------------------------ launchers */

extern "C" int shlm_cuda_available(void) {
    int n = 0;
    /* no driver or no GPU is an answer here, not an error: the cpu backend must stay
     * usable on machines that have the toolkit but no GPU (CI) */
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it so that later checks do not report it */
        return 0;
    }
    return n > 0;
}

extern "C" int shlm_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void shlm_cuda_set_device(int device) {
    const int n = shlm_cuda_device_count();
    if (device < 0 || device >= n)
        SHLM_FATAL("cuda: device %d requested, but %d visible (CUDA_VISIBLE_DEVICES?)", device, n);
    /* the stream, scratch buffer, cuBLASLt handle and workspace belong to the device
     * that was current when they were made: binding must come first */
    if (g_stream_made && device != g_stream_device)
        SHLM_FATAL("cuda: set_device(%d) after the backend started work on device %d", device,
                   g_stream_device);
    CUDA_CHECK(cudaSetDevice(device));
    g_sm_count = 0;
}

extern "C" int shlm_cuda_device_info(shlm_device_info *out) {
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess ||
        cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    return 0;
}

/* NVTX ranges (header-only NVTX 3 in the CUDA toolkit: no library to link) */
extern "C" void shlm_cuda_range_push(const char *name) { nvtxRangePushA(name); }
extern "C" void shlm_cuda_range_pop(void) { nvtxRangePop(); }

extern "C" int shlm_cuda_mem_info(size_t *used, size_t *total) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    *used = total_b - free_b;
    *total = total_b;
    return 0;
}

/* The arena: one cudaMalloc sized from the plan at start-up (shlm_cuda_reserve); every
 * later alloc is a bump of its offset, so a step allocates nothing and fragmentation
 * cannot grow. Frees inside it are no-ops (buffers live until the process ends). */
static char *g_arena;
static size_t g_arena_size, g_arena_used;
enum { ARENA_ALIGN = SHLM_CUDA_ALLOC_ALIGN };

extern "C" int shlm_cuda_reserve(size_t bytes) {
    if (g_arena) SHLM_FATAL("cuda: the device arena is reserved already (%zu bytes)", g_arena_size);
    bytes = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    cudaError_t rc = cudaMalloc((void **)&g_arena, bytes);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        g_arena = NULL;
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        SHLM_FATAL("out of device memory reserving the %zu-byte arena (%s; %zu of %zu bytes free)",
                   bytes, cudaGetErrorString(rc), free_b, total_b);
    }
    g_arena_size = bytes;
    g_arena_used = 0;
    return 0;
}

static int in_arena(const void *p) {
    return g_arena && (const char *)p >= g_arena && (const char *)p < g_arena + g_arena_size;
}

extern "C" void *shlm_cuda_alloc(size_t bytes) {
    /* at least one granule, so that a 0-byte request still returns a unique pointer
     * that free() accepts, as on the cpu backend */
    size_t rounded = bytes == 0 ? ARENA_ALIGN : (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    void *p = NULL;
    if (g_arena && g_arena_used + rounded <= g_arena_size) {
        p = g_arena + g_arena_used;
        g_arena_used += rounded;
    } else {
        if (g_arena) {
            /* the plan undercounted: say so once, and keep going outside the arena */
            static int warned;
            if (!warned++)
                fprintf(stderr, "shardlm: warning: device arena of %zu bytes full; %zu more "
                        "allocated outside it (the plan undercounts)\n", g_arena_size, bytes);
        }
        cudaError_t rc = cudaMalloc(&p, rounded);
        if (rc != cudaSuccess || p == NULL) {
            (void)cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            SHLM_FATAL("out of device memory allocating %zu bytes (%s; %zu of %zu bytes free)",
                       bytes, cudaGetErrorString(rc), free_b, total_b);
        }
    }
    cudaStream_t s = shlm_cuda_stream();
    CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, s));
    /* allocations happen at set-up; waiting here makes the zeros visible to any stream
     * (the comm backend's too), not only to ops queued after this one */
    CUDA_CHECK(cudaStreamSynchronize(s));
    return p;
}
extern "C" void shlm_cuda_free(void *p) {
    if (p == NULL || in_arena(p)) return;
    /* cudaFree waits for the device, so kernels still reading p finish first */
    CUDA_CHECK(cudaFree(p));
}

extern "C" void shlm_cuda_zero(void *p, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, shlm_cuda_stream()));
}

extern "C" void shlm_cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, shlm_cuda_stream()));
}

/* A copy between host and device memory, done when this returns: the stream is drained
 * first (see shlm_cuda_host_wait) and after, so the caller may reuse the host buffer at
 * once (it may be pinned, when the copy would otherwise still be in flight); uploads are
 * once per micro-batch. */
static void host_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return;
    cudaStream_t s = shlm_cuda_stream();
    shlm_cuda_host_wait(s);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    shlm_cuda_host_wait(s);
}

extern "C" void shlm_cuda_to_device(void *dst, const void *host_src, size_t bytes) {
    host_copy(dst, host_src, bytes, cudaMemcpyHostToDevice);
}

extern "C" void shlm_cuda_to_host(void *host_dst, const void *src, size_t bytes) {
    host_copy(host_dst, src, bytes, cudaMemcpyDeviceToHost);
}

extern "C" void shlm_cuda_sync(void) { shlm_cuda_host_wait(shlm_cuda_stream()); }

extern "C" void *shlm_cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError(); /* a refusal is the caller's to handle, not sticky */
        return NULL;
    }
    return p;
}

extern "C" void shlm_cuda_host_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

/* The side stream of the asynchronous downloads, and the event that orders each after the
 * work queued on the backend's stream so far (what it copies is final there). */
static cudaStream_t g_download_stream;
static cudaEvent_t g_download_after;

extern "C" void shlm_cuda_to_host_async(void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    if (!g_download_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&g_download_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&g_download_after, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(g_download_after, shlm_cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(g_download_stream, g_download_after, 0));
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost,
                               g_download_stream));
}

extern "C" void shlm_cuda_to_host_wait(void) {
    if (g_download_stream) shlm_cuda_host_wait(g_download_stream);
}

/* The side stream of the asynchronous uploads: each copy waits for the work queued on the
 * backend's stream so far (which may still read what it overwrites), and the backend's
 * stream waits for the copy before anything queued after it. */
static cudaStream_t g_upload_stream;
static cudaEvent_t g_upload_after, g_upload_done;

extern "C" void shlm_cuda_to_device_async(void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return;
    if (!g_upload_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&g_upload_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&g_upload_after, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&g_upload_done, cudaEventDisableTiming));
    }
    cudaStream_t s = shlm_cuda_stream();
    CUDA_CHECK(cudaEventRecord(g_upload_after, s));
    CUDA_CHECK(cudaStreamWaitEvent(g_upload_stream, g_upload_after, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, g_upload_stream));
    CUDA_CHECK(cudaEventRecord(g_upload_done, g_upload_stream));
    CUDA_CHECK(cudaStreamWaitEvent(s, g_upload_done, 0));
}

extern "C" void shlm_cuda_to_device_wait(void) {
    if (g_upload_stream) shlm_cuda_host_wait(g_upload_stream);
}
