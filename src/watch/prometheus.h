/* The Prometheus exporter: the run's training metrics and its node's GPU telemetry in
 * the text exposition format (0.0.4), served at http://ADDR:PORT/metrics by a small
 * HTTP server on its own thread (log.prometheus) and/or written for node_exporter's
 * textfile collector (log.prometheus_textfile). One exporter per node, on its local
 * rank 0. GPU metrics carry the DCGM exporter's names, so dashboards made for it work. */
#ifndef SHLM_PROMETHEUS_H
#define SHLM_PROMETHEUS_H

#include <stddef.h>

#include "src/base/startup.h"
#include "src/watch/telemetry.h"

/* The training metrics shown, as of the latest step (the training thread copies them in
 * with prom_publish; NaN = not known, left out). */
typedef struct prom_train {
    double step, steps;          /* steps done; the job's train.steps */
    double loss, val_loss, lr, grad_norm;
    double tokens_per_s;         /* whole job */
    double tokens_per_s_per_gpu;
    double mfu;                  /* ratio, NaN = n/a */
    double step_s;               /* the step's time (its slowest rank) */
    double comm_exposed_s[2];    /* exposed comm of the shard, replica group (slowest rank) */
    double mem_peak_bytes;       /* this rank's */
    double tokens_seen;
    double elapsed_s, eta_s;
    double slowest_rank, fastest_rank;
    char slowest_host[64];
    double slowest_step_s, fastest_step_s, slowest_comm_s, fastest_comm_s;
    double startup_s[STARTUP_N];
} prom_train;

typedef struct prom_labels {
    char host[64];
    char job[128];               /* the job file's name without .ini */
    int rank;                    /* the world rank serving */
    char run_id[40];
    char job_hash[20];
} prom_labels;

/* Metric families, in the order they are written: for docs and tests. */
typedef struct prom_family {
    const char *name, *type, *help;
    int gpu;                     /* 1: one sample per GPU (telemetry) */
    long value;                  /* offsetof the prom_train double it shows, or -1: written
                                  * with labels of its own (prom_render) */
} prom_family;
int prom_family_count(void);
const prom_family *prom_family_at(int i);

/* Renders everything into buf (at most cap bytes, NUL-terminated); returns the length,
 * or 0 when cap was too small. Pure: for the server, the textfile and tests. */
size_t prom_render(char *buf, size_t cap, const prom_labels *labels, const prom_train *t,
                   const tel_gpu *gpus, int n_gpus);

typedef struct prom_exporter prom_exporter;

/* Starts the exporter: listens on `listen` (empty: no server) and writes
 * DIR/shardlm_<job>_<host>_<run_id>.prom (empty: no textfile), the first time before
 * returning.
 * tel may be NULL. Returns NULL with one line in err (the key, the address or directory,
 * the system's reason) when the port is taken, the address is wrong or the directory
 * cannot be written. */
prom_exporter *prom_start(const char *listen, const char *textfile_dir, const prom_labels *labels,
                          telemetry *tel, char *err, size_t errlen);
/* The address listened on ("127.0.0.1:9400"), or "" without a server. */
const char *prom_address(const prom_exporter *p);
/* The textfile's path, or "". */
const char *prom_textfile(const prom_exporter *p);
/* Copies the step's metrics in (a mutex held for a struct copy; the rendering and all
 * I/O happen on the exporter's thread). */
void prom_publish(prom_exporter *p, const prom_train *t);
/* Stops the thread, closes the sockets (connections mid-request included: it never waits
 * for a client) and removes the textfile. NULL is fine. A textfile write that fails
 * during the run (a disk filled up) prints one warning and stops the textfile; training
 * goes on. */
void prom_stop(prom_exporter *p);

#endif
