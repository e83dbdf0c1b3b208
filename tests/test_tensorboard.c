/* Unit tests of what writes TensorBoard's files: CRC32C against RFC 3720's vectors, the
 * record framing and every event the encoder makes against bytes that tensorboard
 * 2.21's own classes wrote (event_pb2, summary_v2.text_pb, RecordWriter: the Python
 * lines beside each vector), the event file (its name, a second file of the same second
 * named after it, refusals), and the metrics row: each TensorBoard scalar is the number
 * its metrics.jsonl field holds, telemetry included, and a null is no scalar.
 *   tests/test_tensorboard */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/tfevents.h"
#include "src/watch/metrics.h"
#include "src/watch/step_reduce.h"
#include "tests/check.h"

/* hex digits into out (returns the byte count) */
static size_t unhex(const char *hex, uint8_t *out) {
    size_t n = 0;
    for (; hex[0] && hex[1]; hex += 2) {
        unsigned v;
        sscanf(hex, "%2x", &v);
        out[n++] = (uint8_t)v;
    }
    return n;
}

/* b holds exactly the bytes of hex */
static int same_bytes(const tfevents_buf *b, const char *hex) {
    uint8_t want[4096];
    size_t n = unhex(hex, want);
    if (b->failed || b->n != n || memcmp(b->p, want, n) != 0) {
        printf("     got  ");
        for (size_t i = 0; i < b->n; i++) printf("%02x", b->p[i]);
        printf("\n     want %s\n", hex);
        return 0;
    }
    return 1;
}

static void test_crc32c(void) {
    uint8_t zeros[32] = {0}, ones[32], up[32], down[32];
    for (int i = 0; i < 32; i++) ones[i] = 0xff, up[i] = (uint8_t)i, down[i] = (uint8_t)(31 - i);
    check(tfevents_crc32c("123456789", 9) == 0xe3069283u, "crc32c(\"123456789\") = 0xe3069283");
    check(tfevents_crc32c(zeros, 32) == 0x8a9136aau, "crc32c: 32 zero bytes (RFC 3720 B.4)");
    check(tfevents_crc32c(ones, 32) == 0x62a8ab43u, "crc32c: 32 bytes 0xff");
    check(tfevents_crc32c(up, 32) == 0x46dd794eu, "crc32c: bytes 0..31");
    check(tfevents_crc32c(down, 32) == 0x113fdb5cu, "crc32c: bytes 31..0");
    check(tfevents_crc32c("", 0) == 0, "crc32c: no bytes");
    /* pywrap_tensorflow.masked_crc32c(b"123456789") */
    check(tfevents_masked_crc32c("123456789", 9) == 0xc78ab0e5u,
          "masked crc32c(\"123456789\") = 0xc78ab0e5 (tensorboard's)");
}

/* Event(wall_time=1765432100.25, file_version="brain.Event:2") */
static const char file_version_event[] =
    "09000010c9964eda411a0d627261696e2e4576656e743a32";
/* RecordWriter(buf).write(that event's bytes) */
static const char file_version_record[] =
    "1800000000000000a37f4b22" "09000010c9964eda411a0d627261696e2e4576656e743a32" "39dc7de6";

static void test_encoder(void) {
    tfevents_buf b = {0};
    tfevents_encode_file_version(&b, 1765432100.25);
    check(same_bytes(&b, file_version_event), "file_version event: tensorboard's bytes");

    tfevents_buf rec = {0};
    tfevents_frame(&rec, b.p, b.n);
    check(same_bytes(&rec, file_version_record), "its record: RecordWriter's bytes");

    /* Event(wall_time=1765432101.5, step=42, summary=Summary(value=[
     *   Value(tag="train/loss", simple_value=2.5), Value(tag="perf/mfu", simple_value=0.0)])) */
    b.n = 0;
    tfevents_scalar v[2] = {{"train/loss", 2.5}, {"perf/mfu", 0.0}};
    tfevents_encode_scalars(&b, 1765432101.5, 42, v, 2);
    check(same_bytes(&b, "09000060c9964eda41102a2a240a110a0a747261696e2f6c6f737315000020400a0f0a08"
                         "706572662f6d66751500000000"),
          "scalars event (a zero value is kept, as a oneof member is): tensorboard's bytes");
    /* ... simple_value=-0.1 (float32 0xbdcccccd) */
    b.n = 0;
    v[1].value = -0.1;
    tfevents_encode_scalars(&b, 1765432101.5, 42, v, 2);
    check(same_bytes(&b, "09000060c9964eda41102a2a240a110a0a747261696e2f6c6f737315000020400a0f0a08"
                         "706572662f6d667515cdccccbd"),
          "scalars event, a negative value rounded to float32: tensorboard's bytes");

    /* Event(wall_time=1765432100.75, step=0, summary=summary_v2.text_pb("job",
     * 'a = 1\nb = "x"')): step 0 is left out */
    b.n = 0;
    tfevents_encode_text(&b, 1765432100.75, 0, "job", "a = 1\nb = \"x\"");
    check(same_bytes(&b, "09000030c9964eda412a260a240a036a6f62421308071200420d61203d20310a62203d20"
                         "2278224a080a060a0474657874"),
          "text event at step 0 (plugin \"text\", a scalar DT_STRING): tensorboard's bytes");

    /* ... step=5, text_pb("job", "x" * 200): lengths of two varint bytes */
    b.n = 0;
    char xs[201];
    memset(xs, 'x', 200);
    xs[200] = 0;
    tfevents_encode_text(&b, 1765432100.75, 5, "job", xs);
    char want[1024] = "09000030c9964eda4110052ae4010ae1010a036a6f6242cf010807120042c801";
    for (int i = 0; i < 200; i++) strcat(want, "78");
    strcat(want, "4a080a060a0474657874");
    check(same_bytes(&b, want), "text event of 200 bytes (nested lengths over 127): "
                                "tensorboard's bytes");

    /* Event(wall_time=1765432100.875, step=300, session_log=SessionLog(status=START)) */
    b.n = 0;
    tfevents_encode_session_start(&b, 1765432100.875, 300);
    check(same_bytes(&b, "09000038c9964eda4110ac023a020801"),
          "session_log START at step 300: tensorboard's bytes");
    tfevents_buf_free(&b);
    tfevents_buf_free(&rec);
}

/* the whole file into a malloc'd buffer */
static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *p = malloc(1 << 16);
    *n = fread(p, 1, 1 << 16, f);
    fclose(f);
    return p;
}

static void test_file(void) {
    char dir[] = "/tmp/shlm-tfevents.XXXXXX", err[2048], sub[256], host[] = "nodeA";
    if (!mkdtemp(dir)) {
        check(0, "mkdtemp");
        return;
    }
    snprintf(sub, sizeof sub, "%s/a/tb", dir);
    tfevents_file f, g;
    int rc = tfevents_create(&f, sub, host, 1765432100.25, err, sizeof err);
    check(rc == 0, "create in a directory not there yet (made): %s", rc == 0 ? "ok" : err);
    char want[600];
    snprintf(want, sizeof want, "%s/events.out.tfevents.1765432100.nodeA.%ld", sub, (long)getpid());
    check(strcmp(f.path, want) == 0, "file name %s (want %s)", f.path, want);
    /* the same second again: named one second later, so it sorts after */
    check(tfevents_create(&g, sub, host, 1765432100.9, err, sizeof err) == 0,
          "a second file in the same second");
    snprintf(want, sizeof want, "%s/events.out.tfevents.1765432101.nodeA.%ld", sub, (long)getpid());
    check(strcmp(g.path, want) == 0, "second file named %s (want %s)", g.path, want);
    tfevents_close(&g);

    tfevents_scalar v[2] = {{"train/loss", 2.5}, {"perf/mfu", 0.0}};
    check(tfevents_write_scalars(&f, 1765432101.5, 42, v, 2, err, sizeof err) == 0,
          "write a scalars event");
    size_t n = 0;
    uint8_t *got = slurp(f.path, &n);
    uint8_t rec1[256], ev2[256];
    size_t n1 = unhex(file_version_record, rec1);
    size_t n2 = unhex("09000060c9964eda41102a2a240a110a0a747261696e2f6c6f737315000020400a0f0a08"
                      "706572662f6d66751500000000", ev2);
    tfevents_buf rec2 = {0};
    tfevents_frame(&rec2, ev2, n2);
    check(got && n == n1 + rec2.n && memcmp(got, rec1, n1) == 0 &&
              memcmp(got + n1, rec2.p, rec2.n) == 0,
          "the file holds both records, flushed (%zu bytes, want %zu)", n, n1 + rec2.n);
    free(got);
    tfevents_buf_free(&rec2);
    tfevents_close(&f);
    check(tfevents_write_scalars(&f, 1, 1, v, 1, err, sizeof err) != 0 && strstr(err, "closed"),
          "a write after close is refused: %s", err);

    /* a directory path that is a file, a path too long */
    char file[300];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *p = fopen(file, "w");
    if (p) fclose(p);
    check(tfevents_create(&f, file, host, 1, err, sizeof err) != 0 &&
              strstr(err, "not a directory") && strstr(err, file),
          "a file where the directory goes is refused: %s", err);
    char longdir[1100];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = 0;
    check(tfevents_create(&f, longdir, host, 1, err, sizeof err) != 0 &&
              strstr(err, "too long"),
          "a directory path too long is refused");

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("     (could not remove %s)\n", dir);
}

/* The metrics.jsonl field (a JSON path, "gpu.power_w.mean.1") each tag comes from. */
static const struct {
    const char *tag, *path;
} tag_fields[] = {
    {"train/loss", "loss"},
    {"train/lr", "lr"},
    {"train/grad_norm", "grad_norm"},
    {"train/tokens_seen", "tokens_seen"},
    {"val/loss", "val_loss"},
    {"perf/tokens_per_s", "tokens_per_s"},
    {"perf/tokens_per_s_per_gpu", "tokens_per_s_per_gpu"},
    {"perf/tflops_per_gpu", "tflops_per_gpu"},
    {"perf/mfu", "mfu"},
    {"perf/step_ms", "step_ms"},
    {"perf/comm_exposed_ms", "comm_exposed_ms"},
    {"perf/comm_shard_ms", "comm_shard_ms"},
    {"perf/comm_replica_ms", "comm_replica_ms"},
    {"mem/peak_bytes", "mem_peak_bytes"},
    {"progress/elapsed_s", "elapsed_s"},
    {"progress/eta_s", "eta_s"},
    {"progress/tokens_to_go", "tokens_to_go"},
    {"straggler/slowest_rank", "slowest_rank"},
    {"straggler/slowest_step_ms", "slowest_step_ms"},
    {"straggler/slowest_comm_ms", "slowest_comm_ms"},
    {"straggler/slowest_compute_ms", "slowest_compute_ms"},
    {"straggler/fastest_rank", "fastest_rank"},
    {"straggler/fastest_step_ms", "fastest_step_ms"},
    {"straggler/fastest_comm_ms", "fastest_comm_ms"},
    {"straggler/fastest_compute_ms", "fastest_compute_ms"},
    {"gpu/util_pct/mean_lo", "gpu.util_pct.mean.0"},
    {"gpu/util_pct/mean_hi", "gpu.util_pct.mean.1"},
    {"gpu/mem_copy_util_pct/mean_lo", "gpu.mem_copy_util_pct.mean.0"},
    {"gpu/mem_copy_util_pct/mean_hi", "gpu.mem_copy_util_pct.mean.1"},
    {"gpu/sm_clock_mhz/mean_lo", "gpu.sm_clock_mhz.mean.0"},
    {"gpu/sm_clock_mhz/mean_hi", "gpu.sm_clock_mhz.mean.1"},
    {"gpu/power_w/mean_lo", "gpu.power_w.mean.0"},
    {"gpu/power_w/mean_hi", "gpu.power_w.mean.1"},
    {"gpu/temp_c/mean_lo", "gpu.temp_c.mean.0"},
    {"gpu/temp_c/mean_hi", "gpu.temp_c.mean.1"},
    {"gpu/mem_used_mib/mean_lo", "gpu.mem_used_mib.mean.0"},
    {"gpu/mem_used_mib/mean_hi", "gpu.mem_used_mib.mean.1"},
};
enum { N_TAG_FIELDS = sizeof tag_fields / sizeof tag_fields[0] };

/* the item at a dotted path (numbers index arrays), or NULL */
static const cJSON *at_path(const cJSON *j, const char *path) {
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *part = strtok_r(buf, ".", &save); part && j; part = strtok_r(NULL, ".", &save))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(part))
                             : cJSON_GetObjectItemCaseSensitive(j, part);
    return j;
}

/* Every tag of the row is in tag_fields with the value of its JSON field; every field of
 * tag_fields that holds a number has its tag; a null has none. */
static void check_row(const char *what, const metrics_row *row) {
    cJSON *j = cJSON_ParseWithLength(row->json, row->len);
    check(j != NULL && row->len > 0 && row->json[row->len - 1] == '\n', "%s: the row is JSON", what);
    if (!j) return;
    int bad = 0, numbers = 0;
    for (int i = 0; i < row->n_scalars; i++) {
        int k = 0;
        while (k < N_TAG_FIELDS && strcmp(tag_fields[k].tag, row->scalars[i].tag) != 0) k++;
        const cJSON *f = k < N_TAG_FIELDS ? at_path(j, tag_fields[k].path) : NULL;
        if (!cJSON_IsNumber(f) || f->valuedouble != row->scalars[i].value) {
            printf("     %s: scalar %s = %.17g, its field %s\n", what, row->scalars[i].tag,
                   row->scalars[i].value, k < N_TAG_FIELDS ? tag_fields[k].path : "(none)");
            bad++;
        }
        for (int m = 0; m < i; m++) bad += strcmp(row->scalars[m].tag, row->scalars[i].tag) == 0;
    }
    for (int k = 0; k < N_TAG_FIELDS; k++) numbers += cJSON_IsNumber(at_path(j, tag_fields[k].path));
    check(bad == 0 && numbers == row->n_scalars,
          "%s: %d scalars, each its field's value (%d fields hold a number)", what,
          row->n_scalars, numbers);
    cJSON_Delete(j);
}

static int has_tag(const metrics_row *row, const char *tag) {
    for (int i = 0; i < row->n_scalars; i++)
        if (strcmp(row->scalars[i].tag, tag) == 0) return 1;
    return 0;
}

static void test_row(void) {
    step_record g;
    memset(&g, 0, sizeof g);
    g.gpus = 2;
    for (int k = 0; k < TEL_N; k++) {
        g.mean_lo[k] = 10.123456789 * (k + 1);
        g.mean_hi[k] = k == TEL_SM_CLOCK ? NAN : 20.5 * (k + 1);
        g.max_lo[k] = 30 + k;
        g.max_hi[k] = 40.25 + k;
    }
    g.throttle_reasons = 4;
    g.ecc_corrected = NAN;
    step_metrics s = {.step = 12, .steps = 100, .loss = 2.345678912345, .val_loss = 2.25,
                      .lr = 3e-4 / 7, .grad_norm = 0.87654321, .tokens_per_s = 12345.678,
                      .tokens_per_s_per_gpu = 6172.839, .tflops_per_gpu = 0.0123456789,
                      .mfu = 0.43215, .step_ms = 123.4567, .comm_exposed_ms = 1.2345,
                      .comm_ms = {0.5, 0.25}, .mem_peak_bytes = 123456789012ull,
                      .tokens_seen = 1234567, .tokens_to_go = 99999, .elapsed_s = 12.3456,
                      .eta_s = 100.25, .slowest_rank = 1, .fastest_rank = 0,
                      .slowest_host = "a", .fastest_host = "b", .slowest_step_ms = 130.1,
                      .slowest_comm_ms = 10.2, .fastest_step_ms = 120.3,
                      .fastest_comm_ms = 5.1, .unix_time = 1765432100.123,
                      .run_id = "20261201T000000Z-12345678", .job_hash = "0123456789abcdef",
                      .gpu = &g};
    static metrics_row row;
    metrics_row_build(&s, &row);
    check_row("a validated step with telemetry", &row);
    check(row.n_scalars == N_TAG_FIELDS - 1 && has_tag(&row, "gpu/power_w/mean_hi") &&
              !has_tag(&row, "gpu/sm_clock_mhz/mean_hi"),
          "... every tag but the GPU mean that is null (%d scalars)", row.n_scalars);
    /* the value is the text: tokens_per_s is written with one decimal */
    for (int i = 0; i < row.n_scalars; i++)
        if (strcmp(row.scalars[i].tag, "perf/tokens_per_s") == 0)
            check(row.scalars[i].value == 12345.7, "perf/tokens_per_s is 12345.7, as the row "
                  "prints it (not 12345.678)");

    s.val_loss = NAN;
    s.mfu = NAN;
    s.loss = NAN;
    s.eta_s = NAN;
    s.skipped = 1;
    s.gpu = NULL;
    metrics_row_build(&s, &row);
    check_row("a skipped step, MFU n/a, no telemetry", &row);
    check(!has_tag(&row, "val/loss") && !has_tag(&row, "perf/mfu") &&
              !has_tag(&row, "train/loss") && !has_tag(&row, "progress/eta_s") &&
              !has_tag(&row, "gpu/power_w/mean_lo") && has_tag(&row, "train/lr"),
          "... no scalar for a null or a missing field");
}

int main(void) {
    test_crc32c();
    test_encoder();
    test_file();
    test_row();
    printf("%d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
