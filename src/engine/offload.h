/* The host side of fsdp.offload = optimizer (docs/engine.md "Optimizer offload"): the
 * engine's fp32 master and AdamW moments in host memory (page-locked where the backend
 * offers it: ops->host_alloc), the gradient shards brought over from the device one unit
 * ahead of the host AdamW (kernels/host_adamw.h) that consumes them, and the updated
 * weights sent back as the device's copy in the plan's offload_dtype, which the gather
 * reads. The engine (fsdp.c) decides what to allocate and when to step; this file owns
 * the host buffers and the copies. On the cpu backend the "device" is host memory too:
 * the same buffers, copies and arithmetic run, so make check runs this path. */
#ifndef SHLM_OFFLOAD_H
#define SHLM_OFFLOAD_H

#include <stddef.h>

#include "kernels/ops.h"

typedef struct offload_host offload_host;

/* For a rank whose largest trained shard is max_shard elements, whose device copy is in
 * copy_dtype (fp32 or bf16): the staging of two gradient shards and, for a bf16 copy, of
 * two uploads. */
offload_host *offload_create(const shlm_ops *ops, shlm_dtype copy_dtype, size_t max_shard);
/* Frees the staging; the state from offload_alloc goes first, through offload_free. */
void offload_destroy(offload_host *o);

/* n zeroed fp32 of host state (NULL for n = 0), counted in offload_host_bytes. */
float *offload_alloc(offload_host *o, size_t n);
void offload_free(offload_host *o, float *p);
/* Host bytes allocated so far, the staging included: what the plan's host_bytes says. */
size_t offload_host_bytes(const offload_host *o);

/* The device copy (n elements of copy_dtype) from host fp32 `master`: bf16 rounds to
 * nearest even, as the gather of a device master rounds (the same values). Synchronous,
 * after the uploads queued before. */
void offload_upload(offload_host *o, void *copy, const float *master, size_t n);

/* The optimizer step's uploads, one unit after another: the caller writes the unit's bf16
 * copy into offload_upload_staging (NULL for an fp32 copy, sent from the master itself:
 * host_adamw's `copy`), then offload_upload_queue sends it to `copy` on the device, on a
 * side stream where the backend has one (ops->to_device_async; the device work queued after
 * runs after it), else at once. The queue first waits for the upload queued before it,
 * which ran while the caller filled this staging, so at most one is in flight and the
 * staging the next call returns is free. offload_upload_wait waits for the one in flight. */
uint16_t *offload_upload_staging(offload_host *o);
void offload_upload_queue(offload_host *o, void *copy, const float *master, size_t n);
void offload_upload_wait(offload_host *o);

/* Gradient shards to the host, in order: offload_grad_queue starts the copy of a device
 * shard (queued behind the backend's work on a side stream where it has one, else copied
 * at once), offload_grad_take returns the host copy of the oldest one not yet taken, landed.
 * At most two may be queued and not taken; a taken buffer stays valid until the queue after
 * the next take. */
void offload_grad_queue(offload_host *o, const float *dev_grad, size_t n);
const float *offload_grad_take(offload_host *o);

#endif
