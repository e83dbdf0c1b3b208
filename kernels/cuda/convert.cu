/* cuda backend dtype conversion: fp32 <-> bf16 (round to nearest even, bit-identical to
 * the cpu backend's shlm_f32_to_bf16) for act tensors and collectives, in-place rounding. */
#include "kernels/cuda/cuda_common.cuh"

/* ------------------------------------------------------------------ kernels */

/* Written out rather than __float2bfloat16_rn so that NaN payloads come out as the cpu
 * backend's do: both backends must produce the same bits from the same fp32 input. */
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
    return __uint_as_float((uint32_t)b << 16);
}

__device__ __forceinline__ uint2 f32x4_to_bf16x4(float4 f) {
    uint2 o;
    o.x = (uint32_t)f32_to_bf16_bits(f.x) | ((uint32_t)f32_to_bf16_bits(f.y) << 16);
    o.y = (uint32_t)f32_to_bf16_bits(f.z) | ((uint32_t)f32_to_bf16_bits(f.w) << 16);
    return o;
}

/* 4 elements per 16-byte fp32 load when every pointer allows it, two loads issued before
 * either result is stored (this cast runs before every all-gather: one load in flight per
 * thread reached 82% of the copy ceiling); the tail
 * and unaligned buffers go element by element. */
__global__ void f32_to_bf16_kernel(uint16_t *out, const float *in, size_t n, bool vec) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (vec) {
        const size_t nv = n / 4;
        const float4 *in4 = reinterpret_cast<const float4 *>(in);
        uint2 *out4 = reinterpret_cast<uint2 *>(out);
        for (size_t v = i; v < nv; v += 2 * stride) {
            const size_t v2 = v + stride;
            const float4 f = in4[v];
            float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (v2 < nv) g = in4[v2];
            out4[v] = f32x4_to_bf16x4(f);
            if (v2 < nv) out4[v2] = f32x4_to_bf16x4(g);
        }
        done = nv * 4;
    }
    for (size_t k = done + i; k < n; k += stride) out[k] = f32_to_bf16_bits(in[k]);
}

__global__ void bf16_to_f32_kernel(float *out, const uint16_t *in, size_t n, bool vec) {
    grid_stride_x4(
        n, vec,
        [&](size_t v) {
            uint2 b = reinterpret_cast<const uint2 *>(in)[v];
            float4 f;
            f.x = bf16_bits_to_f32((uint16_t)(b.x & 0xFFFFu));
            f.y = bf16_bits_to_f32((uint16_t)(b.x >> 16));
            f.z = bf16_bits_to_f32((uint16_t)(b.y & 0xFFFFu));
            f.w = bf16_bits_to_f32((uint16_t)(b.y >> 16));
            reinterpret_cast<float4 *>(out)[v] = f;
        },
        [&](size_t k) { out[k] = bf16_bits_to_f32(in[k]); });
}

__global__ void round_bf16_kernel(float *x, size_t n, bool vec) {
    grid_stride_x4(
        n, vec,
        [&](size_t v) {
            float4 f = reinterpret_cast<float4 *>(x)[v];
            f.x = bf16_bits_to_f32(f32_to_bf16_bits(f.x));
            f.y = bf16_bits_to_f32(f32_to_bf16_bits(f.y));
            f.z = bf16_bits_to_f32(f32_to_bf16_bits(f.z));
            f.w = bf16_bits_to_f32(f32_to_bf16_bits(f.w));
            reinterpret_cast<float4 *>(x)[v] = f;
        },
        [&](size_t k) { x[k] = bf16_bits_to_f32(f32_to_bf16_bits(x[k])); });
}

/* ------------------------------------------------------------------ launchers */

enum { CONV_THREADS = 256 };

static unsigned int conv_blocks(size_t n) {
    /* a grid-stride loop: enough blocks to fill the GPU several times over, no more */
    return shlm_cuda_blocks((n + 3) / 4, CONV_THREADS, (size_t)shlm_cuda_sm_count() * 32);
}

extern "C" void shlm_cuda_f32_to_act(void *act, const float *f32, size_t n) {
    if (n == 0) return;
    bool vec = shlm_aligned(act, 8) && shlm_aligned(f32, 16);
    f32_to_bf16_kernel<<<conv_blocks(n), CONV_THREADS, 0, shlm_cuda_stream()>>>(
        (uint16_t *)act, f32, n, vec);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_f32_to_bf16(uint16_t *bf16, const float *f32, size_t n) {
    shlm_cuda_f32_to_act(bf16, f32, n);
}

extern "C" void shlm_cuda_bf16_to_f32(float *f32, const uint16_t *bf16, size_t n) {
    if (n == 0) return;
    bool vec = shlm_aligned(bf16, 8) && shlm_aligned(f32, 16);
    bf16_to_f32_kernel<<<conv_blocks(n), CONV_THREADS, 0, shlm_cuda_stream()>>>(f32, bf16, n, vec);
    CUDA_CHECK_LAST();
}

extern "C" void shlm_cuda_round_to_bf16(float *x, size_t n) {
    if (n == 0) return;
    round_bf16_kernel<<<conv_blocks(n), CONV_THREADS, 0, shlm_cuda_stream()>>>(
        x, n, shlm_aligned(x, 16));
    CUDA_CHECK_LAST();
}

/* The compute capabilities this file was compiled for (nvcc's __CUDA_ARCH_LIST__, "900"
 * or "800,900"), as "9.0" or "8.0, 9.0". */
static void built_for(char *out, size_t outlen) {
#ifdef __CUDA_ARCH_LIST__
#define SHLM_STR2(...) #__VA_ARGS__
#define SHLM_STR(...) SHLM_STR2(__VA_ARGS__)
    const char *list = SHLM_STR(__CUDA_ARCH_LIST__);
#else
    const char *list = "";
#endif
    size_t n = 0;
    out[0] = '\0';
    for (const char *p = list; *p && n + 8 < outlen;) {
        long a = strtol(p, (char **)&p, 10);
        n += (size_t)snprintf(out + n, outlen - n, "%s%ld.%ld", n ? ", " : "", a / 100, a / 10 % 10);
        while (*p == ',' || *p == ' ') p++;
    }
    if (!out[0]) snprintf(out, outlen, "unknown targets");
}

/* A real load: cudaFuncGetAttributes on one of this build's portable kernels fails with
 * cudaErrorNoKernelImageForDevice where the device can neither run its SASS nor JIT its
 * PTX (an sm_90 build on an A100). Creates the bound device's context, as any op would. */
extern "C" int shlm_cuda_device_check(char *why, size_t whylen) {
    int dev = 0;
    cudaDeviceProp p;
    if (shlm_cuda_bound_device(&dev, &p, why, whylen) != 0) return -1;
    cudaFuncAttributes fa;
    cudaError_t rc = cudaFuncGetAttributes(&fa, round_bf16_kernel);
    if (rc == cudaSuccess) return 0;
    (void)cudaGetLastError();
    char targets[64];
    built_for(targets, sizeof targets);
    snprintf(why, whylen, "device %d, %s (compute capability %d.%d), cannot run this build's "
             "CUDA kernels (built for compute capability %s: %s); rebuild with NVCCFLAGS for "
             "it", dev, p.name, p.major, p.minor, targets, cudaGetErrorString(rc));
    return -1;
}
