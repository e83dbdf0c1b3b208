/* Collective deadlines and the roll call that names the ranks that did not arrive (see
 * comm_watchdog.h). Point-to-point messages on a private duplicate of the world, never
 * blocking: an alarm to every rank, answers to the ranks that raised one. */
#include "kernels/comm/comm_watchdog.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { TAG_ALARM = 1, TAG_ANSWER = 2, N_ANSWER_SLOTS = 16, LINE = 1400 };

/* What a rank is doing, as it tells the others ("waiting in all_gather #17 on shard
 * group (ranks 0-3)"): the same text for the same point of the program on every rank. */
typedef struct roll_msg {
    char status[224];
} roll_msg;

static struct {
    int ready;                 /* shlm_watchdog_init done */
    MPI_Comm comm;             /* the roll call's duplicate of the world */
    int rank, size;
    uint64_t issued;           /* collectives issued so far on this rank */
    const char *last_op, *last_where;
    const shlm_watch *waiting; /* the collective shlm_watch_wait is in, or NULL */
    int alarm_from;            /* lowest rank whose alarm reached us, -1: none */
    double next_poll_s;
    /* answers in flight: a send buffer may not change until its send completes */
    roll_msg answer_buf[N_ANSWER_SLOTS];
    MPI_Request answer_req[N_ANSWER_SLOTS];
    /* held by whoever sends or receives on comm or changes the fields above: the main
     * thread in its timed waits and polls, a guard's thread (below) in a guarded region */
    pthread_mutex_t mu;
} wd = {.alarm_from = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

/* A guarded region (shlm_guard_begin .. shlm_guard_end); its fields under wd.mu. */
static struct {
    int depth;            /* nested begins */
    int stop;             /* shlm_guard_end asks the thread to finish */
    int roll_calls;       /* MPI_THREAD_MULTIPLE and a roll-call communicator */
    pthread_t owner;      /* the thread that began the region (its collectives wait under
                           * the region's rules; another thread's under their own) */
    pthread_t thread;
    pthread_cond_t wake;
    char what[160];       /* "checkpoint save of step 3" */
    const char *phase;    /* "writing the metadata" (static storage) */
    const char *limit_note;
    double begin_s, phase_s, limit_s;
} guard = {.wake = PTHREAD_COND_INITIALIZER};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* runtime.comm_timeout_s, set by shlm_watchdog_init; the key's default until then */
static double g_timeout_s = 600;

double shlm_comm_timeout_s(void) { return g_timeout_s; }

/* How long the roll call listens: a quarter of the timeout, within [0.5, 5] s. Alive
 * ranks answer within milliseconds; the margin covers an op between two polls. */
static double grace_s(void) {
    double g = shlm_comm_timeout_s() / 4;
    return g < 0.5 ? 0.5 : g > 5 ? 5 : g;
}

int shlm_watchdog_init(MPI_Comm world, double timeout_s, char *err, size_t errlen) {
    if (!(timeout_s > 0) || !isfinite(timeout_s)) {
        snprintf(err, errlen, "the comm timeout must be a positive number of seconds, not %g",
                 timeout_s);
        return -1;
    }
    g_timeout_s = timeout_s;
    if (wd.ready) return 0;
    if (MPI_Comm_dup(world, &wd.comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "the comm watchdog cannot duplicate the world communicator");
        return -1;
    }
    MPI_Comm_set_errhandler(wd.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(wd.comm, &wd.rank);
    MPI_Comm_size(wd.comm, &wd.size);
    for (int i = 0; i < N_ANSWER_SLOTS; i++) wd.answer_req[i] = MPI_REQUEST_NULL;
    wd.ready = 1;
    return 0;
}

/* ---- text ---- */

typedef struct text {
    char *p;
    size_t len, used;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...) {
    if (t->used + 1 >= t->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p + t->used, t->len - t->used, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    t->used += (size_t)n < t->len - t->used ? (size_t)n : t->len - t->used - 1;
    if (t->used + 1 >= t->len && t->len > 4) strcpy(t->p + t->len - 4, "...");
}

/* "0-3,6": the n ascending ranks in r as ranges */
static void add_ranks(text *t, const int *r, int n) {
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
        add(t, "%s%d", i ? "," : "", r[i]);
        if (j > i) add(t, "%s%d", j == i + 1 ? "," : "-", r[j]);
        i = j + 1;
    }
}

void shlm_comm_describe(MPI_Comm comm, char *buf, size_t len) {
    text t = {buf, len, 0};
    buf[0] = '\0';
    char name[MPI_MAX_OBJECT_NAME] = "";
    int name_len = 0, size = 0;
    MPI_Comm_get_name(comm, name, &name_len);
    MPI_Comm_size(comm, &size);
    int *in = malloc((size_t)size * sizeof *in), *out = malloc((size_t)size * sizeof *out);
    MPI_Group g, world;
    if (!in || !out || MPI_Comm_group(comm, &g) != MPI_SUCCESS) {
        add(&t, "%s (%d ranks)", name_len ? name : "a group", size);
    } else {
        MPI_Comm_group(MPI_COMM_WORLD, &world);
        for (int i = 0; i < size; i++) in[i] = i;
        MPI_Group_translate_ranks(g, size, in, world, out);
        /* members in world order; a rank outside the world (spawned) stays as it is */
        for (int i = 1; i < size; i++)
            for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
                int x = out[j];
                out[j] = out[j - 1];
                out[j - 1] = x;
            }
        add(&t, "%s (rank%s ", name_len ? name : "a group", size == 1 ? "" : "s");
        add_ranks(&t, out, size);
        add(&t, ")");
        MPI_Group_free(&g);
        MPI_Group_free(&world);
    }
    free(in);
    free(out);
}

static void add_op(text *t, const shlm_watch *w) {
    add(t, "%s", w->op);
    if (w->where) add(t, " (%s)", w->where);
    add(t, " #%llu on ", (unsigned long long)w->seq);
    if (w->group) {
        add(t, "%s", w->group);
    } else {
        char g[160];
        shlm_comm_describe(w->comm, g, sizeof g);
        add(t, "%s", g);
    }
}

static void my_status(roll_msg *m) {
    text t = {m->status, sizeof m->status, 0};
    m->status[0] = '\0';
    if (guard.depth > 0) {
        add(&t, "in %s", guard.what);
        if (guard.phase) add(&t, ": %s", guard.phase);
    } else if (wd.waiting) {
        add(&t, "waiting in ");
        add_op(&t, wd.waiting);
    } else if (wd.issued > 0) {
        add(&t, "running between collectives (last issued: %s", wd.last_op);
        if (wd.last_where) add(&t, " (%s)", wd.last_where);
        add(&t, " #%llu)", (unsigned long long)wd.issued);
    } else {
        add(&t, "running, no collective issued yet");
    }
}

/* ---- messages ---- */

static void send_answer(int to) {
    int slot = -1;
    for (int i = 0; i < N_ANSWER_SLOTS && slot < 0; i++) {
        int done = 1;
        if (wd.answer_req[i] != MPI_REQUEST_NULL)
            MPI_Test(&wd.answer_req[i], &done, MPI_STATUS_IGNORE);
        if (done) slot = i;
    }
    if (slot < 0) return; /* every slot still in flight: this roll call has its answer */
    my_status(&wd.answer_buf[slot]);
    MPI_Isend(&wd.answer_buf[slot], (int)sizeof(roll_msg), MPI_BYTE, to, TAG_ANSWER, wd.comm,
              &wd.answer_req[slot]);
}

/* Receives one message of `tag` if one is there: its sender, or -1. */
static int receive(int tag, roll_msg *m) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, wd.comm, &flag, &st) != MPI_SUCCESS || !flag) return -1;
    MPI_Recv(m, (int)sizeof *m, MPI_BYTE, st.MPI_SOURCE, tag, wd.comm, MPI_STATUS_IGNORE);
    m->status[sizeof m->status - 1] = '\0';
    return st.MPI_SOURCE;
}

/* Receives and answers one alarm if one is there: its sender (its status in *m), or -1. */
static int answer_alarm(roll_msg *m) {
    int from = receive(TAG_ALARM, m);
    if (from < 0) return -1;
    if (wd.alarm_from < 0 || from < wd.alarm_from) wd.alarm_from = from;
    send_answer(from);
    return from;
}

static void answer_alarms(void) {
    roll_msg m;
    while (answer_alarm(&m) >= 0) {
    }
}

void shlm_watchdog_poll(void) {
    if (!wd.ready) return;
    double t = now_s();
    if (t < wd.next_poll_s) return; /* next_poll_s: the main thread's alone */
    wd.next_poll_s = t + 1e-3;
    pthread_mutex_lock(&wd.mu);
    answer_alarms();
    pthread_mutex_unlock(&wd.mu);
}

/* ---- watching ---- */

shlm_watch shlm_watch_issue(const char *op, const char *where, const char *group, MPI_Comm comm) {
    pthread_mutex_lock(&wd.mu);
    const uint64_t seq = ++wd.issued;
    wd.last_op = op;
    wd.last_where = where;
    pthread_mutex_unlock(&wd.mu);
    return (shlm_watch){.seq = seq, .issued_s = now_s(), .op = op, .where = where,
                        .group = group, .comm = comm};
}

int shlm_watch_expired(const shlm_watch *w) {
    return now_s() - w->issued_s > shlm_comm_timeout_s();
}

int shlm_watch_wait(MPI_Request *req, const shlm_watch *w) {
    pthread_mutex_lock(&wd.mu);
    /* in a guarded region the region's deadline applies to the region's own thread
     * (comm_watchdog.h); the roll call's status then names the region, so only a thread
     * outside it records the collective it waits in */
    const int guarded = guard.depth > 0 && pthread_equal(guard.owner, pthread_self());
    const shlm_watch *outer = wd.waiting;
    if (!guarded) wd.waiting = w;
    pthread_mutex_unlock(&wd.mu);
    int rc, flag = 0;
    for (;;) {
        rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || flag) break;
        shlm_watchdog_poll();
        if (!guarded && shlm_watch_expired(w)) shlm_watch_fail(w, NULL, NULL);
    }
    pthread_mutex_lock(&wd.mu);
    if (!guarded) wd.waiting = outer;
    pthread_mutex_unlock(&wd.mu);
    return rc;
}

int shlm_timed_allreduce_at(const char *where, const void *send, void *recv, int count,
                            MPI_Datatype dt, MPI_Op op, MPI_Comm comm) {
    MPI_Request req;
    int rc = MPI_Iallreduce(send, recv, count, dt, op, comm, &req);
    if (rc != MPI_SUCCESS) return rc;
    shlm_watch w = shlm_watch_issue("MPI_Allreduce", where, NULL, comm);
    return shlm_watch_wait(&req, &w);
}

/* ---- the roll call ---- */

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Keeps answering for `s` seconds: another rank is reporting and will end the job. */
static void answer_for(double s) {
    for (double end = now_s() + s; now_s() < end; sleep_s(2e-4)) answer_alarms();
}

static void print_and_abort(const char *line, void (*before_abort)(void *), void *ctx)
    __attribute__((noreturn));
static void print_and_abort(const char *line, void (*before_abort)(void *), void *ctx) {
    fprintf(stderr, "shardlm: error: %s\n", line);
    fflush(stderr);
    if (before_abort) {
        alarm(10); /* should the clean-up itself hang, SIGALRM ends the process */
        before_abort(ctx);
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* What a roll call found. */
typedef struct roll {
    roll_msg *status;    /* each rank's answer (its alarm, for a rank raising one) */
    char *answered;
    int *list;           /* room for every rank, for add_roll */
    MPI_Request *alarm_req; /* the alarms' sends */
    int missing;         /* ranks that did not answer */
    int lowest_reporter; /* the lowest rank that raised an alarm during it, this one included */
    double took_s;
} roll;

/* After a roll call every rank answered: each has received its alarm, so the sends end. */
static void roll_free(roll *rc) {
    MPI_Waitall(wd.size, rc->alarm_req, MPI_STATUSES_IGNORE);
    free(rc->alarm_req);
    free(rc->status);
    free(rc->answered);
    free(rc->list);
}

/* Sends this rank's status as an alarm to every rank and collects answers for the grace
 * period, or until every rank has answered unless `full`; an alarm another rank raised
 * meanwhile counts as its answer. full: the job ends whatever the answers, and the whole
 * grace lets a lower rank raising the same alarm be the one that prints. 0, or -1 when
 * memory runs out. Under wd.mu. */
static int roll_call(roll *rc, int full) {
    const double grace = grace_s();
    rc->status = calloc((size_t)wd.size, sizeof *rc->status);
    rc->answered = calloc((size_t)wd.size, 1);
    rc->list = malloc((size_t)wd.size * sizeof *rc->list);
    rc->alarm_req = malloc((size_t)wd.size * sizeof *rc->alarm_req);
    static roll_msg alarm; /* the send buffer outlives this function's sends */
    if (!rc->status || !rc->answered || !rc->list || !rc->alarm_req) return -1;
    my_status(&alarm);
    for (int r = 0; r < wd.size; r++) {
        rc->alarm_req[r] = MPI_REQUEST_NULL;
        if (r != wd.rank)
            MPI_Isend(&alarm, (int)sizeof alarm, MPI_BYTE, r, TAG_ALARM, wd.comm,
                      &rc->alarm_req[r]);
    }
    rc->status[wd.rank] = alarm;
    rc->answered[wd.rank] = 1;
    rc->lowest_reporter = wd.rank;
    int n_answered = 1, from_alarm;
    const double t0 = now_s();
    while ((full || n_answered < wd.size) && now_s() - t0 < grace) {
        roll_msg m;
        int from = receive(TAG_ANSWER, &m);
        if (from < 0) { /* another rank's alarm is its answer too */
            from = answer_alarm(&m);
            if (from >= 0 && from < rc->lowest_reporter) rc->lowest_reporter = from;
        }
        if (from < 0) {
            sleep_s(2e-4);
            continue;
        }
        if (!rc->answered[from]) n_answered++;
        rc->answered[from] = 1;
        rc->status[from] = m;
    }
    /* a rank that raised its alarm at the same time as we did: its alarm was sent before
     * its answer, and MPI delivers a pair's messages in order, so it is here by now */
    for (roll_msg m; (from_alarm = answer_alarm(&m)) >= 0;) {
        if (!rc->answered[from_alarm]) n_answered++;
        rc->answered[from_alarm] = 1;
        rc->status[from_alarm] = m;
        if (from_alarm < rc->lowest_reporter) rc->lowest_reporter = from_alarm;
    }
    rc->missing = wd.size - n_answered;
    rc->took_s = now_s() - t0;
    return 0;
}

/* Appends what the roll call found: the ranks that did not answer, or (all_alive: why
 * every rank answering can still wait) that every rank answers; then the answering
 * ranks grouped by what they do, in rank order of each group's first. */
static void add_roll(text *t, const roll *rc, const char *all_alive) {
    int n = 0;
    for (int r = 0; r < wd.size; r++)
        if (!rc->answered[r]) rc->list[n++] = r;
    if (n > 0) {
        add(t, ": rank%s ", n > 1 ? "s" : "");
        add_ranks(t, rc->list, n);
        add(t, " did not arrive (no answer in %.1f s: stopped, hung or dead)", rc->took_s);
    } else {
        add(t, ", yet every rank answers (%s)", all_alive);
    }
    char *done = calloc((size_t)wd.size, 1);
    for (int r = 0; done && r < wd.size; r++) {
        if (!rc->answered[r] || done[r]) continue;
        n = 0;
        for (int q = r; q < wd.size; q++)
            if (rc->answered[q] && !done[q] &&
                strcmp(rc->status[q].status, rc->status[r].status) == 0)
                rc->list[n++] = q, done[q] = 1;
        if (strcmp(rc->status[r].status, rc->status[wd.rank].status) == 0) { /* where we are */
            add(t, "; waiting in it: rank%s ", n > 1 ? "s" : "");
            add_ranks(t, rc->list, n);
        } else {
            add(t, "; rank%s ", n > 1 ? "s" : "");
            add_ranks(t, rc->list, n);
            add(t, ": %s", rc->status[r].status);
        }
    }
    free(done);
}

void shlm_watch_fail(const shlm_watch *w, void (*before_abort)(void *), void *ctx) {
    pthread_mutex_lock(&wd.mu); /* held to the end: the job ends here */
    const double T = shlm_comm_timeout_s(), grace = grace_s();
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    char line[LINE];
    text t = {line, sizeof line, 0};
    add_op(&t, w);
    add(&t, " did not complete within %g s (rank %d)", T, me);
    if (!wd.ready) {
        add(&t, ": a rank died or hangs; runtime.comm_timeout_s sets the limit");
        print_and_abort(line, before_abort, ctx);
    }
    wd.waiting = w;
    /* another rank's roll call is under way: it will end the job; report ourselves only
     * if it does not */
    answer_alarms();
    if (wd.alarm_from >= 0) answer_for(2 * grace + 2);
    roll rc;
    if (roll_call(&rc, 0) != 0) print_and_abort(line, before_abort, ctx);
    if (rc.lowest_reporter < wd.rank) answer_for(grace + 2); /* it prints; we print if not */
    add_roll(&t, &rc, "collectives issued in different orders, or a rank looping outside them");
    add(&t, "; runtime.comm_timeout_s sets the limit");
    print_and_abort(line, before_abort, ctx);
}

/* ---- guarded regions ---- */

/* The guard's end of the job: what its region did not finish, the roll call's findings
 * (rc; NULL: none could be made), then the process ends. Under wd.mu. */
static void guard_fail(roll *rc, int past_limit) __attribute__((noreturn));
static void guard_fail(roll *rc, int past_limit) {
    char line[LINE];
    text t = {line, sizeof line, 0};
    add(&t, "%s", guard.what);
    if (guard.phase) add(&t, " (%s)", guard.phase);
    add(&t, " did not complete within %.0f s (rank %d)",
        past_limit ? guard.limit_s : shlm_comm_timeout_s(), wd.rank);
    if (!rc) {
        add(&t, ": the ranks that stopped cannot be named (%s); %s",
            guard.roll_calls ? "no memory for the roll call"
            : wd.ready       ? "the MPI library gives no MPI_THREAD_MULTIPLE"
                             : "no roll call was set up",
            past_limit ? guard.limit_note : "runtime.comm_timeout_s sets the limit");
        if (guard.roll_calls) print_and_abort(line, NULL, NULL);
        /* MPI may not be called from this thread: the rank exits, which ends the job
         * under mpirun and srun */
        fprintf(stderr, "shardlm: error: %s\n", line);
        fflush(stderr);
        _exit(1);
    }
    if (rc->lowest_reporter < wd.rank) answer_for(grace_s() + 2); /* it prints; we if not */
    add_roll(&t, rc, "a file system that stopped answering, or a save or load slower than "
                     "its limit");
    if (past_limit) add(&t, "; %s", guard.limit_note);
    else add(&t, "; runtime.comm_timeout_s sets the limit");
    print_and_abort(line, NULL, NULL);
}

/* The guard's thread: answers roll calls for this rank, runs one when this rank has been
 * in one phase for the timeout (and again each timeout while every rank answers), and
 * ends the job when a rank does not answer or the region passes its limit. */
static void *guard_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&wd.mu);
    double next_roll_s = 0;
    while (!guard.stop) {
        if (guard.roll_calls) answer_alarms();
        const double t = now_s(), T = shlm_comm_timeout_s();
        const int past_limit = t - guard.begin_s > guard.limit_s;
        double due = guard.phase_s + T;
        if (due < next_roll_s) due = next_roll_s;
        if (past_limit || t >= due) {
            roll rc;
            if (!guard.roll_calls) {
                if (past_limit) guard_fail(NULL, 1);
            } else if (roll_call(&rc, past_limit) != 0) {
                guard_fail(NULL, past_limit);
            } else if (rc.missing > 0 || past_limit) {
                guard_fail(&rc, past_limit && rc.missing == 0);
            } else {
                roll_free(&rc);
                wd.alarm_from = -1; /* that round ended: every rank answered */
            }
            next_roll_s = now_s() + T;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 5000000; /* alive ranks answer within the grace's first milliseconds */
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&guard.wake, &wd.mu, &ts);
    }
    pthread_mutex_unlock(&wd.mu);
    return NULL;
}

void shlm_guard_begin(const char *what, double limit_s, const char *limit_note) {
    pthread_mutex_lock(&wd.mu);
    if (guard.depth++ > 0) {
        pthread_mutex_unlock(&wd.mu);
        return;
    }
    snprintf(guard.what, sizeof guard.what, "%s", what);
    guard.phase = NULL;
    guard.limit_note = limit_note;
    guard.begin_s = guard.phase_s = now_s();
    guard.limit_s = limit_s;
    guard.stop = 0;
    guard.owner = pthread_self();
    int init = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    if (init) MPI_Query_thread(&level);
    guard.roll_calls = wd.ready && level == MPI_THREAD_MULTIPLE;
    /* signals stay the main thread's (stop requests, SIGPIPE): the thread blocks them */
    sigset_t block, old;
    sigemptyset(&block);
    const int async[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP, SIGPIPE, SIGALRM, SIGCHLD};
    for (size_t i = 0; i < sizeof async / sizeof async[0]; i++) sigaddset(&block, async[i]);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    if (pthread_create(&guard.thread, NULL, guard_main, NULL) != 0) {
        fprintf(stderr, "shardlm: warning: no thread for the deadline of %s: it runs "
                "unguarded\n", what);
        guard.depth = 0;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_mutex_unlock(&wd.mu);
}

void shlm_guard_phase(const char *phase) {
    pthread_mutex_lock(&wd.mu);
    if (guard.depth > 0) {
        guard.phase = phase;
        guard.phase_s = now_s();
    }
    pthread_mutex_unlock(&wd.mu);
}

void shlm_guard_end(void) {
    pthread_mutex_lock(&wd.mu);
    if (guard.depth == 0 || --guard.depth > 0) {
        pthread_mutex_unlock(&wd.mu);
        return;
    }
    guard.depth = 1; /* the thread still answers as in the region until it has finished */
    guard.stop = 1;
    pthread_cond_signal(&guard.wake);
    pthread_mutex_unlock(&wd.mu);
    pthread_join(guard.thread, NULL);
    pthread_mutex_lock(&wd.mu);
    guard.depth = 0;
    guard.phase = NULL;
    wd.alarm_from = -1; /* an alarm heard in the region came from a round that ended */
    pthread_mutex_unlock(&wd.mu);
}

void shlm_watchdog_test_stop(int world_rank, long step) {
    const char *v = getenv("SHLM_TEST_STOP_AT");
    long r = -1, s = -1;
    if (!v || sscanf(v, "%ld:%ld", &r, &s) != 2 || r != world_rank || s != step) return;
    fprintf(stderr, "shardlm: SHLM_TEST_STOP_AT: rank %d stops itself (SIGSTOP) at step %ld\n",
            world_rank, step);
    fflush(stderr);
    raise(SIGSTOP);
}
