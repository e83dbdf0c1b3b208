/* Stop requests by signal for `shardlm train`: SIGUSR1 (Slurm's warning before the time
 * limit, forwarded by slurm/train.sbatch and by mpirun), SIGTERM (scancel, preemption)
 * and SIGINT (Ctrl-C on a run without a launcher). */
#ifndef SHLM_SIGNALS_H
#define SHLM_SIGNALS_H

#include <pthread.h>

/*
 * The first SIGUSR1, SIGTERM or SIGINT only records the signal (a volatile sig_atomic_t,
 * nothing else happens in the handler); the training loop reads it at the end of every
 * step, and between the batches of a validation pass, and combines it over all ranks
 * with a reduction it makes there anyway, so every rank stops at the same point even
 * when the signal reached them at different times (or reached only one). It then saves
 * a checkpoint and exits 0 (src/run/loop.c); a validation pass cut short reports no loss.
 *
 * A second one (either signal) aborts the process at once: the handler writes one line
 * to stderr, restores the default action and re-raises the signal, so the launcher sees
 * the rank killed by it (exit status 128 + signal number in a shell). So does the end
 * of the launcher that started the rank (mpirun ends at once on a second SIGINT or
 * SIGTERM, without passing it on): a thread sees the rank's parent change within 50 ms
 * and ends the process with status 1. Either way nothing is saved after it: no save
 * starts, and one being written is abandoned where it is (its temporary file is removed
 * by the next save into that directory) unless its rename has happened; `latest` names
 * the last checkpoint committed before. A wrapper between the launcher and shardlm must
 * exec it or outlive it (apptainer's starter does), or it counts as the launcher.
 *
 * SIGPIPE is ignored: a closed stdout makes writes to it fail (said once, src/watch/watch.c)
 * instead of killing the run.
 */

/* Installs the handlers for SIGUSR1, SIGTERM and SIGINT (SA_RESTART, so interrupted
 * system calls resume), ignores SIGPIPE and, under an MPI launcher, starts the launcher
 * watch. Call before any long work (again: no effect). */
void shlm_signals_install(void);

/* The number of the first stop signal this process received, or 0. Local to the rank. */
int shlm_signals_pending(void);

/* The stop was handled (saved, or said why not) and the rank is on its way out: later
 * stop signals are ignored. When one rank exits non-zero first, the launcher sends
 * SIGTERM to the others; they then finish their own exit instead of reporting an abort. */
void shlm_signals_stop_handled(void);

/* "SIGUSR1", "SIGTERM", "SIGINT", or "signal N". */
const char *shlm_signal_name(int sig);

/* pthread_create with every signal blocked in the new thread (helper threads: telemetry,
 * the Prometheus exporter, the launcher watch), so that stop signals reach the training
 * thread. Returns pthread_create's status. */
int shlm_thread_create_unsignalled(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
