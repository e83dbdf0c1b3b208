/* Stand-ins for the few backend functions that kernels/cuda/attention.cu and
 * attention_sm90.cu call (memory.cu's stream, scratch and host wait, check.c's fatal path), so that
 * tests/gpu/attn_sm90_check.cu can also be built with nvcc alone -- no MPI, no
 * configure, no libshardlm.a -- e.g. on the GPU machine, from the repository root:
 *
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -o /tmp/attn_sm90_check \
 *       tests/gpu/attn_sm90_check.cu tests/gpu/attn_sm90_shim.cu \
 *       kernels/cuda/attention.cu kernels/cuda/attention_sm90.cu \
 *       kernels/cuda/attention_bwd_sm90.cu kernels/cuda/rope.cu
 *
 * (attention.cu is then built for sm_90a rather than the project's sm_90: the same code.)
 * Same behaviour as the originals for one device and one process. */
#include "kernels/cuda/cuda_common.cuh"

#include <stdarg.h>

cudaStream_t shlm_cuda_stream(void) {
    static cudaStream_t s = NULL;
    if (!s) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

extern "C" void *shlm_cuda_stream_handle(void) { return (void *)shlm_cuda_stream(); }

int shlm_cuda_sm_count(void) {
    static int n = 0;
    if (n == 0) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    }
    return n;
}

/* no host-wait hook outside the program: a plain synchronize */
void shlm_cuda_host_wait(cudaStream_t s) { CUDA_CHECK(cudaStreamSynchronize(s)); }

/* grows (after synchronising the stream: the old buffer may be in use), never shrinks */
void *shlm_cuda_scratch(size_t bytes) {
    static void *p = NULL;
    static size_t have = 0;
    if (bytes > have) {
        CUDA_CHECK(cudaStreamSynchronize(shlm_cuda_stream()));
        if (p) CUDA_CHECK(cudaFree(p));
        CUDA_CHECK(cudaMalloc(&p, bytes));
        have = bytes;
    }
    return p;
}

extern "C" void shlm_fatal_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (%s:%d)\n", file, line);
    va_end(ap);
    exit(1);
}
