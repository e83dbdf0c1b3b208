/* The compute and comm backends compiled into this build (NULL-terminated lists),
 * lookup by name, the pair a run uses (backends.h), and dtype names for messages. */
#ifdef HAVE_CONFIG_H
#include "shlm_config.h"
#endif

#include <stdio.h>
#include <string.h>

#include "kernels/backends/backends.h"
#include "kernels/comm.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"

#ifdef SHLM_HAVE_CUDA
extern const shlm_ops shlm_ops_cuda;
#endif

/* cpu first: it is always built, and lists printed from here start with it */
const shlm_ops *const shlm_backends[] = {
    &shlm_ops_cpu,
#ifdef SHLM_HAVE_CUDA
    &shlm_ops_cuda,
#endif
    NULL,
};

const shlm_ops *shlm_ops_find(const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; shlm_backends[i] != NULL; i++)
        if (strcmp(shlm_backends[i]->name, name) == 0) return shlm_backends[i];
    return NULL;
}

const char *shlm_dtype_name(shlm_dtype t) {
    switch (t) {
    case SHLM_F32: return "fp32";
    case SHLM_BF16: return "bf16";
    }
    return "unknown";
}

/* The comm backends compiled into this build; mpi is always there. */
#ifdef SHLM_HAVE_NCCL
extern const shlm_comm shlm_comm_nccl;
#endif

const shlm_comm *const shlm_comm_backends[] = {
    &shlm_comm_mpi,
#ifdef SHLM_HAVE_NCCL
    &shlm_comm_nccl,
#endif
    NULL,
};

const shlm_comm *shlm_comm_find(const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; shlm_comm_backends[i] != NULL; i++)
        if (strcmp(shlm_comm_backends[i]->name, name) == 0) return shlm_comm_backends[i];
    return NULL;
}

const char *shlm_backend_choice_name(shlm_backend_choice c) {
    switch (c) {
    case SHLM_BACKEND_AUTO: return "auto";
    case SHLM_BACKEND_CPU: return "cpu";
    case SHLM_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

int shlm_backend_decide(shlm_backend_choice want, const shlm_backend_probe *p, char *note,
                        size_t notelen, char *err, size_t errlen) {
    if (note && notelen) note[0] = '\0';
    if (want == SHLM_BACKEND_CPU) return SHLM_BACKEND_CPU;
    const char *why = NULL;
    if (!p->cuda_built) why = "this build has no cuda backend (configure found no CUDA)";
    else if (!p->nccl_built) why = "this build has the cuda backend but not the NCCL comm backend";
    else if (p->gpus <= 0) why = "no GPU is visible on this machine";
    else if (p->device_why) why = p->device_why;
    if (!why) return SHLM_BACKEND_CUDA;
    if (want == SHLM_BACKEND_CUDA) {
        snprintf(err, errlen, "runtime.backend = cuda: %s", why);
        return -1;
    }
    /* auto: the cpu, saying why only where a GPU was there to be used */
    if (p->gpus > 0 && note && notelen)
        snprintf(note, notelen, "runtime.backend = auto: %s; using cpu", why);
    return SHLM_BACKEND_CPU;
}

int shlm_backend_pick(const shlm_backend_options *opt, int (*device_of)(int n, void *ctx),
                      void *ctx, shlm_backend_pair *out, char *note, size_t notelen, char *err,
                      size_t errlen) {
    const shlm_ops *cuda = shlm_ops_find("cuda");
    const shlm_comm *nccl = shlm_comm_find("nccl");
    shlm_backend_probe probe = {.cuda_built = cuda != NULL, .nccl_built = nccl != NULL};
    char device_why[512];
    if (opt->backend != SHLM_BACKEND_CPU && cuda && nccl && cuda->available() &&
        nccl->available()) {
        probe.gpus = cuda->device_count();
        cuda->set_device(device_of(probe.gpus, ctx));
        if (cuda->device_check && cuda->device_check(device_why, sizeof device_why) != 0)
            probe.device_why = device_why;
    }
    int pick = shlm_backend_decide(opt->backend, &probe, note, notelen, err, errlen);
    if (pick < 0) return -1;
    *out = pick == SHLM_BACKEND_CUDA ? (shlm_backend_pair){cuda, nccl}
                                     : (shlm_backend_pair){&shlm_ops_cpu, &shlm_comm_mpi};
    shlm_cpu_set_threads(opt->threads);
    if (out->ops->init) out->ops->init(&opt->ops);
    if (out->comm->init) out->comm->init(&opt->comm);
    return 0;
}
