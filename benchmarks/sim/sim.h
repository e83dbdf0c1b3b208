/* The simulated backends of the performance model (benchmarks/perf_model.c): a compute
 * table (shlm_ops) and a comm table (shlm_comm) that move no data and advance a virtual
 * clock instead, so the real engine (src/engine/fsdp.c) and model (src/model/llama/llama.c) run rank 0 of a
 * world of any size in one process. Ranks are symmetric under every strategy, so rank 0's
 * timeline is the step's.
 *
 * The clock has one compute timeline (the cuda backend's stream; on the cpu backend the
 * thread that runs the ops) and one timeline per comm group (the NCCL backend's per-group
 * stream; MPI's collectives of one communicator complete in issue order). An op starts
 * when the compute timeline is free and occupies it for its cost; a collective starts at
 * max(compute time at issue, its group's timeline) and occupies the group's timeline;
 * wait() moves the compute timeline to the collective's end, and the gap is the exposed
 * (blocked) time. So what overlaps is exactly what the engine's issue and wait order lets
 * overlap.
 *
 * Costs: an op's from a table of measured op times (bench_kernels' output format; exact
 * shape, else the nearest measured shape of the same op scaled by its work); a
 * collective's from a latency/bandwidth model of its group (inside a node, across nodes)
 * or from bench_comm's measured curves. One process, one simulated rank: not thread-safe. */
#ifndef SHLM_SIM_H
#define SHLM_SIM_H

#include <stddef.h>

#include <mpi.h>

#include "kernels/comm.h"
#include "kernels/ops.h"

/* ---- the op table ---- */

/* The ops whose cost the table gives, named as bench_kernels names them. */
typedef enum sim_op {
    SIM_EMBEDDING_FWD, SIM_EMBEDDING_BWD, SIM_RMSNORM_FWD, SIM_RMSNORM_BWD, SIM_MATMUL_FWD,
    SIM_MATMUL_BWD, SIM_ROPE, SIM_ATTENTION_FWD, SIM_ATTENTION_BWD, SIM_SWIGLU_FWD,
    SIM_SWIGLU_BWD, SIM_XENT, SIM_F32_TO_ACT, SIM_ADAMW, SIM_SUM_SQUARES, SIM_ACCUMULATE,
    SIM_COPY, SIM_ZERO, SIM_ROUND_TO_BF16, SIM_F32_TO_BF16, SIM_BF16_TO_F32, SIM_BIAS_ADD,
    SIM_BIAS_GRAD, SIM_N_OPS
} sim_op;

const char *sim_op_name(sim_op op);

/* One op call's shape: up to six integers whose meaning is the op's (sim_ops.c lists
 * them; bench_kernels' shape column holds the same numbers). */
enum { SIM_DIMS = 6 };
typedef struct sim_shape {
    sim_op op;
    long d[SIM_DIMS];
} sim_shape;

/* The work an op's time scales with at other shapes (FLOPs, elements or bytes). */
double sim_shape_work(const sim_shape *s);
/* Writes the shape in bench_kernels' shape column format (parsed back by the table). */
void sim_shape_format(const sim_shape *s, char *out, size_t len);

typedef struct sim_table_entry {
    sim_shape shape;
    double us;
} sim_table_entry;

typedef struct sim_op_table {
    sim_table_entry *e;
    int n, cap;
    double copy_gbs;  /* memory-bound ops without an entry: bytes / this (bench_kernels'
                       * copy ceiling, or the table's accumulate rate) */
    double launch_us; /* the least time an op takes when scaled down from a larger shape
                       * (3 us for bench_kernels' tables, 0 for --measure-ops') */
    char source[256]; /* file it was read from */
} sim_op_table;

/* Reads bench_kernels' output (or perf_model --measure-ops', the same format). Returns 0,
 * or -1 with one line in err naming the file and line. */
int sim_table_load(sim_op_table *t, const char *path, char *err, size_t errlen);
void sim_table_free(sim_op_table *t);
/* Microseconds of one call of this shape. */
double sim_table_us(const sim_op_table *t, const sim_shape *s);

/* ---- the clock ---- */

typedef struct sim_clock {
    double compute_us;            /* when the compute timeline is next free */
    double op_us;                 /* sum of op costs (the compute the step does) */
    double blocked_us;            /* compute stalled on collectives (exposed comm) */
    double comm_us;               /* sum of collective durations */
    double op_class_us[SIM_N_OPS];
} sim_clock;

extern sim_clock sim_now;

/* ---- the compute backend ---- */

typedef struct sim_compute {
    const sim_op_table *table;
    double slowdown;  /* factor on every op's cost (ranks sharing fewer cores) */
    double mem_slowdown; /* and on the memory-bound ops' (all but matmuls and attention) */
    /* 1: record every distinct op shape called (for --measure-ops), costs ignored */
    int record;
} sim_compute;

/* Sets the backend up: act_dtype is the one of the backend simulated (cpu fp32, cuda
 * bf16). Allocations reserve address space only (no access allowed: an op that touched
 * data would fault), so nothing big is ever backed by memory. */
void sim_ops_setup(const sim_compute *c, shlm_dtype act_dtype);
extern shlm_ops shlm_ops_sim;
/* Bytes currently allocated through shlm_ops_sim, and the most at once since the last
 * sim_ops_setup. */
size_t sim_ops_allocated(void);
size_t sim_ops_peak(void);
/* The distinct shapes called while record was on. */
const sim_shape *sim_ops_recorded(int *n);

/* ---- the comm backend ---- */

/* A group's cost model: time = base_us + steps x hop_us + wire bytes / (busbw GB/s). */
typedef struct sim_link {
    double base_us, hop_us, busbw_gbs;
} sim_link;

/* Where a group's ranks sit. */
typedef struct sim_group_shape {
    int size;     /* ranks in the group */
    int per_node; /* of them on one node */
    int sharing;  /* groups whose inter-node traffic shares one node's network links */
    int ranks;    /* of the whole job (which bench_comm curve applies) */
} sim_group_shape;

typedef struct sim_network {
    sim_link intra;   /* a group inside one node */
    sim_link inter;   /* across nodes: busbw is one node's links together, shared by the
                       * groups that cross from it */
    double contention; /* share of each collective's time that also delays compute (NCCL
                        * kernels take SMs; MPI copies and sums on the cores) */
} sim_network;

/* Measured curves from bench_comm --json (the group sizes they cover take them over the
 * link model). Returns 0, or -1 with one line in err. */
int sim_comm_load_curves(const char *path, char *err, size_t errlen);
void sim_comm_setup(const sim_network *n);
/* Binds an MPI communicator to the simulated group shape that group_create(comm) gets. */
void sim_comm_bind(MPI_Comm comm, sim_group_shape shape);
/* Microseconds of one collective of `bytes` (nccl-tests' size) over a group of `shape`. */
double sim_comm_us(shlm_comm_op op, shlm_dtype dt, double bytes, sim_group_shape shape);
/* A blocking collective outside the comm table (src/ issues a few small ones over MPI
 * itself: the gradient norm, the step's loss sums): charged to the compute timeline. */
void sim_comm_blocking(shlm_comm_op op, double bytes, sim_group_shape shape);
/* Moves the compute timeline past every collective still in flight. */
void sim_comm_drain(void);
extern const shlm_comm shlm_comm_sim;

#endif
