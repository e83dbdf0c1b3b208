/* MPI test of the rank topology (src/engine/topology.c), 4 ranks: every strategy's group sizes
 * and memberships for ranks_per_node 2 and 4 and shard_group_size 2, and the errors. */
#include <mpi.h>

#include <stdio.h>
#include <string.h>

#include "kernels/check.h"
#include "src/engine/topology.h"
#include "tests/check.h"

static int world_rank, world_size;

/* The world ranks of comm's members, in comm rank order, must be first, first+stride, … */
static void expect_members(MPI_Comm comm, const char *what, const char *label, int first,
                           int stride, int n) {
    int size;
    MPI_CHECK(MPI_Comm_size(comm, &size));
    CHECK(size == n, "%s: %s group has %d ranks, expected %d", label, what, size, n);
    if (size != n) return;
    int members[64];
    MPI_CHECK(MPI_Allgather(&world_rank, 1, MPI_INT, members, 1, MPI_INT, comm));
    for (int i = 0; i < n; i++)
        CHECK(members[i] == first + i * stride, "%s: %s group member %d is world rank %d, "
               "expected %d", label, what, i, members[i], first + i * stride);
}

/* Builds the topology for (strategy, rpn, sgs) and checks it against what the rules in
 * topology.h say, written out independently here: with B the shard block size, rank w's
 * shard group is [w/B·B, w/B·B + B) and its replica group is {v : v % B == w % B}. */
static void check_case(fsdp_strategy s, int rpn, int sgs) {
    char label[128], err[256] = "";
    snprintf(label, sizeof label, "%s ranks_per_node=%d shard_group_size=%d", strategy_name(s),
             rpn, sgs);
    topology t;
    topology_options opt = {.strategy = s, .ranks_per_node = rpn, .shard_group_size = sgs};
    int rc = topology_create(&t, MPI_COMM_WORLD, &opt, err, sizeof err);
    CHECK(rc == 0, "%s: %s", label, err);
    if (rc != 0) return;

    int W = world_size, w = world_rank;
    int R = rpn > 0 ? rpn : t.host_size; /* rpn 0: the real machine (all ranks, here) */
    int B = s == FSDP_NO_SHARD ? 1
          : sgs > 0            ? sgs
          : s == FSDP_HYBRID_SHARD ? R
                               : W;
    CHECK(t.world_rank == w && t.world_size == W, "%s: world %d/%d", label, t.world_rank,
           t.world_size);
    CHECK(t.dp_rank == w && t.dp_size == W, "%s: dp %d/%d", label, t.dp_rank, t.dp_size);
    CHECK(t.node_index == w / R && t.n_nodes == W / R, "%s: node %d/%d, expected %d/%d",
           label, t.node_index, t.n_nodes, w / R, W / R);
    CHECK(t.node_rank == w % R && t.node_size == R, "%s: local %d/%d, expected %d/%d", label,
           t.node_rank, t.node_size, w % R, R);
    CHECK(t.shard_rank == w % B && t.shard_size == B, "%s: shard %d/%d, expected %d/%d",
           label, t.shard_rank, t.shard_size, w % B, B);
    CHECK(t.shard_index == w / B && t.n_shard_groups == W / B,
           "%s: shard group %d of %d, expected %d of %d", label, t.shard_index,
           t.n_shard_groups, w / B, W / B);
    CHECK(t.replica_rank == w / B && t.replica_size == W / B,
           "%s: replica %d/%d, expected %d/%d", label, t.replica_rank, t.replica_size, w / B,
           W / B);
    expect_members(t.node, "node", label, w / R * R, 1, R);
    expect_members(t.shard, "shard", label, w / B * B, 1, B);
    expect_members(t.replica, "replica", label, w % B, B, W / B);

    /* the start-up line */
    char line[512], want[512];
    topology_describe(&t, "hostA", "cpu", line, sizeof line);
    snprintf(want, sizeof want,
             "rank %d/%d host=hostA node=%d/%d local=%d/%d shard=%d/%d replica=%d/%d "
             "strategy=%s device=cpu",
             w, W, w / R, W / R, w % R, R, w % B, B, w / B, W / B, strategy_name(s));
    CHECK(strcmp(line, want) == 0, "%s: describe gave '%s', expected '%s'", label, line, want);
    topology_free(&t);
    CHECK(t.world == MPI_COMM_NULL && t.shard == MPI_COMM_NULL && t.replica == MPI_COMM_NULL &&
               t.node == MPI_COMM_NULL, "%s: topology_free left a communicator", label);
}

static void expect_error(fsdp_strategy s, int rpn, int sgs, const char *want) {
    char err[256] = "";
    topology t;
    topology_options opt = {.strategy = s, .ranks_per_node = rpn, .shard_group_size = sgs};
    int rc = topology_create(&t, MPI_COMM_WORLD, &opt, err, sizeof err);
    CHECK(rc == -1, "%s ranks_per_node=%d shard_group_size=%d should fail", strategy_name(s),
           rpn, sgs);
    CHECK(strcmp(err, want) == 0, "error '%s', expected '%s'", err, want);
    CHECK(t.world == MPI_COMM_NULL && t.shard == MPI_COMM_NULL, "a failed create left a "
           "communicator");
    if (rc == 0) topology_free(&t);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    check_rank = world_rank;
    if (world_rank == 0) printf("# reproduce: tests/mpi_test.sh 4 %s\n", argv[0]);
    if (world_size != 4) {
        const int rc = world_rank == 0 ? check_skip("needs 4 ranks, got %d", world_size) : 77;
        MPI_Finalize();
        return rc;
    }

    /* names */
    fsdp_strategy s;
    char err[256];
    for (int i = 0; i < FSDP_N_STRATEGIES; i++) {
        CHECK(strategy_from_name(strategy_name((fsdp_strategy)i), &s, err, sizeof err) == 0 &&
                   s == (fsdp_strategy)i, "round trip of %s", strategy_name((fsdp_strategy)i));
    }
    CHECK(strategy_from_name("hybrid_shard", &s, err, sizeof err) == 0 &&
               s == FSDP_HYBRID_SHARD, "names are case-insensitive");
    CHECK(strategy_from_name("ZERO3", &s, err, sizeof err) == -1, "ZERO3 is not a strategy");
    CHECK(strcmp(err, "unknown strategy 'ZERO3': valid names are FULL_SHARD, SHARD_GRAD_OP, "
                       "NO_SHARD, HYBRID_SHARD") == 0, "message '%s'", err);

    /* GPU binding */
    CHECK(topology_device_for(0, 8) == 0, "device of 0 on 8");
    CHECK(topology_device_for(5, 4) == 1, "device of 5 on 4");
    CHECK(topology_device_for(3, 0) == -1, "no GPU visible");

    /* every strategy, node sizes 2 and 4 (and the real machine), shard groups of 2 */
    int rpns[] = {2, 4, 0};
    for (int si = 0; si < FSDP_N_STRATEGIES; si++)
        for (int ri = 0; ri < 3; ri++)
            for (int sgs = 0; sgs <= 2; sgs += 2) {
                if (si == FSDP_NO_SHARD && sgs == 2) continue; /* an error, below */
                if (rpns[ri] == 0) {
                    /* the real-node case is only predictable when all ranks share a machine */
                    int host_size;
                    MPI_Comm host;
                    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                        &host);
                    MPI_Comm_size(host, &host_size);
                    MPI_Comm_free(&host);
                    if (host_size != world_size) continue;
                }
                check_case((fsdp_strategy)si, rpns[ri], sgs);
            }
    check_case(FSDP_NO_SHARD, 2, 1); /* shard_group_size 1 is NO_SHARD's own */

    /* HYBRID_SHARD on a single node: allowed, replica group of 1 (checked in check_case
     * with ranks_per_node=4); say so explicitly */
    topology t;
    topology_options one = {.strategy = FSDP_HYBRID_SHARD, .ranks_per_node = 4};
    CHECK(topology_create(&t, MPI_COMM_WORLD, &one, err, sizeof err) == 0 &&
               t.replica_size == 1 && t.shard_size == 4, "HYBRID on one node");
    topology_free(&t);

    /* the start-up lines of one layout, in rank order */
    topology_options hy = {.strategy = FSDP_HYBRID_SHARD, .ranks_per_node = 2};
    if (topology_create(&t, MPI_COMM_WORLD, &hy, err, sizeof err) == 0) {
        char dev[32], line[256], all[4][256];
        snprintf(dev, sizeof dev, "cuda:%d", topology_device(&t, 2));
        topology_describe(&t, "localhost", dev, line, sizeof line);
        MPI_Gather(line, 256, MPI_CHAR, all, 256, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (world_rank == 0)
            for (int i = 0; i < world_size; i++) printf("  %s\n", all[i]);
        topology_free(&t);
    }

    /* errors: one line naming the numbers, the same on every rank */
    expect_error(FSDP_FULL_SHARD, 3, 0, "world size 4 is not divisible by runtime.ranks_per_node=3");
    expect_error(FSDP_HYBRID_SHARD, 8, 0, "runtime.ranks_per_node=8 is larger than the world size 4");
    expect_error(FSDP_FULL_SHARD, 0, 3, "world size 4 is not divisible by fsdp.shard_group_size=3");
    expect_error(FSDP_HYBRID_SHARD, 2, 8, "fsdp.shard_group_size=8 is larger than the world size 4");
    expect_error(FSDP_NO_SHARD, 2, 2, "NO_SHARD keeps a full copy on every rank: "
                                      "fsdp.shard_group_size=2 must be 0 or 1");
    expect_error(FSDP_FULL_SHARD, -1, 0, "runtime.ranks_per_node=-1 must be 0 (real nodes) or positive");
    topology_options six = {.strategy = FSDP_FULL_SHARD, .ranks_per_node = 4};
    CHECK(topology_check(6, &six, err, sizeof err) == -1 &&
               strcmp(err, "world size 6 is not divisible by runtime.ranks_per_node=4") == 0,
           "world 6: '%s'", err);
    topology_options twelve = {.strategy = FSDP_HYBRID_SHARD, .ranks_per_node = 4,
                               .shard_group_size = 8};
    CHECK(topology_check(12, &twelve, err, sizeof err) == -1 &&
               strcmp(err, "world size 12 is not divisible by fsdp.shard_group_size=8") == 0,
           "world 12: '%s'", err);

    const int rc = check_exit_mpi(MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
