/* The state record of a checkpoint: the root attributes (the training state, the sharding
 * it was saved with, the model's shape), their bounds, their reading and writing, and the
 * state checksum that binds them to the file's datasets. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/errmsg.h"
#include "kernels/check.h"
#include "shlm_config.h"
#include "src/ckpt/ckpt_internal.h"
#include "src/families/families.h"

/* The formulas, written into every file (attributes checksum_algorithm and
 * state_checksum_text) so that a reader needs nothing of shardlm to check one. */
#define CKPT_CHECKSUM_DOC                                                                  \
    "sum64-pos: w_i = 32-bit word of element i (row-major), n elements, mod 2^64: "       \
    "s1 = sum w_i, s2 = sum i*w_i, checksum = mix(s1 ^ mix(s2 + n)), mix = splitmix64 "   \
    "finaliser (x += 0x9E3779B97F4A7C15; x = (x ^ x>>30) * 0xBF58476D1CE4E5B9; "          \
    "x = (x ^ x>>27) * 0x94D049BB133111EB; x ^ x>>31); a byte dataset (/hf): w_i = 32-bit " \
    "word i of its bytes zero-padded to a multiple of 4"

#define CKPT_STATE_CHECKSUM_DOC                                                            \
    "state_checksum = sum64-pos of the 32-bit little-endian words of this text, "          \
    "zero-padded to a multiple of 4 bytes: a line NAME=VALUE per state attribute (in the "  \
    "order of the attribute state_attributes; integers in decimal, "                        \
    "floating point as the 16 hex digits of the double's bits, strings as they are), then " \
    "a line 'PATH SHAPE CHECKSUM' per dataset in byte order of the paths (SHAPE: the "      \
    "dimensions joined by x; CHECKSUM: 16 lowercase hex digits)"

/* ---------------------------------------------------------------- state */

/* FT_STR: fsdp.strategy, a strategy's name; FT_PATH: a file's name, any text; FT_TEXT:
 * data.train_sources, lines of text (src/data/data_mix.h) */
typedef enum field_type {
    FT_INT, FT_I64, FT_U64, FT_FLOAT, FT_DOUBLE, FT_STR, FT_PATH, FT_TEXT
} field_type;

/* A root attribute every save writes and every open reads back, range-checked, and that
 * the state checksum covers. Its bounds are the job key's named `key` where one exists
 * (config.c's table: one copy of each rule), else [min, max]. Files of a format version
 * before `since` lack it and read `absent`. */
typedef struct state_attr {
    const char *name;
    field_type type;
    size_t offset;      /* of the field in ckpt_record */
    const char *key;
    double min, max;
    int since;
    double absent;
} state_attr;

#define ST(f) offsetof(ckpt_record, st.f)
#define KEY(name) name, 0, 0
#define IMAXD ((double)INT_MAX)
#define NODES ((double)(1 << 24))
static const state_attr state_attrs[] = {
    /* where training stands */
    {"step", FT_I64, ST(step), NULL, 0, IMAXD, 1, 0},
    {"adamw_step", FT_I64, ST(adamw_step), NULL, 0, IMAXD, 1, 0},
    {"skipped_in_a_row", FT_I64, ST(skipped_in_a_row), NULL, 0, IMAXD, 2, 0},
    {"tokens_seen", FT_I64, ST(tokens_seen), NULL, 0, (double)INT64_MAX, 1, 0},
    {"data_position", FT_U64, ST(data_position), NULL, 0, (double)UINT64_MAX, 1, 0},
    {"lr_last", FT_DOUBLE, ST(lr_last), KEY("train.lr"), 1, 0},
    {"lr_decay_from", FT_I64, ST(lr_decay_from), NULL, -1, IMAXD, 2, -1},
    {"lr_decay_lr", FT_DOUBLE, ST(lr_decay_lr), KEY("train.lr"), 2, 0},
    /* the data order, the batch and the schedule's length */
    {"train.seed", FT_U64, ST(seed), KEY("train.seed"), 1, 0},
    {"data.shuffle", FT_INT, ST(shuffle), KEY("data.shuffle"), 1, 0},
    {"train.global_batch", FT_INT, ST(global_batch), KEY("train.global_batch"), 1, 0},
    {"train.seq_len", FT_INT, ST(seq_len), KEY("train.seq_len"), 1, 0},
    {"train.steps", FT_INT, ST(steps), KEY("train.steps"), 1, 0},
    /* the training file, recognised on resume */
    {"data.train", FT_PATH, ST(data_train), NULL, 0, 0, 4, 0},
    {"data.train_bytes", FT_U64, ST(data_bytes), NULL, 0, (double)UINT64_MAX, 4, 0},
    {"data.train_fingerprint", FT_U64, ST(data_fingerprint), NULL, 0, (double)UINT64_MAX, 4, 0},
    {"data.train_sources", FT_TEXT, ST(data_sources), NULL, 0, 0, 5, 0},
    /* LoRA: the adapters the datasets are, the frozen base they were trained on */
    {"lora.rank", FT_INT, ST(lora_rank), KEY("lora.rank"), 5, 0},
    {"lora.targets", FT_INT, ST(lora_targets), NULL, 0, (1 << MODEL_N_TARGETS) - 1, 5, 0},
    {"lora.dora", FT_INT, ST(lora_dora), NULL, 0, 1, 5, 0},
    {"lora.base", FT_PATH, ST(lora_base), NULL, 0, 0, 5, 0},
    {"lora.base_fingerprint", FT_U64, ST(lora_base_fingerprint), NULL, 0, (double)UINT64_MAX, 5, 0},
    /* LoRA's arithmetic, for an export (0 in a full fine-tune's and in format-5 files) */
    {"lora.alpha", FT_FLOAT, ST(lora_alpha), NULL, 0, 1e6, 6, 0},
    {"lora.rslora", FT_INT, ST(lora_rslora), NULL, 0, 1, 6, 0},
    {"lora.dropout", FT_FLOAT, ST(lora_dropout), NULL, 0, 1, 6, 0},
    /* the sharding it was saved with (informative: any other loads it) */
    {"fsdp.strategy", FT_STR, ST(strategy), NULL, 0, 0, 1, 0},
    {"world_size", FT_INT, ST(world_size), NULL, 1, NODES, 1, 0},
    {"shard_group_size", FT_INT, ST(shard_size), NULL, 1, NODES, 1, 0},
    {"replica_group_size", FT_INT, ST(replica_size), NULL, 1, NODES, 1, 0},
};
#undef KEY
#define N_STATE_ATTRS ((int)(sizeof state_attrs / sizeof state_attrs[0]))

/* A numeric field's value (for bounds and messages). */
static double field_value(const ckpt_record *r, const state_attr *a) {
    const char *p = (const char *)r + a->offset;
    switch (a->type) {
    case FT_INT: return *(const int *)p;
    case FT_I64: return (double)*(const int64_t *)p;
    case FT_U64: return (double)*(const uint64_t *)p;
    case FT_FLOAT: return *(const float *)p;
    case FT_DOUBLE: return *(const double *)p;
    case FT_STR:
    case FT_PATH:
    case FT_TEXT: break;
    }
    return 0;
}

/* The field as text: integers in decimal, floating point as the 16 hex digits of the
 * IEEE-754 double stored in the file, strings as they are (the state checksum's form). */
static void field_text(const ckpt_record *r, const state_attr *a, char *out, size_t outlen) {
    const char *p = (const char *)r + a->offset;
    double d;
    uint64_t bits;
    switch (a->type) {
    case FT_INT: snprintf(out, outlen, "%d", *(const int *)p); return;
    case FT_I64: snprintf(out, outlen, "%lld", (long long)*(const int64_t *)p); return;
    case FT_U64: snprintf(out, outlen, "%llu", (unsigned long long)*(const uint64_t *)p); return;
    case FT_FLOAT:
    case FT_DOUBLE:
        d = a->type == FT_FLOAT ? (double)*(const float *)p : *(const double *)p;
        memcpy(&bits, &d, 8);
        snprintf(out, outlen, "%016llx", (unsigned long long)bits);
        return;
    case FT_STR:
    case FT_PATH:
    case FT_TEXT: snprintf(out, outlen, "%s", p); return;
    }
}

/* Whether value v of attribute a (shown as `shown`) lies in a's bounds; else -1 with
 * "PATH: attribute NAME = SHOWN: out of range, must be in [...] SUFFIX". */
static int check_value(const char *path, const state_attr *a, double v, const char *shown,
                       const char *suffix, char *err, size_t errlen) {
    char why[256];
    if (a->type == FT_PATH || a->type == FT_TEXT) return 0;
    if (a->type == FT_STR) {
        fsdp_strategy sg;
        if (strategy_from_name(shown, &sg, why, sizeof why) == 0) return 0;
    } else if (a->key) {
        if (job_key_check(a->key, v, why, sizeof why) == 0) return 0;
    } else if (v >= a->min && v <= a->max) {
        return 0;
    } else {
        snprintf(why, sizeof why, "out of range, must be in [%.0f, %.0f]", a->min, a->max);
    }
    io_set_err(err, errlen, "%s: attribute %s = %s: %s %s", path, a->name, shown, why, suffix);
    return -1;
}

int ckpt_record_check(const char *path, const ckpt_record *r, const char *suffix, char *err,
                      size_t errlen) {
    char why[256], val[40];
    for (int i = 0; i < N_STATE_ATTRS; i++) {
        const state_attr *a = &state_attrs[i];
        const double v = field_value(r, a);
        field_text(r, a, val, sizeof val);
        if (a->type == FT_FLOAT || a->type == FT_DOUBLE) snprintf(val, sizeof val, "%g", v);
        if (check_value(path, a, v, val, suffix, err, errlen) != 0) return -1;
    }
    const ckpt_state *st = &r->st;
    why[0] = '\0';
    if (st->adamw_step > st->step)
        snprintf(why, sizeof why, "attribute adamw_step = %lld is more than step = %lld",
                 (long long)st->adamw_step, (long long)st->step);
    else if (st->skipped_in_a_row > st->step - st->adamw_step)
        snprintf(why, sizeof why, "attribute skipped_in_a_row = %lld is more than the %lld "
                 "steps skipped", (long long)st->skipped_in_a_row,
                 (long long)(st->step - st->adamw_step));
    else if (st->lr_decay_from > st->step)
        snprintf(why, sizeof why, "attribute lr_decay_from = %lld is past step = %lld",
                 (long long)st->lr_decay_from, (long long)st->step);
    /* each step advances the position by one global batch, at most 2^30 samples */
    else if (st->data_position > (uint64_t)st->step << 30)
        snprintf(why, sizeof why, "attribute data_position = %llu is more than step %lld x "
                 "the largest train.global_batch (2^30)", (unsigned long long)st->data_position,
                 (long long)st->step);
    else if ((int64_t)st->shard_size * st->replica_size != st->world_size)
        snprintf(why, sizeof why, "attributes shard_group_size = %d x replica_group_size = %d "
                 "is not world_size = %d", st->shard_size, st->replica_size, st->world_size);
    if (why[0]) {
        io_set_err(err, errlen, "%s: %s %s", path, why, suffix);
        return -1;
    }
    if (model_shape_validate(&r->m, why, sizeof why) != 0) {
        io_set_err(err, errlen, "%s: bad model shape in the attributes: %s %s", path, why, suffix);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the shape */

/* The [model] keys of family f that a file of format `version` holds: every one from
 * version 5 on; version 4 all but RoPE's scaling (rope_type and its parameters: a format-4
 * file's model has plain RoPE, the keys' defaults); before, the Llama shape of that
 * version (tie_word_embeddings from 3). */
static int shape_key_stored(const model_family *f, int i, int version) {
    static const char *const before_4[] = {"dim", "n_layers", "n_heads", "n_kv_heads",
                                           "head_dim", "ffn_dim", "vocab_size", "max_seq_len",
                                           "norm_eps", "rope_theta", "init_std"};
    static const char *const from_5[] = {"rope_type", "rope_factor", "rope_low_freq_factor",
                                         "rope_high_freq_factor",
                                         "rope_original_max_position_embeddings"};
    const char *k = f->keys[i].key;
    if (version >= 5) return 1;
    for (size_t j = 0; j < sizeof from_5 / sizeof from_5[0]; j++)
        if (strcmp(k, from_5[j]) == 0) return 0;
    if (version >= 4) return 1;
    if (version >= 3 && strcmp(k, "tie_word_embeddings") == 0) return 1;
    for (size_t j = 0; j < sizeof before_4 / sizeof before_4[0]; j++)
        if (strcmp(k, before_4[j]) == 0) return 1;
    return 0;
}

/* The key's value as the state checksum writes it: field_text's forms (an enum as its
 * word). */
static void value_text(const key_def *k, const model_shape *m, char *out, size_t outlen) {
    const char *p = (const char *)model_shape_cdata(m) + k->offset;
    if (k->type == KT_FLOAT) {
        double d = *(const float *)p;
        uint64_t bits;
        memcpy(&bits, &d, 8);
        snprintf(out, outlen, "%016llx", (unsigned long long)bits);
    } else if (k->type == KT_INT || k->type == KT_BOOL) {
        snprintf(out, outlen, "%d", *(const int *)p);
    } else {
        key_format(k, model_shape_cdata(m), out, outlen);
    }
}

/* Appends "model.family=NAME\n" (version 4 on) and "model.KEY=VALUE\n" per stored key. */
static size_t shape_checksum_text(const model_shape *m, int version, char *text, size_t cap) {
    const model_family *f = m->family;
    size_t len = 0;
    char val[80];
    if (version >= 4) len += (size_t)snprintf(text + len, cap - len, "model.family=%s\n", f->name);
    for (int i = 0; i < f->n_keys; i++) {
        if (!shape_key_stored(f, i, version)) continue;
        value_text(&f->keys[i], m, val, sizeof val);
        len += (size_t)snprintf(text + len, cap - len, "model.%s=%s\n", f->keys[i].key, val);
    }
    return len;
}

static int write_shape(ckpt_h5_file *f, const model_shape *m, char *err, size_t errlen) {
    const model_family *fam = m->family;
    if (ckpt_h5_attr_write_str(f, "/", "model.family", fam->name, err, errlen) != 0) return -1;
    char name[96], text[80];
    for (int i = 0; i < fam->n_keys; i++) {
        const key_def *k = &fam->keys[i];
        const char *p = (const char *)model_shape_cdata(m) + k->offset;
        snprintf(name, sizeof name, "model.%s", k->key);
        int rc;
        if (k->type == KT_INT || k->type == KT_BOOL)
            rc = ckpt_h5_attr_write_i64(f, "/", name, *(const int *)p, err, errlen);
        else if (k->type == KT_FLOAT)
            rc = ckpt_h5_attr_write_f64(f, "/", name, *(const float *)p, err, errlen);
        else {
            key_format(k, model_shape_cdata(m), text, sizeof text);
            rc = ckpt_h5_attr_write_str(f, "/", name, text, err, errlen);
        }
        if (rc != 0) return -1;
    }
    return 0;
}

/* Reads the shape of a file of format `version` into *m: its family (Llama before version
 * 4), every key it holds, range-checked by the family's own table, the others at their
 * defaults. */
static int read_shape(ckpt_h5_file *f, int version, model_shape *m, char *err, size_t errlen) {
    const model_family *fam = family_named("llama");
    if (version >= 4) {
        char *name = NULL;
        if (ckpt_h5_attr_read_str(f, "/", "model.family", &name, err, errlen) != 0) return -1;
        fam = family_named(name);
        if (!fam) {
            io_set_err(err, errlen, "%s: attribute model.family = %.40s: not a model family this "
                       "build has (%s) " CKPT_CORRUPT, f->path, name, family_names());
            free(name);
            return -1;
        }
        free(name);
    }
    family_shape_defaults(fam, m);
    char name[96], why[256], shown[64];
    for (int i = 0; i < fam->n_keys; i++) {
        if (!shape_key_stored(fam, i, version)) continue;
        const key_def *k = &fam->keys[i];
        char *p = (char *)model_shape_data(m) + k->offset;
        snprintf(name, sizeof name, "model.%s", k->key);
        double v = 0;
        if (k->type == KT_INT || k->type == KT_BOOL) {
            int64_t i64;
            if (ckpt_h5_attr_read_i64(f, "/", name, &i64, err, errlen) != 0) return -1;
            v = (double)i64;
            snprintf(shown, sizeof shown, "%lld", (long long)i64);
        } else if (k->type == KT_FLOAT) {
            if (ckpt_h5_attr_read_f64(f, "/", name, &v, err, errlen) != 0) return -1;
            snprintf(shown, sizeof shown, "%g", v);
        } else {
            char *str = NULL;
            if (ckpt_h5_attr_read_str(f, "/", name, &str, err, errlen) != 0) return -1;
            int rc = key_parse(k, str, model_shape_data(m), why, sizeof why);
            if (rc != 0)
                io_set_err(err, errlen, "%s: attribute %s = %.40s: %s " CKPT_CORRUPT, f->path, name,
                           str, why);
            free(str);
            if (rc != 0) return -1;
            continue;
        }
        if (key_check_number(k, v, why, sizeof why) != 0) {
            io_set_err(err, errlen, "%s: attribute %s = %s: %s " CKPT_CORRUPT, f->path, name, shown, why);
            return -1;
        }
        if (k->type == KT_FLOAT) *(float *)p = (float)v;
        else *(int *)p = (int)v;
    }
    return 0;
}

static int write_record(ckpt_h5_file *f, const ckpt_record *r, char *err, size_t errlen) {
    for (int i = 0; i < N_STATE_ATTRS; i++) {
        const state_attr *a = &state_attrs[i];
        const char *p = (const char *)r + a->offset;
        int rc;
        switch (a->type) {
        case FT_INT: rc = ckpt_h5_attr_write_i64(f, "/", a->name, *(const int *)p, err, errlen); break;
        case FT_I64: rc = ckpt_h5_attr_write_i64(f, "/", a->name, *(const int64_t *)p, err, errlen); break;
        case FT_U64: rc = ckpt_h5_attr_write_u64(f, "/", a->name, *(const uint64_t *)p, err, errlen); break;
        case FT_FLOAT: rc = ckpt_h5_attr_write_f64(f, "/", a->name, *(const float *)p, err, errlen); break;
        case FT_DOUBLE: rc = ckpt_h5_attr_write_f64(f, "/", a->name, *(const double *)p, err, errlen); break;
        default: rc = ckpt_h5_attr_write_str(f, "/", a->name, p, err, errlen); break;
        }
        if (rc != 0) return -1;
    }
    return write_shape(f, &r->m, err, errlen);
}

int ckpt_record_read(ckpt_h5_file *f, int version, ckpt_record *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < N_STATE_ATTRS; i++) {
        const state_attr *a = &state_attrs[i];
        char *p = (char *)r + a->offset;
        int64_t i64 = (int64_t)a->absent;
        uint64_t u64 = 0;
        double d = a->absent;
        char *str = NULL;
        int rc = 0;
        const int present = version >= a->since;
        switch (a->type) {
        case FT_INT:
        case FT_I64:
            if (present) rc = ckpt_h5_attr_read_i64(f, "/", a->name, &i64, err, errlen);
            if (rc == 0 && a->type == FT_INT && (i64 < INT_MIN || i64 > INT_MAX)) {
                /* refused before an (int) cast could make 2^32 + 16 read as 16 */
                char shown[32];
                snprintf(shown, sizeof shown, "%lld", (long long)i64);
                check_value(f->path, a, (double)i64, shown, CKPT_CORRUPT, err, errlen);
                return -1;
            }
            if (a->type == FT_INT) *(int *)p = (int)i64;
            else *(int64_t *)p = i64;
            break;
        case FT_U64:
            if (present) rc = ckpt_h5_attr_read_u64(f, "/", a->name, &u64, err, errlen);
            *(uint64_t *)p = u64;
            break;
        case FT_FLOAT:
        case FT_DOUBLE:
            if (present) rc = ckpt_h5_attr_read_f64(f, "/", a->name, &d, err, errlen);
            if (a->type == FT_DOUBLE) *(double *)p = d;
            else *(float *)p = fabs(d) > FLT_MAX ? (float)copysign(INFINITY, d) : (float)d;
            break;
        case FT_STR: /* the one string field, fsdp.strategy */
            if (present) rc = ckpt_h5_attr_read_str(f, "/", a->name, &str, err, errlen);
            if (rc == 0) snprintf(p, sizeof r->st.strategy, "%s", str ? str : "");
            if (rc == 0 && str && strlen(str) >= sizeof r->st.strategy) {
                io_set_err(err, errlen, "%s: attribute %s is %zu characters long (a corrupt or "
                        "edited checkpoint)", f->path, a->name, strlen(str));
                rc = -1;
            }
            fsdp_strategy known;
            char why[256];
            if (rc == 0 && present && strategy_from_name(p, &known, why, sizeof why) != 0) {
                io_set_err(err, errlen, "%s: attribute %s is not a strategy (a corrupt or edited "
                        "checkpoint)", f->path, a->name);
                rc = -1;
            }
            free(str);
            break;
        case FT_PATH:
        case FT_TEXT: {
            const size_t cap = a->type == FT_PATH ? sizeof r->st.data_train
                                                  : sizeof r->st.data_sources;
            if (present) rc = ckpt_h5_attr_read_str(f, "/", a->name, &str, err, errlen);
            if (rc == 0 && str && strlen(str) >= cap) {
                io_set_err(err, errlen, "%s: attribute %s is %zu characters long (a corrupt or "
                        "edited checkpoint)", f->path, a->name, strlen(str));
                rc = -1;
            }
            if (rc == 0) snprintf(p, cap, "%s", str ? str : "");
            free(str);
            break;
        }
        }
        if (rc != 0) return -1;
    }
    return read_shape(f, version, &r->m, err, errlen);
}

static int cmp_ds_path(const void *a, const void *b) {
    return strcmp(((const ckpt_ds_entry *)a)->path, ((const ckpt_ds_entry *)b)->path);
}

/* The state checksum of a file of format `version`: sum64-pos (as of a dataset) of the
 * 32-bit little-endian words of this text, zero-padded to a multiple of 4 bytes: one line
 * "NAME=VALUE" per state attribute of that version in state_attrs order (field_text's
 * form), then one line "PATH SHAPE CHECKSUM" per dataset in byte order of the paths
 * (SHAPE: the dimensions joined by 'x'; CHECKSUM: 16 lowercase hex digits). It binds the
 * state to the file's structure: every dataset's name, shape and contents. Sorts ds. */
uint64_t ckpt_state_checksum(const ckpt_record *r, int version, ckpt_ds_entry *ds, int n) {
    qsort(ds, (size_t)n, sizeof *ds, cmp_ds_path);
    /* every line is shorter than 320 bytes (paths < 256, numbers < 24 digits) but the
     * data.train file's and its sources' (the fields' sizes) */
    const size_t cap = (size_t)(N_STATE_ATTRS + r->m.family->n_keys + n + 2) * 320 +
                       sizeof r->st.data_train + sizeof r->st.data_sources;
    size_t len = 0;
    char *text = calloc(cap, 1), *val = malloc(sizeof r->st.data_sources);
    SHLM_CHECK_ALLOC(text);
    SHLM_CHECK_ALLOC(val);
    for (int i = 0; i < N_STATE_ATTRS; i++) {
        if (state_attrs[i].since > version) continue;
        field_text(r, &state_attrs[i], val, sizeof r->st.data_sources);
        len += (size_t)snprintf(text + len, cap - len, "%s=%s\n", state_attrs[i].name, val);
    }
    free(val);
    len += shape_checksum_text(&r->m, version, text + len, cap - len);
    for (int i = 0; i < n; i++) {
        char dims[48];
        if (ds[i].ndim == 2)
            snprintf(dims, sizeof dims, "%lldx%lld", (long long)ds[i].shape[0],
                     (long long)ds[i].shape[1]);
        else
            snprintf(dims, sizeof dims, "%lld", (long long)ds[i].shape[0]);
        len += (size_t)snprintf(text + len, cap - len, "%s %s %016llx\n", ds[i].path, dims,
                                (unsigned long long)ds[i].checksum);
    }
    const uint64_t words = (len + 3) / 4; /* calloc'd: the padding is zeros */
    ckpt_h5_sum s = {0, 0};
    ckpt_h5_sum_add(&s, (const float *)(const void *)text, 0, words);
    free(text);
    return ckpt_h5_sum_final(&s, words);
}

int checkpoint_check_shape(const char *path, const model_shape *s, const model_shape *m,
                           char *err, size_t errlen) {
    const int i = model_shape_diff(s, m, KF_LAYOUT);
    if (i == -1) return 0;
    if (i == -2) {
        io_set_err(err, errlen, "%s holds a %s model, this job's is a %s model; refusing to load "
                   "it", path, s->family->name, m->family->name);
        return -1;
    }
    const model_family *f = s->family;
    char stored[64], job[64], list[600] = "";
    for (int k = 0; k < f->n_keys; k++) {
        if (!(f->keys[k].flags & KF_LAYOUT)) continue;
        key_format(&f->keys[k], model_shape_cdata(s), stored, sizeof stored);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s %s", list[0] ? ", " : "",
                 f->keys[k].key, stored);
    }
    key_format(&f->keys[i], model_shape_cdata(s), stored, sizeof stored);
    key_format(&f->keys[i], model_shape_cdata(m), job, sizeof job);
    io_set_err(err, errlen, "%s holds a different model: [model] %s = %s there, %s in this job "
               "(checkpoint: %s %s); refusing to load it", path, f->keys[i].key, stored, job,
               f->name, list);
    return -1;
}

/* The record is written in state_attrs order, the attribute state_attributes listing it. */
int ckpt_root_attrs_write(ckpt_h5_file *f, const ckpt_record *rec, const job_config *cfg,
                          char *err, size_t errlen) {
    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
    char h5v[32];
    snprintf(h5v, sizeof h5v, "%u.%u.%u", maj, min, rel);
#define I64(name, v) if (ckpt_h5_attr_write_i64(f, "/", name, (int64_t)(v), err, errlen)) return -1
#define U64(name, v) if (ckpt_h5_attr_write_u64(f, "/", name, (uint64_t)(v), err, errlen)) return -1
#define F64(name, v) if (ckpt_h5_attr_write_f64(f, "/", name, (double)(v), err, errlen)) return -1
#define STR(name, v) if (ckpt_h5_attr_write_str(f, "/", name, (v), err, errlen)) return -1
    STR("format", "shardlm-checkpoint");
    I64("format_version", CKPT_FORMAT_VERSION);
    STR("shardlm_version", PACKAGE_VERSION);
    STR("hdf5_version", h5v);
    STR("created_utc", when);
    STR("checksum_algorithm", CKPT_CHECKSUM_DOC);
    STR("state_checksum_text", CKPT_STATE_CHECKSUM_DOC);
    char names[2048] = "";
    for (int i = 0; i < N_STATE_ATTRS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? " " : "",
                 state_attrs[i].name);
    snprintf(names + strlen(names), sizeof names - strlen(names), " model.family");
    for (int i = 0; i < rec->m.family->n_keys; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), " model.%s",
                 rec->m.family->keys[i].key);
    STR("state_attributes", names);
    if (write_record(f, rec, err, errlen) != 0) return -1;
    U64("state_checksum", 0);
    /* informative: the rest of the schedule and AdamW, the job */
    I64("train.micro_batch", cfg->micro_batch);
    F64("train.lr", cfg->lr);
    F64("train.min_lr", cfg->min_lr);
    I64("train.warmup_steps", cfg->warmup_steps);
    F64("train.beta1", cfg->beta1);
    F64("train.beta2", cfg->beta2);
    F64("train.eps", cfg->eps);
    F64("train.weight_decay", cfg->weight_decay);
    F64("train.grad_clip", cfg->grad_clip);
    STR("job_path", cfg->path);
    STR("job_text", cfg->text ? cfg->text : "");
    I64("model.param_count", model_shape_param_count(&rec->m));
#undef I64
#undef U64
#undef F64
#undef STR
    return 0;
}

