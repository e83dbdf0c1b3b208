/* Checks FSDP schedule traces (fsdp_trace_write, one file per rank) against the rules
 * of DESIGN.md "Strategies" and "Prefetch"; run by tests/fsdp_trace.sh.
 *
 *   check_trace [--strategy FULL_SHARD|HYBRID_SHARD|SHARD_GRAD_OP] [--no-prefetch]
 *               [--micro-per-step N] [--tied] TRACE.jsonl...
 *
 * A pass is the run of compute events that starts at unit 0: units 0, 1, ..., L (the
 * embedding and the blocks) in forward, then the head (unit L+1; with --tied, tied
 * embeddings, unit 0 again), which also runs its own backward there, then L, ..., 1 in
 * backward (the embedding's backward needs no parameters). The "serving issue" of a
 * compute is the last gather_issue of its unit before it. Rules, each counted and
 * reported:
 *   structure  every pass computes 0..L, the head, then L..1 (or stops at the head:
 *              forward only)
 *   prefetch   the next compute's serving issue comes before this compute (forward:
 *              i+1 before i computes, backward: i-1 before i computes); with
 *              --no-prefetch the opposite must hold (issue after the compute)
 *   served     between a compute's serving issue and it: a gather_wait, no free
 *   waited     every gather_issue is waited on before its unit is issued again,
 *              freed, or the trace ends; no wait without an issue
 *   in_flight  (FULL_SHARD, HYBRID_SHARD) at no event are more than two units
 *              gathered (issued and not yet freed)
 *   reshard    (FULL_SHARD, HYBRID_SHARD) each block is freed and gathered again
 *              between its forward and its backward compute
 *   keep       (SHARD_GRAD_OP) each block is neither freed nor gathered again
 *              between its forward and its backward compute
 *   reduced    every reduce_issue has a reduce_done before the unit's next
 *              reduce_issue and before the first compute of the next step (with
 *              --micro-per-step N: N passes a step); each backward pass reduces
 *              every unit once, a tied embedding twice (the head's part, the lookup's)
 * Exit status: 0 every rule holds in every file, 1 a rule is broken, 2 bad usage or
 * an unreadable trace. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the events of fsdp_trace_write, in the order of fsdp.c's trace_names */
enum { EV_GATHER_ISSUE, EV_GATHER_WAIT, EV_COMPUTE, EV_RELEASE, EV_FREE, EV_REDUCE_ISSUE,
       EV_REDUCE_DONE, EV_N };
static const char *const ev_names[EV_N] = {"gather_issue", "gather_wait", "compute", "release",
                                           "free", "reduce_issue", "reduce_done"};

enum { MAX_UNITS = 4096, MAX_REPORTS = 8 };

typedef enum strategy { ST_FULL_SHARD, ST_HYBRID_SHARD, ST_SHARD_GRAD_OP } strategy;

typedef struct event {
    double t_us;
    int unit, kind;
} event;

typedef struct trace {
    const char *path;
    event *ev; /* (n) in file order, which is seq order */
    size_t n;
} trace;

/* A pass: indices into the event array of its compute events, in order. */
typedef struct pass {
    size_t *comp;
    int n_comp;
    int backward; /* computes L..1 after the head */
} pass;

/* The units of a trace: L blocks (units 1..L), the head's unit (L+1, or 0 when tied). */
typedef struct shape {
    int L, head, tied;
} shape;

/* The unit of compute #k of a pass: 0..L forward, the head, then L..1 backward; 2L+2
 * computes with a backward, L+2 without. */
static int unit_of_compute(const shape *sh, int k) {
    return k <= sh->L ? k : k == sh->L + 1 ? sh->head : 2 * (sh->L + 1) - k;
}

typedef struct rule {
    const char *name;
    long checked, broken;
} rule;

enum { R_STRUCTURE, R_PREFETCH, R_SERVED, R_WAITED, R_IN_FLIGHT, R_RESHARD, R_KEEP, R_REDUCED,
       R_N };

static rule rules[R_N] = {{"structure", 0, 0}, {"prefetch", 0, 0}, {"served", 0, 0},
                          {"waited", 0, 0},    {"in_flight", 0, 0}, {"reshard", 0, 0},
                          {"keep", 0, 0},      {"reduced", 0, 0}};

static const char *cur_path = "";

/* Counts one check of rule r; on failure prints (at most MAX_REPORTS per rule). */
static void check(int r, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int r, int ok, const char *fmt, ...) {
    rules[r].checked++;
    if (ok) return;
    if (rules[r].broken++ < MAX_REPORTS) {
        va_list ap;
        va_start(ap, fmt);
        printf("  VIOLATION %-9s %s: ", rules[r].name, cur_path);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    } else if (rules[r].broken == MAX_REPORTS + 1) {
        printf("  VIOLATION %-9s %s: (further violations of this rule not shown)\n",
               rules[r].name, cur_path);
    }
}

static int kind_of(const char *name) {
    for (int k = 0; k < EV_N; k++)
        if (strcmp(name, ev_names[k]) == 0) return k;
    return -1;
}

/* Reads one trace file; returns 0 or -1 with a message on stderr. */
static int trace_read(trace *t, const char *path) {
    memset(t, 0, sizeof *t);
    t->path = path;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "check_trace: cannot open %s\n", path);
        return -1;
    }
    size_t cap = 0;
    char line[512];
    long lineno = 0;
    double last_t = -1;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '\n') continue;
        size_t seq;
        double t_us;
        int unit;
        char name[32];
        if (sscanf(line, " {\"seq\": %zu, \"t_us\": %lf, \"unit\": %d, \"event\": \"%31[a-z_]\"}",
                   &seq, &t_us, &unit, name) != 4) {
            fprintf(stderr, "check_trace: %s:%ld: not a trace event: %s", path, lineno, line);
            fclose(f);
            return -1;
        }
        int k = kind_of(name);
        if (k < 0 || unit < 0 || unit >= MAX_UNITS || seq != t->n || t_us < last_t) {
            fprintf(stderr, "check_trace: %s:%ld: bad event (unknown name, unit out of range, "
                    "seq not %zu, or time going backwards): %s", path, lineno, t->n, line);
            fclose(f);
            return -1;
        }
        last_t = t_us;
        if (t->n == cap) {
            cap = cap ? 2 * cap : 1024;
            t->ev = realloc(t->ev, cap * sizeof *t->ev);
            if (!t->ev) {
                fprintf(stderr, "check_trace: out of memory\n");
                exit(2);
            }
        }
        t->ev[t->n++] = (event){t_us, unit, k};
    }
    fclose(f);
    return 0;
}

/* The last event of (unit, kind) at an index in [lo, hi), or -1. */
static long last_between(const trace *t, size_t lo, size_t hi, int unit, int kind) {
    for (size_t i = hi; i-- > lo;)
        if (t->ev[i].unit == unit && t->ev[i].kind == kind) return (long)i;
    return -1;
}

static int any_between(const trace *t, size_t lo, size_t hi, int unit, int kind) {
    return last_between(t, lo, hi, unit, kind) >= 0;
}

/* Splits the computes into passes and checks their order; returns the pass count. */
static int split_passes(const trace *t, const shape *sh, pass **out) {
    const int n_full = 2 * (sh->L + 1), n_fwd = sh->L + 2;
    int n_pass = 0, cap = 0;
    pass *ps = NULL;
    for (size_t i = 0; i < t->n; i++) {
        if (t->ev[i].kind != EV_COMPUTE) continue;
        /* unit 0 starts a pass, unless it is a tied head the pass is waiting for */
        const int head_next = n_pass > 0 && sh->tied && ps[n_pass - 1].n_comp == sh->L + 1;
        if ((t->ev[i].unit == 0 && !head_next) || n_pass == 0) {
            if (n_pass == cap) {
                cap = cap ? 2 * cap : 64;
                ps = realloc(ps, (size_t)cap * sizeof *ps);
                if (!ps) exit(2);
            }
            ps[n_pass].comp = malloc((size_t)(n_full + 1) * sizeof(size_t));
            if (!ps[n_pass].comp) exit(2);
            ps[n_pass].n_comp = 0;
            ps[n_pass].backward = 0;
            n_pass++;
        }
        pass *p = &ps[n_pass - 1];
        int k = p->n_comp;
        int want = unit_of_compute(sh, k);
        int ok = k < n_full && t->ev[i].unit == want;
        check(R_STRUCTURE, ok, "seq %zu: compute of unit %d, expected unit %d (compute #%d of "
              "pass %d)", i, t->ev[i].unit, k < n_full ? want : -1, k, n_pass - 1);
        if (k < n_full) p->comp[p->n_comp++] = i;
    }
    for (int q = 0; q < n_pass; q++) {
        pass *p = &ps[q];
        int ok = p->n_comp == n_fwd || p->n_comp == n_full;
        check(R_STRUCTURE, ok, "pass %d has %d computes, expected %d (forward only) or %d", q,
              p->n_comp, n_fwd, n_full);
        p->backward = p->n_comp == n_full;
    }
    *out = ps;
    return n_pass;
}

/* Is compute #k of a pass a block's backward that SHARD_GRAD_OP serves from its forward? */
static int kept_compute(strategy st, int k, const shape *sh) {
    return st == ST_SHARD_GRAD_OP && k > sh->L + 1;
}

static int check_file(const trace *t, strategy st, int prefetch, int micro_per_step, int tied,
                      int *max_gathered_out, int *n_pass_out, int *n_bwd_out) {
    cur_path = t->path;
    int H = -1; /* the largest unit */
    long n_issue = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (t->ev[i].unit > H) H = t->ev[i].unit;
        n_issue += t->ev[i].kind == EV_GATHER_ISSUE;
    }
    const shape sh = {tied ? H : H - 1, tied ? 0 : H, tied};
    if (sh.L < 1 || n_issue == 0) {
        printf("  %s: %zu events, %ld gathers: nothing to check (a shard group of one "
               "rank serves the master weights directly; at least one block is needed)\n",
               t->path, t->n, n_issue);
        return -1;
    }
    const int L = sh.L;
    pass *ps;
    int n_pass = split_passes(t, &sh, &ps);

    /* prefetch and served, per pass */
    for (int q = 0; q < n_pass; q++) {
        pass *p = &ps[q];
        for (int k = 0; k < p->n_comp; k++) {
            size_t c = p->comp[k];
            int u = t->ev[c].unit;
            long iss = last_between(t, 0, c, u, EV_GATHER_ISSUE);
            int ok = iss >= 0 && any_between(t, (size_t)iss, c, u, EV_GATHER_WAIT) &&
                     !any_between(t, (size_t)iss, c, u, EV_FREE);
            check(R_SERVED, ok, "seq %zu: compute of unit %d (pass %d) not served by a waited, "
                  "unfreed gather (issue at seq %ld)", c, u, q, iss);
            if (k + 1 >= p->n_comp || kept_compute(st, k + 1, &sh)) continue;
            size_t c2 = p->comp[k + 1];
            int u2 = t->ev[c2].unit;
            long iss2 = last_between(t, 0, c2, u2, EV_GATHER_ISSUE);
            const char *phase = k <= L ? "forward" : "backward";
            if (prefetch)
                check(R_PREFETCH, iss2 >= 0 && (size_t)iss2 < c,
                      "pass %d %s: gather_issue of unit %d (seq %ld) is not before the compute "
                      "of unit %d (seq %zu)", q, phase, u2, iss2, u, c);
            else
                check(R_PREFETCH, iss2 > (long)c,
                      "pass %d %s with prefetch off: gather_issue of unit %d (seq %ld) is "
                      "not after the compute of unit %d (seq %zu)", q, phase, u2, iss2, u, c);
        }
        /* blocks between their forward and backward computes */
        if (!p->backward) continue;
        for (int b = 1; b <= L; b++) {
            size_t f = p->comp[b], w = p->comp[2 * (L + 1) - b];
            int freed = any_between(t, f, w, b, EV_FREE);
            int regathered = any_between(t, f, w, b, EV_GATHER_ISSUE);
            if (st == ST_SHARD_GRAD_OP)
                check(R_KEEP, !freed && !regathered, "pass %d: block unit %d %s%s between its "
                      "forward (seq %zu) and backward (seq %zu)", q, b, freed ? "freed " : "",
                      regathered ? "gathered again" : "", f, w);
            else
                check(R_RESHARD, freed && regathered, "pass %d: block unit %d not %s between "
                      "its forward (seq %zu) and backward (seq %zu)", q, b,
                      !freed ? "freed" : "gathered again", f, w);
        }
    }

    /* waited and in_flight: one walk over the events */
    char *issued = calloc((size_t)H + 1, 1);  /* issued, not yet waited */
    char *gathered = calloc((size_t)H + 1, 1); /* issued, not yet freed */
    long *red_open = malloc(((size_t)H + 1) * sizeof(long)); /* open reduce_issue seq */
    long *red_count = calloc((size_t)H + 1, sizeof(long));
    if (!issued || !gathered || !red_open || !red_count) exit(2);
    for (int u = 0; u <= H; u++) red_open[u] = -1;
    int n_gathered = 0, max_gathered = 0, pass_no = -1, next_pass = 0;
    for (size_t i = 0; i < t->n; i++) {
        const event *e = &t->ev[i];
        const int u = e->unit;
        switch (e->kind) {
        case EV_GATHER_ISSUE:
            check(R_WAITED, !issued[u], "seq %zu: unit %d issued again before its previous "
                  "gather was waited on", i, u);
            issued[u] = 1;
            if (!gathered[u]) gathered[u] = 1, n_gathered++;
            break;
        case EV_GATHER_WAIT:
            check(R_WAITED, issued[u], "seq %zu: gather_wait of unit %d with no gather in flight",
                  i, u);
            issued[u] = 0;
            break;
        case EV_FREE:
            check(R_WAITED, !issued[u], "seq %zu: unit %d freed with its gather not waited on",
                  i, u);
            issued[u] = 0;
            if (gathered[u]) gathered[u] = 0, n_gathered--;
            break;
        case EV_COMPUTE:
            if (next_pass < n_pass && i == ps[next_pass].comp[0]) { /* a pass starts */
                next_pass++;
                pass_no++;
                /* a new step: every reduction of the last one is complete */
                if (micro_per_step > 0 && pass_no > 0 && pass_no % micro_per_step == 0)
                    for (int v = 0; v <= H; v++)
                        check(R_REDUCED, red_open[v] < 0, "seq %zu: step %d starts with the "
                              "reduce of unit %d (issued at seq %ld) not done", i,
                              pass_no / micro_per_step, v, red_open[v]);
            }
            break;
        case EV_REDUCE_ISSUE:
            check(R_REDUCED, red_open[u] < 0, "seq %zu: unit %d reduce issued again before its "
                  "previous one (seq %ld) was done", i, u, red_open[u]);
            red_open[u] = (long)i;
            red_count[u]++;
            break;
        case EV_REDUCE_DONE:
            check(R_REDUCED, red_open[u] >= 0, "seq %zu: reduce_done of unit %d with no reduce "
                  "in flight", i, u);
            red_open[u] = -1;
            break;
        default: break;
        }
        if (n_gathered > max_gathered) max_gathered = n_gathered;
        if (st != ST_SHARD_GRAD_OP)
            check(R_IN_FLIGHT, n_gathered <= 2, "seq %zu (%s of unit %d): %d units gathered",
                  i, ev_names[e->kind], u, n_gathered);
    }
    int n_bwd = 0;
    for (int q = 0; q < n_pass; q++) n_bwd += ps[q].backward;
    for (int u = 0; u <= H; u++) {
        check(R_WAITED, !issued[u], "end of trace: the gather of unit %d was never waited on", u);
        check(R_REDUCED, red_open[u] < 0, "end of trace: the reduce of unit %d (seq %ld) never "
              "done", u, red_open[u]);
        /* a tied embedding gets the head's part and the lookup's */
        const int parts = tied && u == 0 ? 2 : 1;
        check(R_REDUCED, red_count[u] == (long)parts * n_bwd, "unit %d reduced %ld times in %d "
              "backward passes, expected %d each", u, red_count[u], n_bwd, parts);
    }
    for (int q = 0; q < n_pass; q++) free(ps[q].comp);
    free(ps);
    free(issued);
    free(gathered);
    free(red_open);
    free(red_count);
    *max_gathered_out = max_gathered;
    *n_pass_out = n_pass;
    *n_bwd_out = n_bwd;
    return H;
}

static void usage(void) {
    fprintf(stderr, "usage: check_trace [--strategy FULL_SHARD|HYBRID_SHARD|SHARD_GRAD_OP] "
            "[--no-prefetch] [--micro-per-step N] [--tied] TRACE.jsonl...\n");
    exit(2);
}

int main(int argc, char **argv) {
    strategy st = ST_FULL_SHARD;
    int prefetch = 1, micro_per_step = 0, tied = 0, first = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--strategy") == 0 && i + 1 < argc) {
            const char *s = argv[++i];
            if (strcmp(s, "FULL_SHARD") == 0) st = ST_FULL_SHARD;
            else if (strcmp(s, "HYBRID_SHARD") == 0) st = ST_HYBRID_SHARD;
            else if (strcmp(s, "SHARD_GRAD_OP") == 0) st = ST_SHARD_GRAD_OP;
            else usage();
        } else if (strcmp(argv[i], "--no-prefetch") == 0) {
            prefetch = 0;
        } else if (strcmp(argv[i], "--tied") == 0) {
            tied = 1;
        } else if (strcmp(argv[i], "--micro-per-step") == 0 && i + 1 < argc) {
            micro_per_step = atoi(argv[++i]);
            if (micro_per_step < 1) usage();
        } else if (argv[i][0] == '-') {
            usage();
        } else {
            first = i;
            break;
        }
    }
    if (first >= argc) usage();
    int bad_input = 0, nothing = 0;
    for (int i = first; i < argc; i++) {
        trace t;
        if (trace_read(&t, argv[i]) != 0) {
            bad_input = 1;
            continue;
        }
        int max_g, n_pass, n_bwd;
        int H = check_file(&t, st, prefetch, micro_per_step, tied, &max_g, &n_pass, &n_bwd);
        if (H < 0) nothing = 1;
        else
            printf("  %s: %zu events, units 0..%d, %d passes (%d with backward), at most %d "
                   "units gathered at once\n", t.path, t.n, H, n_pass, n_bwd, max_g);
        free(t.ev);
    }
    long broken = 0;
    printf("  %-10s %8s %8s\n", "rule", "checked", "broken");
    for (int r = 0; r < R_N; r++) {
        if (rules[r].checked == 0) continue;
        printf("  %-10s %8ld %8ld\n", rules[r].name, rules[r].checked, rules[r].broken);
        broken += rules[r].broken;
    }
    if (bad_input) return 2;
    if (broken || nothing) {
        printf("check_trace: FAIL (%ld violations%s)\n", broken,
               nothing ? ", and a trace with nothing to check" : "");
        return 1;
    }
    printf("check_trace: PASS\n");
    return 0;
}
