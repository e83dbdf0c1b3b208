/* The device table (device_table.h). Peaks are NVIDIA's datasheet figures for dense
 * bf16 (half of the "with sparsity" figure); memory is what nvidia-smi shows. */
#include "src/watch/device_table.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Within a model, variants come before the default (variant NULL). */
static const device_spec table[] = {
    {"a100-40gb", "A100", "40GB", 8, 0, 312, 40960},
    {"a100-80gb", "A100", "80GB", 8, 0, 312, 81920},
    {"a100", "A100", NULL, 8, 0, 312, 0},
    {"a30", "A30", NULL, 8, 0, 165, 0},
    {"a10", "A10", NULL, 8, 6, 125, 23028},
    {"l4", "L4", NULL, 8, 9, 121, 23034},
    {"l40s", "L40S", NULL, 8, 9, 362, 46068},
    {"l40", "L40", NULL, 8, 9, 181, 46068},
    {"h100-pcie", "H100", "PCIe", 9, 0, 756, 81559},
    {"h100-nvl", "H100", "NVL", 9, 0, 835, 95830},
    {"h100", "H100", NULL, 9, 0, 989, 81559},
    {"h800", "H800", NULL, 9, 0, 989, 81559},
    {"h200-nvl", "H200", "NVL", 9, 0, 835, 143771},
    {"h200", "H200", NULL, 9, 0, 989, 143771},
    {"gh200", "GH200", NULL, 9, 0, 989, 0},
    {"h20", "H20", NULL, 9, 0, 148, 0},
    {"b200", "B200", NULL, 10, 0, 2250, 0},
};
#define N_DEVICES ((int)(sizeof table / sizeof table[0]))

/* The model word: the name's second word ("NVIDIA A100-SXM4-80GB" -> "A100"), cut at '-'. */
static void model_word(const char *name, char *out, size_t outlen) {
    const char *p = name;
    while (*p && !isspace((unsigned char)*p)) p++;
    while (isspace((unsigned char)*p)) p++;
    if (!*p) p = name; /* a one-word name is its own model */
    size_t n = 0;
    while (p[n] && !isspace((unsigned char)p[n]) && p[n] != '-' && n + 1 < outlen) n++;
    memcpy(out, p, n);
    out[n] = 0;
}

static int has_word(const char *name, const char *word) { return strcasestr(name, word) != NULL; }

const device_spec *device_table_find(const char *name, int cc_major, int cc_minor) {
    char model[32];
    model_word(name, model, sizeof model);
    for (int i = 0; i < N_DEVICES; i++) {
        const device_spec *d = &table[i];
        if (strcasecmp(d->model, model) != 0 || d->cc_major != cc_major || d->cc_minor != cc_minor)
            continue;
        if (d->variant && !has_word(name, d->variant)) continue;
        if (!d->variant) { /* the default: none of the model's variants' words */
            int other = 0;
            for (int j = 0; j < N_DEVICES; j++)
                other |= table[j].variant && strcasecmp(table[j].model, model) == 0 &&
                         has_word(name, table[j].variant);
            if (other) continue;
        }
        return d;
    }
    return NULL;
}

const device_spec *device_table_by_short_name(const char *short_name) {
    for (int i = 0; i < N_DEVICES; i++)
        if (strcasecmp(table[i].short_name, short_name) == 0) return &table[i];
    return NULL;
}

void device_table_short_names(char *out, size_t outlen) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < N_DEVICES && n < outlen; i++)
        n += (size_t)snprintf(out + n, outlen - n, "%s%s", i ? ", " : "", table[i].short_name);
}

double device_spec_peak_tflops(const device_spec *d, const char *dtype) {
    if (!d) return 0;
    return strcmp(dtype, "bf16") == 0 ? d->bf16_tflops : 0;
}
