/* Stop requests by signal for `shardlm train`: SIGUSR1 (Slurm's warning before the time
 * limit, forwarded by slurm/train.sbatch and by mpirun) and SIGTERM (scancel, preemption). */
#ifndef SHLM_SIGNALS_H
#define SHLM_SIGNALS_H

#include <pthread.h>

/*
 * The first SIGUSR1 or SIGTERM only records the signal (a volatile sig_atomic_t, nothing
 * else happens in the handler); the training loop reads it at the end of every step and
 * combines it over all ranks with the step's MPI_Allreduce, so every rank stops after
 * the same step even when the signal reached them at different times (or reached only
 * one). It then saves a checkpoint and exits 0 (src/run/train.c).
 *
 * A second one (either signal) aborts the process at once: the handler writes one line
 * to stderr, restores the default action and re-raises the signal, so the launcher sees
 * the rank killed by it (exit status 128 + signal number in a shell).
 */

/* Installs the handlers for SIGUSR1 and SIGTERM (SA_RESTART, so interrupted system
 * calls resume). Call once, before any long work. */
void shlm_signals_install(void);

/* The number of the first stop signal this process received, or 0. Local to the rank. */
int shlm_signals_pending(void);

/* The stop was handled (saved, or said why not) and the rank is on its way out: later
 * stop signals are ignored. When one rank exits non-zero first, the launcher sends
 * SIGTERM to the others; they then finish their own exit instead of reporting an abort. */
void shlm_signals_stop_handled(void);

/* "SIGUSR1", "SIGTERM", or "signal N". */
const char *shlm_signal_name(int sig);

/* pthread_create with every signal blocked in the new thread (helper threads: telemetry,
 * the Prometheus exporter), so that stop signals reach the training thread. Returns
 * pthread_create's status. */
int shlm_thread_create_unsignalled(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
