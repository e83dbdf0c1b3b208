/* Prints what shardlm's NVML telemetry (src/watch/telemetry_nvml.c) reads from each GPU named
 * on the command line by PCI bus id, one CSV line per GPU after a second of sampling
 * every 100 ms: index, utilization.gpu, utilization.memory, clocks.sm, power.draw,
 * temperature.gpu, memory.used (MiB), the clock event reasons (hex), corrected and
 * uncorrected volatile ECC totals, samples — the fields and order of the nvidia-smi query
 * tests/gpu/nvml_fields.sh compares it with. Exit 77 when NVML cannot start (no driver or
 * a build without nvml.h).
 *   tests/gpu/nvml_fields $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader) */
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "src/watch/telemetry.h"

static void field(double v, const char *fmt) {
    if (isnan(v)) printf(",N/A");
    else printf(fmt, v);
}

int main(int argc, char **argv) {
    enum { MAX = 64 };
    int n = argc - 1 < MAX ? argc - 1 : MAX, ranks[MAX];
    const char *ids[MAX];
    for (int i = 0; i < n; i++) ids[i] = argv[i + 1], ranks[i] = i;
    char why[512] = "";
    telemetry *t = telemetry_start(ids, ranks, n, 100, why, sizeof why);
    if (!t) {
        fprintf(stderr, "nvml_fields: %s\n", why);
        return 77;
    }
    sleep(1);
    tel_gpu g[MAX];
    int k = telemetry_window(t, g, MAX);
    tel_gpu last[MAX];
    telemetry_latest(t, last, MAX);
    for (int i = 0; i < k; i++) {
        printf("%d", last[i].index);
        field(last[i].last[TEL_GPU_UTIL], ",%.0f");
        field(last[i].last[TEL_MEM_COPY_UTIL], ",%.0f");
        field(last[i].last[TEL_SM_CLOCK], ",%.0f");
        field(last[i].last[TEL_POWER], ",%.2f");
        field(last[i].last[TEL_TEMP], ",%.0f");
        field(last[i].last[TEL_MEM_USED], ",%.0f");
        printf(",0x%016llx", (unsigned long long)last[i].throttle_reasons);
        field(last[i].ecc_corrected, ",%.0f");
        field(last[i].ecc_uncorrected, ",%.0f");
        printf(",%d\n", g[i].samples);
    }
    telemetry_stop(t);
    return 0;
}
