/* The training loop's test hooks (faults.h). */
#include "src/run/faults.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"

int nonfinite_hook_get(int rank, nonfinite_hook *h, char *err, size_t errlen) {
    *h = (nonfinite_hook){NF_NONE, 0, -1};
    const char *v = getenv("SHLM_TEST_NONFINITE");
    if (!v || !*v) return 0;
    char what[8] = "", *p = NULL;
    int first = 0, last = 0, r = 0, n = 0;
    const int ok = sscanf(v, "%7[a-z]:%d%n", what, &first, &n) == 2;
    p = (char *)v + n;
    last = first;
    if (ok && *p == '-') last = (int)strtol(p + 1, &p, 10);
    if (ok && *p == ':') r = (int)strtol(p + 1, &p, 10);
    nonfinite_target t = !strcmp(what, "loss") ? NF_LOSS : !strcmp(what, "norm") ? NF_NORM
                         : !strcmp(what, "weights") ? NF_WEIGHTS : NF_NONE;
    if (!ok || *p || t == NF_NONE || first < 1 || last < first) {
        snprintf(err, errlen, "SHLM_TEST_NONFINITE=%.100s: expected loss|norm|weights:FIRST"
                 "[-LAST][:RANK]", v);
        return -1;
    }
    if (r == rank) *h = (nonfinite_hook){t, first, last};
    return 0;
}

int nonfinite_hook_hits(const nonfinite_hook *h, nonfinite_target t, int step) {
    return h->what == t && step >= h->first && step <= h->last;
}

void nonfinite_poison_embedding(fsdp_engine *e) {
    size_t b, en;
    fsdp_shard_range(e, 0, &b, &en);
    float *x = malloc((en - b + 1) * sizeof(float));
    SHLM_CHECK_ALLOC(x);
    for (size_t i = 0; i < en - b; i++) x[i] = NAN;
    fsdp_set_state(e, 0, FSDP_STATE_MASTER, x);
    free(x);
}
