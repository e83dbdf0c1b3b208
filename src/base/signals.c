/* Stop requests by signal: an async-signal-safe handler that records the first SIGUSR1 or
 * SIGTERM and aborts on the second (the loop that acts on it is in src/run/train.c). */
#include "src/base/signals.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
}

int shlm_signals_pending(void) { return (int)first_signal; }

void shlm_signals_stop_handled(void) {
    signal(SIGUSR1, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
}

const char *shlm_signal_name(int sig) {
    static char other[32];
    switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
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
