/* The Prometheus exporter (prometheus.h): the renderer, the HTTP server and the textfile
 * writer, one thread for both. The server is one poll loop over non-blocking sockets on
 * that thread, serving up to MAX_CLIENTS connections at once: a request of at most
 * REQ_MAX bytes that must be whole within REQUEST_DEADLINE_MS of its accept, GET /metrics
 * answered 200 with the body rendered into the connection's buffer, any other path 404,
 * any other method 405, then the connection closed once the response is taken (within
 * RESPONSE_DEADLINE_MS) or its deadline passes. A connection past the bound drops the
 * oldest one still sending its request. Buffers are allocated once, at start. A poll loop
 * rather than a pool of threads: the exporter already is one thread polling its wake pipe
 * and the textfile's timer; with nothing blocking, a deadline is a poll timeout and
 * stopping is one wake-up, where blocked threads would each need interrupting. A
 * hand-written server rather than a library (Debian's libmicrohttpd would be a new build
 * dependency on every machine, with threads and pools of its own, for one path of one
 * method). */
#include "src/watch/prometheus.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "io/safe_file.h"
#include "src/base/listen_addr.h"
#include "src/base/signals.h"

enum {
    REQ_MAX = 8192,              /* a request's line and headers */
    BODY_MAX = 256 * 1024,       /* the rendered metrics: ~30 families + ~10 per GPU */
    HEAD_MAX = 256,              /* a response's status line and headers */
    MAX_GPUS = 64,               /* GPUs of one node */
    MAX_CLIENTS = 16,            /* connections served at once: scrapers, a person's curl */
    ACCEPTS_PER_TURN = 4,        /* accepted per wake-up, so that connections already
                                  * accepted are read before a flood can push them out */
    REQUEST_DEADLINE_MS = 2000,  /* from accept to the request's last byte */
    RESPONSE_DEADLINE_MS = 10000, /* from then to the response's last byte taken
                                  * (Prometheus's default scrape timeout) */
    ACCEPT_PAUSE_MS = 100,       /* out of descriptors: accept again after this */
    TEXTFILE_PERIOD_MS = 1000    /* the textfile is rewritten at most this often */
};

/* ---- the families ---- */

#define V(field) ((long)offsetof(prom_train, field))
static const prom_family families[] = {
    /* GPU telemetry under the DCGM exporter's names and help texts */
    {"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", 1, -1},
    {"DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", 1, -1},
    {"DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", 1, -1},
    {"DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", 1, -1},
    {"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", 1, -1},
    {"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", 1, -1},
    {"DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", 1, -1},
    {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons.", 1, -1},
    {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "gauge", "Total number of single-bit volatile ECC errors.", 1, -1},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gauge", "Total number of double-bit volatile ECC errors.", 1, -1},
    {"shardlm_gpu_xid_events_total", "counter", "XID error events seen since the run started.", 1, -1},
    /* the training */
    {"shardlm_info", "gauge", "The run: its id and job hash as labels; always 1.", 0, -1},
    {"shardlm_step", "gauge", "Optimizer steps done.", 0, V(step)},
    {"shardlm_steps", "gauge", "Optimizer steps the job runs to (train.steps).", 0, V(steps)},
    {"shardlm_loss", "gauge", "Mean training loss of the latest step (nats/token).", 0, V(loss)},
    {"shardlm_val_loss", "gauge", "Latest validation loss (nats/token).", 0, V(val_loss)},
    {"shardlm_learning_rate", "gauge", "Learning rate of the latest step.", 0, V(lr)},
    {"shardlm_grad_norm", "gauge", "Global gradient L2 norm of the latest step, before clipping.", 0, V(grad_norm)},
    {"shardlm_tokens_per_second", "gauge", "Training tokens per second, whole job.", 0, V(tokens_per_s)},
    {"shardlm_tokens_per_second_per_gpu", "gauge", "Training tokens per second per rank.", 0, V(tokens_per_s_per_gpu)},
    {"shardlm_mfu_ratio", "gauge", "Model FLOPs utilisation against the device's dense peak (0..1).", 0, V(mfu)},
    {"shardlm_step_seconds", "gauge", "Time of the latest step (its slowest rank).", 0, V(step_s)},
    {"shardlm_comm_exposed_seconds", "gauge", "Time the latest step waited on collectives, per group (slowest rank).", 0, -1},
    {"shardlm_memory_peak_bytes", "gauge", "Peak device (or host, on the cpu backend) memory of this rank.", 0, V(mem_peak_bytes)},
    {"shardlm_tokens_seen_total", "counter", "Training tokens consumed, resumed steps included.", 0, V(tokens_seen)},
    {"shardlm_elapsed_seconds", "gauge", "Seconds since this run's first step started.", 0, V(elapsed_s)},
    {"shardlm_eta_seconds", "gauge", "Estimated seconds to the last step.", 0, V(eta_s)},
    {"shardlm_slowest_rank", "gauge", "Rank with the longest latest step (its host as a label).", 0, -1},
    {"shardlm_slowest_step_seconds", "gauge", "Step time of the slowest rank.", 0, V(slowest_step_s)},
    {"shardlm_slowest_comm_exposed_seconds", "gauge", "Exposed comm of the slowest rank.", 0, V(slowest_comm_s)},
    {"shardlm_fastest_rank", "gauge", "Rank with the shortest latest step.", 0, V(fastest_rank)},
    {"shardlm_fastest_step_seconds", "gauge", "Step time of the fastest rank.", 0, V(fastest_step_s)},
    {"shardlm_fastest_comm_exposed_seconds", "gauge", "Exposed comm of the fastest rank.", 0, V(fastest_comm_s)},
    {"shardlm_startup_seconds", "gauge", "Seconds of each start-up phase.", 0, -1},
};
#undef V
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

int prom_family_count(void) { return N_FAMILIES; }
const prom_family *prom_family_at(int i) { return i >= 0 && i < N_FAMILIES ? &families[i] : NULL; }

/* ---- rendering ---- */

typedef struct out_buf {
    char *p;
    size_t cap, len;
    int full;
} out_buf;

static void put(out_buf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_buf *o, const char *fmt, ...) {
    if (o->full) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len) o->full = 1;
    else o->len += (size_t)n;
}

/* A label value with \, " and newlines escaped (the format's rule). */
static void put_label(out_buf *o, const char *name, const char *value, int first) {
    put(o, "%s%s=\"", first ? "" : ",", name);
    for (const char *c = value; *c; c++) {
        if (*c == '\\') put(o, "\\\\");
        else if (*c == '"') put(o, "\\\"");
        else if (*c == '\n') put(o, "\\n");
        else put(o, "%c", *c);
    }
    put(o, "\"");
}

static void put_value(out_buf *o, double v) {
    if (isnan(v)) put(o, " NaN\n");
    else if (isinf(v)) put(o, v > 0 ? " +Inf\n" : " -Inf\n");
    else put(o, " %.17g\n", v);
}

/* One sample: name{[gpu,]host,rank,job[,k1=v1[,k2=v2]]} v (gpu < 0: no gpu label). */
static void put_sample(out_buf *o, const char *name, const prom_labels *l, int gpu, int rank,
                       const char *k1, const char *v1, const char *k2, const char *v2,
                       double v) {
    char num[16];
    put(o, "%s{", name);
    if (gpu >= 0) {
        snprintf(num, sizeof num, "%d", gpu);
        put_label(o, "gpu", num, 1);
    }
    put_label(o, "host", l->host, gpu < 0);
    snprintf(num, sizeof num, "%d", rank);
    put_label(o, "rank", num, 0);
    put_label(o, "job", l->job, 0);
    if (k1) put_label(o, k1, v1, 0);
    if (k2) put_label(o, k2, v2, 0);
    put(o, "}");
    put_value(o, v);
}

/* a training sample of the serving rank, with at most one extra label */
static void put_train(out_buf *o, const prom_labels *l, const char *name, const char *extra_name,
                      const char *extra_value, double v) {
    put_sample(o, name, l, -1, l->rank, extra_name, extra_value, NULL, NULL, v);
}

/* The value of GPU family f for g; NaN when the device does not report it. */
static double gpu_value(int f, const tel_gpu *g) {
    static const int gauge_of[] = {TEL_GPU_UTIL, TEL_MEM_COPY_UTIL, TEL_SM_CLOCK, TEL_POWER,
                                   TEL_TEMP, TEL_MEM_USED};
    if (f < (int)(sizeof gauge_of / sizeof gauge_of[0])) return g->last[gauge_of[f]];
    switch (f) {
    case 6: return (double)g->xid_last;
    case 7: return (double)g->throttle_reasons;
    case 8: return g->ecc_corrected;
    case 9: return g->ecc_uncorrected;
    default: return (double)g->xid_count;
    }
}

size_t prom_render(char *buf, size_t cap, const prom_labels *l, const prom_train *t,
                   const tel_gpu *gpus, int n_gpus) {
    out_buf o = {buf, cap, 0, cap == 0};
    for (int f = 0; f < N_FAMILIES; f++) {
        const prom_family *fam = &families[f];
        if (fam->gpu && n_gpus == 0) continue;
        const char *n = fam->name;
        put(&o, "# HELP %s %s\n# TYPE %s %s\n", n, fam->help, n, fam->type);
        if (fam->gpu) {
            for (int g = 0; g < n_gpus; g++)
                put_sample(&o, n, l, gpus[g].index, gpus[g].rank, NULL, NULL, NULL, NULL,
                           gpu_value(f, &gpus[g]));
            continue;
        }
        if (!strcmp(n, "shardlm_info")) {
            put_sample(&o, n, l, -1, l->rank, "run_id", l->run_id, "job_hash", l->job_hash, 1);
        } else if (!strcmp(n, "shardlm_comm_exposed_seconds")) {
            put_train(&o, l, n, "group", "shard", t->comm_exposed_s[0]);
            put_train(&o, l, n, "group", "replica", t->comm_exposed_s[1]);
        } else if (!strcmp(n, "shardlm_slowest_rank")) {
            if (t->step > 0) put_train(&o, l, n, "slowest_host", t->slowest_host, t->slowest_rank);
        } else if (!strcmp(n, "shardlm_startup_seconds")) {
            for (int p = 0; p < STARTUP_N; p++)
                put_train(&o, l, n, "phase", startup_phase_key((startup_phase)p), t->startup_s[p]);
        } else if (fam->value >= 0) {
            const double v = *(const double *)((const char *)t + fam->value);
            /* before the first step only the start-up and the job's size are known; an
             * unknown value (no validation yet, MFU n/a) is left out, not NaN */
            const int before_first = t->step == 0 && fam->value != (long)offsetof(prom_train, step) &&
                                     fam->value != (long)offsetof(prom_train, steps) &&
                                     fam->value != (long)offsetof(prom_train, tokens_seen);
            const int unknown = isnan(v) && fam->value != (long)offsetof(prom_train, loss) &&
                                fam->value != (long)offsetof(prom_train, grad_norm);
            if (!before_first && !unknown) put_train(&o, l, n, NULL, NULL, v);
        }
    }
    return o.full ? 0 : o.len;
}

/* ---- the server and the textfile ---- */

/* One connection: reading its request, then sending its response. */
typedef struct client {
    int fd;                      /* -1: a free slot */
    int answering;               /* 0: reading the request; 1: sending the response */
    double accepted_ms;          /* CLOCK_MONOTONIC: the oldest is dropped first */
    double deadline_ms;          /* the phase's end: the connection is closed then */
    size_t got;                  /* request bytes read */
    size_t start, len, sent;     /* the response: out[start .. start+len), sent so far */
    char *req;                   /* REQ_MAX */
    char *out;                   /* HEAD_MAX + BODY_MAX: headers end where the body starts */
} client;

struct prom_exporter {
    prom_labels labels;
    telemetry *tel;
    int listen_fd;               /* -1: no server */
    int wake[2];                 /* a byte written here ends the thread's poll */
    char address[300];
    char textfile[SAFE_FILE_PATH_MAX];
    int textfile_failed;
    pthread_t thread;
    int have_thread;
    pthread_mutex_t mu;
    prom_train train;            /* under mu */
    unsigned long version;       /* under mu: published steps */
    int stop;                    /* under mu */
    char *body;                  /* BODY_MAX: the textfile's rendering */
    client clients[MAX_CLIENTS]; /* the exporter thread's own */
    double accept_after_ms;      /* accept() paused until then (descriptors ran out) */
    tel_gpu gpus[MAX_GPUS];
};

/* Binds and listens; returns the socket, or -1 with err. */
static int listen_on(const char *spec, char *address, size_t addrlen, char *err, size_t errlen) {
    char host[256], port[16], why[256];
    if (listen_addr_parse(spec, host, sizeof host, port, sizeof port, why, sizeof why) != 0) {
        snprintf(err, errlen, "log.prometheus = %s: %s", spec, why);
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "log.prometheus = %s: address %s: %s", spec, host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1; /* a previous run's connections in TIME_WAIT must not block the port */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "log.prometheus = %s: cannot listen on %s port %s: %s%s", spec, host,
                 port, strerror(saved),
                 saved == EADDRINUSE ? " (another program or run has it: choose another port)" : "");
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    int bound = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof ip);
            bound = ntohs(s4->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof ip);
            bound = ntohs(s6->sin6_port);
        }
    }
    snprintf(address, addrlen, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, bound);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Renders the current metrics into buf (BODY_MAX); returns the length (0: did not fit). */
static size_t render_now(prom_exporter *p, char *buf) {
    prom_train t;
    pthread_mutex_lock(&p->mu);
    t = p->train;
    pthread_mutex_unlock(&p->mu);
    int n = telemetry_latest(p->tel, p->gpus, MAX_GPUS);
    return prom_render(buf, BODY_MAX, &p->labels, &t, p->gpus, n);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static void drop(client *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Sends what the socket takes now; closes the connection once all is sent or the client
 * is gone. */
static void send_more(client *c) {
    while (c->sent < c->len) {
        ssize_t k = send(c->fd, c->out + c->start + c->sent, c->len - c->sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return; /* poll says when */
        if (k <= 0) break; /* the client left: nothing to do */
        c->sent += (size_t)k;
    }
    drop(c);
}

/* Puts the response in c->out (the body already at out + HEAD_MAX unless msg is given)
 * and starts sending it; metrics: the exposition format's content type, else plain text. */
static void respond(client *c, const char *status, const char *extra, int metrics,
                    const char *msg, size_t len) {
    if (msg) memcpy(c->out + HEAD_MAX, msg, len);
    char head[HEAD_MAX];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                     "Connection: close\r\n\r\n", status,
                     metrics ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain", len, extra);
    c->start = HEAD_MAX - (size_t)n;
    memcpy(c->out + c->start, head, (size_t)n);
    c->len = (size_t)n + len;
    c->sent = 0;
    c->answering = 1;
    c->deadline_ms = now_ms() + RESPONSE_DEADLINE_MS;
    send_more(c);
}
#define RESPOND_TEXT(c, status, extra, msg) respond(c, status, extra, 0, msg, sizeof msg - 1)

/* The request is whole (or REQ_MAX long): answers it. */
static void answer(prom_exporter *p, client *c) {
    char method[16] = "", target[256] = "";
    if (sscanf(c->req, "%15s %255s HTTP/", method, target) != 2 ||
        (!strstr(c->req, "\r\n\r\n") && !strstr(c->req, "\n\n"))) {
        RESPOND_TEXT(c, "400 Bad Request", "", "bad request\n");
        return;
    }
    if (strcmp(method, "GET") != 0) {
        RESPOND_TEXT(c, "405 Method Not Allowed", "Allow: GET\r\n", "only GET /metrics\n");
        return;
    }
    size_t plen = strcspn(target, "?");
    if (plen != 8 || strncmp(target, "/metrics", 8) != 0) {
        RESPOND_TEXT(c, "404 Not Found", "", "not found: this server has /metrics only\n");
        return;
    }
    size_t len = render_now(p, c->out + HEAD_MAX);
    if (len == 0) {
        RESPOND_TEXT(c, "500 Internal Server Error", "", "metrics larger than the buffer\n");
        return;
    }
    respond(c, "200 OK", "", 1, NULL, len);
}

/* Reads what has arrived of c's request; answers it once whole. */
static void read_more(prom_exporter *p, client *c) {
    while (c->got < REQ_MAX - 1) {
        ssize_t k = recv(c->fd, c->req + c->got, REQ_MAX - 1 - c->got, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) { /* closed or reset before the request was whole */
            drop(c);
            return;
        }
        const size_t from = c->got > 3 ? c->got - 3 : 0; /* an end split across reads */
        c->got += (size_t)k;
        c->req[c->got] = 0;
        if (strstr(c->req + from, "\r\n\r\n") || strstr(c->req + from, "\n\n")) break;
    }
    answer(p, c);
}

/* Accepts what is waiting, a few at a time; past MAX_CLIENTS a new connection takes the
 * slot of the oldest one still sending its request (else of the oldest of all). */
static void accept_some(prom_exporter *p, double now) {
    for (int n = 0; n < ACCEPTS_PER_TURN; n++) {
        int fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                p->accept_after_ms = now + ACCEPT_PAUSE_MS; /* a queued client waits */
            return;
        }
        client *slot = NULL, *oldest_reading = NULL, *oldest = NULL;
        for (int i = 0; i < MAX_CLIENTS && !slot; i++) {
            client *c = &p->clients[i];
            if (c->fd < 0) slot = c;
            else if (!oldest || c->accepted_ms < oldest->accepted_ms) oldest = c;
            if (c->fd >= 0 && !c->answering &&
                (!oldest_reading || c->accepted_ms < oldest_reading->accepted_ms))
                oldest_reading = c;
        }
        if (!slot) {
            slot = oldest_reading ? oldest_reading : oldest;
            drop(slot);
        }
        slot->fd = fd;
        slot->answering = 0;
        slot->accepted_ms = now;
        slot->deadline_ms = now + REQUEST_DEADLINE_MS;
        slot->got = 0;
        slot->req[0] = 0;
    }
}

/* Writes the textfile (atomically: safe_file's temporary name, then rename). */
static int write_textfile(prom_exporter *p, char *err, size_t errlen) {
    size_t len = render_now(p, p->body);
    if (len == 0) {
        snprintf(err, errlen, "%s: metrics larger than the exporter's buffer", p->textfile);
        return -1;
    }
    return safe_file_write_all(p->textfile, p->body, len, err, errlen);
}

/* The poll timeout: until the nearest deadline of a connection, the textfile's next
 * look or the end of an accept pause; -1: none. */
static int next_timeout_ms(const prom_exporter *p, double now, double textfile_due) {
    double due = p->textfile[0] && !p->textfile_failed ? textfile_due : INFINITY;
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (p->clients[i].fd >= 0 && p->clients[i].deadline_ms < due)
            due = p->clients[i].deadline_ms;
    if (p->accept_after_ms > now && p->accept_after_ms < due) due = p->accept_after_ms;
    if (isinf(due)) return -1;
    return due <= now ? 0 : (int)(due - now) + 1;
}

static void *exporter_thread(void *arg) {
    prom_exporter *p = arg;
    unsigned long written = 0;
    double last_write = now_ms();
    for (;;) {
        /* fds: the wake pipe, the listening socket (unless paused), then the clients */
        struct pollfd fds[2 + MAX_CLIENTS];
        client *of[2 + MAX_CLIENTS];
        nfds_t n = 0;
        double now = now_ms();
        fds[n++] = (struct pollfd){p->wake[0], POLLIN, 0};
        int listening = p->listen_fd >= 0 && now >= p->accept_after_ms;
        if (listening) fds[n++] = (struct pollfd){p->listen_fd, POLLIN, 0};
        const nfds_t first_client = n;
        for (int i = 0; i < MAX_CLIENTS; i++) {
            client *c = &p->clients[i];
            if (c->fd < 0) continue;
            of[n] = c;
            fds[n++] = (struct pollfd){c->fd, c->answering ? POLLOUT : POLLIN, 0};
        }
        int rc = poll(fds, n, next_timeout_ms(p, now, last_write + TEXTFILE_PERIOD_MS));
        if (rc < 0 && errno != EINTR) break;
        if (rc > 0 && (fds[0].revents & POLLIN)) {
            char drain[64];
            while (read(p->wake[0], drain, sizeof drain) > 0) {}
        }
        pthread_mutex_lock(&p->mu);
        int stop = p->stop;
        unsigned long version = p->version;
        pthread_mutex_unlock(&p->mu);
        if (stop) break;
        /* connections already accepted first, then new ones */
        for (nfds_t k = first_client; rc > 0 && k < n; k++) {
            if (!fds[k].revents) continue;
            if (of[k]->answering) send_more(of[k]);
            else read_more(p, of[k]);
        }
        now = now_ms();
        for (int i = 0; i < MAX_CLIENTS; i++)
            if (p->clients[i].fd >= 0 && now >= p->clients[i].deadline_ms) drop(&p->clients[i]);
        if (listening && rc > 0 && (fds[1].revents & POLLIN)) accept_some(p, now);
        if (p->textfile[0] && !p->textfile_failed && version != written &&
            now_ms() - last_write >= TEXTFILE_PERIOD_MS) {
            char err[1400];
            if (write_textfile(p, err, sizeof err) != 0) {
                fprintf(stderr, "shardlm: warning: log.prometheus_textfile: %s; the textfile is "
                        "no longer updated\n", err);
                p->textfile_failed = 1;
            }
            written = version;
            last_write = now_ms();
        }
    }
    for (int i = 0; i < MAX_CLIENTS; i++) drop(&p->clients[i]); /* mid-request or not */
    return NULL;
}

/* "name" with characters other than [A-Za-z0-9_.-] made '_' (for a file name). */
static void file_safe(const char *in, char *out, size_t outlen) {
    size_t n = 0;
    for (; in[n] && n + 1 < outlen; n++) {
        char c = in[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-';
        out[n] = ok ? c : '_';
    }
    out[n] = 0;
}

prom_exporter *prom_start(const char *listen, const char *textfile_dir, const prom_labels *labels,
                          telemetry *tel, char *err, size_t errlen) {
    prom_exporter *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->labels = *labels;
    p->tel = tel;
    p->listen_fd = -1;
    p->wake[0] = p->wake[1] = -1;
    p->body = malloc(BODY_MAX);
    int ok = p->body != NULL;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        client *c = &p->clients[i];
        c->fd = -1;
        if (listen[0]) { /* touched as used: a response's pages, not BODY_MAX, become memory */
            c->req = malloc(REQ_MAX);
            c->out = malloc(HEAD_MAX + BODY_MAX);
            ok = ok && c->req && c->out;
        }
    }
    for (int k = 0; k < STARTUP_N; k++) p->train.startup_s[k] = NAN;
    p->train.loss = p->train.val_loss = p->train.grad_norm = p->train.mfu = NAN;
    pthread_mutex_init(&p->mu, NULL);
    if (!ok) snprintf(err, errlen, "out of memory");
    if (ok && pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        snprintf(err, errlen, "log.prometheus: pipe: %s", strerror(errno));
        ok = 0;
    }
    if (ok && listen[0])
        ok = (p->listen_fd = listen_on(listen, p->address, sizeof p->address, err, errlen)) >= 0;
    if (ok && textfile_dir[0]) {
        char why[1200], job[128], host[64], run_id[40];
        file_safe(labels->job, job, sizeof job);
        file_safe(labels->host, host, sizeof host);
        file_safe(labels->run_id, run_id, sizeof run_id);
        /* the run id keeps two runs of one job on one host (or sharing DIR) apart: unique to
         * the run on every host, unlike a pid, and the run_id label and metrics.jsonl's */
        int n = snprintf(p->textfile, sizeof p->textfile, "%s/shardlm_%s_%s_%s.prom",
                         textfile_dir, job, host, run_id);
        if (n < 0 || (size_t)n >= sizeof p->textfile) {
            snprintf(err, errlen, "log.prometheus_textfile = %.200s: path too long", textfile_dir);
            ok = 0;
        } else if (safe_file_probe_dir(textfile_dir, why, sizeof why) != 0) {
            snprintf(err, errlen, "log.prometheus_textfile = %s: %s", textfile_dir, why);
            ok = 0;
        } else if (write_textfile(p, why, sizeof why) != 0) {
            snprintf(err, errlen, "log.prometheus_textfile = %s: %s", textfile_dir, why);
            ok = 0;
        }
        if (!ok) p->textfile[0] = 0;
    }
    if (ok && shlm_thread_create_unsignalled(&p->thread, exporter_thread, p) != 0) {
        snprintf(err, errlen, "log.prometheus: cannot start the exporter thread");
        ok = 0;
    }
    p->have_thread = ok;
    if (!ok) {
        prom_stop(p);
        return NULL;
    }
    return p;
}

const char *prom_address(const prom_exporter *p) { return p ? p->address : ""; }
const char *prom_textfile(const prom_exporter *p) { return p ? p->textfile : ""; }

void prom_publish(prom_exporter *p, const prom_train *t) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->train = *t;
    p->version++;
    pthread_mutex_unlock(&p->mu);
}

void prom_stop(prom_exporter *p) {
    if (!p) return;
    if (p->have_thread) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_mutex_unlock(&p->mu);
        /* the thread sees stop at this wake-up (it never blocks on a client: its sockets are
         * non-blocking), closes its connections mid-request or not, and returns; the
         * descriptors it polls are closed after the join, never under its poll */
        if (write(p->wake[1], "x", 1) < 0) {}
        pthread_join(p->thread, NULL);
    }
    if (p->listen_fd >= 0) close(p->listen_fd);
    if (p->wake[0] >= 0) close(p->wake[0]);
    if (p->wake[1] >= 0) close(p->wake[1]);
    /* a finished run's gauges are not current; only the regular file it wrote is removed */
    if (p->textfile[0]) safe_file_remove(p->textfile);
    pthread_mutex_destroy(&p->mu);
    free(p->body);
    for (int i = 0; i < MAX_CLIENTS; i++) {
        free(p->clients[i].req);
        free(p->clients[i].out);
    }
    free(p);
}
