/* Host buffers and device copies of the optimizer offload (see offload.h). */
#include "src/engine/offload.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/host_adamw.h"

struct offload_host {
    const shlm_ops *ops;
    shlm_dtype copy_dtype;
    size_t max_shard;
    size_t bytes;          /* host bytes allocated (state and staging) */
    float *grad[2];        /* (max_shard) gradient shards from the device */
    uint16_t *upload[2];   /* (max_shard) a bf16 copy's staging, alternately; NULL for fp32 */
    unsigned queued, taken, uploads;
};

/* Page-locked where the backend has it (the device copies into it at full speed), else,
 * or when refused, plain memory: the copies work on either. A header of HEAD bytes before
 * the buffer says which, for host_free (cudaFreeHost refuses malloc's memory). */
enum { HEAD = 64 };

static void *host_alloc(offload_host *o, size_t bytes) {
    char *p = o->ops->host_alloc ? o->ops->host_alloc(HEAD + bytes) : NULL;
    const int pinned = p != NULL;
    if (!p) {
        p = malloc(HEAD + bytes);
        SHLM_CHECK_ALLOC(p);
    }
    memcpy(p, &pinned, sizeof pinned);
    o->bytes += bytes;
    return p + HEAD;
}

static void host_free(offload_host *o, void *q) {
    if (!q) return;
    char *p = (char *)q - HEAD;
    int pinned;
    memcpy(&pinned, p, sizeof pinned);
    if (pinned) o->ops->host_free(p);
    else free(p);
}

offload_host *offload_create(const shlm_ops *ops, shlm_dtype copy_dtype, size_t max_shard) {
    offload_host *o = calloc(1, sizeof *o);
    SHLM_CHECK_ALLOC(o);
    o->ops = ops;
    o->copy_dtype = copy_dtype;
    o->max_shard = max_shard;
    for (int k = 0; k < 2; k++) o->grad[k] = host_alloc(o, max_shard * sizeof(float));
    for (int k = 0; k < 2 && copy_dtype != SHLM_F32; k++)
        o->upload[k] = host_alloc(o, max_shard * sizeof(uint16_t));
    return o;
}

void offload_destroy(offload_host *o) {
    if (!o) return;
    if (o->ops->to_host_wait) o->ops->to_host_wait(); /* a step abandoned midway */
    offload_upload_wait(o);
    for (int k = 0; k < 2; k++) {
        host_free(o, o->grad[k]);
        host_free(o, o->upload[k]);
    }
    free(o);
}

float *offload_alloc(offload_host *o, size_t n) {
    if (!n) return NULL;
    float *p = host_alloc(o, n * sizeof(float));
    memset(p, 0, n * sizeof(float));
    return p;
}

void offload_free(offload_host *o, float *p) { host_free(o, p); }

size_t offload_host_bytes(const offload_host *o) { return o->bytes; }

static void check_shard(const offload_host *o, size_t n) {
    if (n > o->max_shard) SHLM_FATAL("offload: a shard of %zu elements, staging for %zu", n, o->max_shard);
}

void offload_upload(offload_host *o, void *copy, const float *master, size_t n) {
    if (!n) return;
    check_shard(o, n);
    offload_upload_wait(o); /* the staging, and the copy, free of queued uploads */
    if (o->copy_dtype == SHLM_F32) {
        o->ops->to_device(copy, master, n * sizeof(float));
        return;
    }
    host_bf16_copy(o->upload[0], master, n);
    o->ops->to_device(copy, o->upload[0], n * sizeof(uint16_t));
}

uint16_t *offload_upload_staging(offload_host *o) { return o->upload[o->uploads % 2]; }

void offload_upload_queue(offload_host *o, void *copy, const float *master, size_t n) {
    check_shard(o, n);
    const void *src = o->copy_dtype == SHLM_F32 ? (const void *)master : o->upload[o->uploads % 2];
    const size_t bytes = n * (o->copy_dtype == SHLM_F32 ? sizeof(float) : sizeof(uint16_t));
    o->uploads++;
    if (!n) return;
    if (!o->ops->to_device_async) {
        o->ops->to_device(copy, src, bytes);
        return;
    }
    /* the upload before this one ran while the caller filled this staging: once it has
     * landed, the other staging (offload_upload_staging's next answer) is free */
    o->ops->to_device_wait();
    o->ops->to_device_async(copy, src, bytes);
}

void offload_upload_wait(offload_host *o) {
    if (o->ops->to_device_wait) o->ops->to_device_wait();
}

void offload_grad_queue(offload_host *o, const float *dev_grad, size_t n) {
    if (o->queued - o->taken >= 2) SHLM_FATAL("offload: a third gradient shard queued");
    check_shard(o, n);
    float *dst = o->grad[o->queued++ % 2];
    if (!n) return;
    if (o->ops->to_host_async) o->ops->to_host_async(dst, dev_grad, n * sizeof(float));
    else o->ops->to_host(dst, dev_grad, n * sizeof(float));
}

const float *offload_grad_take(offload_host *o) {
    if (o->taken == o->queued) SHLM_FATAL("offload: a gradient shard taken that was never queued");
    /* the wait covers every copy queued: at most the one asked for and the next */
    if (o->ops->to_host_wait) o->ops->to_host_wait();
    return o->grad[o->taken++ % 2];
}
