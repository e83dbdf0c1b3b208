/* Step metrics output: fixed-width log line, JSON lines, FLOP count, peak memory. */
#include "src/watch/metrics.h"

#include <math.h>
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

void metrics_close(metrics_log *log) {
    if (log->jsonl) fclose(log->jsonl);
    log->jsonl = NULL;
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

/* A number as JSON with printf format fmt, or null for NaN and infinities (which JSON
 * cannot hold). */
static const char *json_num(const char *fmt, double v, char buf[40]) {
    if (isfinite(v)) snprintf(buf, 40, fmt, v);
    else snprintf(buf, 40, "null");
    return buf;
}

/* A string as JSON (hosts and ids hold no quotes, but escape anyway). */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void json_telemetry(FILE *f, const step_record *g) {
    char a[40], b[40], c[40], d[40];
    fprintf(f, ", \"gpu\": {\"gpus\": %.0f", g->gpus);
    for (int k = 0; k < TEL_N; k++)
        fprintf(f, ", \"%s\": {\"mean\": [%s, %s], \"max\": [%s, %s]}", tel_field_keys[k],
                json_num("%.6g", g->mean_lo[k], a), json_num("%.6g", g->mean_hi[k], b),
                json_num("%.6g", g->max_lo[k], c), json_num("%.6g", g->max_hi[k], d));
    fprintf(f, ", \"throttle_reasons\": %.0f, \"ecc_corrected\": %s, \"ecc_uncorrected\": %s, "
            "\"xid_count\": %.0f, \"xid_last\": %.0f}", g->throttle_reasons,
            json_num("%.0f", g->ecc_corrected, a), json_num("%.0f", g->ecc_uncorrected, b),
            g->xid_count, g->xid_last);
}

void metrics_write_json(metrics_log *log, const step_metrics *s) {
    if (!log->jsonl) return;
    FILE *f = log->jsonl;
    char loss[40], norm[40], mfu[40], eta[40], when[64];
    time_t secs = (time_t)s->unix_time;
    struct tm tm;
    gmtime_r(&secs, &tm);
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03dZ", (int)((s->unix_time - (double)secs) * 1000));
    /* the first fields keep their order and format: scripts read them with sed and awk */
    fprintf(f,
            "{\"step\": %d, \"loss\": %s, \"lr\": %.6e, \"grad_norm\": %s, "
            "\"tokens_per_s\": %.1f, \"tflops_per_gpu\": %.6f, \"mfu\": %s, "
            "\"step_ms\": %.3f, \"comm_exposed_ms\": %.3f, \"mem_peak_bytes\": %zu, "
            "\"tokens_seen\": %lld",
            s->step, json_num("%.9g", s->loss, loss), s->lr, json_num("%.9g", s->grad_norm, norm),
            s->tokens_per_s, s->tflops_per_gpu, json_num("%.6f", s->mfu, mfu),
            s->step_ms, s->comm_exposed_ms, s->mem_peak_bytes, s->tokens_seen);
    if (!isnan(s->val_loss)) fprintf(f, ", \"val_loss\": %.9g", s->val_loss);
    if (s->skipped) fprintf(f, ", \"skipped\": true");
    fprintf(f, ", \"steps\": %d, \"time\": \"%s\", \"run_id\": ", s->steps, when);
    json_str(f, s->run_id);
    fprintf(f, ", \"job_hash\": ");
    json_str(f, s->job_hash);
    fprintf(f, ", \"elapsed_s\": %.3f, \"eta_s\": %s, \"tokens_to_go\": %lld, "
            "\"tokens_per_s_per_gpu\": %.1f, \"comm_shard_ms\": %.3f, \"comm_replica_ms\": %.3f, "
            "\"slowest_rank\": %d, \"slowest_host\": ", s->elapsed_s,
            json_num("%.1f", s->eta_s, eta), s->tokens_to_go, s->tokens_per_s_per_gpu,
            s->comm_ms[0], s->comm_ms[1], s->slowest_rank);
    json_str(f, s->slowest_host);
    fprintf(f, ", \"slowest_step_ms\": %.3f, \"slowest_comm_ms\": %.3f, "
            "\"slowest_compute_ms\": %.3f, \"fastest_rank\": %d, \"fastest_host\": ",
            s->slowest_step_ms, s->slowest_comm_ms, s->slowest_step_ms - s->slowest_comm_ms,
            s->fastest_rank);
    json_str(f, s->fastest_host);
    fprintf(f, ", \"fastest_step_ms\": %.3f, \"fastest_comm_ms\": %.3f, \"fastest_compute_ms\": %.3f",
            s->fastest_step_ms, s->fastest_comm_ms, s->fastest_step_ms - s->fastest_comm_ms);
    if (s->gpu && s->gpu->gpus > 0) json_telemetry(f, s->gpu);
    fprintf(f, "}\n");
    fflush(f);
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
