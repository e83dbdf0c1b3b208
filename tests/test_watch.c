/* Unit tests of what watches a run: the device table (MFU peaks by name and compute
 * capability), the step-end reduction's operation, the summary's statistics, the
 * Prometheus renderer (every family, label escaping), its HTTP server (200, 404, 405,
 * 400 on a request too large, a port in use; scrapes answered while a client drips its
 * request and while 200 idle connections are held, such clients dropped, a stop that
 * does not wait for them), its textfile (written, rewritten, removed, one per run; an
 * unwritable directory refused), the telemetry's refusal to start without NVML (no
 * library, or a build without nvml.h: a reason, nothing loaded), and the Grafana
 * dashboard: every metric and label it queries is one the exporter emits. Every client
 * is on 127.0.0.1 and bounded in time.
 *   SHLM_SRCDIR=. tests/test_watch */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "src/watch/device_table.h"
#include "src/watch/prometheus.h"
#include "src/watch/run_summary.h"
#include "src/watch/step_reduce.h"
#include "tests/check.h"

static void test_device_table(void) {
    static const struct {
        const char *name;
        int major, minor;
        double peak;
    } cases[] = {
        {"NVIDIA H200", 9, 0, 989},          {"NVIDIA H200 NVL", 9, 0, 835},
        {"NVIDIA H100 80GB HBM3", 9, 0, 989}, {"NVIDIA H100 PCIe", 9, 0, 756},
        {"NVIDIA H100 NVL", 9, 0, 835},      {"NVIDIA A100-SXM4-80GB", 8, 0, 312},
        {"NVIDIA A100-PCIE-40GB", 8, 0, 312}, {"NVIDIA L40S", 8, 9, 362},
        {"NVIDIA L40", 8, 9, 181},           {"NVIDIA GH200 480GB", 9, 0, 989},
        {"NVIDIA H20", 9, 0, 148},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const device_spec *d = device_table_find(cases[i].name, cases[i].major, cases[i].minor);
        double p = device_spec_peak_tflops(d, "bf16");
        check(p == cases[i].peak, "device table: %s (%d.%d) -> %g TFLOP/s bf16 (want %g)",
              cases[i].name, cases[i].major, cases[i].minor, p, cases[i].peak);
    }
    check(device_table_find("NVIDIA H200", 8, 0) == NULL,
          "device table: a known name with another compute capability is not matched");
    check(device_table_find("NVIDIA Imaginary X1", 9, 0) == NULL, "device table: unknown name");
    check(device_spec_peak_tflops(device_table_find("NVIDIA H200", 9, 0), "fp32") == 0,
          "device table: no fp32 peak (n/a, not a wrong one)");
    const device_spec *a = device_table_by_short_name("A100-80GB");
    check(a && a->mem_mib == 81920, "device table: a100-80gb by short name, 81920 MiB");
}

static void test_reduce_op(void) {
    double c0[2] = {1, 2}, c1[2] = {5, 0}, c2[2] = {1, 1};
    tel_gpu g[2] = {{0}};
    for (int f = 0; f < TEL_N; f++) {
        g[0].mean[f] = 10, g[0].max[f] = 20;
        g[1].mean[f] = 30, g[1].max[f] = 40;
    }
    g[0].throttle_reasons = 1, g[1].throttle_reasons = 4;
    g[0].ecc_corrected = NAN, g[1].ecc_corrected = 3;
    g[1].xid_count = 2, g[1].xid_last = 79;
    step_record a, b, c;
    step_record_fill(&a, 0, 0, 0, 100, c0, 1e6, g, 1);
    step_record_fill(&b, 1, 1, 0, 150, c1, 2e6, g + 1, 1);
    step_record_fill(&c, 2, 0, 0, 90, c2, 5e5, NULL, 0);
    step_record_combine(&a, &b); /* b = a op b */
    step_record_combine(&c, &b);
    check(b.slow_rank == 1 && b.slow_ms == 150 && b.slow_comm_ms == 5,
          "reduce: slowest rank 1, 150 ms, comm 5 ms (got rank %g, %g, %g)", b.slow_rank,
          b.slow_ms, b.slow_comm_ms);
    check(b.fast_rank == 2 && b.fast_ms == 90 && b.fast_comm_ms == 2,
          "reduce: fastest rank 2, 90 ms, comm 2 ms (got rank %g, %g, %g)", b.fast_rank, b.fast_ms,
          b.fast_comm_ms);
    check(b.stop_signal == 1 && b.comm_ms[0] == 5 && b.comm_ms[1] == 2 && b.comm_ms[2] == 5 &&
              b.mem_peak_bytes == 2e6, "reduce: flags, comm per group and memory are maxima");
    check(b.mean_lo[0] == 10 && b.mean_hi[0] == 30 && b.max_lo[0] == 20 && b.max_hi[0] == 40 &&
              b.gpus == 2, "reduce: telemetry min/max across GPUs, a rank without GPUs ignored");
    check(b.throttle_reasons == 5 && b.ecc_corrected == 3 && b.xid_count == 2 && b.xid_last == 79,
          "reduce: throttle reasons OR-ed, ECC and XID counts summed, NaN = not reported");
    step_record d = a;
    step_record e;
    step_record_fill(&e, 3, 0, 0, 100, c0, 1e6, NULL, 0);
    step_record_combine(&e, &d);
    check(d.slow_rank == 0, "reduce: a tie goes to the lower rank (commutative)");
}

static void test_summary(void) {
    run_summary s;
    run_summary_init(&s, 4);
    const double ms[] = {500, 100, 110, 90, 100, 400, 105};
    for (int i = 0; i < 7; i++) run_summary_add(&s, 11 + i, ms[i], 10, 1000, 123, i == 5 ? 3 : 1, 0);
    run_summary_stats st;
    run_summary_compute(&s, &st);
    check(st.steps == 7 && s.first == 11 && s.last == 17, "summary: steps 11..17");
    check(st.median_ms == 105 && fabs(st.mean_ms - 1405.0 / 7) < 1e-9,
          "summary: median 105, mean 200.7 (got %g, %g)", st.median_ms, st.mean_ms);
    check(st.stalls == 1 && st.stall_ms == 295,
          "summary: one stall (400 ms > 2 x 105; the first step not counted), 295 ms beyond "
          "(got %d, %g)", st.stalls, st.stall_ms);
    check(st.usual_slowest_rank == 1 && fabs(st.usual_slowest_share - 6.0 / 7) < 1e-12,
          "summary: rank 1 slowest in 6 of 7 steps");
    run_summary_free(&s);
}

static prom_labels labels(void) {
    prom_labels l = {.rank = 4};
    snprintf(l.host, sizeof l.host, "node\"7");
    snprintf(l.job, sizeof l.job, "tiny");
    snprintf(l.run_id, sizeof l.run_id, "20261201T000000Z-00000001");
    snprintf(l.job_hash, sizeof l.job_hash, "0123456789abcdef");
    return l;
}

static prom_train train_values(void) {
    prom_train t = {.step = 12, .steps = 300, .loss = 2.5, .val_loss = 2.6, .lr = 1e-3,
                    .grad_norm = 0.7, .tokens_per_s = 1000, .tokens_per_s_per_gpu = 250,
                    .mfu = 0.4, .step_s = 0.1, .comm_exposed_s = {0.01, 0.02},
                    .mem_peak_bytes = 1 << 20, .tokens_seen = 4096, .elapsed_s = 3,
                    .eta_s = 60, .slowest_rank = 3, .fastest_rank = 1, .slowest_step_s = 0.1,
                    .fastest_step_s = 0.09, .slowest_comm_s = 0.02, .fastest_comm_s = 0.01};
    snprintf(t.slowest_host, sizeof t.slowest_host, "node8");
    for (int p = 0; p < STARTUP_N; p++) t.startup_s[p] = p;
    return t;
}

static char rendered[1 << 18];

/* Renders with two GPUs; every family has a sample line. */
static void test_render(void) {
    prom_labels l = labels();
    prom_train t = train_values();
    tel_gpu g[2] = {{.index = 0, .rank = 4}, {.index = 1, .rank = 5}};
    for (int i = 0; i < 2; i++)
        for (int f = 0; f < TEL_N; f++) g[i].last[f] = 10 * i + f;
    size_t n = prom_render(rendered, sizeof rendered, &l, &t, g, 2);
    check(n > 0 && strlen(rendered) == n, "render: %zu bytes", n);
    for (int i = 0; i < prom_family_count(); i++) {
        const prom_family *f = prom_family_at(i);
        char type[200], sample[200];
        snprintf(type, sizeof type, "# TYPE %s %s\n", f->name, f->type);
        snprintf(sample, sizeof sample, "\n%s{", f->name);
        check(strstr(rendered, type) && strstr(rendered, sample), "render: %s has TYPE and a sample",
              f->name);
    }
    check(strstr(rendered, "DCGM_FI_DEV_POWER_USAGE{gpu=\"1\",host=\"node\\\"7\",rank=\"5\",job=\"tiny\"} 13\n") != NULL,
          "render: a GPU sample with gpu, host (quote escaped), rank and job labels");
    check(strstr(rendered, "shardlm_slowest_rank{host=\"node\\\"7\",rank=\"4\",job=\"tiny\",slowest_host=\"node8\"} 3\n") != NULL,
          "render: the slowest rank with its host");
    check(prom_render(rendered, 100, &l, &t, g, 2) == 0, "render: a buffer too small gives 0");
    t.val_loss = NAN;
    t.mfu = NAN;
    prom_render(rendered, sizeof rendered, &l, &t, NULL, 0);
    check(!strstr(rendered, "\nshardlm_val_loss{") && !strstr(rendered, "\nshardlm_mfu_ratio{") &&
              !strstr(rendered, "DCGM_"), "render: unknown values and absent GPUs are left out");
}

static double mono_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* poll(2) on one descriptor until `deadline` (mono_ms); returns revents, 0 at the deadline. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - mono_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, (int)left + 1);
        if (rc > 0) return p.revents;
        if (rc == 0) return 0;
        if (errno != EINTR) return POLLERR;
    }
}

/* A non-blocking socket connecting to 127.0.0.1:port, or -1. */
static int connect_nb(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* 1 once fd's connect has completed before `deadline`. */
static int connected(int fd, double deadline) {
    int err = 0;
    socklen_t len = sizeof err;
    return (wait_fd(fd, POLLOUT, deadline) & POLLOUT) &&
           getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
}

/* Sends req to 127.0.0.1:port and reads the response to its end, all within timeout_ms;
 * returns its status code (0: no connection, no answer, or not within the time). */
static int http(int port, const char *req, size_t len, char *body, size_t bodylen,
                int timeout_ms) {
    const double deadline = mono_ms() + timeout_ms;
    int fd = connect_nb(port);
    if (fd < 0) return 0;
    if (!connected(fd, deadline)) {
        close(fd);
        return 0;
    }
    for (size_t off = 0; off < len;) {
        ssize_t k = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (k > 0) off += (size_t)k;
        else if (k < 0 && errno == EAGAIN && (wait_fd(fd, POLLOUT, deadline) & POLLOUT)) continue;
        else break; /* closed early (a request too large): its answer is still read */
    }
    shutdown(fd, SHUT_WR);
    static char resp[1 << 18];
    size_t got = 0;
    int in_time = 1;
    while (got < sizeof resp - 1) {
        ssize_t k = recv(fd, resp + got, sizeof resp - 1 - got, MSG_DONTWAIT);
        if (k > 0) got += (size_t)k;
        else if (k == 0) break;
        else if (errno != EAGAIN) break;
        else if (!wait_fd(fd, POLLIN, deadline)) {
            in_time = 0;
            break;
        }
    }
    resp[got] = 0;
    close(fd);
    int code = 0;
    if (in_time) sscanf(resp, "HTTP/1.1 %d", &code);
    if (body) {
        const char *b = strstr(resp, "\r\n\r\n");
        snprintf(body, bodylen, "%s", b ? b + 4 : "");
    }
    return code;
}

static void test_server(void) {
    prom_labels l = labels();
    char err[1400] = "";
    prom_exporter *p = prom_start("127.0.0.1:0", "", &l, NULL, err, sizeof err);
    check(p != NULL, "server: listening on port 0 (%s)", p ? prom_address(p) : err);
    if (!p) return;
    int port = atoi(strrchr(prom_address(p), ':') + 1);
    prom_train t = train_values();
    prom_publish(p, &t);
    static char body[1 << 18];
    const char *get = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n";
    check(http(port, get, strlen(get), body, sizeof body, 5000) == 200 &&
              strstr(body, "\nshardlm_step{host=\"node\\\"7\",rank=\"4\",job=\"tiny\"} 12\n"),
          "server: GET /metrics -> 200 with the published step");
    const char *other = "GET /other HTTP/1.1\r\n\r\n";
    check(http(port, other, strlen(other), NULL, 0, 5000) == 404, "server: GET /other -> 404");
    const char *post = "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    check(http(port, post, strlen(post), NULL, 0, 5000) == 405, "server: POST /metrics -> 405");
    static char big[20000];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
    check(http(port, big, sizeof big, NULL, 0, 5000) == 400, "server: a request over 8 KiB -> 400");
    const char *garbage = "hello\r\n\r\n";
    check(http(port, garbage, strlen(garbage), NULL, 0, 5000) == 400, "server: not HTTP -> 400");
    check(http(port, get, strlen(get), NULL, 0, 5000) == 200, "server: still answering");
    prom_exporter *q = prom_start(prom_address(p), "", &l, NULL, err, sizeof err);
    check(q == NULL && strstr(err, "log.prometheus = 127.0.0.1:") &&
              strstr(err, "Address already in use"), "server: a port in use is refused: %s", err);
    prom_stop(q);
    q = prom_start("localhost:99999", "", &l, NULL, err, sizeof err);
    check(q == NULL && strstr(err, "log.prometheus = localhost:99999"), "server: bad port: %s", err);
    prom_stop(p);
    check(http(port, get, strlen(get), NULL, 0, 5000) == 0, "server: closed after prom_stop");
}

/* A client that sends its request one byte every gap_ms and never ends it, connecting
 * again when dropped, for at most run_ms or until told to stop; first_drop_ms: when the
 * server closed its first connection (from that connect), or -1 if it never did. */
typedef struct drip {
    int port;
    double gap_ms, run_ms;
    int stop;                    /* __atomic */
    double first_drop_ms;
    pthread_t thread;
} drip;

static int drip_going(drip *d, double start) {
    return !__atomic_load_n(&d->stop, __ATOMIC_RELAXED) && mono_ms() - start < d->run_ms;
}

static void *drip_run(void *arg) {
    drip *d = arg;
    static const char head[] = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    d->first_drop_ms = -1;
    const double start = mono_ms();
    while (drip_going(d, start)) {
        const double t0 = mono_ms();
        int fd = connect_nb(d->port);
        if (fd < 0) return NULL;
        if (!connected(fd, t0 + 2000)) { /* the server is gone */
            close(fd);
            return NULL;
        }
        for (size_t i = 0; drip_going(d, start); i++) {
            char ch = i < sizeof head - 1 ? head[i] : 'a';
            int gone = send(fd, &ch, 1, MSG_NOSIGNAL) != 1;
            if (!gone && wait_fd(fd, POLLIN, mono_ms() + d->gap_ms)) {
                char b[256];
                ssize_t k = recv(fd, b, sizeof b, MSG_DONTWAIT);
                gone = k == 0 || (k < 0 && errno != EAGAIN);
            }
            if (gone) {
                if (d->first_drop_ms < 0) d->first_drop_ms = mono_ms() - t0;
                break;
            }
        }
        close(fd);
    }
    return NULL;
}

/* "2.0 s" or "never" */
static const char *drop_time(const drip *d, char *buf, size_t len) {
    if (d->first_drop_ms < 0) snprintf(buf, len, "never");
    else snprintf(buf, len, "%.1f s", d->first_drop_ms / 1000);
    return buf;
}

static const char get_metrics[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

/* Scrapes and the textfile go on while a client drips its request (and drips again
 * when dropped); each of its connections is dropped at its request's deadline (2 s). */
static void test_server_slow_client(void) {
    char dir[] = "/tmp/shlm_test_watch.XXXXXX";
    if (!mkdtemp(dir)) {
        check(0, "mkdtemp");
        return;
    }
    prom_labels l = labels();
    char err[1400] = "", when[32];
    prom_exporter *p = prom_start("127.0.0.1:0", dir, &l, NULL, err, sizeof err);
    check(p != NULL, "slow client: exporter started (%s)", err);
    if (!p) return;
    char path[1200];
    snprintf(path, sizeof path, "%s", prom_textfile(p));
    prom_train t = train_values();
    prom_publish(p, &t);
    drip d = {.port = atoi(strrchr(prom_address(p), ':') + 1), .gap_ms = 500, .run_ms = 15000};
    pthread_create(&d.thread, NULL, drip_run, &d);
    usleep(300000); /* the drip is connected and has sent its first bytes */
    t.step = 13;
    prom_publish(p, &t);
    int found = 0;
    for (int i = 0; i < 25 && !found; i++) { /* rewritten within about a second */
        usleep(100000);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        static char text[1 << 18];
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
        found = strstr(text, "\nshardlm_step{host=\"node\\\"7\",rank=\"4\",job=\"tiny\"} 13\n") != NULL;
    }
    check(found, "slow client: the textfile is rewritten within 2.5 s while a client drips its "
          "request");
    int answered = 0;
    double slowest = 0;
    for (int i = 0; i < 5; i++) {
        double t0 = mono_ms();
        answered += http(d.port, get_metrics, strlen(get_metrics), NULL, 0, 1500) == 200;
        slowest = fmax(slowest, mono_ms() - t0);
        usleep(300000);
    }
    check(answered == 5, "slow client: %d of 5 scrapes answered within 1.5 s each while a client "
          "drips its request (slowest %.0f ms)", answered, slowest);
    __atomic_store_n(&d.stop, 1, __ATOMIC_RELAXED);
    pthread_join(d.thread, NULL);
    check(d.first_drop_ms >= 0 && d.first_drop_ms < 3500,
          "slow client: its connection dropped %s after its connect (the request's deadline: "
          "2 s)", drop_time(&d, when, sizeof when));
    prom_stop(p);
    rmdir(dir);
}

/* A scrape is answered while 200 idle connections are held open: past 16 connections the
 * oldest idle ones are dropped. */
static void test_server_idle_flood(void) {
    prom_labels l = labels();
    char err[1400] = "";
    prom_exporter *p = prom_start("127.0.0.1:0", "", &l, NULL, err, sizeof err);
    check(p != NULL, "idle flood: exporter started (%s)", err);
    if (!p) return;
    const int port = atoi(strrchr(prom_address(p), ':') + 1);
    enum { N_IDLE = 200 };
    int fds[N_IDLE], n_connected = 0;
    for (int i = 0; i < N_IDLE; i++) fds[i] = connect_nb(port);
    const double deadline = mono_ms() + 5000; /* a listening queue that is not drained
                                               * makes connects wait for SYN retries */
    for (int i = 0; i < N_IDLE; i++) n_connected += fds[i] >= 0 && connected(fds[i], deadline);
    double t0 = mono_ms();
    int code = http(port, get_metrics, strlen(get_metrics), NULL, 0, 2000);
    check(code == 200, "idle flood: a scrape answered (status %d) in %.0f ms (at most 2 s) while "
          "%d idle connections were opened (%d connected)", code, mono_ms() - t0, N_IDLE,
          n_connected);
    for (int i = 0; i < N_IDLE; i++)
        if (fds[i] >= 0) close(fds[i]);
    prom_stop(p);
}

/* prom_stop does not wait for a client in the middle of its request. */
static void test_server_stop_with_client(void) {
    prom_labels l = labels();
    char err[1400] = "";
    prom_exporter *p = prom_start("127.0.0.1:0", "", &l, NULL, err, sizeof err);
    check(p != NULL, "stop: exporter started (%s)", err);
    if (!p) return;
    drip d = {.port = atoi(strrchr(prom_address(p), ':') + 1), .gap_ms = 300, .run_ms = 6000};
    pthread_create(&d.thread, NULL, drip_run, &d);
    usleep(500000);
    double t0 = mono_ms();
    prom_stop(p);
    double took = mono_ms() - t0;
    pthread_join(d.thread, NULL);
    char when[32];
    check(took < 1000 && d.first_drop_ms >= 0 && d.first_drop_ms < 1500,
          "stop: prom_stop returned in %.0f ms (at most 1 s) while a client dripped its request, "
          "its connection closed %s after its connect", took, drop_time(&d, when, sizeof when));
}

static void test_textfile(void) {
    char dir[] = "/tmp/shlm_test_watch.XXXXXX";
    if (!mkdtemp(dir)) {
        check(0, "mkdtemp");
        return;
    }
    prom_labels l = labels();
    char err[1400] = "", path[1200];
    prom_exporter *p = prom_start("", dir, &l, NULL, err, sizeof err);
    check(p != NULL, "textfile: started in %s (%s)", dir, err);
    if (!p) return;
    snprintf(path, sizeof path, "%s/shardlm_tiny_node_7_20261201T000000Z-00000001.prom", dir);
    check(strcmp(prom_textfile(p), path) == 0, "textfile: named %s", prom_textfile(p));
    struct stat sb;
    check(stat(path, &sb) == 0, "textfile: written before the first step");
    prom_train t = train_values();
    prom_publish(p, &t);
    int found = 0;
    for (int i = 0; i < 40 && !found; i++) { /* rewritten within about a second */
        usleep(100000);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        static char text[1 << 18];
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
        found = strstr(text, "\nshardlm_step{host=\"node\\\"7\",rank=\"4\",job=\"tiny\"} 12\n") != NULL;
    }
    check(found, "textfile: rewritten with the published step");
    prom_stop(p);
    check(stat(path, &sb) != 0, "textfile: removed at the end of the run");
    /* two runs of one job on one host: a file each, the first to end removes only its own */
    prom_labels l2 = l;
    snprintf(l2.run_id, sizeof l2.run_id, "20261201T000001Z-00000002");
    p = prom_start("", dir, &l, NULL, err, sizeof err);
    prom_exporter *q = prom_start("", dir, &l2, NULL, err, sizeof err);
    char other[1200] = "";
    if (q) snprintf(other, sizeof other, "%s", prom_textfile(q));
    check(p && q && strcmp(prom_textfile(p), other) != 0,
          "textfile: two runs of one job on one host write two files (%s, %s)",
          p ? prom_textfile(p) : err, other);
    prom_stop(p);
    check(q && stat(other, &sb) == 0, "textfile: the other run's file stays when one run ends");
    prom_stop(q);
    check(stat(other, &sb) != 0, "textfile: and goes when that run ends");
    char file[1200];
    snprintf(file, sizeof file, "%s/a-file", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    p = prom_start("", file, &l, NULL, err, sizeof err);
    check(p == NULL && strstr(err, "log.prometheus_textfile = ") && strstr(err, "a-file"),
          "textfile: a directory that is a file is refused: %s", err);
    prom_stop(p);
    unlink(file);
    rmdir(dir);
}

/* A family the exporter writes, or -1. */
static int family_index(const char *name) {
    for (int i = 0; i < prom_family_count(); i++)
        if (!strcmp(prom_family_at(i)->name, name)) return i;
    return -1;
}

static int known_label(const char *l) {
    static const char *const labels_emitted[] = {"host", "gpu", "rank", "job", "group",
                                                 "slowest_host", "phase", "run_id", "job_hash",
                                                 "instance"};
    for (size_t i = 0; i < sizeof labels_emitted / sizeof labels_emitted[0]; i++)
        if (!strcmp(l, labels_emitted[i])) return 1;
    return 0;
}

/* Checks one PromQL expression: its metric names and the labels it matches on. Returns
 * the number of metrics it names. */
static int check_expr(const char *title, const char *e) {
    int metrics = 0;
    for (const char *p = e; *p;) {
        if (*p == '"') { /* a label value */
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1]) p++;
            if (*p) p++;
            continue;
        }
        if (!(isalpha((unsigned char)*p) || *p == '_')) {
            p++;
            continue;
        }
        const char *s = p;
        while (isalnum((unsigned char)*p) || *p == '_' || *p == ':') p++;
        char word[128];
        snprintf(word, sizeof word, "%.*s", (int)(p - s), s);
        const char *q = p;
        while (*q == ' ') q++;
        if (!strncmp(word, "DCGM_", 5) || !strncmp(word, "shardlm_", 8)) {
            metrics++;
            check(family_index(word) >= 0, "dashboard: panel '%s' queries %s, which the exporter "
                  "emits", title, word);
        } else if (*q == '=' || *q == '!') { /* a label matcher */
            check(known_label(word), "dashboard: panel '%s' matches label %s, which the exporter "
                  "emits", title, word);
        }
    }
    return metrics;
}

static void test_dashboard(void) {
    const char *src = getenv("SHLM_SRCDIR");
    char path[1100];
    snprintf(path, sizeof path, "%s/examples/monitoring/grafana-dashboard.json", src ? src : ".");
    FILE *f = fopen(path, "r");
    check(f != NULL, "dashboard: %s", path);
    if (!f) return;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    cJSON *d = cJSON_Parse(text);
    check(d != NULL, "dashboard: valid JSON");
    if (!d) return;
    int panels = 0, gpu_fields = 0;
    const char *six[] = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS",
                         "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"};
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(d, "panels")) {
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(p, "type"));
        if (type && !strcmp(type, "row")) continue;
        const char *title = cJSON_GetStringValue(cJSON_GetObjectItem(p, "title"));
        int metrics = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(p, "targets")) {
            const char *e = cJSON_GetStringValue(cJSON_GetObjectItem(t, "expr"));
            if (!e) continue;
            metrics += check_expr(title ? title : "?", e);
            for (int k = 0; k < 6; k++) gpu_fields += strstr(e, six[k]) != NULL;
        }
        check(metrics > 0, "dashboard: panel '%s' queries at least one metric", title ? title : "?");
        panels++;
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, cJSON_GetObjectItem(cJSON_GetObjectItem(d, "templating"), "list")) {
        const char *def = cJSON_GetStringValue(cJSON_GetObjectItem(v, "definition"));
        if (def) check_expr("templating", def);
    }
    check(panels >= 13 && gpu_fields >= 6, "dashboard: %d panels, the six DCGM fields among them",
          panels);
    cJSON_Delete(d);
}

static void test_telemetry_absent(void) {
    const char *ids[1] = {"0000:00:00.0"};
    int ranks[1] = {0};
    char why[512] = "";
    setenv("SHLM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
    telemetry *t = telemetry_start(ids, ranks, 1, 100, why, sizeof why);
    check(t == NULL && (strstr(why, "/nonexistent/libnvidia-ml.so.1 not found") ||
                        strstr(why, "no NVML telemetry")),
          "telemetry: no NVML library: no sampler, the reason given (%s)", why);
    unsetenv("SHLM_NVML_LIBRARY");
    check(telemetry_window(NULL, NULL, 0) == 0 && telemetry_gpu_count(NULL) == 0,
          "telemetry: a run without a sampler reads no GPUs");
    telemetry_stop(NULL);
}

int main(void) {
    test_device_table();
    test_reduce_op();
    test_summary();
    test_render();
    test_server();
    test_server_slow_client();
    test_server_idle_flood();
    test_server_stop_with_client();
    test_textfile();
    test_telemetry_absent();
    test_dashboard();
    return check_exit();
}
