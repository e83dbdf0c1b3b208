/* The rank topology: from the world communicator, the node, shard and replica groups
 * of an FSDP strategy, the data-parallel rank, and which GPU a rank binds to. */
#ifndef SHLM_TOPOLOGY_H
#define SHLM_TOPOLOGY_H

#include <stddef.h>

#include <mpi.h>

/* How parameters, gradients and optimizer state are split (DESIGN.md "Strategies"). */
typedef enum fsdp_strategy {
    FSDP_FULL_SHARD = 0, /* sharded; gathered per use in forward and again in backward */
    FSDP_SHARD_GRAD_OP,  /* sharded; gathered from a unit's forward until its backward */
    FSDP_NO_SHARD,       /* full copy on every rank; gradients all-reduced (DDP) */
    FSDP_HYBRID_SHARD,   /* sharded inside a node, replicated across nodes */
    FSDP_N_STRATEGIES
} fsdp_strategy;

/* "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD" ("?" if out of range). */
const char *strategy_name(fsdp_strategy s);
/* Parses a strategy name (case-insensitive). Returns 0, or -1 with one line in err that
 * lists the valid names. */
int strategy_from_name(const char *name, fsdp_strategy *out, char *err, size_t errlen);

typedef struct topology_options {
    fsdp_strategy strategy;
    /* > 0: a "node" is a block of this many consecutive world ranks, so one machine can
     * act as several nodes in tests. 0: real nodes (MPI_COMM_TYPE_SHARED). */
    int ranks_per_node;
    /* > 0: shard over blocks of this many consecutive world ranks and replicate across
     * blocks (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD; NO_SHARD accepts only 1).
     * 0: the strategy's own shard group (world; 1 rank for NO_SHARD; the node for
     * HYBRID_SHARD). Blocks of consecutive ranks sit inside a node when the launcher
     * places ranks by slot (mpirun's and srun's default). */
    int shard_group_size;
} topology_options;

/*
 * Where this rank sits. "rank/size" pairs are 0-based ranks within their group. Every
 * rank belongs to exactly one node, one shard group and one replica group:
 *   shard group   ranks that split one copy of the parameters among them (size S);
 *                 gathers and reduce-scatters run here.
 *   replica group ranks holding the same shard position (shard_rank) in different shard
 *                 groups (size world/S); gradients are all-reduced here after the
 *                 reduce-scatter when replica_size > 1 (HYBRID_SHARD, NO_SHARD, or a
 *                 shard_group_size below the world). replica_rank == shard_index.
 * Communicators are owned by the topology (topology_free); comm backends duplicate them.
 */
typedef struct topology {
    fsdp_strategy strategy;
    MPI_Comm world;                  /* duplicate of the world given to topology_create */
    int world_rank, world_size;
    int dp_rank, dp_size;            /* data parallel: every rank reads different data,
                                      * so these equal the world's */
    MPI_Comm node;                   /* this rank's (logical) node */
    int node_index, n_nodes;         /* nodes numbered by their lowest world rank */
    int node_rank, node_size;        /* the node-local rank */
    int host_rank, host_size;        /* rank on the physical machine (MPI_COMM_TYPE_SHARED),
                                      * whatever ranks_per_node says: for GPU binding */
    MPI_Comm shard;
    int shard_rank, shard_size;      /* S */
    int shard_index, n_shard_groups; /* which shard group, of how many */
    MPI_Comm replica;
    int replica_rank, replica_size;
} topology;

/* The checks that need no communication: ranks_per_node and shard_group_size against
 * the world size and the strategy. Returns 0, or -1 with one line in err naming the
 * numbers (e.g. "world size 6 is not divisible by ranks_per_node=4"). */
int topology_check(int world_size, const topology_options *opt, char *err, size_t errlen);

/* The shard and replica group sizes topology_create makes on world_size ranks when every
 * node holds ranks_per_node ranks (opt->ranks_per_node, or the whole world when 0): for
 * planning a job without running it (opt passes topology_check). */
void topology_group_sizes(int world_size, const topology_options *opt, int *S, int *R);

/* Collective over world. Fills *t, or returns -1 with one line in err (the same on every
 * rank, so all ranks fail together) and leaves no communicator behind. */
int topology_create(topology *t, MPI_Comm world, const topology_options *opt, char *err,
                    size_t errlen);
/* Collective. Frees the communicators. */
void topology_free(topology *t);

/* The GPU a rank binds to: local_rank % visible_gpus, or -1 when none is visible. */
int topology_device_for(int local_rank, int visible_gpus);
/* topology_device_for(t->host_rank, visible_gpus): the physical machine's local rank,
 * which equals node_rank on a real cluster and, when ranks_per_node splits one machine
 * into several "nodes", still spreads its ranks over all of its GPUs. */
int topology_device(const topology *t, int visible_gpus);

/* The one start-up line of a rank (no newline), e.g.
 *   rank 5/8 host=gpu07 node=1/2 local=1/4 shard=1/4 replica=1/2 strategy=HYBRID_SHARD device=cuda:1
 * Returns what snprintf returns. */
int topology_describe(const topology *t, const char *host, const char *device, char *buf,
                      size_t len);

#endif
