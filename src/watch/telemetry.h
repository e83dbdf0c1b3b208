/* GPU telemetry: a thread that samples the node's GPUs through NVML at an interval, off
 * the training thread; the training thread and the Prometheus exporter read summaries
 * of what it saw (src/watch/telemetry_nvml.c). */
#ifndef SHLM_TELEMETRY_H
#define SHLM_TELEMETRY_H

#include <stddef.h>
#include <stdint.h>

/* The gauges sampled per GPU (DCGM's field for each in brackets). */
typedef enum tel_field {
    TEL_GPU_UTIL = 0, /* % of the sample period a kernel ran (DCGM_FI_DEV_GPU_UTIL) */
    TEL_MEM_COPY_UTIL, /* % of it device memory was read or written (_MEM_COPY_UTIL) */
    TEL_SM_CLOCK,     /* SM clock, MHz (_SM_CLOCK) */
    TEL_POWER,        /* board power, W (_POWER_USAGE) */
    TEL_TEMP,         /* GPU temperature, degrees C (_GPU_TEMP) */
    TEL_MEM_USED,     /* device memory used, MiB (_FB_USED) */
    TEL_N
} tel_field;

/* Field names as metrics.jsonl writes them (units in the name). */
extern const char *const tel_field_keys[TEL_N];

/* What one GPU showed over a window of samples (or, with samples = 0, its latest sample
 * as both mean and max). A gauge the device does not report is NaN. */
typedef struct tel_gpu {
    int index;                  /* NVML's index of the GPU (nvidia-smi's, DCGM's "gpu") */
    int rank;                   /* the world rank bound to it */
    int samples;                /* samples in the window */
    double mean[TEL_N], max[TEL_N], last[TEL_N];
    uint64_t throttle_reasons;  /* NVML clock event reasons, OR over the window's samples */
    double ecc_corrected, ecc_uncorrected; /* volatile ECC totals, latest; NaN: no ECC */
    uint64_t xid_count;         /* XID error events since the telemetry started */
    uint64_t xid_last;          /* the latest XID error's code, 0 = none yet */
} tel_gpu;

typedef struct telemetry telemetry;

/* Starts sampling the n GPUs named by their PCI bus ids (ops->device_info), ranks[i]
 * being the world rank bound to bus_ids[i], every interval_ms. Returns the sampler, or
 * NULL with the reason in why ("libnvidia-ml.so.1 not found", "built without nvml.h",
 * an NVML error naming the device): a run goes on without telemetry. Loads
 * libnvidia-ml at run time (dlopen): nothing of it is linked. */
telemetry *telemetry_start(const char *const *bus_ids, const int *ranks, int n, int interval_ms,
                           char *why, size_t whylen);
/* Stops the thread and releases NVML. NULL is fine. */
void telemetry_stop(telemetry *t);
/* Number of GPUs sampled. */
int telemetry_gpu_count(const telemetry *t);
/* Copies each GPU's window since the last telemetry_reset_window (or the start) into
 * out[0..n); returns n. Thread-safe; a mutex held for a copy. */
int telemetry_window(telemetry *t, tel_gpu *out, int max);
/* Starts a new window on every GPU. */
void telemetry_reset_window(telemetry *t);
/* Copies each GPU's latest sample (in last[], mean[] and max[] alike, samples = 1) into
 * out; returns n. For the exporter. */
int telemetry_latest(telemetry *t, tel_gpu *out, int max);

#endif
