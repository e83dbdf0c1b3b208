/* Step metrics output: fixed-width log line, JSON lines, FLOP count, peak memory. */
#include "src/metrics.h"

#include <math.h>
#include <string.h>

#include "io/safe_file.h"

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

void metrics_print_header(FILE *out) {
    fprintf(out, "%7s | %8s | %8s | %9s | %7s | %9s | %10s | %8s | %6s | %8s\n", "step",
            "loss", "val", "lr", "norm", "ms", "tok/s", "TFLOP/s", "MFU%", "mem MiB");
    fflush(out);
}

void metrics_print_step(FILE *out, const step_metrics *s) {
    char val[16];
    if (isnan(s->val_loss)) snprintf(val, sizeof val, "%8s", "-");
    else snprintf(val, sizeof val, "%8.4f", s->val_loss);
    fprintf(out, "%7d | %8.4f | %s | %9.3e | %7.3f | %9.1f | %10.0f | %8.3f | %6.2f | %8.1f%s\n",
            s->step, s->loss, val, s->lr, s->grad_norm, s->step_ms, s->tokens_per_s,
            s->tflops_per_gpu, 100.0 * s->mfu, s->mem_peak_bytes / 1048576.0,
            s->skipped ? " | skipped: not finite, no update" : "");
    fflush(out);
}

/* A number as JSON: %.9g, or null for NaN and infinities (which JSON cannot hold). */
static const char *json_number(double v, char buf[32]) {
    if (isfinite(v)) snprintf(buf, 32, "%.9g", v);
    else snprintf(buf, 32, "null");
    return buf;
}

void metrics_write_json(metrics_log *log, const step_metrics *s) {
    if (!log->jsonl) return;
    char loss[32], norm[32];
    fprintf(log->jsonl,
            "{\"step\": %d, \"loss\": %s, \"lr\": %.6e, \"grad_norm\": %s, "
            "\"tokens_per_s\": %.1f, \"tflops_per_gpu\": %.6f, \"mfu\": %.6f, "
            "\"step_ms\": %.3f, \"comm_exposed_ms\": %.3f, \"mem_peak_bytes\": %zu, "
            "\"tokens_seen\": %lld",
            s->step, json_number(s->loss, loss), s->lr, json_number(s->grad_norm, norm),
            s->tokens_per_s, s->tflops_per_gpu, s->mfu,
            s->step_ms, s->comm_exposed_ms, s->mem_peak_bytes, s->tokens_seen);
    if (!isnan(s->val_loss)) fprintf(log->jsonl, ", \"val_loss\": %.9g", s->val_loss);
    if (s->skipped) fprintf(log->jsonl, ", \"skipped\": true");
    fprintf(log->jsonl, "}\n");
    fflush(log->jsonl);
}

double model_flops_per_token(const llama_config *c, int T) {
    return 6.0 * (double)llama_param_count(c) + 12.0 * c->n_layers * (double)c->dim * T;
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
