/* `shardlm plot [--out DIR] RUN_DIR...`: PNGs of a run's metrics.jsonl over steps (loss
 * and validation loss, learning rate, tokens/s, memory, GPU power, SM clock and
 * utilisation), one line per run dir so several runs overlay. gnuplot draws them (as
 * benchmarks/report.sh draws the scaling plot: gnuplot-nox, a C-only dependency with no
 * Python stack, on every login node); this file reads the rows with cJSON, writes one
 * whitespace table per run dir and a gnuplot script, and runs it. Rows of a run dir:
 * the last run (its run_id) and, before its first step, the runs it resumed from; rows
 * of a run that a later one restarted from an earlier step are left out. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safe_file.h"
#include "src/cli/cli_fail.h"
#include "src/cli/commands.h"

enum { MAX_RUNS = 16, N_PNG = 7 /* four, and three of GPU telemetry */ };

/* The columns of a table: step, then these (NaN where a row lacks the field). */
enum {
    C_LOSS, C_VAL, C_LR, C_TPS, C_TPS_GPU, C_MEM_MIB,
    C_POWER_LO, C_POWER_HI, C_CLOCK_LO, C_CLOCK_HI, C_UTIL_LO, C_UTIL_HI, C_N
};

typedef struct row {
    int step;
    double v[C_N];
    char run_id[48];
} row;

typedef struct run_rows {
    row *rows;
    int n, cap;
    int gpu_rows; /* rows with telemetry */
} run_rows;

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* gpu.FIELD.mean[i]: the window mean's min (i = 0) or max (1) across GPUs */
static double gpu_mean(const cJSON *o, const char *field, int i) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "gpu");
    const cJSON *f = g ? cJSON_GetObjectItemCaseSensitive(g, field) : NULL;
    const cJSON *m = f ? cJSON_GetObjectItemCaseSensitive(f, "mean") : NULL;
    const cJSON *v = cJSON_IsArray(m) ? cJSON_GetArrayItem(m, i) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Reads DIR/metrics.jsonl into rr (every row); -1 with err. */
static int read_rows(const char *dir, run_rows *rr, char *err, size_t errlen) {
    char path[SAFE_FILE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = safe_file_read_own(path, err, errlen);
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        cJSON *o = cJSON_Parse(line);
        const cJSON *step = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
        if (!cJSON_IsNumber(step)) {
            snprintf(err, errlen, "%s:%ld: not a metrics row (JSON with a \"step\")", path, lineno);
            cJSON_Delete(o);
            rc = -1;
            break;
        }
        if (rr->n == rr->cap) {
            rr->cap = rr->cap ? 2 * rr->cap : 256;
            row *grown = realloc(rr->rows, (size_t)rr->cap * sizeof(row));
            if (!grown) {
                snprintf(err, errlen, "out of memory");
                cJSON_Delete(o);
                rc = -1;
                break;
            }
            rr->rows = grown;
        }
        row *r = &rr->rows[rr->n++];
        r->step = step->valueint;
        r->v[C_LOSS] = num(o, "loss");
        r->v[C_VAL] = num(o, "val_loss");
        r->v[C_LR] = num(o, "lr");
        r->v[C_TPS] = num(o, "tokens_per_s");
        r->v[C_TPS_GPU] = num(o, "tokens_per_s_per_gpu");
        r->v[C_MEM_MIB] = num(o, "mem_peak_bytes") / 1048576.0;
        static const char *const fields[] = {"power_w", "sm_clock_mhz", "util_pct"};
        for (int k = 0; k < 3; k++) {
            r->v[C_POWER_LO + 2 * k] = gpu_mean(o, fields[k], 0);
            r->v[C_POWER_LO + 2 * k + 1] = gpu_mean(o, fields[k], 1);
        }
        rr->gpu_rows += !isnan(r->v[C_POWER_HI]) || !isnan(r->v[C_UTIL_HI]);
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "run_id"));
        snprintf(r->run_id, sizeof r->run_id, "%s", id ? id : "");
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    if (rc == 0 && rr->n == 0) {
        snprintf(err, errlen, "%s: no rows", path);
        rc = -1;
    }
    return rc;
}

/* Writes the rows of the run chain that ends with the last run (see the file comment),
 * in step order, to path. Returns the rows written, -1 with err. */
static int write_table(const run_rows *rr, const char *path, char *err, size_t errlen) {
    /* walk back run by run: keep a run's rows below the first step kept so far */
    char *keep = calloc((size_t)rr->n, 1);
    if (!keep) return snprintf(err, errlen, "out of memory"), -1;
    int bound = 1 << 30, i = rr->n - 1;
    while (i >= 0) {
        int j = i, lowest = bound;
        while (j >= 0 && strcmp(rr->rows[j].run_id, rr->rows[i].run_id) == 0) {
            if (rr->rows[j].step < bound) {
                keep[j] = 1;
                if (rr->rows[j].step < lowest) lowest = rr->rows[j].step;
            }
            j--;
        }
        bound = lowest;
        i = j;
    }
    safe_file out;
    if (safe_file_begin(&out, path, err, errlen) != 0) {
        free(keep);
        return -1;
    }
    fprintf(out.fp, "# step loss val_loss lr tokens_per_s tokens_per_s_per_gpu mem_mib "
            "power_lo power_hi clock_lo clock_hi util_lo util_hi\n");
    int written = 0;
    for (int k = 0; k < rr->n; k++) {
        if (!keep[k]) continue;
        fprintf(out.fp, "%d", rr->rows[k].step);
        for (int c = 0; c < C_N; c++) {
            if (isnan(rr->rows[k].v[c])) fprintf(out.fp, " NaN");
            else fprintf(out.fp, " %.9g", rr->rows[k].v[c]);
        }
        fprintf(out.fp, "\n");
        written++;
    }
    free(keep);
    return safe_file_finish(&out, err, errlen) == 0 ? written : -1;
}

/* One PNG, written to `output`: for each run, `columns` (1-based gnuplot columns) as lines
 * (the first solid, the second dashed). */
static void plot_png(FILE *gp, const char *output, const char *name, const char *title,
                     const char *ylabel, int logy, const int *columns, const char *const *what,
                     int n_columns, char tables[][SAFE_FILE_PATH_MAX + 32],
                     char labels[][256], int n_runs) {
    fprintf(gp, "set output '%s'\nset title \"%s\"\nset ylabel \"%s\"\n%s\nplot ",
            output, title, ylabel, logy ? "set logscale y" : "unset logscale y");
    for (int r = 0; r < n_runs; r++)
        for (int k = 0; k < n_columns; k++)
            fprintf(gp, "%s'%s' using 1:%d with %s lw 2 dt %d lc %d title \"%s%s\"",
                    r || k ? ", " : "", tables[r], columns[k], k == 1 && !strcmp(name, "loss")
                        ? "linespoints pt 7 ps 0.8" : "lines", k + 1, r + 1, labels[r], what[k]);
    fprintf(gp, "\n");
}

int cmd_plot(int argc, char **argv) {
    const char *out_dir = NULL;
    const char *dirs[MAX_RUNS];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out")) {
            if (++i >= argc) return cli_fail("plot", 1, "--out needs a directory");
            out_dir = argv[i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: shardlm plot [--out DIR] RUN_DIR...\n"
                   "  PNGs of each RUN_DIR/metrics.jsonl over steps, the runs overlaid: loss.png,\n"
                   "  lr.png, throughput.png, memory.png and, with GPU telemetry, gpu_power.png,\n"
                   "  gpu_clock.png, gpu_util.png; in DIR (default: RUN_DIR/plots for one run,\n"
                   "  ./plots for several). Needs gnuplot (Debian: gnuplot-nox).\n");
            return 0;
        } else if (argv[i][0] == '-') {
            return cli_fail("plot", 1, "unknown option '%s' (usage: shardlm plot [--out DIR] "
                            "RUN_DIR...)", argv[i]);
        } else if (n == MAX_RUNS) {
            return cli_fail("plot", 1, "at most 16 run directories");
        } else {
            dirs[n++] = argv[i];
        }
    }
    if (n == 0) return cli_fail("plot", 1, "no run directory given (usage: shardlm plot "
                                "[--out DIR] RUN_DIR...)");
    if (system("gnuplot --version >/dev/null 2>&1") != 0)
        return cli_fail("plot", 1, "gnuplot not found (Debian: apt-get install gnuplot-nox)");
    char default_out[SAFE_FILE_PATH_MAX];
    if (!out_dir) {
        snprintf(default_out, sizeof default_out, "%s/plots", n == 1 ? dirs[0] : ".");
        out_dir = default_out;
    }
    if (strchr(out_dir, '\'')) return cli_fail("plot", 1, "--out %s: a quote in the path", out_dir);
    char err[1536];
    if (safe_file_mkdir_p(out_dir, err, sizeof err) != 0) return cli_fail("plot", 1, "%s", err);

    static char tables[MAX_RUNS][SAFE_FILE_PATH_MAX + 32];
    static char labels[MAX_RUNS][256];
    int gpu_rows = 0;
    for (int r = 0; r < n; r++) {
        run_rows rr = {0};
        if (read_rows(dirs[r], &rr, err, sizeof err) != 0) {
            free(rr.rows);
            return cli_fail("plot", 1, "%s", err);
        }
        gpu_rows += rr.gpu_rows;
        snprintf(tables[r], sizeof tables[r], "%s/run%d.dat", out_dir, r + 1);
        int rows = write_table(&rr, tables[r], err, sizeof err);
        free(rr.rows);
        if (rows < 0) return cli_fail("plot", 1, "%s", err);
        /* the legend: the run dir, with the characters gnuplot's strings treat specially
         * dropped */
        size_t k = 0;
        for (const char *p = dirs[r]; *p && k + 1 < sizeof labels[r]; p++)
            if (*p != '"' && *p != '\\' && *p != '\'') labels[r][k++] = *p;
        labels[r][k] = 0;
        printf("plot: %s: %d row(s)\n", dirs[r], rows);
    }

    /* gnuplot writes the PNGs and its notes (a column without data, a flat range: the log,
     * shown on failure) under temporary names made and created here (io/safe_file.h),
     * renamed into place once it has finished: it would truncate or write into whatever
     * is at the final names */
    static const char *const png_names[N_PNG] = {"loss", "lr", "throughput", "memory",
                                                 "gpu_power", "gpu_clock", "gpu_util"};
    const int n_png = gpu_rows > 0 ? N_PNG : N_PNG - 3;
    safe_file out[N_PNG + 1]; /* the PNGs, then the log */
    char path[SAFE_FILE_PATH_MAX];
    int n_out = 0;
    for (; n_out <= n_png; n_out++) {
        int len = n_out < n_png
                      ? snprintf(path, sizeof path, "%s/%s.png", out_dir, png_names[n_out])
                      : snprintf(path, sizeof path, "%s/gnuplot.log", out_dir);
        if (len < 0 || (size_t)len >= sizeof path) {
            snprintf(err, sizeof err, "--out %.200s...: path too long", out_dir);
            break;
        }
        if (safe_file_begin(&out[n_out], path, err, sizeof err) != 0) break;
    }
    if (n_out <= n_png) {
        while (n_out > 0) safe_file_abort(&out[--n_out]);
        return cli_fail("plot", 1, "%s", err);
    }
    char cmd[SAFE_FILE_PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "gnuplot 2>'%s'", out[n_png].tmp);
    FILE *gp = popen(cmd, "w");
    if (!gp) {
        for (int i = 0; i <= n_png; i++) safe_file_abort(&out[i]);
        return cli_fail("plot", 1, "cannot start gnuplot: %s", strerror(errno));
    }
    /* as benchmarks/report.sh: pngcairo where gnuplot has it, else png */
    fprintf(gp, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size "
            "960,540 font ',10' } else { set terminal png size 960,540 }\n"
            "set termoption noenhanced\nset datafile missing 'NaN'\nset grid\n"
            "set key outside bottom center horizontal\nset xlabel 'step'\n");
    static const char *const one[] = {""}, *const two_tok[] = {" job", " per GPU"},
                             *const loss_what[] = {" train", " val"},
                             *const span[] = {" max over GPUs", " min over GPUs"};
    plot_png(gp, out[0].tmp, "loss", "loss", "nats/token", 0, (const int[]){2, 3}, loss_what,
             2, tables, labels, n);
    plot_png(gp, out[1].tmp, "lr", "learning rate", "lr", 0, (const int[]){4}, one, 1, tables,
             labels, n);
    plot_png(gp, out[2].tmp, "throughput", "throughput", "tokens/s", 1, (const int[]){5, 6},
             two_tok, 2, tables, labels, n);
    plot_png(gp, out[3].tmp, "memory", "peak memory (rank 0)", "MiB", 0, (const int[]){7}, one,
             1, tables, labels, n);
    if (gpu_rows > 0) {
        plot_png(gp, out[4].tmp, "gpu_power", "GPU power (mean over each logged interval)", "W",
                 0, (const int[]){9, 8}, span, 2, tables, labels, n);
        plot_png(gp, out[5].tmp, "gpu_clock", "SM clock (mean over each logged interval)", "MHz",
                 0, (const int[]){11, 10}, span, 2, tables, labels, n);
        plot_png(gp, out[6].tmp, "gpu_util", "GPU utilisation (mean over each logged interval)",
                 "%", 0, (const int[]){13, 12}, span, 2, tables, labels, n);
    }
    int rc = pclose(gp);
    /* the log is kept either way; the PNGs only from a gnuplot that succeeded */
    int ok = safe_file_finish(&out[n_png], err, sizeof err) == 0;
    for (int i = 0; i < n_png; i++) {
        if (rc == 0 && ok) ok = safe_file_finish(&out[i], err, sizeof err) == 0;
        else safe_file_abort(&out[i]);
    }
    if (rc != 0) return cli_fail("plot", 1, "gnuplot failed: see %s/gnuplot.log", out_dir);
    if (!ok) return cli_fail("plot", 1, "%s", err);
    printf("plot: wrote %s/loss.png, lr.png, throughput.png, memory.png%s\n", out_dir,
           gpu_rows > 0 ? ", gpu_power.png, gpu_clock.png, gpu_util.png"
                        : " (no GPU telemetry in these runs: no GPU plots)");
    return 0;
}
