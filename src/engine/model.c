/* The family-independent part of model.h: a model's layout and passes made once, the
 * projection names LoRA targets. */
#include "src/engine/model.h"

#include <stdlib.h>
#include <string.h>

const char *const model_target_names[MODEL_N_TARGETS] = {"q", "k", "v", "o", "gate", "up",
                                                          "down"};

void model_layout_free(model_layout *lay) {
    free(lay->units);
    lay->units = NULL;
    lay->n_units = 0;
}

void model_desc_open(model_desc *m, const model_spec *spec, const void *cfg) {
    memset(m, 0, sizeof *m);
    m->spec = spec;
    m->cfg = cfg;
    spec->layout(cfg, &m->lay);
    spec->pass(cfg, &m->lay, 1, &m->train_pass);
    spec->pass(cfg, &m->lay, 0, &m->eval_pass);
}

void model_desc_close(model_desc *m) {
    model_layout_free(&m->lay);
    free(m->train_pass.uses);
    free(m->eval_pass.uses);
    model_layout_free(&m->adapters);
    free(m->lora_products);
    memset(m, 0, sizeof *m);
}
