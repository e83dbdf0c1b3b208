/* What shardlm knows of each GPU model: its dense bf16 tensor peak (the MFU denominator)
 * and its memory (`plan --device`), found by the driver's device name and compute
 * capability. */
#ifndef SHLM_DEVICE_TABLE_H
#define SHLM_DEVICE_TABLE_H

#include <stddef.h>

typedef struct device_spec {
    const char *short_name;  /* plan --device NAME: "h200", "a100-80gb", ... */
    const char *model;       /* the driver's model word: "H200" of "NVIDIA H200 NVL" */
    const char *variant;     /* a word the name must hold ("PCIe", "NVL", "80GB"), or NULL:
                              * the model's default, none of its listed variants' words */
    int cc_major, cc_minor;  /* compute capability the model has */
    double bf16_tflops;      /* dense (no sparsity) bf16 tensor-core peak, TFLOP/s */
    double mem_mib;          /* memory as nvidia-smi reports it, MiB; 0 = not known */
} device_spec;

/* The entry of the device the driver calls `name` with compute capability major.minor,
 * or NULL when the table has none (MFU then reads n/a unless log.peak_tflops is set). */
const device_spec *device_table_find(const char *name, int cc_major, int cc_minor);
/* The entry whose short name is `short_name` (case-insensitive), or NULL. */
const device_spec *device_table_by_short_name(const char *short_name);
/* The short names, "a100-40gb, a100-80gb, ...", for messages. */
void device_table_short_names(char *out, size_t outlen);

/* The dense peak, TFLOP/s, of the device for matmuls in `dtype` ("bf16", "fp32"), from
 * the table; 0 when it has none for that dtype. */
double device_spec_peak_tflops(const device_spec *d, const char *dtype);

#endif
