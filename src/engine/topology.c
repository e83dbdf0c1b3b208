/* The rank topology (see topology.h): node, shard and replica communicators for each
 * FSDP strategy, built from the world with MPI_Comm_split[_type]. */
#include "src/engine/topology.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "kernels/check.h"

static const char *const strategy_names[FSDP_N_STRATEGIES] = {
    [FSDP_FULL_SHARD] = "FULL_SHARD",
    [FSDP_SHARD_GRAD_OP] = "SHARD_GRAD_OP",
    [FSDP_NO_SHARD] = "NO_SHARD",
    [FSDP_HYBRID_SHARD] = "HYBRID_SHARD",
};

const char *strategy_name(fsdp_strategy s) {
    return (unsigned)s < FSDP_N_STRATEGIES ? strategy_names[s] : "?";
}

int strategy_from_name(const char *name, fsdp_strategy *out, char *err, size_t errlen) {
    for (int s = 0; s < FSDP_N_STRATEGIES; s++) {
        if (name != NULL && strcasecmp(name, strategy_names[s]) == 0) {
            *out = (fsdp_strategy)s;
            return 0;
        }
    }
    snprintf(err, errlen,
             "unknown strategy '%s': valid names are FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
             "HYBRID_SHARD", name ? name : "");
    return -1;
}

/* A group size given by key: 0 (zero_means) or a positive divisor of the world size. */
static int check_group_size(const char *key, int v, const char *zero_means, int world_size,
                            char *err, size_t errlen) {
    if (v < 0) {
        snprintf(err, errlen, "%s=%d must be 0 (%s) or positive", key, v, zero_means);
        return -1;
    }
    if (v > world_size) {
        snprintf(err, errlen, "%s=%d is larger than the world size %d", key, v, world_size);
        return -1;
    }
    if (v > 0 && world_size % v != 0) {
        snprintf(err, errlen, "world size %d is not divisible by %s=%d", world_size, key, v);
        return -1;
    }
    return 0;
}

int topology_check(int world_size, const topology_options *opt, char *err, size_t errlen) {
    int rpn = opt->ranks_per_node, sgs = opt->shard_group_size;
    if ((unsigned)opt->strategy >= FSDP_N_STRATEGIES) {
        snprintf(err, errlen, "invalid strategy %d", (int)opt->strategy);
        return -1;
    }
    if (check_group_size("runtime.ranks_per_node", rpn, "real nodes", world_size, err, errlen) ||
        check_group_size("fsdp.shard_group_size", sgs, "the strategy's own", world_size, err,
                         errlen))
        return -1;
    if (opt->strategy == FSDP_NO_SHARD && sgs > 1) {
        snprintf(err, errlen,
                 "NO_SHARD keeps a full copy on every rank: fsdp.shard_group_size=%d must be 0 or 1",
                 sgs);
        return -1;
    }
    return 0;
}

static void free_comm(MPI_Comm *c) {
    if (*c != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(c));
    *c = MPI_COMM_NULL;
}

void topology_free(topology *t) {
    free_comm(&t->replica);
    free_comm(&t->shard);
    free_comm(&t->node);
    free_comm(&t->world);
}

/* Numbers the nodes by their lowest world rank and checks their sizes, from one
 * all-gather of (lowest world rank, size) per rank: every rank sees the same table, so
 * every rank reaches the same verdict. */
static void number_nodes(topology *t, int *min_size, int *max_size) {
    int mine[2] = {t->world_rank, t->node_size};
    /* the node's lowest world rank is its rank 0 (split keys are world ranks) */
    MPI_CHECK(MPI_Bcast(&mine[0], 1, MPI_INT, 0, t->node));
    int *all = malloc(sizeof(int) * 2 * (size_t)t->world_size);
    SHLM_CHECK_ALLOC(all);
    MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, t->world));
    t->node_index = 0;
    t->n_nodes = 0;
    *min_size = *max_size = t->node_size;
    for (int i = 0; i < t->world_size; i++) {
        int leader = all[2 * i], size = all[2 * i + 1];
        if (leader != i) continue; /* count each node once, at its leader */
        t->n_nodes++;
        if (leader < mine[0]) t->node_index++;
        if (size < *min_size) *min_size = size;
        if (size > *max_size) *max_size = size;
    }
    free(all);
}

void topology_group_sizes(int world_size, const topology_options *opt, int *S, int *R) {
    const int node = opt->ranks_per_node > 0 ? opt->ranks_per_node : world_size;
    *S = opt->shard_group_size > 0            ? opt->shard_group_size
         : opt->strategy == FSDP_NO_SHARD     ? 1
         : opt->strategy == FSDP_HYBRID_SHARD ? node
                                              : world_size;
    *R = world_size / *S;
}

int topology_create(topology *t, MPI_Comm world, const topology_options *opt, char *err,
                    size_t errlen) {
    *t = (topology){.strategy = opt->strategy,
                    .world = MPI_COMM_NULL,
                    .node = MPI_COMM_NULL,
                    .shard = MPI_COMM_NULL,
                    .replica = MPI_COMM_NULL};
    int world_size;
    MPI_CHECK(MPI_Comm_size(world, &world_size));
    if (topology_check(world_size, opt, err, errlen) != 0) return -1;

    MPI_CHECK(MPI_Comm_dup(world, &t->world));
    MPI_CHECK(MPI_Comm_rank(t->world, &t->world_rank));
    t->world_size = world_size;
    t->dp_rank = t->world_rank;
    t->dp_size = t->world_size;

    /* the physical machine, for GPU binding, and the logical node */
    MPI_Comm host;
    MPI_CHECK(MPI_Comm_split_type(t->world, MPI_COMM_TYPE_SHARED, t->world_rank,
                                  MPI_INFO_NULL, &host));
    MPI_CHECK(MPI_Comm_rank(host, &t->host_rank));
    MPI_CHECK(MPI_Comm_size(host, &t->host_size));
    if (opt->ranks_per_node > 0) {
        MPI_CHECK(MPI_Comm_split(t->world, t->world_rank / opt->ranks_per_node, t->world_rank,
                                 &t->node));
        MPI_CHECK(MPI_Comm_free(&host));
    } else {
        t->node = host;
    }
    MPI_CHECK(MPI_Comm_set_name(t->node, "node group")); /* names for messages */
    MPI_CHECK(MPI_Comm_rank(t->node, &t->node_rank));
    MPI_CHECK(MPI_Comm_size(t->node, &t->node_size));
    int min_node, max_node;
    number_nodes(t, &min_node, &max_node);

    /* the shard group: color = which group, key = world rank (so shard ranks follow world
     * order inside a block) */
    int sgs = opt->shard_group_size;
    int color;
    switch (opt->strategy) {
    case FSDP_NO_SHARD: color = t->world_rank; break;
    case FSDP_HYBRID_SHARD:
        if (sgs > 0) {
            color = t->world_rank / sgs;
        } else if (min_node != max_node) {
            /* replicas need shard groups of one size; real nodes may differ */
            snprintf(err, errlen,
                     "HYBRID_SHARD needs the same number of ranks on every node, found %d to "
                     "%d: set ranks_per_node or shard_group_size",
                     min_node, max_node);
            topology_free(t);
            return -1;
        } else {
            color = t->node_index;
        }
        break;
    default: color = sgs > 0 ? t->world_rank / sgs : 0; break;
    }
    MPI_CHECK(MPI_Comm_split(t->world, color, t->world_rank, &t->shard));
    MPI_CHECK(MPI_Comm_set_name(t->shard, "shard group"));
    MPI_CHECK(MPI_Comm_rank(t->shard, &t->shard_rank));
    MPI_CHECK(MPI_Comm_size(t->shard, &t->shard_size));
    t->shard_index = color;
    t->n_shard_groups = t->world_size / t->shard_size;

    /* the replica group: equal shard position, ordered by shard group */
    MPI_CHECK(MPI_Comm_split(t->world, t->shard_rank, t->shard_index, &t->replica));
    MPI_CHECK(MPI_Comm_set_name(t->replica, "replica group"));
    MPI_CHECK(MPI_Comm_rank(t->replica, &t->replica_rank));
    MPI_CHECK(MPI_Comm_size(t->replica, &t->replica_size));
    return 0;
}

int topology_device_for(int local_rank, int visible_gpus) {
    return visible_gpus > 0 ? local_rank % visible_gpus : -1;
}

int topology_device(const topology *t, int visible_gpus) {
    return topology_device_for(t->host_rank, visible_gpus);
}

int topology_describe(const topology *t, const char *host, const char *device, char *buf,
                      size_t len) {
    return snprintf(buf, len,
                    "rank %d/%d host=%s node=%d/%d local=%d/%d shard=%d/%d replica=%d/%d "
                    "strategy=%s device=%s",
                    t->world_rank, t->world_size, host ? host : "?", t->node_index, t->n_nodes,
                    t->node_rank, t->node_size, t->shard_rank, t->shard_size, t->replica_rank,
                    t->replica_size, strategy_name(t->strategy), device ? device : "?");
}
