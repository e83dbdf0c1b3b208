/* Watching a training run (watch.h). */
#include "src/watch/watch.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "io/safe_file.h"
#include "kernels/check.h"
#include "src/base/agree.h"
#include "src/watch/device_table.h"
#include "src/watch/prometheus.h"
#include "src/watch/run_summary.h"
#include "src/base/startup.h"
#include "src/watch/telemetry.h"

enum { HOST_LEN = 64, BUS_LEN = 32, MAX_NODE_GPUS = 64 };

struct watch {
    watch_run r;                 /* what the run told watch_open */
    int first, end;              /* steps first+1..end */
    long long tokens_per_step;
    double flops_per_token;
    double peak_tflops;          /* 0: MFU n/a */
    char run_id[40], job_hash[20];
    char (*hosts)[HOST_LEN];     /* per world rank */
    const char **host_ptrs;
    metrics_log log;             /* rank 0 */
    run_summary summary;         /* rank 0 */
    telemetry *tel;              /* node-local rank 0, when NVML is there */
    prom_exporter *prom;         /* node-local rank 0, when asked for */
    prom_labels labels;
    tel_gpu gpus[MAX_NODE_GPUS];
    double t_start;              /* wall clock (MPI_Wtime) when this run's first step began */
    double last_val_loss;        /* the exporter's gauge holds the latest validation */
    int started;
    int stdout_lost;             /* rank 0: standard output failed (said once) */
};

static double unix_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* "20261201T082205Z-1a2b3c4d": the UTC start and 32 random bits (rank 0's). */
static void make_run_id(char *out, size_t outlen) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char when[20];
    strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
    unsigned v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = (unsigned)now ^ (unsigned)clock();
    snprintf(out, outlen, "%.16s-%08x", when, v);
}

/* Rows and distinct run ids already in metrics.jsonl, for the notice that this run's
 * rows follow them (told apart by run_id). Anything there but a regular file is left for
 * the appender to refuse (io/safe_file.h). */
static void count_earlier_runs(const char *run_dir, long *rows, int *runs, int *unnamed) {
    *rows = 0;
    *runs = 0;
    *unnamed = 0;
    char path[1200], line[8192], last[48] = "";
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    char why[1536];
    FILE *f = safe_file_read_own(path, why, sizeof why);
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n && line[n - 1] != '\n' && !feof(f)) { /* a longer line: skip its rest */
            int c;
            while ((c = fgetc(f)) != EOF && c != '\n') {}
        }
        (*rows)++;
        const char *id = strstr(line, "\"run_id\": \"");
        if (!id) {
            (*unnamed)++;
            continue;
        }
        id += 11;
        size_t k = strcspn(id, "\"");
        if (k >= sizeof last) k = sizeof last - 1;
        if (strncmp(last, id, k) != 0 || last[k] != 0) {
            (*runs)++; /* a resumed chain's runs each count: rows are grouped by run */
            memcpy(last, id, k);
            last[k] = 0;
        }
    }
    fclose(f);
}

/* The device's dense peak for MFU (0: n/a), saying where it came from in what. */
static double resolve_peak(const watch_run *r, char *what, size_t whatlen, int *warn) {
    const job_config *c = r->cfg;
    *warn = 0;
    shlm_device_info d = {0};
    int have = r->ops->device_info && r->ops->device_info(&d) == 0;
    const char *dtype = shlm_dtype_name(r->ops->act_dtype);
    const char *hook = getenv("SHLM_TEST_DEVICE"); /* NAME:MAJOR.MINOR, a bf16 device */
    if (hook && *hook) {
        const char *colon = strrchr(hook, ':');
        snprintf(d.name, sizeof d.name, "%.*s", colon ? (int)(colon - hook) : (int)strlen(hook), hook);
        if (!colon || sscanf(colon + 1, "%d.%d", &d.cc_major, &d.cc_minor) != 2)
            d.cc_major = d.cc_minor = -1;
        dtype = "bf16";
        have = 1;
    }
    if (c->peak_tflops > 0) {
        snprintf(what, whatlen, "%g TFLOP/s per device (log.peak_tflops)", c->peak_tflops);
        return c->peak_tflops;
    }
    if (!have) {
        snprintf(what, whatlen, "n/a on the %s backend (log.peak_tflops sets a peak)", r->ops->name);
        return 0;
    }
    const device_spec *spec = device_table_find(d.name, d.cc_major, d.cc_minor);
    double peak = device_spec_peak_tflops(spec, dtype);
    if (peak > 0) {
        snprintf(what, whatlen, "%g TFLOP/s, the dense %s peak of %s (%s)", peak, dtype, d.name,
                 spec->short_name);
        return peak;
    }
    *warn = 1;
    snprintf(what, whatlen, "n/a: the device table (src/watch/device_table.c) has no dense %s peak "
             "for '%s' (compute capability %d.%d); set log.peak_tflops", dtype, d.name,
             d.cc_major, d.cc_minor);
    return 0;
}

/* The job's name for labels and file names: the job file's, without directory and .ini. */
static void job_stem(const char *path, char *out, size_t outlen) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".ini") == 0) n -= 4;
    snprintf(out, outlen, "%.*s", (int)n, base);
}

/* Node-local rank 0 starts the sampler over the GPUs of its node's ranks. */
static void start_telemetry(watch *w, MPI_Comm node, int node_rank, int node_size) {
    const watch_run *r = &w->r;
    char bus[BUS_LEN] = "";
    shlm_device_info d;
    int have = r->cfg->telemetry_interval_ms > 0 && r->ops->device_info &&
               r->ops->device_info(&d) == 0;
    if (have) snprintf(bus, sizeof bus, "%s", d.pci_bus_id);
    int any = have;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, node));
    if (!any) return;
    char *all = node_rank == 0 ? calloc((size_t)node_size, BUS_LEN) : NULL;
    int *ranks = node_rank == 0 ? calloc((size_t)node_size, sizeof(int)) : NULL;
    if (node_rank == 0) {
        SHLM_CHECK_ALLOC(all);
        SHLM_CHECK_ALLOC(ranks);
    }
    MPI_CHECK(MPI_Gather(bus, BUS_LEN, MPI_CHAR, all, BUS_LEN, MPI_CHAR, 0, node));
    MPI_CHECK(MPI_Gather(&r->rank, 1, MPI_INT, ranks, 1, MPI_INT, 0, node));
    if (node_rank == 0) {
        /* one entry per GPU: ranks sharing a GPU sample it once, as its first rank */
        const char *ids[MAX_NODE_GPUS];
        int owners[MAX_NODE_GPUS], n = 0;
        for (int i = 0; i < node_size; i++) {
            const char *b = all + (size_t)i * BUS_LEN;
            int seen = !b[0];
            for (int k = 0; k < n && !seen; k++) seen = !strcmp(ids[k], b);
            if (!seen && n < MAX_NODE_GPUS) ids[n] = b, owners[n++] = ranks[i];
        }
        char why[512] = "";
        w->tel = telemetry_start(ids, owners, n, r->cfg->telemetry_interval_ms, why, sizeof why);
        if (w->tel)
            printf("telemetry: %s: NVML, %d GPU(s) every %d ms\n", shlm_host(), n,
                   r->cfg->telemetry_interval_ms);
        else
            printf("telemetry: %s: off: %s\n", shlm_host(), why);
        fflush(stdout);
    }
    free(all);
    free(ranks);
}

void watch_set_range(watch *w, int first, int end) {
    w->first = first;
    w->end = end;
    if (w->r.rank != 0 || !w->log.tb.fp) return;
    /* the job as the start-up table shows it, a Markdown code block for the text plugin */
    char *table = NULL, *text = NULL;
    size_t n = 0, m = 0;
    FILE *f = open_memstream(&table, &n);
    SHLM_CHECK_ALLOC(f);
    job_config_fprint(f, w->r.cfg, w->r.world);
    fclose(f);
    f = open_memstream(&text, &m);
    SHLM_CHECK_ALLOC(f);
    for (const char *line = table; *line;) {
        size_t k = strcspn(line, "\n");
        fprintf(f, "    %.*s\n", (int)k, line);
        line += k + (line[k] == '\n');
    }
    fclose(f);
    metrics_begin_tensorboard(&w->log, first, unix_now(), text);
    free(table);
    free(text);
}

int watch_open(watch **out, const watch_run *r) {
    const job_config *c = r->cfg;
    watch *w = calloc(1, sizeof *w);
    SHLM_CHECK_ALLOC(w);
    *out = w;
    w->r = *r;
    w->tokens_per_step = (long long)c->global_batch * c->seq_len;
    w->flops_per_token = model_shape_flops_per_token(&c->model, c->seq_len);
    w->last_val_loss = NAN;
    step_reduce_init();
    char err[1536] = "";

    /* identity: rank 0's run id for every rank's rows and labels */
    if (r->rank == 0) make_run_id(w->run_id, sizeof w->run_id);
    MPI_CHECK(MPI_Bcast(w->run_id, sizeof w->run_id, MPI_CHAR, 0, MPI_COMM_WORLD));
    snprintf(w->job_hash, sizeof w->job_hash, "%016llx", (unsigned long long)job_config_hash(c));
    w->hosts = calloc((size_t)r->world, HOST_LEN);
    w->host_ptrs = calloc((size_t)r->world, sizeof(char *));
    SHLM_CHECK_ALLOC(w->hosts);
    SHLM_CHECK_ALLOC(w->host_ptrs);
    char me[HOST_LEN];
    snprintf(me, sizeof me, "%s", shlm_host());
    MPI_CHECK(MPI_Allgather(me, HOST_LEN, MPI_CHAR, w->hosts, HOST_LEN, MPI_CHAR, MPI_COMM_WORLD));
    for (int i = 0; i < r->world; i++) w->host_ptrs[i] = w->hosts[i];

    /* metrics.jsonl and the summary on rank 0 */
    int ok = 1;
    if (r->rank == 0) {
        long rows;
        int runs, unnamed;
        count_earlier_runs(c->run_dir, &rows, &runs, &unnamed);
        ok = metrics_open(&w->log, c->run_dir, err, sizeof err) == 0;
        if (ok && rows > 0)
            printf("metrics: %s/metrics.jsonl: appending run %s after %ld row(s) of %d earlier "
                   "run(s)%s: every row carries its run_id\n", c->run_dir, w->run_id, rows,
                   runs + (unnamed > 0), unnamed ? " (some rows without a run_id)" : "");
        else if (ok)
            printf("metrics: %s/metrics.jsonl: run %s\n", c->run_dir, w->run_id);
        char dir[1100];
        if (ok && c->tensorboard[0]) {
            ok = metrics_open_tensorboard(&w->log, c->tensorboard, c->run_dir, shlm_host(),
                                          unix_now(), dir, sizeof dir, err, sizeof err) == 0;
            if (ok)
                printf("tensorboard: %s: run %s (tensorboard --logdir %s)\n", w->log.tb.path,
                       w->run_id, dir);
        }
        run_summary_init(&w->summary, r->world);
    }
    if (any_rank_failed(ok, err)) return -1;

    int warn = 0;
    char what[400];
    w->peak_tflops = resolve_peak(r, what, sizeof what, &warn);
    if (r->rank == 0 && warn) fprintf(stderr, "shardlm: warning: MFU %s\n", what);
    if (r->rank == 0) printf("MFU: %s\n", what);

    /* telemetry and the exporter on each node's local rank 0 */
    MPI_Comm node;
    int node_rank, node_size;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL,
                                  &node));
    MPI_CHECK(MPI_Comm_rank(node, &node_rank));
    MPI_CHECK(MPI_Comm_size(node, &node_size));
    start_telemetry(w, node, node_rank, node_size);
    MPI_CHECK(MPI_Comm_free(&node));
    ok = 1;
    if (node_rank == 0 && (c->prometheus[0] || c->prometheus_textfile[0])) {
        snprintf(w->labels.host, sizeof w->labels.host, "%s", shlm_host());
        job_stem(c->path, w->labels.job, sizeof w->labels.job);
        w->labels.rank = r->rank;
        snprintf(w->labels.run_id, sizeof w->labels.run_id, "%s", w->run_id);
        snprintf(w->labels.job_hash, sizeof w->labels.job_hash, "%s", w->job_hash);
        w->prom = prom_start(c->prometheus, c->prometheus_textfile, &w->labels, w->tel, err,
                             sizeof err);
        ok = w->prom != NULL;
        if (ok && prom_address(w->prom)[0])
            printf("prometheus: %s: serving http://%s/metrics (rank %d)\n", shlm_host(),
                   prom_address(w->prom), r->rank);
        if (ok && prom_textfile(w->prom)[0])
            printf("prometheus: %s: writing %s for node_exporter's textfile collector\n",
                   shlm_host(), prom_textfile(w->prom));
        fflush(stdout);
    }
    if (any_rank_failed(ok, err)) return -1;
    if (w->prom) { /* before step 1: the start-up so far and the job's size */
        prom_train t = {.steps = c->steps, .loss = NAN, .val_loss = NAN,
                        .grad_norm = NAN, .mfu = NAN};
        for (int p = 0; p < STARTUP_N; p++) t.startup_s[p] = startup_seconds((startup_phase)p);
        prom_publish(w->prom, &t);
    }
    startup_mark(STARTUP_WATCH);
    return 0;
}

void watch_step_end(watch *w, double stop_signal, double data_failed, double step_s,
                    const double comm_ms[2], size_t mem_peak_bytes, step_record *out) {
    int n = telemetry_window(w->tel, w->gpus, MAX_NODE_GPUS);
    step_record_fill(out, w->r.rank, stop_signal, data_failed, 1000 * step_s, comm_ms,
                     (double)mem_peak_bytes, w->gpus, n);
    MPI_CHECK(step_reduce(out, MPI_COMM_WORLD));
    if (!w->started) startup_mark(STARTUP_FIRST_STEP);
}

static const char *host_of(const watch *w, double rank) {
    int k = (int)rank;
    return k >= 0 && k < w->r.world ? w->hosts[k] : "?";
}

void watch_step(watch *w, step_metrics *sm, const step_record *rec, int logged) {
    const watch_run *r = &w->r;
    const double now = MPI_Wtime();
    if (!w->started) {
        /* the first step began its own step time ago */
        w->t_start = now - rec->slow_ms / 1000;
        w->started = 1;
        if (r->rank == 0) startup_print(stdout, "the end of the first step");
    }
    const int done = sm->step - w->first; /* steps this run has trained */
    sm->steps = r->cfg->steps;
    sm->step_ms = rec->slow_ms;
    sm->comm_exposed_ms = rec->comm_ms[2];
    sm->comm_ms[0] = rec->comm_ms[0];
    sm->comm_ms[1] = rec->comm_ms[1];
    sm->tokens_per_s = w->tokens_per_step / (rec->slow_ms / 1000);
    sm->tokens_per_s_per_gpu = sm->tokens_per_s / r->world;
    sm->tflops_per_gpu = w->flops_per_token * sm->tokens_per_s_per_gpu / 1e12;
    sm->mfu = w->peak_tflops > 0 ? sm->tflops_per_gpu / w->peak_tflops : NAN;
    sm->elapsed_s = now - w->t_start;
    sm->eta_s = done > 0 ? sm->elapsed_s / done * (w->end - sm->step) : NAN;
    sm->tokens_to_go = (long long)(w->end - sm->step) * w->tokens_per_step;
    sm->slowest_rank = (int)rec->slow_rank;
    sm->fastest_rank = (int)rec->fast_rank;
    sm->slowest_host = host_of(w, rec->slow_rank);
    sm->fastest_host = host_of(w, rec->fast_rank);
    sm->slowest_step_ms = rec->slow_ms;
    sm->slowest_comm_ms = rec->slow_comm_ms;
    sm->fastest_step_ms = rec->fast_ms;
    sm->fastest_comm_ms = rec->fast_comm_ms;
    sm->unix_time = unix_now();
    sm->run_id = w->run_id;
    sm->job_hash = w->job_hash;
    sm->gpu = rec->gpus > 0 ? rec : NULL;
    if (r->rank == 0) {
        run_summary_add(&w->summary, sm->step, rec->slow_ms, sm->comm_exposed_ms,
                        w->tokens_per_step, (size_t)rec->mem_peak_bytes, sm->slowest_rank,
                        sm->skipped);
        if (logged) {
            metrics_print_step(stdout, sm);
            const int out_errno = errno;
            /* a closed stdout (SIGPIPE is ignored: src/base/signals.h) does not stop the run */
            if (ferror(stdout) && !w->stdout_lost) {
                w->stdout_lost = 1;
                fprintf(stderr, "shardlm: warning: standard output cannot be written (%s, seen "
                        "at step %d): the run goes on; every step is in %s/metrics.jsonl\n",
                        strerror(out_errno), sm->step, r->cfg->run_dir);
            }
            metrics_write(&w->log, sm);
        }
    }
    if (!isnan(sm->val_loss)) w->last_val_loss = sm->val_loss;
    if (w->prom) {
        prom_train t = {
            .step = sm->step, .steps = sm->steps, .loss = sm->loss, .val_loss = w->last_val_loss,
            .lr = sm->lr, .grad_norm = sm->grad_norm, .tokens_per_s = sm->tokens_per_s,
            .tokens_per_s_per_gpu = sm->tokens_per_s_per_gpu, .mfu = sm->mfu,
            .step_s = sm->step_ms / 1000,
            .comm_exposed_s = {sm->comm_ms[0] / 1000, sm->comm_ms[1] / 1000},
            .mem_peak_bytes = (double)sm->mem_peak_bytes, .tokens_seen = (double)sm->tokens_seen,
            .elapsed_s = sm->elapsed_s, .eta_s = sm->eta_s, .slowest_rank = sm->slowest_rank,
            .fastest_rank = sm->fastest_rank, .slowest_step_s = sm->slowest_step_ms / 1000,
            .fastest_step_s = sm->fastest_step_ms / 1000,
            .slowest_comm_s = sm->slowest_comm_ms / 1000,
            .fastest_comm_s = sm->fastest_comm_ms / 1000};
        snprintf(t.slowest_host, sizeof t.slowest_host, "%s", sm->slowest_host);
        for (int p = 0; p < STARTUP_N; p++) t.startup_s[p] = startup_seconds((startup_phase)p);
        prom_publish(w->prom, &t);
    }
    if (logged) telemetry_reset_window(w->tel);
}

void watch_summary(watch *w, int print) {
    const watch_run *r = &w->r;
    if (r->rank != 0 || !print) return;
    double wall = w->started ? MPI_Wtime() - w->t_start : 0;
    run_summary_print(stdout, &w->summary, w->run_id, wall, w->host_ptrs);
    char err[1400];
    if (run_summary_write(r->cfg->run_dir, &w->summary, w->run_id, w->job_hash, wall,
                          w->host_ptrs, err, sizeof err) != 0)
        fprintf(stderr, "shardlm: warning: %s\n", err);
}

void watch_close(watch *w) {
    if (!w) return;
    const watch_run *r = &w->r;
    if (r->rank == 0) {
        metrics_close(&w->log);
        run_summary_free(&w->summary);
    }
    prom_stop(w->prom);
    telemetry_stop(w->tel);
    free(w->hosts);
    free(w->host_ptrs);
    free(w);
    step_reduce_free();
}
