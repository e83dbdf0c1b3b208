/* Tests of the data mixture (src/data/data_mix.c): data.train's list and its bad input,
 * the sources' shares over 200 steps, the same windows on 1, 2 and 4 ranks simulated in
 * one process, a resume from the saved state continuing exactly, each source's epochs,
 * and each source's loss masks and document starts kept. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/data_mix.h"

#include "tests/check.h"

enum { T = 8, G = 8, SOURCES = 3, BASE = 1000000 };

/* An in-memory token file: token i of source f is f·BASE + i, so a row's first input
 * names its source and window. flags: every 3rd token untrained and a document start
 * every 20 tokens when masked. */
static token_file make_source(int f, uint64_t count, int masked) {
    token_file tf;
    memset(&tf, 0, sizeof tf);
    snprintf(tf.path, sizeof tf.path, "mem/source%d.bin", f);
    tf.width = 4;
    tf.count = count;
    tf.vocab_size = (uint32_t)(SOURCES * BASE);
    tf.fd = -1;
    tf.tokens = malloc(count * sizeof *tf.tokens);
    for (uint64_t i = 0; i < count; i++) tf.tokens[i] = (int32_t)(f * BASE + i);
    tf.documents = 1;
    tf.trained = count;
    if (masked) {
        tf.flags = malloc(count);
        tf.trained = tf.documents = 0;
        for (uint64_t i = 0; i < count; i++) {
            tf.flags[i] = (uint8_t)((i % 3 ? TOKEN_TRAINED : 0) | (i % 20 == 0 ? TOKEN_DOC_START : 0));
            tf.trained += i % 3 != 0;
            tf.documents += i % 20 == 0;
        }
    }
    return tf;
}

static void test_parse(void) {
    data_mix_list l;
    char why[800], text[2048];
    check(data_mix_parse("chat.bin:0.7, code.bin:0.2,web.bin:0.1", &l, why, sizeof why) == 0 &&
              l.n == 3 && !strcmp(l.e[0].path, "chat.bin") && !strcmp(l.e[2].path, "web.bin") &&
              fabs(l.e[0].weight - 0.7) < 1e-12 && fabs(l.e[1].weight - 0.2) < 1e-12,
          "parse: 'chat.bin:0.7, code.bin:0.2,web.bin:0.1' is three files, spaces dropped");
    check(data_mix_parse("a.bin:7, b.bin:3", &l, why, sizeof why) == 0 &&
              fabs(l.e[0].weight - 0.7) < 1e-12 && fabs(l.e[1].weight - 0.3) < 1e-12,
          "parse: weights 7 and 3 normalised to 0.7 and 0.3");
    check(data_mix_parse("train.bin", &l, why, sizeof why) == 0 && l.n == 1 &&
              l.e[0].weight == 1 && !strcmp(l.e[0].path, "train.bin"),
          "parse: one file without a weight");
    check(data_mix_parse("data/v1:old.bin", &l, why, sizeof why) == 0 && l.n == 1 &&
              !strcmp(l.e[0].path, "data/v1:old.bin"),
          "parse: a ':' not followed by a number is part of the path");
    check(data_mix_parse("run:3:1, web.bin:1", &l, why, sizeof why) == 0 && l.n == 2 &&
              !strcmp(l.e[0].path, "run:3"),
          "parse: 'run:3:1' is the file run:3 with weight 1 (the last ':' takes the weight)");
    check(data_mix_parse("run:3:1", &l, why, sizeof why) == 0 &&
              data_mix_format(&l, text, sizeof text) > 0 && !strcmp(text, "run:3:1"),
          "format: one file whose name ends in ':3' keeps a weight, so it parses back (%s)",
          text);
    check(data_mix_parse("a.bin:0.7, b.bin:0.3", &l, why, sizeof why) == 0 &&
              data_mix_format(&l, text, sizeof text) > 0 && !strcmp(text, "a.bin:0.7, b.bin:0.3"),
          "format: a mixture as written (%s)", text);
    const struct { const char *text, *want; } bad[] = {
        {"a.bin:0.7, b.bin:0", "weight 0 of b.bin: must be a number more than 0"},
        {"a.bin:-1, b.bin:1", "weight -1 of a.bin: must be a number more than 0"},
        {"a.bin:1e999, b.bin:1", "weight 1e999 of a.bin"},
        {"a.bin:0.5, b.bin", "b.bin has no weight"},
        {"a.bin:1,, b.bin:1", "entry 2 of"},
        {"a.bin:1, :1", "has a weight but no path"},
        {"a.bin:1, a.bin:2", "a.bin is listed twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        const int rc = data_mix_parse(bad[i].text, &l, why, sizeof why);
        check(rc == -1 && strstr(why, bad[i].want) != NULL, "parse refuses '%s': %s",
              bad[i].text, why);
    }
}

/* The windows the step hands out, read from every rank's rows in global-sample order:
 * out[j] = source·BASE + first token of sample j's row. Returns 0 on a failure. */
static int step_rows(data_mix *ranks, int W, int mb, int64_t *targets, uint64_t *out,
                     int64_t *trained_rows) {
    const int accum = G / (W * mb);
    int32_t in[G * T], tg[G * T], ds[G * T];
    char err[512];
    *trained_rows = 0;
    for (int r = 0; r < W; r++) {
        int64_t n;
        if (data_mix_step(&ranks[r], 0, G, &n, err, sizeof err) != 0) {
            printf("     step failed: %s\n", err);
            return 0;
        }
        if (r == 0) *targets = n;
        else if (n != *targets) return 0;
        for (int m = 0; m < accum; m++) {
            if (data_mix_batch(&ranks[r], m, in, tg, ds, err, sizeof err) != 0) {
                printf("     batch failed: %s\n", err);
                return 0;
            }
            for (int b = 0; b < mb; b++) {
                const uint64_t j = ((uint64_t)m * mb + b) * W + r;
                out[j] = (uint64_t)in[b * T];
                for (int t = 0; t < T; t++) *trained_rows += tg[b * T + t] != -1;
            }
        }
    }
    return 1;
}

static int init_world(data_mix *ranks, const token_file *tfs, const double *w, int W, int mb,
                      int shuffle, const data_mix_saved *saved) {
    const token_file *p[SOURCES] = {&tfs[0], &tfs[1], &tfs[2]};
    char err[512];
    for (int r = 0; r < W; r++)
        if (data_mix_init(&ranks[r], p, w, SOURCES, T, shuffle, 1234, r, W, mb, 1, saved, err,
                          sizeof err) != 0) {
            printf("     init failed: %s\n", err);
            return 0;
        }
    return 1;
}

int main(void) {
    test_parse();

    /* sources of 41, 161 and 2001 tokens: 5, 20 and 250 windows of 8; the small ones run
     * through many epochs in 200 steps */
    token_file tfs[SOURCES] = {make_source(0, 2001, 1), make_source(1, 161, 0),
                               make_source(2, 41, 1)};
    const double w[SOURCES] = {0.7, 0.2, 0.1};
    const int steps = 200;
    uint64_t *rows[3];
    const int worlds[3] = {1, 2, 4}, mbs[3] = {2, 2, 1};
    int same_counts = 1, masks_ok = 1;
    for (int k = 0; k < 3; k++) {
        const int W = worlds[k];
        data_mix ranks[4];
        rows[k] = malloc((size_t)steps * G * sizeof *rows[k]);
        if (!init_world(ranks, tfs, w, W, mbs[k], 1, NULL)) return check_exit();
        for (int s = 0; s < steps; s++) {
            int64_t targets, trained_rows;
            if (!step_rows(ranks, W, mbs[k], &targets, rows[k] + (size_t)s * G, &trained_rows)) {
                same_counts = 0;
                break;
            }
            if (targets != trained_rows) masks_ok = 0;
        }
        for (int r = 0; r < W; r++) data_mix_free(&ranks[r]);
    }
    check(same_counts, "every rank counts the same trained targets per step");
    check(masks_ok, "the rows' trained targets (loss masks, document starts) are what the step "
          "counted, on 1, 2 and 4 ranks");
    check(!memcmp(rows[0], rows[1], (size_t)steps * G * sizeof *rows[0]) &&
              !memcmp(rows[0], rows[2], (size_t)steps * G * sizeof *rows[0]),
          "the same windows in the same order on 1, 2 and 4 ranks over %d steps", steps);

    /* shares over the 200 steps, within 2% of the weights, and at every step within 2
     * samples of what the weights give */
    long long count[SOURCES] = {0};
    double worst = 0;
    for (int j = 0; j < steps * G; j++) {
        count[rows[0][j] / BASE]++;
        for (int f = 0; f < SOURCES; f++) {
            const double off = fabs((double)count[f] - (j + 1) * w[f]);
            if (off > worst) worst = off;
        }
    }
    for (int f = 0; f < SOURCES; f++) {
        const double share = (double)count[f] / (steps * G);
        check(fabs(share - w[f]) <= 0.02 * w[f], "source %d: %lld of %d windows, share %.4f, "
              "weight %.1f (within 2%%)", f, count[f], steps * G, share, w[f]);
    }
    check(worst < 2, "after every sample each source is within %.3f samples of its weight's",
          worst);

    /* each source's epochs: its k-th epoch holds each of its windows once */
    int epochs_ok = 1;
    for (int f = 0; f < SOURCES; f++) {
        const uint64_t nw = (tfs[f].count - 1) / T;
        uint64_t seen = 0, *hits = calloc(nw, sizeof *hits);
        for (int j = 0; j < steps * G; j++) {
            if (rows[0][j] / BASE != (uint64_t)f) continue;
            const uint64_t win = (rows[0][j] % BASE) / T;
            if (win >= nw || hits[win] != seen / nw) epochs_ok = 0;
            hits[win]++;
            seen++;
        }
        free(hits);
    }
    check(epochs_ok, "each source starts its next epoch on its own, every window once per epoch");

    /* resume: 100 steps, the state as a checkpoint keeps it, a new loader from it, 100
     * more: the rows of the uninterrupted run */
    data_mix first[2], second[2];
    data_mix_list l;
    char why[256], text[4096];
    data_mix_parse("mem/source0.bin:0.7, mem/source1.bin:0.2, mem/source2.bin:0.1", &l, why,
                   sizeof why);
    uint64_t *resumed = malloc((size_t)steps * G * sizeof *resumed);
    int resume_ok = init_world(first, tfs, w, 2, 2, 1, NULL);
    int64_t tg, tr;
    for (int s = 0; s < steps / 2 && resume_ok; s++)
        resume_ok = step_rows(first, 2, 2, &tg, resumed + (size_t)s * G, &tr);
    data_mix_saved saved[DATA_MIX_MAX];
    int n_saved = 0;
    resume_ok = resume_ok && data_mix_state_text(&first[0], &l, text, sizeof text) == 0 &&
                data_mix_state_parse(text, saved, &n_saved, why, sizeof why) == 0 &&
                n_saved == SOURCES;
    for (int r = 0; r < 2; r++) data_mix_free(&first[r]);
    resume_ok = resume_ok && init_world(second, tfs, w, 2, 2, 1, saved);
    for (int s = steps / 2; s < steps && resume_ok; s++)
        resume_ok = step_rows(second, 2, 2, &tg, resumed + (size_t)s * G, &tr);
    if (resume_ok) for (int r = 0; r < 2; r++) data_mix_free(&second[r]);
    check(resume_ok && !memcmp(resumed, rows[0], (size_t)steps * G * sizeof *resumed),
          "a loader made from the saved state after step 100 continues as the uninterrupted "
          "one (its first source's state: %.*s)", (int)strcspn(text, "\n"), text);
    check(data_mix_state_parse("1 2 3 4 0.5\n", saved, &n_saved, why, sizeof why) == -1 &&
              data_mix_state_parse("3 2 3 4 0.5 a.bin", saved, &n_saved, why, sizeof why) == -1 &&
              data_mix_state_parse("1 2 3 4 0.5 a.bin\n", saved, &n_saved, why, sizeof why) == -1,
          "a saved state without a path, a line's end, or more taken since the weights than "
          "taken is refused");

    for (int k = 0; k < 3; k++) free(rows[k]);
    free(resumed);
    for (int f = 0; f < SOURCES; f++) free(tfs[f].tokens), free(tfs[f].flags);
    return check_exit();
}
