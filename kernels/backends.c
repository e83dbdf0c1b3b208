/* The compute and comm backends compiled into this build (NULL-terminated lists),
 * lookup by name, and dtype names for messages. */
#ifdef HAVE_CONFIG_H
#include "shlm_config.h"
#endif

#include <string.h>

#include "kernels/comm.h"
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
