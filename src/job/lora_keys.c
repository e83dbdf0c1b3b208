/* The [lora] keys' words and PEFT's module names (lora_keys.h). */
#include "src/job/lora_keys.h"

#include <stdio.h>
#include <string.h>

#include "io/errmsg.h"
#include "src/engine/adapters.h"

int lora_targets_parse(const char *text, unsigned *mask, char *bad, size_t badlen) {
    *mask = 0;
    bad[0] = '\0';
    const char *p = text;
    int words = 0;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ' ' && *e != '\t' && *e != ',') e++;
        const size_t n = (size_t)(e - p);
        unsigned m = 0;
        for (int t = 0; t < MODEL_N_TARGETS; t++)
            if (strlen(model_target_names[t]) == n && strncmp(p, model_target_names[t], n) == 0)
                m = 1u << t;
        if (n == 4 && strncmp(p, "attn", 4) == 0)
            m = 1u << MODEL_TARGET_Q | 1u << MODEL_TARGET_K | 1u << MODEL_TARGET_V | 1u << MODEL_TARGET_O;
        if (n == 3 && strncmp(p, "mlp", 3) == 0)
            m = 1u << MODEL_TARGET_GATE | 1u << MODEL_TARGET_UP | 1u << MODEL_TARGET_DOWN;
        if (n == 3 && strncmp(p, "all", 3) == 0) m = (1u << MODEL_N_TARGETS) - 1;
        if (!m) {
            snprintf(bad, badlen, "%.*s", (int)(n < 60 ? n : 60), p);
            return -1;
        }
        *mask |= m;
        words++;
        p = e;
    }
    return words ? 0 : -1;
}

void lora_targets_text(unsigned mask, char *out, size_t outlen) {
    out[0] = '\0';
    for (int t = 0; t < MODEL_N_TARGETS; t++)
        if (mask & 1u << t) {
            const size_t n = strlen(out);
            snprintf(out + n, outlen - n, "%s%s", n ? " " : "", model_target_names[t]);
        }
}

int lora_targets_of_peft(const model_layout *lay, const peft_config *pc, unsigned *mask,
                         char *err, size_t errlen) {
    *mask = 0;
    for (int i = 0; i < pc->n_modules; i++) {
        int found = -1;
        char name[64], known[256] = "";
        for (int t = 0; t < MODEL_N_TARGETS; t++) {
            if (adapters_module_name(lay, t, name, sizeof name) != 0) continue;
            if (strcmp(name, pc->modules[i]) == 0) found = t;
            const size_t n = strlen(known);
            snprintf(known + n, sizeof known - n, "%s%s", n ? " " : "", name);
        }
        if (found < 0) {
            io_set_err(err, errlen, "target_modules names \"%s\", which is not a projection of "
                       "this model (its are: %s)", pc->modules[i], known);
            return -1;
        }
        *mask |= 1u << found;
    }
    return 0;
}
