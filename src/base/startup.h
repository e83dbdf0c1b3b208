/* The start-up timeline: where the time from the process's start to the first training
 * step goes, phase by phase, so a slow start names its cause. */
#ifndef SHLM_STARTUP_H
#define SHLM_STARTUP_H

#include <stdio.h>

typedef enum startup_phase {
    STARTUP_EXEC = 0,   /* exec and shared-library loading, up to main() */
    STARTUP_MPI,        /* MPI_Init */
    STARTUP_JOB,        /* job file, topology, token files */
    STARTUP_DEVICE,     /* binding to the device, its context */
    STARTUP_COMM,       /* the comm backend's groups (NCCL communicators) */
    STARTUP_ALLOC,      /* the device arena, engine and model buffers */
    STARTUP_WEIGHTS,    /* weight init from the seed, import or resume */
    STARTUP_WATCH,      /* metrics file, Prometheus endpoint, telemetry */
    STARTUP_FIRST_STEP, /* the first training step */
    STARTUP_N
} startup_phase;

/* Where the initial weights came from, for the breakdown's line. */
typedef enum startup_weights {
    STARTUP_WEIGHTS_SEED = 0, /* the family's init_slice from train.seed */
    STARTUP_WEIGHTS_IMPORT,   /* model.init_from */
    STARTUP_WEIGHTS_RESUME,   /* a checkpoint */
} startup_weights;

/* Called first in main's command, before MPI_Init: the time since the process started
 * (from /proc/self/stat) is the exec phase, and the clock starts. */
void startup_begin(void);
/* The time since the previous mark (or startup_begin) is added to phase p. Phases may
 * recur (allocation happens in several places); each accumulates. No-op before
 * startup_begin. Local, cheap (one clock read). */
void startup_mark(startup_phase p);
void startup_set_weights(startup_weights w);
/* Values drawn from the seed's RNG while the weights were set (the family's init_count): shown
 * in the weights phase; 0 when they were imported or resumed. */
void startup_set_drawn(unsigned long long n);
/* Seconds accumulated in phase p; the total since the process started. */
double startup_seconds(startup_phase p);
double startup_total_seconds(void);
/* One line: "start-up: 12.3 s to <what>: exec 0.1 s, MPI init 0.4 s, ..." (phases with
 * time only; the weights phase says seed, import or resume). */
void startup_print(FILE *out, const char *what);
/* The phase's name as the JSON and Prometheus outputs use it ("mpi_init", ...). */
const char *startup_phase_key(startup_phase p);

#endif
