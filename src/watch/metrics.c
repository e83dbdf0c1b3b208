/* Step metrics output: fixed-width log line, the row of JSON lines and TensorBoard
 * scalars, FLOP count, peak memory. */
#include "src/watch/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/safe_file.h"
#include "src/watch/step_reduce.h"

int metrics_open(metrics_log *log, const char *run_dir, char *err, size_t errlen) {
    log->jsonl = NULL;
    char why[1024];
    if (safe_file_mkdir_p(run_dir, why, sizeof why) != 0) {
        snprintf(err, errlen, "log.run_dir: %s", why);
        return -1;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    log->jsonl = safe_file_append(path, err, errlen);
    return log->jsonl ? 0 : -1;
}

int metrics_open_tensorboard(metrics_log *log, const char *setting, const char *run_dir,
                             const char *host, double wall_time, char *dir, size_t dirlen,
                             char *err, size_t errlen) {
    const int is_auto = strcmp(setting, "auto") == 0;
    char why[1400];
    if (is_auto) snprintf(dir, dirlen, "%s/tb", run_dir);
    else snprintf(dir, dirlen, "%s", setting);
    if (tfevents_create(&log->tb, dir, host, wall_time, why, sizeof why) != 0) {
        snprintf(err, errlen, "log.tensorboard = %s%s%s%s: %s", setting, is_auto ? " (" : "",
                 is_auto ? dir : "", is_auto ? ")" : "", why);
        return -1;
    }
    return 0;
}

/* A failed event write: one warning, and no more events. */
static void tensorboard_failed(metrics_log *log, const char *why) {
    fprintf(stderr, "shardlm: warning: log.tensorboard: %s; no more TensorBoard events are "
            "written (metrics.jsonl goes on)\n", why);
    fflush(stderr);
    tfevents_close(&log->tb);
}

void metrics_begin_tensorboard(metrics_log *log, int first, double wall_time,
                               const char *job_text) {
    char why[1400];
    if (log->tb.fp &&
        (tfevents_write_text(&log->tb, wall_time, first, "job", job_text, why, sizeof why) != 0 ||
         tfevents_write_session_start(&log->tb, wall_time, first + 1, why, sizeof why) != 0))
        tensorboard_failed(log, why);
}

void metrics_close(metrics_log *log) {
    if (log->jsonl) fclose(log->jsonl);
    log->jsonl = NULL;
    tfevents_close(&log->tb);
}

void metrics_human_count(double v, char *out, size_t outlen) {
    static const char *const unit[] = {"", "K", "M", "B", "T", "P"};
    int u = 0;
    while (fabs(v) >= 1000 && u < 5) v /= 1000, u++;
    snprintf(out, outlen, u == 0 ? "%.0f%s" : (fabs(v) < 10 ? "%.2f%s" : "%.1f%s"), v, unit[u]);
}

void metrics_human_duration(double s, char *out, size_t outlen) {
    if (!isfinite(s) || s < 0) {
        snprintf(out, outlen, "-");
        return;
    }
    long long t = (long long)(s + 0.5);
    long long d = t / 86400, h = t / 3600 % 24, m = t / 60 % 60, sec = t % 60;
    if (d > 0) snprintf(out, outlen, "%lldd %02lld:%02lld:%02lld", d, h, m, sec);
    else snprintf(out, outlen, "%lld:%02lld:%02lld", h, m, sec);
}

void metrics_print_header(FILE *out) {
    fprintf(out, "%13s | %8s | %8s | %9s | %7s | %9s | %10s | %9s | %7s | %6s | %8s | %15s | %8s "
            "| %8s\n", "step/total", "loss", "val", "lr", "norm", "ms", "tok/s job", "tok/s/GPU",
            "TFLOP/s", "MFU%", "mem MiB", "tokens seen/left", "elapsed", "ETA");
    fflush(out);
}

void metrics_print_step(FILE *out, const step_metrics *s) {
    char val[16], mfu[16], steps[32], seen[16], left[16], tokens[40], elapsed[24], eta[24];
    if (isnan(s->val_loss)) snprintf(val, sizeof val, "%8s", "-");
    else snprintf(val, sizeof val, "%8.4f", s->val_loss);
    if (isnan(s->mfu)) snprintf(mfu, sizeof mfu, "%6s", "n/a");
    else snprintf(mfu, sizeof mfu, "%6.2f", 100.0 * s->mfu);
    snprintf(steps, sizeof steps, "%d/%d", s->step, s->steps);
    metrics_human_count((double)s->tokens_seen, seen, sizeof seen);
    metrics_human_count((double)s->tokens_to_go, left, sizeof left);
    snprintf(tokens, sizeof tokens, "%s/%s", seen, left);
    metrics_human_duration(s->elapsed_s, elapsed, sizeof elapsed);
    metrics_human_duration(s->eta_s, eta, sizeof eta);
    fprintf(out, "%13s | %8.4f | %s | %9.3e | %7.3f | %9.1f | %10.0f | %9.0f | %7.3f | %s | %8.1f | "
            "%15s | %8s | %8s%s\n", steps, s->loss, val, s->lr, s->grad_norm, s->step_ms,
            s->tokens_per_s, s->tokens_per_s_per_gpu, s->tflops_per_gpu, mfu,
            s->mem_peak_bytes / 1048576.0, tokens, elapsed, eta,
            s->skipped ? " | skipped: not finite, no update" : "");
    fflush(out);
}

/* ---- the row ---- */

static void row_text(metrics_row *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void row_text(metrics_row *r, const char *fmt, ...) {
    const size_t room = sizeof r->json - r->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->json + r->len, room, fmt, ap);
    va_end(ap);
    if (n > 0) r->len += (size_t)n < room ? (size_t)n : room - 1;
}

/* A number as JSON with printf format fmt, or null for NaN and infinities (which JSON
 * cannot hold); with a tag, a finite number is also a scalar: its text read back. */
static void row_value(metrics_row *r, const char *tag, const char *fmt, double v) {
    char text[64];
    if (!isfinite(v)) {
        row_text(r, "null");
        return;
    }
    snprintf(text, sizeof text, fmt, v);
    row_text(r, "%s", text);
    if (tag && r->n_scalars < METRICS_ROW_SCALARS)
        r->scalars[r->n_scalars++] = (tfevents_scalar){tag, strtod(text, NULL)};
}

/* ', "key": ' and the number (row_value) */
static void row_num(metrics_row *r, const char *key, const char *tag, const char *fmt, double v) {
    row_text(r, ", \"%s\": ", key);
    row_value(r, tag, fmt, v);
}

/* ', "key": ' and an integer (exact as a double: counts and bytes stay below 2^53) */
static void row_int(metrics_row *r, const char *key, const char *tag, long long v) {
    row_num(r, key, tag, "%.0f", (double)v);
}

/* A string as JSON (hosts and ids hold no quotes, but escape anyway) */
static void row_json_string(metrics_row *r, const char *s) {
    row_text(r, "\"");
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') row_text(r, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) row_text(r, "\\u%04x", *s);
        else row_text(r, "%c", *s);
    }
    row_text(r, "\"");
}

/* ', "key": ' and a string as JSON */
static void row_str(metrics_row *r, const char *key, const char *s) {
    row_text(r, ", \"%s\": ", key);
    row_json_string(r, s);
}

/* ', "tokens_seen_by_source": {"NAME": N, ...}', each also data/tokens_seen/NAME */
static void row_sources(metrics_row *r, const step_metrics *s) {
    row_text(r, ", \"tokens_seen_by_source\": {");
    for (int i = 0; i < s->n_sources && i < METRICS_ROW_SOURCES; i++) {
        char *tag = r->source_tags[i];
        snprintf(tag, METRICS_SOURCE_TAG, "data/tokens_seen/%s", s->source_names[i]);
        row_text(r, "%s", i ? ", " : "");
        row_json_string(r, s->source_names[i]);
        row_text(r, ": ");
        row_value(r, tag, "%.0f", (double)s->source_tokens[i]);
    }
    row_text(r, "}");
}

static void row_telemetry(metrics_row *r, const step_record *g) {
    row_text(r, ", \"gpu\": {\"gpus\": ");
    row_value(r, NULL, "%.0f", g->gpus);
    for (int k = 0; k < TEL_N; k++) {
        char *lo = r->gpu_tags[2 * k], *hi = r->gpu_tags[2 * k + 1];
        snprintf(lo, sizeof r->gpu_tags[0], "gpu/%s/mean_lo", tel_field_keys[k]);
        snprintf(hi, sizeof r->gpu_tags[0], "gpu/%s/mean_hi", tel_field_keys[k]);
        row_text(r, ", \"%s\": {\"mean\": [", tel_field_keys[k]);
        row_value(r, lo, "%.6g", g->mean_lo[k]);
        row_text(r, ", ");
        row_value(r, hi, "%.6g", g->mean_hi[k]);
        row_text(r, "], \"max\": [");
        row_value(r, NULL, "%.6g", g->max_lo[k]);
        row_text(r, ", ");
        row_value(r, NULL, "%.6g", g->max_hi[k]);
        row_text(r, "]}");
    }
    row_num(r, "throttle_reasons", NULL, "%.0f", g->throttle_reasons);
    row_num(r, "ecc_corrected", NULL, "%.0f", g->ecc_corrected);
    row_num(r, "ecc_uncorrected", NULL, "%.0f", g->ecc_uncorrected);
    row_num(r, "xid_count", NULL, "%.0f", g->xid_count);
    row_num(r, "xid_last", NULL, "%.0f", g->xid_last);
    row_text(r, "}");
}

void metrics_row_build(const step_metrics *s, metrics_row *r) {
    r->len = 0;
    r->n_scalars = 0;
    char when[64];
    time_t secs = (time_t)s->unix_time;
    struct tm tm;
    gmtime_r(&secs, &tm);
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03dZ", (int)((s->unix_time - (double)secs) * 1000));
    /* the first fields keep their order and format: scripts read them with sed and awk */
    row_text(r, "{\"step\": %d", s->step);
    row_num(r, "loss", "train/loss", "%.9g", s->loss);
    row_num(r, "lr", "train/lr", "%.6e", s->lr);
    row_num(r, "grad_norm", "train/grad_norm", "%.9g", s->grad_norm);
    row_num(r, "tokens_per_s", "perf/tokens_per_s", "%.1f", s->tokens_per_s);
    row_num(r, "tflops_per_gpu", "perf/tflops_per_gpu", "%.6f", s->tflops_per_gpu);
    row_num(r, "mfu", "perf/mfu", "%.6f", s->mfu);
    row_num(r, "step_ms", "perf/step_ms", "%.3f", s->step_ms);
    row_num(r, "comm_exposed_ms", "perf/comm_exposed_ms", "%.3f", s->comm_exposed_ms);
    row_int(r, "mem_peak_bytes", "mem/peak_bytes", (long long)s->mem_peak_bytes);
    row_int(r, "tokens_seen", "train/tokens_seen", s->tokens_seen);
    if (!isnan(s->val_loss)) row_num(r, "val_loss", "val/loss", "%.9g", s->val_loss);
    if (s->skipped) row_text(r, ", \"skipped\": true");
    row_int(r, "steps", NULL, s->steps);
    row_text(r, ", \"time\": \"%s\"", when);
    row_str(r, "run_id", s->run_id);
    row_str(r, "job_hash", s->job_hash);
    row_num(r, "elapsed_s", "progress/elapsed_s", "%.3f", s->elapsed_s);
    row_num(r, "eta_s", "progress/eta_s", "%.1f", s->eta_s);
    row_int(r, "tokens_to_go", "progress/tokens_to_go", s->tokens_to_go);
    row_num(r, "tokens_per_s_per_gpu", "perf/tokens_per_s_per_gpu", "%.1f",
            s->tokens_per_s_per_gpu);
    row_num(r, "comm_shard_ms", "perf/comm_shard_ms", "%.3f", s->comm_ms[0]);
    row_num(r, "comm_replica_ms", "perf/comm_replica_ms", "%.3f", s->comm_ms[1]);
    row_int(r, "slowest_rank", "straggler/slowest_rank", s->slowest_rank);
    row_str(r, "slowest_host", s->slowest_host);
    row_num(r, "slowest_step_ms", "straggler/slowest_step_ms", "%.3f", s->slowest_step_ms);
    row_num(r, "slowest_comm_ms", "straggler/slowest_comm_ms", "%.3f", s->slowest_comm_ms);
    row_num(r, "slowest_compute_ms", "straggler/slowest_compute_ms", "%.3f",
            s->slowest_step_ms - s->slowest_comm_ms);
    row_int(r, "fastest_rank", "straggler/fastest_rank", s->fastest_rank);
    row_str(r, "fastest_host", s->fastest_host);
    row_num(r, "fastest_step_ms", "straggler/fastest_step_ms", "%.3f", s->fastest_step_ms);
    row_num(r, "fastest_comm_ms", "straggler/fastest_comm_ms", "%.3f", s->fastest_comm_ms);
    row_num(r, "fastest_compute_ms", "straggler/fastest_compute_ms", "%.3f",
            s->fastest_step_ms - s->fastest_comm_ms);
    if (s->n_sources > 0) row_sources(r, s);
    if (s->gpu && s->gpu->gpus > 0) row_telemetry(r, s->gpu);
    row_text(r, "}\n");
}

void metrics_write(metrics_log *log, const step_metrics *s) {
    metrics_row row;
    metrics_row_build(s, &row);
    if (log->jsonl) {
        fwrite(row.json, 1, row.len, log->jsonl);
        fflush(log->jsonl);
    }
    char why[1400];
    if (log->tb.fp && tfevents_write_scalars(&log->tb, s->unix_time, s->step, row.scalars,
                                             row.n_scalars, why, sizeof why) != 0)
        tensorboard_failed(log, why);
}

size_t peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
