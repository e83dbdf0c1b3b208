/* cpu backend memory: host allocations (zeroed, 64-byte aligned so that rows vectorise
 * and no two threads' hot data share a cache line at the start of a buffer, counted for
 * the plan check), copies. */
#include "kernels/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"

enum { SHLM_CPU_ALIGN = 64 };

int shlm_cpu_available(void) { return 1; }

/* Live bytes handed out, as requested: allocations happen at set-up, from one thread.
 * Each buffer carries its requested size in a header line before it, so free can count
 * it back. */
static size_t allocated;

size_t shlm_cpu_allocated_bytes(void) { return allocated; }

void *shlm_cpu_alloc(size_t bytes) {
    /* round up to whole lines (and ask for at least one) so that a 0-byte request still
     * returns a unique pointer that free() accepts, as on every other path */
    size_t rounded = (bytes + SHLM_CPU_ALIGN - 1) / SHLM_CPU_ALIGN * SHLM_CPU_ALIGN;
    if (rounded < bytes || rounded + SHLM_CPU_ALIGN < rounded)
        SHLM_FATAL("host allocation of %zu bytes overflows", bytes);
    if (rounded == 0) rounded = SHLM_CPU_ALIGN;
    char *p = NULL;
    if (posix_memalign((void **)&p, SHLM_CPU_ALIGN, rounded + SHLM_CPU_ALIGN) != 0 || p == NULL)
        SHLM_FATAL("out of host memory allocating %zu bytes", bytes);
    memcpy(p, &bytes, sizeof bytes);
    allocated += bytes;
    memset(p + SHLM_CPU_ALIGN, 0, rounded);
    return p + SHLM_CPU_ALIGN;
}

void shlm_cpu_free(void *p) {
    if (!p) return;
    char *base = (char *)p - SHLM_CPU_ALIGN;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    allocated -= bytes;
    free(base);
}

void shlm_cpu_zero(void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
}

/* memmove rather than memcpy: an in-place all-gather copies a rank's shard onto its own
 * slot (src == dst), which memcpy does not allow. */
void shlm_cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
}

void shlm_cpu_to_device(void *dst, const void *host_src, size_t bytes) {
    shlm_cpu_copy(dst, host_src, bytes);
}

void shlm_cpu_to_host(void *host_dst, const void *src, size_t bytes) {
    shlm_cpu_copy(host_dst, src, bytes);
}

/* every cpu op has finished when it returns */
void shlm_cpu_sync(void) {}
