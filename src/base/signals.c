/* Stop requests by signal: an async-signal-safe handler that records the first SIGUSR1,
 * SIGTERM or SIGINT and aborts on the second, and a thread that ends a rank whose MPI
 * launcher is gone (the loop that acts on the first signal is in src/run/loop.c). */
#include "src/base/signals.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { LAUNCHER_POLL_US = 50000 }; /* how often the launcher watch looks at the parent */

static volatile sig_atomic_t first_signal = 0;

static void on_stop_signal(int sig) {
    if (first_signal == 0) {
        first_signal = sig;
        return;
    }
    /* only async-signal-safe calls from here: write, signal, raise, _exit */
    static const char msg[] = "shardlm: second stop signal: aborting without saving\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    signal(sig, SIG_DFL);
    raise(sig); /* SA_NODEFER: delivered now, and the default action ends the process */
    _exit(128 + sig);
}

/* The process that started this rank under an MPI launcher: mpirun or its daemon on the
 * node, slurmstepd. Reparenting (getppid changes) happens only when it has exited. */
static pid_t launcher;

static void *watch_launcher(void *arg) {
    (void)arg;
    while (getppid() == launcher) usleep(LAUNCHER_POLL_US);
    char msg[200];
    int n = snprintf(msg, sizeof msg,
                     "shardlm: the MPI launcher that started this rank (pid %d) is gone: "
                     "aborting without saving\n", (int)launcher);
    ssize_t w = write(STDERR_FILENO, msg, (size_t)n); /* its pipe may be gone too */
    (void)w;
    _exit(1); /* no exit handlers: the training thread may be anywhere */
    return NULL;
}

/* Ranks started by a launcher carry its environment (Open MPI's mpirun, PMIx launchers
 * such as srun --mpi=pmix, PMI-1/2 launchers); a process run without one (a singleton)
 * has a shell or a supervisor as its parent, which may well end first (nohup). */
static int under_launcher(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

void shlm_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    /* SA_RESTART: MPI's and the file system's system calls resume after the handler;
     * SA_NODEFER: the re-raise of a second signal is not held back by the handler */
    sa.sa_flags = SA_RESTART | SA_NODEFER;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* a closed stdout (`| head`, a terminal gone) must not end the run: writes to it fail
     * with EPIPE and the step line says so once (src/watch/watch.c) */
    signal(SIGPIPE, SIG_IGN);
    if (launcher == 0 && under_launcher() && getppid() > 1) {
        launcher = getppid();
        pthread_t t;
        if (shlm_thread_create_unsignalled(&t, watch_launcher, NULL) == 0) pthread_detach(t);
    }
}

int shlm_signals_pending(void) { return (int)first_signal; }

void shlm_signals_stop_handled(void) {
    signal(SIGUSR1, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
}

const char *shlm_signal_name(int sig) {
    static char other[32];
    switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: snprintf(other, sizeof other, "signal %d", sig); return other;
    }
}

int shlm_thread_create_unsignalled(pthread_t *t, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the new thread inherits this mask */
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
