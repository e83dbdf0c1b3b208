/* The start-up timeline (startup.h): one clock, phases accumulated between marks. */
#include "src/base/startup.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    int begun;
    double last;               /* CLOCK_MONOTONIC at the previous mark */
    double process_start;      /* CLOCK_MONOTONIC of the process's start (estimated) */
    double s[STARTUP_N];
    startup_weights weights;
    unsigned long long drawn;
} g;

static double mono_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds since the process started: field 22 of /proc/self/stat (clock ticks since
 * boot) against CLOCK_BOOTTIME; -1 when unknown. */
static double seconds_since_exec(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long start = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
                            "%*d %*d %*d %llu", &start) != 1)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec t;
    if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &t) != 0) return -1;
    double since = (double)t.tv_sec + 1e-9 * (double)t.tv_nsec - (double)start / (double)hz;
    return since >= 0 && since < 3600 ? since : -1;
}

void startup_begin(void) {
    memset(&g, 0, sizeof g);
    g.begun = 1;
    g.last = mono_now();
    double exec = seconds_since_exec();
    g.s[STARTUP_EXEC] = exec > 0 ? exec : 0;
    g.process_start = g.last - g.s[STARTUP_EXEC];
}

void startup_mark(startup_phase p) {
    if (!g.begun || p < 0 || p >= STARTUP_N) return;
    double now = mono_now();
    g.s[p] += now - g.last;
    g.last = now;
}

void startup_set_weights(startup_weights w) { g.weights = w; }
void startup_set_drawn(unsigned long long n) { g.drawn = n; }

double startup_seconds(startup_phase p) { return p >= 0 && p < STARTUP_N ? g.s[p] : 0; }

double startup_total_seconds(void) { return g.begun ? mono_now() - g.process_start : 0; }

static const char *const names[STARTUP_N] = {
    "exec", "MPI init", "job and data", "device", "comm groups", "allocation", "weights",
    "metrics and telemetry", "first step"};
static const char *const keys[STARTUP_N] = {"exec", "mpi_init", "job", "device", "comm",
                                            "alloc", "weights", "watch", "first_step"};

const char *startup_phase_key(startup_phase p) { return p >= 0 && p < STARTUP_N ? keys[p] : "?"; }

void startup_print(FILE *out, const char *what) {
    static const char *const weights[] = {"init from the seed", "import", "resume"};
    fprintf(out, "start-up: %.1f s to %s:", startup_total_seconds(), what);
    const char *sep = " ";
    for (int p = 0; p < STARTUP_N; p++) {
        if (g.s[p] < 0.05 && p != STARTUP_WEIGHTS) continue;
        if (p == STARTUP_WEIGHTS && g.drawn)
            fprintf(out, "%sweights (%s, %llu values drawn) %.1f s", sep, weights[g.weights],
                    g.drawn, g.s[p]);
        else if (p == STARTUP_WEIGHTS)
            fprintf(out, "%sweights (%s) %.1f s", sep, weights[g.weights], g.s[p]);
        else
            fprintf(out, "%s%s %.1f s", sep, names[p], g.s[p]);
        sep = ", ";
    }
    fprintf(out, "\n");
    fflush(out);
}
