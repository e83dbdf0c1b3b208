/* The backend registry's pairing: which compute backend a run uses (runtime.backend), the
 * comm backend that goes with it (cpu with mpi, cuda with nccl), and the options both take
 * at start-up. The lists and lookups by name are in ops.h and comm.h. */
#ifndef SHLM_BACKENDS_H
#define SHLM_BACKENDS_H

#include <stddef.h>

#include "kernels/comm.h"
#include "kernels/ops.h"

/* runtime.backend */
typedef enum shlm_backend_choice {
    SHLM_BACKEND_AUTO = 0, /* cuda where this build's kernels run on the bound GPU, else cpu */
    SHLM_BACKEND_CPU = 1,
    SHLM_BACKEND_CUDA = 2
} shlm_backend_choice;

/* "auto", "cpu", "cuda" */
const char *shlm_backend_choice_name(shlm_backend_choice c);

/* Everything the backends take from the job ([runtime], [cuda], [nccl]). */
typedef struct shlm_backend_options {
    shlm_backend_choice backend;
    int threads;            /* OpenMP and OpenBLAS threads of this process (>= 1) */
    shlm_ops_options ops;   /* the compute backend's init */
    shlm_comm_options comm; /* the comm backend's init */
} shlm_backend_options;

typedef struct shlm_backend_pair {
    const shlm_ops *ops;
    const shlm_comm *comm;
} shlm_backend_pair;

/* The pair for opt->backend, each initialised with its options, and the process's thread
 * count set. cuda binds device_of(n, ctx) of the n visible devices (the topology's rule)
 * before asking the backend whether this build's kernels run there. Refused (-1, one line
 * in err naming runtime.backend) where shlm_backend_decide refuses; note receives a line
 * for rank 0 to print when auto fell back to cpu beside a GPU it cannot use ("" else).
 * Local; the same on every rank of identical nodes. */
int shlm_backend_pick(const shlm_backend_options *opt, int (*device_of)(int n, void *ctx),
                      void *ctx, shlm_backend_pair *out, char *note, size_t notelen, char *err,
                      size_t errlen);

/* What the machine offers, as shlm_backend_pick finds it. */
typedef struct shlm_backend_probe {
    int cuda_built;         /* this build has the cuda compute backend */
    int nccl_built;         /* ... and the nccl comm backend */
    int gpus;               /* devices visible (0 without a driver) */
    const char *device_why; /* NULL: this build's kernels run on the bound device; else why
                             * not, naming it and its compute capability */
} shlm_backend_probe;

/* The decision of shlm_backend_pick, apart from the machine so that a test can give any
 * probe: SHLM_BACKEND_CPU or SHLM_BACKEND_CUDA, or -1 with err. cpu is always taken. cuda
 * needs the cuda and nccl backends, a GPU, and a device the kernels run on. auto takes cuda
 * where cuda would be taken, else cpu, with a line in note when a GPU was visible. */
int shlm_backend_decide(shlm_backend_choice want, const shlm_backend_probe *p, char *note,
                        size_t notelen, char *err, size_t errlen);

#endif
