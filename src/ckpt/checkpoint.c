/* Checkpoints (see checkpoint.h): shard-to-tensor slices for save and load, the commit
 * protocol and `latest`, keep-K pruning, resume resolution, Hugging Face import. */
#include "src/ckpt/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "io/ckpt_hdf5.h"
#include "io/errmsg.h"
#include "io/hf_model.h"
#include "io/safe_file.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "shlm_config.h"
#include "src/base/agree.h"
#include "src/base/shard.h"
#include "src/families/families.h"

/* 2: the state checksum, skipped_in_a_row, lr_decay_from, lr_decay_lr; 3:
 * model.tie_word_embeddings (older files are untied) and the /hf group of Hugging Face
 * files; 4: model.family and every [model] key of that family (older files are Llama
 * shapes: the keys of version 3, the others at their defaults), and data.train,
 * data.train_bytes, data.train_fingerprint (the training file); versions 1 to 3 are read
 * too (version 1's state range-checked, without a checksum to compare) */
enum { CKPT_FORMAT_VERSION = 4, CKPT_FORMAT_OLDEST = 1, N_KINDS = 3 };

const char *const checkpoint_groups[FSDP_STATE_N] = {"/model", "/optim/exp_avg",
                                                     "/optim/exp_avg_sq"};
#define kind_group checkpoint_groups
#define HF_GROUP "/hf"

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

/* A byte count for messages: "2.638 GB", "1.13 MB", "228.5 kB". */
typedef struct human_t {
    char s[32];
} human_t;
static human_t human(double b) {
    human_t h;
    if (b >= 1e9) snprintf(h.s, sizeof h.s, "%.3f GB", b / 1e9);
    else if (b >= 1e6) snprintf(h.s, sizeof h.s, "%.2f MB", b / 1e6);
    else snprintf(h.s, sizeof h.s, "%.1f kB", b / 1e3);
    return h;
}

/* A tensor's shape for messages: "[16]", "[64, 256]". */
typedef struct shape_t {
    char s[96];
} shape_t;
static shape_t shape_text(int ndim, const int64_t *shape) {
    shape_t t = {"["};
    for (int i = 0; i < ndim; i++)
        snprintf(t.s + strlen(t.s), sizeof t.s - strlen(t.s), "%s%lld", i ? ", " : "",
                 (long long)shape[i]);
    snprintf(t.s + strlen(t.s), sizeof t.s - strlen(t.s), "]");
    return t;
}

/* ---------------------------------------------------------------- deadlines */

/* Every collective function here runs as a guarded region of the comm watchdog
 * (kernels/comm/comm_watchdog.h): a rank that stops answering ends the job within
 * runtime.comm_timeout_s or two, named, wherever in HDF5 the others wait. While every rank
 * answers, a region may last the timeout plus its bytes at CKPT_SLOWEST_BYTES_S, at least
 * CKPT_GUARD_FLOOR_S more: a big checkpoint on a slow disk is not a hang, a file system
 * that never returns is. */
#define CKPT_SLOWEST_BYTES_S 10e6
#define CKPT_GUARD_FLOOR_S 60.0
#define CKPT_LIMIT_NOTE                                                                    \
    "a checkpoint save or load may last runtime.comm_timeout_s + its size at 10 MB/s (at " \
    "least 60 s) while every rank answers"

/* The last component of path, for the watchdog's short texts. */
static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash && slash[1] ? slash + 1 : path;
}

/* The bytes of the model's tensors, `kinds` state kinds of them. */
static uint64_t layout_bytes(const model_layout *lay, int kinds) {
    uint64_t b = 0;
    for (int u = 0; u < lay->n_units; u++)
        for (int i = 0; i < lay->units[u].n_tensors; i++)
            b += lay->units[u].tensors[i].numel * sizeof(float);
    return b * (uint64_t)kinds;
}

static void guard_begin(const char *what, uint64_t bytes) {
    double more = (double)bytes / CKPT_SLOWEST_BYTES_S;
    if (more < CKPT_GUARD_FLOOR_S) more = CKPT_GUARD_FLOOR_S;
    shlm_guard_begin(what, shlm_comm_timeout_s() + more, CKPT_LIMIT_NOTE);
}

/* The number of elements of x[0, n) that are NaN or infinite. */
static uint64_t count_nonfinite(const float *x, size_t n) {
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}

/* The piece of this rank's shard of unit u that it writes on save and checksums on
 * load: the shard split into replica_size pieces, so that replicas, which hold the same
 * shard, move each byte once. */
static void my_piece(fsdp_engine *e, const topology *t, int u, size_t *begin, size_t *end) {
    size_t b, en;
    fsdp_shard_range(e, u, &b, &en);
    const size_t n = en - b, R = (size_t)t->replica_size, j = (size_t)t->replica_rank;
    *begin = b + n * j / R;
    *end = b + n * (j + 1) / R;
}

/* Every tensor of the layout in (unit, tensor) order, as a flat list. */
typedef struct tensor_ref {
    int unit;
    const model_tensor *t;
} tensor_ref;

static tensor_ref *list_tensors(const model_layout *lay, int *n) {
    int total = 0;
    for (int u = 0; u < lay->n_units; u++) total += lay->units[u].n_tensors;
    tensor_ref *r = malloc((size_t)total * sizeof *r);
    SHLM_CHECK_ALLOC(r);
    int k = 0;
    for (int u = 0; u < lay->n_units; u++)
        for (int i = 0; i < lay->units[u].n_tensors; i++) r[k++] = (tensor_ref){u, &lay->units[u].tensors[i]};
    *n = total;
    return r;
}

static size_t max_shard_numel(fsdp_engine *e) {
    size_t m = 1;
    for (int u = 0; u < fsdp_layout(e)->n_units; u++) {
        size_t b, en;
        fsdp_shard_range(e, u, &b, &en);
        if (en - b > m) m = en - b;
    }
    return m;
}

/* ---------------------------------------------------------------- state */

/* What the root attributes of the state, the sharding and the shape hold. */
typedef struct ckpt_record {
    ckpt_state st;
    model_shape m;
} ckpt_record;

/* FT_STR: fsdp.strategy, a strategy's name; FT_PATH: a file's name, any text */
typedef enum field_type { FT_INT, FT_I64, FT_U64, FT_FLOAT, FT_DOUBLE, FT_STR, FT_PATH } field_type;

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
    /* the sharding it was saved with (informative: any other loads it) */
    {"fsdp.strategy", FT_STR, ST(strategy), NULL, 0, 0, 1, 0},
    {"world_size", FT_INT, ST(world_size), NULL, 1, NODES, 1, 0},
    {"shard_group_size", FT_INT, ST(shard_size), NULL, 1, NODES, 1, 0},
    {"replica_group_size", FT_INT, ST(replica_size), NULL, 1, NODES, 1, 0},
};
#undef KEY
#define N_STATE_ATTRS ((int)(sizeof state_attrs / sizeof state_attrs[0]))
#define CORRUPT "(a corrupt or edited checkpoint)"

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
    case FT_PATH: break;
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
    case FT_PATH: snprintf(out, outlen, "%s", p); return;
    }
}

/* Whether value v of attribute a (shown as `shown`) lies in a's bounds; else -1 with
 * "PATH: attribute NAME = SHOWN: out of range, must be in [...] SUFFIX". */
static int check_value(const char *path, const state_attr *a, double v, const char *shown,
                       const char *suffix, char *err, size_t errlen) {
    char why[256];
    if (a->type == FT_PATH) return 0;
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

/* Whether every field lies in its bounds and the fields agree with each other; else -1
 * with the first problem, followed by suffix (what it means for the caller). */
static int check_record(const char *path, const ckpt_record *r, const char *suffix, char *err,
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
 * version 4 on; before, the Llama shape of that version (tie_word_embeddings from 3). */
static int shape_key_stored(const model_family *f, int i, int version) {
    static const char *const before_4[] = {"dim", "n_layers", "n_heads", "n_kv_heads",
                                           "head_dim", "ffn_dim", "vocab_size", "max_seq_len",
                                           "norm_eps", "rope_theta", "init_std"};
    const char *k = f->keys[i].key;
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
                       "build has (%s) " CORRUPT, f->path, name, family_names());
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
                io_set_err(err, errlen, "%s: attribute %s = %.40s: %s " CORRUPT, f->path, name,
                           str, why);
            free(str);
            if (rc != 0) return -1;
            continue;
        }
        if (key_check_number(k, v, why, sizeof why) != 0) {
            io_set_err(err, errlen, "%s: attribute %s = %s: %s " CORRUPT, f->path, name, shown, why);
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

/* Reads every state attribute of a file of format `version` into *r, unchecked. */
static int read_record(ckpt_h5_file *f, int version, ckpt_record *r, char *err, size_t errlen) {
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
                check_value(f->path, a, (double)i64, shown, CORRUPT, err, errlen);
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
            if (present) rc = ckpt_h5_attr_read_str(f, "/", a->name, &str, err, errlen);
            if (rc == 0 && str && strlen(str) >= sizeof r->st.data_train) {
                io_set_err(err, errlen, "%s: attribute %s is %zu characters long (a corrupt or "
                        "edited checkpoint)", f->path, a->name, strlen(str));
                rc = -1;
            }
            if (rc == 0) snprintf(p, sizeof r->st.data_train, "%s", str ? str : "");
            free(str);
            break;
        }
        if (rc != 0) return -1;
    }
    return read_shape(f, version, &r->m, err, errlen);
}

/* A dataset of the checkpoint as the state checksum sees it. */
typedef struct ds_entry {
    char path[256];
    int ndim;
    int64_t shape[2];
    uint64_t checksum;
} ds_entry;

static int cmp_ds_path(const void *a, const void *b) {
    return strcmp(((const ds_entry *)a)->path, ((const ds_entry *)b)->path);
}

/* The state checksum of a file of format `version`: sum64-pos (as of a dataset) of the
 * 32-bit little-endian words of this text, zero-padded to a multiple of 4 bytes: one line
 * "NAME=VALUE" per state attribute of that version in state_attrs order (field_text's
 * form), then one line "PATH SHAPE CHECKSUM" per dataset in byte order of the paths
 * (SHAPE: the dimensions joined by 'x'; CHECKSUM: 16 lowercase hex digits). It binds the
 * state to the file's structure: every dataset's name, shape and contents. Sorts ds. */
static uint64_t state_checksum(const ckpt_record *r, int version, ds_entry *ds, int n) {
    qsort(ds, (size_t)n, sizeof *ds, cmp_ds_path);
    /* every line is shorter than 320 bytes (paths < 256, numbers < 24 digits) but the
     * data.train file's (the field's size) */
    const size_t cap = (size_t)(N_STATE_ATTRS + r->m.family->n_keys + n + 2) * 320 +
                       sizeof r->st.data_train;
    size_t len = 0;
    char *text = calloc(cap, 1);
    SHLM_CHECK_ALLOC(text);
    char val[sizeof r->st.data_train];
    for (int i = 0; i < N_STATE_ATTRS; i++) {
        if (state_attrs[i].since > version) continue;
        field_text(r, &state_attrs[i], val, sizeof val);
        len += (size_t)snprintf(text + len, cap - len, "%s=%s\n", state_attrs[i].name, val);
    }
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

/* ---------------------------------------------------------------- save */

/* 1 when name is a checkpoint file's name as `latest` may give it: step_<N>.h5 with N
 * decimal digits (no sign, no path, never "." or ".."). */
static int is_checkpoint_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return 0;
    const char *p = name + 5;
    size_t digits = strspn(p, "0123456789");
    return digits >= 1 && digits <= 19 && strcmp(p + digits, ".h5") == 0;
}


/* Writes the root attributes: the state record (state_attrs), a placeholder state
 * checksum (set once the datasets' checksums are known), and what is only informative:
 * versions, the time, the job's text and path, AdamW's hyper-parameters. */
static int write_state_attrs(ckpt_h5_file *f, const ckpt_record *rec, const job_config *cfg,
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

/* Test hooks SHLM_TEST_KILL_IN_SAVE, SHLM_TEST_STOP_IN_SAVE, SHLM_TEST_SLOW_SAVE,
 * SHLM_TEST_STOP_IN_LOAD (checkpoint.h) = RANK[:STEP]: whether hook `var` hits this rank in the save or load of
 * `step` (-1: a load, which takes no STEP). */
static int test_hook_hits(const char *var, int rank, int64_t step) {
    const char *v = getenv(var);
    if (!v || !*v) return 0;
    long r = -1;
    long long s = -1;
    int n = sscanf(v, "%ld:%lld", &r, &s);
    return n >= 1 && r == rank && (n == 1 || s == step);
}

/* SHLM_TEST_STOP_IN_*: this rank stops (SIGSTOP) where it stands, `where` saying so. */
static void test_stop(const char *var, int rank, const char *where) {
    fprintf(stderr, "shardlm: %s: rank %d stops itself (SIGSTOP) %s\n", var, rank, where);
    fflush(stderr);
    raise(SIGSTOP);
}

/* Renames tmp into place, fsyncs, and points <dir>/latest at it (rank 0 only); both
 * renames refuse a symbolic link at the name they replace (io/safe_file.h). */
static int commit(const char *dir, const char *tmp, const char *final, const char *name,
                  char *err, size_t errlen) {
    if (safe_file_fsync(tmp, 0, err, errlen) != 0) return -1;
    if (safe_file_rename(tmp, final, err, errlen) != 0) return -1;
    char latest[1100], line[80];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", name);
    return safe_file_write_all(latest, line, strlen(line), err, errlen);
}

static int cmp_i64_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Removes the temporary files of failed saves and commits (step_<N>.h5.tmp.*,
 * latest.tmp.*, .shardlm-probe.tmp.*: regular files only, a link is neither followed nor
 * removed) and, with keep > 0, the step_*.h5 beyond the newest `keep` (never `saved`).
 * Rank 0 only, after a commit, under the directory's lock (no other run's files are
 * there); problems are printed, not fatal. */
static void prune(const char *dir, int keep, int64_t saved) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    char path[2100];
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        long long s;
        char canon[64] = "";
        if (sscanf(nm, "step_%lld.h5", &s) == 1) snprintf(canon, sizeof canon, "step_%lld.h5", s);
        if (canon[0] && strcmp(nm, canon) == 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                int64_t *g = realloc(steps, cap * sizeof *steps);
                if (!g) break;
                steps = g;
            }
            steps[n++] = s;
            continue;
        }
        if (!(canon[0] && safe_file_is_temp_of(nm, canon)) && !safe_file_is_temp_of(nm, "latest") &&
            !safe_file_is_temp_of(nm, ".shardlm-probe"))
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), nm, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        if (unlink(path) == 0) printf("checkpoint: removed %s (left by a failed save)\n", path);
    }
    closedir(d);
    if (keep > 0 && n > (size_t)keep) {
        qsort(steps, n, sizeof *steps, cmp_i64_desc);
        for (size_t i = (size_t)keep; i < n; i++) {
            if (steps[i] == saved) continue;
            snprintf(path, sizeof path, "%s/step_%lld.h5", dir, (long long)steps[i]);
            if (unlink(path) == 0) printf("checkpoint: removed %s (checkpoint.keep = %d)\n", path, keep);
            else fprintf(stderr, "shardlm: warning: cannot remove %s: %s\n", path, strerror(errno));
        }
    }
    free(steps);
}

/* The bytes of the files kept for export. */
static uint64_t hf_bytes(const hf_files *hf) {
    uint64_t b = 0;
    for (int i = 0; hf && i < hf->n; i++) b += hf->f[i].size;
    return b;
}

/* How a save moves its data: the job's [checkpoint] direct_io, collective_io, alignment
 * (datasets of at least `alignment` bytes start at a multiple of it). */
static void save_options(const job_config *cfg, ckpt_h5_options *opt) {
    ckpt_h5_default_options(opt);
    opt->direct_io = cfg->ckpt_direct_io;
    opt->collective_io = cfg->ckpt_collective_io;
    opt->alignment = (uint64_t)cfg->ckpt_alignment;
    opt->align_threshold = opt->alignment;
}

/* An upper bound of the file's size: data, alignment gaps, metadata, the kept files. */
static uint64_t estimate_file_bytes(const tensor_ref *tl, int nt, const ckpt_h5_options *opt,
                                    size_t job_len, const hf_files *hf) {
    /* metadata comes in blocks of 1 MiB (make_fapl): ~2 KiB per dataset (object header,
     * checksum, group links) and the root attributes, rounded up, plus a spare block */
    const uint64_t mib = 1u << 20;
    uint64_t meta = 64 * 1024 + 2 * job_len + (uint64_t)N_KINDS * nt * 2048;
    uint64_t b = (meta + mib - 1) / mib * mib + mib + hf_bytes(hf);
    for (int k = 0; k < N_KINDS; k++) {
        for (int i = 0; i < nt; i++) {
            uint64_t n = tl[i].t->numel * sizeof(float);
            b += n;
            if (opt->alignment > 1 && n >= opt->align_threshold) b += opt->alignment;
        }
    }
    return b;
}

/* Whether the file fits before a byte is written: the file-size limit of this process
 * (ulimit -f) on every rank, free space on rank 0. A disk that fills up during the save
 * still fails it cleanly (ckpt_h5_flush); this only says so sooner and more clearly.
 * Test hook: SHLM_TEST_NO_SPACE_CHECK=1 turns it off (to fill a disk mid-save). */
static int check_space(const char *dir, int rank, uint64_t need, char *err, size_t errlen) {
    const char *v = getenv("SHLM_TEST_NO_SPACE_CHECK");
    if (v && strcmp(v, "1") == 0) return 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (uint64_t)rl.rlim_cur < need) {
        io_set_err(err, errlen, "the checkpoint needs about %s but this process may write files "
                "of at most %s (ulimit -f)", human((double)need).s, human((double)rl.rlim_cur).s);
        return -1;
    }
    struct statvfs sv;
    if (rank == 0 && statvfs(dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < need) {
        io_set_err(err, errlen, "not enough space in %s: the checkpoint needs about %s, %s are "
                "free", dir, human((double)need).s, human((double)sv.f_bavail * sv.f_frsize).s);
        return -1;
    }
    return 0;
}

/* The longest name a save creates in checkpoint.dir, its unpredictable suffix included. */
#define LONGEST_CKPT_NAME "/step_9223372036854775807.h5.tmp.0123456789abcdef"

/* Refuses a symbolic link at `latest` or at any step_<N>.h5 in dir (rank 0): a save would
 * replace it, and whoever made it expects the write to go through it. */
static int refuse_links(const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        io_set_err(err, errlen, "checkpoint.dir = %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        struct stat sb;
        if (strcmp(de->d_name, "latest") != 0 && !is_checkpoint_name(de->d_name)) continue;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(sb.st_mode))
            continue;
        char path[2100];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        rc = safe_file_refuse_link(path, err, errlen);
    }
    closedir(d);
    return rc;
}

static int dir_open(fsdp_engine *e, const topology *topo, const job_config *cfg,
                    const hf_files *hf, int *lock_fd, char *err, size_t errlen) {
    const char *dir = cfg->ckpt_dir;
    const int rank = topo->world_rank;
    *lock_fd = -1;
    if (!dir[0]) return 0;
    const size_t most = sizeof(((ckpt_h5_file *)0)->path) - 1 - strlen(LONGEST_CKPT_NAME);
    if (strlen(dir) > most) {
        io_set_err(err, errlen, "checkpoint.dir is %zu characters long, at most %zu fit (its "
                "files' paths must stay under %zu characters)", strlen(dir), most,
                sizeof(((ckpt_h5_file *)0)->path));
        return -1;
    }
    int ok = 1;
    char why[1536] = "";
    if (rank == 0) {
        char lock[1100], owner[1400];
        snprintf(lock, sizeof lock, "%s/shardlm.lock", dir);
        snprintf(owner, sizeof owner, "host %s pid %ld job %016llx (%s)", shlm_host(),
                 (long)getpid(), (unsigned long long)job_config_hash(cfg), cfg->path);
        ok = safe_file_mkdir_p(dir, why, sizeof why) == 0;
        if (!ok) {
            io_set_err(err, errlen, "checkpoint.dir = %s: %s", dir, why);
        } else {
            int lr = safe_file_lock(lock, owner, lock_fd, why, sizeof why);
            if (lr == 1) fprintf(stderr, "shardlm: warning: %s\n", why);
            if (lr == -2)
                io_set_err(err, errlen, "checkpoint.dir = %s is in use by another run (%s): two "
                        "runs must not share a checkpoint directory", dir, why);
            else if (lr == -1)
                io_set_err(err, errlen, "checkpoint.dir = %s: %s", dir, why);
            ok = lr >= 0;
        }
        if (ok) ok = refuse_links(dir, err, errlen) == 0;
        if (ok && safe_file_probe_dir(dir, why, sizeof why) != 0) {
            ok = 0;
            io_set_err(err, errlen, "checkpoint.dir = %s is not writable: %s", dir, why);
        }
    }
    if (ranks_agree(topo->world, ok, err, errlen) == 0) {
        /* what each save checks again: the file (an upper bound) must fit */
        int nt;
        tensor_ref *tl = list_tensors(fsdp_layout(e), &nt);
        ckpt_h5_options opt;
        save_options(cfg, &opt);
        const uint64_t need =
            estimate_file_bytes(tl, nt, &opt, cfg->text ? strlen(cfg->text) : 0, hf);
        free(tl);
        ok = check_space(dir, rank, need, err, errlen) == 0;
        if (ranks_agree(topo->world, ok, err, errlen) == 0) return 0;
    }
    checkpoint_dir_close(lock_fd);
    return -1;
}

int checkpoint_dir_open(fsdp_engine *e, const topology *topo, const job_config *cfg,
                        const hf_files *hf, int *lock_fd, char *err, size_t errlen) {
    guard_begin("opening checkpoint.dir", 0);
    const int rc = dir_open(e, topo, cfg, hf, lock_fd, err, errlen);
    shlm_guard_end();
    return rc;
}

void checkpoint_dir_close(int *lock_fd) {
    if (*lock_fd >= 0) close(*lock_fd);
    *lock_fd = -1;
}

static int save(fsdp_engine *e, const topology *topo, const job_config *cfg,
                const ckpt_state *st, const hf_files *hf, const char *dir, int keep, char *err,
                size_t errlen) {
    /* a full disk or a file-size limit must fail the write (EFBIG), not kill the rank */
    signal(SIGXFSZ, SIG_IGN);
    MPI_Comm comm = topo->world;
    const int rank = topo->world_rank;
    const double t0 = MPI_Wtime();
    const model_layout *lay = fsdp_layout(e);
    char name[64], final[1100], tmp[1200] = "";
    snprintf(name, sizeof name, "step_%lld.h5", (long long)st->step);
    snprintf(final, sizeof final, "%s/%s", dir, name);

    /* rank 0 picks an unpredictable temporary name, which all ranks then create
     * exclusively (a planted link at a guessable name would be written through) */
    shlm_guard_phase("choosing the file name");
    int ok = rank != 0 || (safe_file_mkdir_p(dir, err, errlen) == 0 &&
                           safe_file_refuse_link(final, err, errlen) == 0 &&
                           safe_file_temp_name(final, tmp, sizeof tmp, err, errlen) == 0);
    if (ranks_agree(comm, ok, err, errlen)) return -1;
    MPI_CHECK(MPI_Bcast(tmp, (int)sizeof tmp, MPI_CHAR, 0, comm));

    int nt;
    tensor_ref *tl = list_tensors(lay, &nt);
    const int nd = N_KINDS * nt;
    ckpt_h5_dataset *ds = calloc((size_t)nd, sizeof *ds);
    uint64_t *sums = calloc((size_t)nd * 2, sizeof *sums);
    float *buf = malloc(max_shard_numel(e) * sizeof(float));
    SHLM_CHECK_ALLOC(ds);
    SHLM_CHECK_ALLOC(sums);
    SHLM_CHECK_ALLOC(buf);
    for (int i = 0; i < nd; i++) ds[i].id = -1;
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    ckpt_h5_options opt;
    save_options(cfg, &opt);
    double t_data = 0, t_close = 0;
    uint64_t bytes = 0;
    int close_failed = 0, created = 0; /* created: tmp is this save's file */
    double prof[4] = {0, 0, 0, 0}; /* this rank's data phase: copy, write, checksum, wait */

    /* the state as it will be read back: a file no load would accept is not written */
    shlm_guard_phase("checking the state and the free space");
    ckpt_record rec = {.st = *st, .m = cfg->model};
    snprintf(rec.st.strategy, sizeof rec.st.strategy, "%s", strategy_name(topo->strategy));
    rec.st.world_size = topo->world_size;
    rec.st.shard_size = topo->shard_size;
    rec.st.replica_size = topo->replica_size;
    ok = check_record(final, &rec, "(refusing to write a checkpoint no load would accept)", err,
                      errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto fail_closed;

    const uint64_t need = estimate_file_bytes(tl, nt, &opt, cfg->text ? strlen(cfg->text) : 0, hf);
    ok = check_space(dir, rank, need, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto fail_closed;

    /* all metadata first, flushed, so that a failing data write leaves a file that
     * closes cleanly (ckpt_h5_flush); checksum attributes start at 0 and are set at the end */
    shlm_guard_phase("creating the file");
    ok = ckpt_h5_create(&f, tmp, comm, &opt, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto fail;
    created = 1;
    if (test_hook_hits("SHLM_TEST_STOP_IN_SAVE", rank, st->step))
        test_stop("SHLM_TEST_STOP_IN_SAVE", rank, "in the save, its file created");
    shlm_guard_phase("writing the metadata");
    for (int k = 0; ok && k < N_KINDS; k++) ok = ckpt_h5_create_group(&f, kind_group[k], err, errlen) == 0;
    for (int i = 0; ok && i < nd; i++) {
        const model_tensor *t = tl[i % nt].t;
        char path[256];
        snprintf(path, sizeof path, "%s/%s", kind_group[i / nt], t->name);
        ok = ckpt_h5_create_dataset(&f, path, t->ndim, t->shape, &ds[i], err, errlen) == 0 &&
             ckpt_h5_attr_write_u64(&f, path, "checksum", 0, err, errlen) == 0;
        bytes += t->numel * sizeof(float);
    }
    /* the kept files: created, with their checksums, here; written with the data */
    const int n_hf = hf ? hf->n : 0;
    if (ok && n_hf) ok = ckpt_h5_create_group(&f, HF_GROUP, err, errlen) == 0;
    for (int i = 0; ok && i < n_hf; i++) {
        char path[256];
        snprintf(path, sizeof path, HF_GROUP "/%s", hf->f[i].name);
        ok = ckpt_h5_create_bytes(&f, path, hf->f[i].data, hf->f[i].size, err, errlen) == 0;
        bytes += hf->f[i].size;
    }
    if (ok) ok = write_state_attrs(&f, &rec, cfg, err, errlen) == 0;
    if (ok) ok = ckpt_h5_flush(&f, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto fail;
    t_data = MPI_Wtime();
    shlm_guard_phase("writing the data");

    /* the data: per state kind and unit, this rank's shard once from the engine, then
     * its piece of every tensor the shard overlaps. Ranks do not wait for each other
     * between datasets (they agree once, after the last): a rank whose write failed keeps
     * joining the calls with nothing to write, as H5Dwrite is collective */
    const int kill_me = test_hook_hits("SHLM_TEST_KILL_IN_SAVE", rank, st->step);
    int done = 0;
    ok = 1;
    for (int k = 0; k < N_KINDS; k++) {
        for (int u = 0; u < lay->n_units; u++) {
            size_t sb, se, pb, pe;
            fsdp_shard_range(e, u, &sb, &se);
            my_piece(e, topo, u, &pb, &pe);
            double tc = MPI_Wtime();
            fsdp_get_state(e, u, (fsdp_state_kind)k, buf);
            prof[0] += MPI_Wtime() - tc;
            for (int i = 0; i < nt; i++) {
                if (tl[i].unit != u) continue;
                const int di = k * nt + i;
                const model_tensor *t = tl[i].t;
                shard_overlap ov;
                shard_intersect(pb, pe, t->offset, t->numel, &ov);
                const float *src = buf + (ov.count ? ov.flat_offset - sb : 0);
                double tw = MPI_Wtime();
                if (ckpt_h5_write_range(&f, &ds[di], ov.tensor_offset, ok ? ov.count : 0, src,
                                        err, errlen) != 0)
                    ok = 0;
                double ts = MPI_Wtime();
                ckpt_h5_sum s = {0, 0};
                const uint64_t bad = ckpt_h5_sum_add(&s, src, ov.tensor_offset, ov.count);
                sums[2 * di] = s.s1;
                sums[2 * di + 1] = s.s2;
                /* `latest` never names a checkpoint with a NaN or an infinity in it */
                if (bad && ok)
                    io_set_err(err, errlen, "%s: %llu of the %llu elements rank %d writes are not "
                            "finite (NaN or infinite): refusing to save them", ds[di].path,
                            (unsigned long long)bad, (unsigned long long)ov.count, rank);
                if (bad) ok = 0;
                double ta = MPI_Wtime();
                prof[1] += ts - tw;
                prof[2] += ta - ts;
                if (kill_me && ++done == nd / 2) {
                    fprintf(stderr, "shardlm: SHLM_TEST_KILL_IN_SAVE: rank %d raises SIGKILL "
                            "after %d of %d datasets of %s\n", rank, done, nd, tmp);
                    fflush(stderr);
                    raise(SIGKILL);
                }
            }
        }
    }
    if (test_hook_hits("SHLM_TEST_SLOW_SAVE", rank, st->step)) {
        /* a disk this slow: the others wait for this rank through two roll calls */
        const double secs = 2 * shlm_comm_timeout_s();
        fprintf(stderr, "shardlm: SHLM_TEST_SLOW_SAVE: rank %d takes %.0f s more to write its "
                "data\n", rank, secs);
        fflush(stderr);
        struct timespec left = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
        while (nanosleep(&left, &left) != 0 && errno == EINTR) {
        }
    }
    for (int i = 0; i < n_hf; i++) { /* a failed rank still joins the calls (collective) */
        char path[256];
        snprintf(path, sizeof path, HF_GROUP "/%s", hf->f[i].name);
        if (ckpt_h5_write_bytes(&f, path, hf->f[i].data, hf->f[i].size, err, errlen) != 0) ok = 0;
    }
    double tw = MPI_Wtime();
    if (ranks_agree(comm, ok, err, errlen)) goto fail;
    prof[3] += MPI_Wtime() - tw;
    shlm_guard_phase("completing the checksums");
    /* complete the checksums: every element was summed by exactly one rank */
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 2 * nd, MPI_UINT64_T, MPI_SUM, comm));
    ok = 1;
    ds_entry *entries = calloc((size_t)(nd + n_hf), sizeof *entries);
    SHLM_CHECK_ALLOC(entries);
    for (int i = 0; i < n_hf; i++) {
        ds_entry *de = &entries[nd + i];
        snprintf(de->path, sizeof de->path, HF_GROUP "/%s", hf->f[i].name);
        de->ndim = 1;
        de->shape[0] = (int64_t)hf->f[i].size;
        de->checksum = ckpt_h5_bytes_checksum(hf->f[i].data, hf->f[i].size);
    }
    for (int i = 0; ok && i < nd; i++) {
        ckpt_h5_sum s = {sums[2 * i], sums[2 * i + 1]};
        ds_entry *de = &entries[i];
        snprintf(de->path, sizeof de->path, "%s", ds[i].path);
        de->ndim = ds[i].ndim;
        de->shape[0] = ds[i].shape[0];
        de->shape[1] = ds[i].shape[1];
        de->checksum = ckpt_h5_sum_final(&s, ds[i].numel);
        ok = ckpt_h5_attr_write_u64(&f, ds[i].path, "checksum", de->checksum, err, errlen) == 0;
    }
    if (ok)
        ok = ckpt_h5_attr_write_u64(&f, "/", "state_checksum",
                                    state_checksum(&rec, CKPT_FORMAT_VERSION, entries, nd + n_hf),
                                    err, errlen) == 0;
    free(entries);
    if (ranks_agree(comm, ok, err, errlen)) goto fail;
    t_close = MPI_Wtime();
    shlm_guard_phase("closing the file");
    for (int i = 0; i < nd; i++) ckpt_h5_close_dataset(&ds[i]);
    ok = ckpt_h5_close(&f, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) {
        close_failed = 1;
        goto fail_closed;
    }

    /* commit: only now does the checkpoint exist under its name and in `latest` */
    const double t_commit = MPI_Wtime();
    shlm_guard_phase("committing it (fsync, rename, latest)");
    ok = rank != 0 || commit(dir, tmp, final, name, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto fail_closed;
    const double t1 = MPI_Wtime();
    if (rank == 0) {
        printf("checkpoint: saved step %lld to %s: %s in %.3f s = %.2f GB/s (create %.3f s, "
               "data %.3f s [rank 0: copy %.3f, write %.3f, checksum %.3f, wait %.3f], close %.3f s, "
               "fsync+rename %.3f s; %d ranks, %s)\n",
               (long long)st->step, final, human((double)bytes).s,
               t1 - t0, bytes / 1e9 / (t1 - t0), t_data - t0, t_close - t_data, prof[0],
               prof[1], prof[2], prof[3],
               t_commit - t_close, t1 - t_commit, topo->world_size,
               f.io_mode);
        prune(dir, keep, st->step);
        fflush(stdout);
    }
    free(tl);
    free(ds);
    free(sums);
    free(buf);
    return 0;

fail:
    shlm_guard_phase("removing the failed file");
    for (int i = 0; i < nd; i++) ckpt_h5_close_dataset(&ds[i]);
    if (f.file >= 0) {
        char why[512];
        close_failed = ranks_agree(comm, ckpt_h5_close(&f, why, sizeof why) == 0, why, sizeof why) != 0;
    }
fail_closed:
    MPI_CHECK(MPI_Barrier(comm));
    if (rank == 0 && created) unlink(tmp);
    {
        /* MPI-IO reports a full disk as a short write: say how full the disk is */
        char why[1536], space[96] = "";
        snprintf(why, sizeof why, "%s", err);
        struct statvfs sv;
        if (statvfs(dir, &sv) == 0)
            snprintf(space, sizeof space, " [%s free there]",
                     human((double)sv.f_bavail * sv.f_frsize).s);
        io_set_err(err, errlen, "checkpoint save of step %lld failed (earlier checkpoints and "
                "%s/latest untouched): %s%s", (long long)st->step, dir, why, space);
    }
    /* HDF5 1.10 cannot shut down after a failed close of a file being written (its ID
     * dangles and MPI_Finalize would crash in H5F__close_cb): end the job here, with
     * the message, instead of returning to a clean exit that cannot happen */
    if (close_failed) SHLM_FATAL("%s; HDF5 could not close the file, so the job ends here", err);
    free(tl);
    free(ds);
    free(sums);
    free(buf);
    return -1;
}

int checkpoint_save(fsdp_engine *e, const topology *topo, const job_config *cfg,
                    const ckpt_state *st, const hf_files *hf, const char *dir, int keep,
                    char *err, size_t errlen) {
    int nt;
    tensor_ref *tl = list_tensors(fsdp_layout(e), &nt);
    ckpt_h5_options opt;
    save_options(cfg, &opt);
    const uint64_t bytes = estimate_file_bytes(tl, nt, &opt, cfg->text ? strlen(cfg->text) : 0, hf);
    free(tl);
    char what[64];
    snprintf(what, sizeof what, "checkpoint save of step %lld", (long long)st->step);
    guard_begin(what, bytes);
    const int rc = save(e, topo, cfg, st, hf, dir, keep, err, errlen);
    shlm_guard_end();
    return rc;
}

/* ---------------------------------------------------------------- load */

/* Each file of the /hf group (format 3), read whole and checked against its checksum,
 * into out (where out lacks it; NULL: only checked) and, with entries, as the state
 * checksum sees it (*n_entries grows; entries has room for HF_FILES_MAX more). A name
 * that is not a file shardlm keeps is refused. */
static int read_hf_group(ckpt_h5_file *f, hf_files *out, ds_entry *entries, int *n_entries,
                         char *err, size_t errlen) {
    if (!ckpt_h5_exists(f, HF_GROUP)) return 0;
    char **names;
    int n;
    if (ckpt_h5_list(f, HF_GROUP, &names, &n, err, errlen) != 0) return -1;
    int rc = 0;
    if (n > HF_FILES_MAX) {
        io_set_err(err, errlen, "%s: %s holds %d files, at most %d are kept %s", f->path, HF_GROUP,
                n, HF_FILES_MAX, CORRUPT);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        char path[256], *data;
        uint64_t size, sum;
        snprintf(path, sizeof path, HF_GROUP "/%s", names[i]);
        if (!hf_files_known(names[i])) {
            io_set_err(err, errlen, "%s: %s is not a file shardlm keeps %s", f->path, path, CORRUPT);
            rc = -1;
            break;
        }
        rc = ckpt_h5_read_bytes(f, path, &data, &size, &sum, err, errlen);
        if (rc == 0 && out) {
            char path_err[512];
            rc = hf_files_add(out, names[i], data, (size_t)size, path_err, sizeof path_err);
            if (rc) io_set_err(err, errlen, "%s: %s", f->path, path_err);
        }
        if (rc == 0 && entries) {
            ds_entry *de = &entries[(*n_entries)++];
            snprintf(de->path, sizeof de->path, "%s", path);
            de->ndim = 1;
            de->shape[0] = (int64_t)size;
            de->checksum = sum;
        }
        free(data);
    }
    ckpt_h5_free_names(names, n);
    return rc;
}

/* The datasets of a checkpoint of shape m as the state checksum covers them: path,
 * shape and stored checksum of each, opened through plain links only; the /hf files too
 * (format 3). */
static int read_datasets(ckpt_h5_file *f, const model_shape *m, ds_entry **out, int *n,
                         char *err, size_t errlen) {
    model_desc md;
    model_shape_desc_open(&md, m);
    const model_layout lay = md.lay;
    int nt;
    tensor_ref *tl = list_tensors(&lay, &nt);
    ds_entry *e = calloc((size_t)N_KINDS * nt + HF_FILES_MAX, sizeof *e);
    SHLM_CHECK_ALLOC(e);
    int rc = 0;
    for (int i = 0; rc == 0 && i < N_KINDS * nt; i++) {
        snprintf(e[i].path, sizeof e[i].path, "%s/%s", kind_group[i / nt], tl[i % nt].t->name);
        ckpt_h5_dataset d = {.id = -1};
        rc = ckpt_h5_open_dataset(f, e[i].path, &d, err, errlen);
        if (rc == 0) rc = ckpt_h5_attr_read_u64(f, e[i].path, "checksum", &e[i].checksum, err, errlen);
        e[i].ndim = d.ndim;
        e[i].shape[0] = d.shape[0];
        e[i].shape[1] = d.shape[1];
        ckpt_h5_close_dataset(&d);
    }
    free(tl);
    model_desc_close(&md);
    int total = N_KINDS * nt;
    if (rc == 0) rc = read_hf_group(f, NULL, e, &total, err, errlen);
    if (rc != 0) {
        free(e);
        return -1;
    }
    *out = e;
    *n = total;
    return 0;
}

int checkpoint_read_hf(ckpt_h5_file *f, hf_files *out, char *err, size_t errlen) {
    int n = 0;
    int ok = read_hf_group(f, out, NULL, &n, err, errlen) == 0;
    return ranks_agree(f->comm, ok, err, errlen);
}

int checkpoint_read_hf_path(const char *path, MPI_Comm comm, hf_files *out, char *err,
                            size_t errlen) {
    char what[200];
    snprintf(what, sizeof what, "checkpoint load of %s", base_name(path));
    guard_begin(what, 0);
    shlm_guard_phase("reading its Hugging Face files");
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    int ok = checkpoint_open(&f, path, comm, NULL, NULL, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen) == 0) ok = checkpoint_read_hf(&f, out, err, errlen) == 0;
    char ignored[256];
    if (f.file >= 0) ckpt_h5_close(&f, ignored, sizeof ignored);
    shlm_guard_end();
    return ok ? 0 : -1;
}

int checkpoint_open(ckpt_h5_file *f, const char *path, MPI_Comm comm, model_shape *shape,
                    ckpt_state *st, char *err, size_t errlen) {
    if (ckpt_h5_open(f, path, comm, NULL, err, errlen) != 0) return -1;
    char *fmt = NULL;
    int64_t ver = 0;
    if (ckpt_h5_attr_read_str(f, "/", "format", &fmt, err, errlen) != 0 ||
        strcmp(fmt, "shardlm-checkpoint") != 0 ||
        ckpt_h5_attr_read_i64(f, "/", "format_version", &ver, err, errlen) != 0) {
        io_set_err(err, errlen, "%s: not a shardlm checkpoint (no format attribute)", path);
        free(fmt);
        return -1;
    }
    free(fmt);
    if (ver < CKPT_FORMAT_OLDEST || ver > CKPT_FORMAT_VERSION) {
        io_set_err(err, errlen, "%s: checkpoint format version %lld, this shardlm reads %d to %d",
                path, (long long)ver, CKPT_FORMAT_OLDEST, CKPT_FORMAT_VERSION);
        return -1;
    }
    ckpt_record rec;
    if (read_record(f, (int)ver, &rec, err, errlen) != 0 ||
        check_record(path, &rec, CORRUPT, err, errlen) != 0)
        return -1;
    if (ver >= 2) {
        uint64_t stored;
        ds_entry *entries;
        int n;
        if (ckpt_h5_attr_read_u64(f, "/", "state_checksum", &stored, err, errlen) != 0 ||
            read_datasets(f, &rec.m, &entries, &n, err, errlen) != 0)
            return -1;
        const uint64_t got = state_checksum(&rec, (int)ver, entries, n);
        free(entries);
        if (got != stored) {
            io_set_err(err, errlen, "%s: the state attributes and the datasets' names, shapes and "
                    "checksums give state checksum 0x%016llx, the file says 0x%016llx %s", path,
                    (unsigned long long)got, (unsigned long long)stored, CORRUPT);
            return -1;
        }
    }
    rec.st.format_version = (int)ver;
    if (shape) *shape = rec.m;
    if (st) *st = rec.st;
    return 0;
}

int checkpoint_read_state(const char *path, MPI_Comm comm, ckpt_state *st, char *err,
                          size_t errlen) {
    char what[200];
    snprintf(what, sizeof what, "checkpoint load of %s", base_name(path));
    guard_begin(what, 0);
    shlm_guard_phase("reading its state");
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    int ok = checkpoint_open(&f, path, comm, NULL, st, err, errlen) == 0;
    char ignored[256];
    if (f.file >= 0) ckpt_h5_close(&f, ignored, sizeof ignored);
    const int rc = ranks_agree(comm, ok, err, errlen);
    shlm_guard_end();
    return rc;
}

static int load(fsdp_engine *e, const topology *topo, const model_shape *mc,
                const char *path, ckpt_load_what what, ckpt_state *st_out, char *err,
                size_t errlen) {
    MPI_Comm comm = topo->world;
    const int rank = topo->world_rank;
    const double t0 = MPI_Wtime();
    const model_layout *lay = fsdp_layout(e);
    ckpt_h5_file f = {.file = -1, .dxpl = -1};
    int nt;
    tensor_ref *tl = list_tensors(lay, &nt);
    const int nk = what == CKPT_LOAD_ALL ? N_KINDS : 1, nd = nk * nt;
    uint64_t *sums = calloc((size_t)nd * 2, sizeof *sums), *stored = calloc((size_t)nd, 8);
    float *buf = malloc(max_shard_numel(e) * sizeof(float));
    SHLM_CHECK_ALLOC(sums);
    SHLM_CHECK_ALLOC(stored);
    SHLM_CHECK_ALLOC(buf);
    ckpt_state st;
    model_shape shape;
    uint64_t bytes = 0;
    int rc = -1;

    shlm_guard_phase("opening the file and checking its state");
    int ok = checkpoint_open(&f, path, comm, &shape, &st, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto done;
    ok = checkpoint_check_shape(path, &shape, mc, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto done;
    if (test_hook_hits("SHLM_TEST_STOP_IN_LOAD", rank, -1))
        test_stop("SHLM_TEST_STOP_IN_LOAD", rank, "in the load, its file open");
    shlm_guard_phase("reading the data");

    for (int k = 0; k < nk; k++) {
        for (int u = 0; u < lay->n_units; u++) {
            size_t sb, se, pb, pe;
            fsdp_shard_range(e, u, &sb, &se);
            my_piece(e, topo, u, &pb, &pe);
            memset(buf, 0, (se - sb) * sizeof(float)); /* padding stays zero */
            for (int i = 0; i < nt; i++) {
                if (tl[i].unit != u) continue;
                const int di = k * nt + i;
                const model_tensor *t = tl[i].t;
                char dpath[256];
                snprintf(dpath, sizeof dpath, "%s/%s", kind_group[k], t->name);
                ckpt_h5_dataset d = {.id = -1};
                ok = ckpt_h5_open_dataset(&f, dpath, &d, err, errlen) == 0;
                if (ok && (d.ndim != t->ndim || d.shape[0] != t->shape[0] ||
                           (t->ndim == 2 && d.shape[1] != t->shape[1]))) {
                    io_set_err(err, errlen, "%s: dataset %s has shape %s, the model needs %s", path,
                            dpath, shape_text(d.ndim, d.shape).s, shape_text(t->ndim, t->shape).s);
                    ok = 0;
                }
                if (ok) ok = ckpt_h5_attr_read_u64(&f, dpath, "checksum", &stored[di], err, errlen) == 0;
                /* read what the whole shard needs; sum only this rank's piece of it */
                shard_overlap ov, pv;
                shard_intersect(sb, se, t->offset, t->numel, &ov);
                shard_intersect(pb, pe, t->offset, t->numel, &pv);
                if (ok)
                    ok = ckpt_h5_read_range(&f, &d, ov.tensor_offset, ov.count,
                                            buf + (ov.count ? ov.flat_offset - sb : 0), err,
                                            errlen) == 0;
                if (ok && pv.count) {
                    ckpt_h5_sum s = {0, 0};
                    const uint64_t bad = ckpt_h5_sum_add(&s, buf + (pv.flat_offset - sb),
                                                         pv.tensor_offset, pv.count);
                    sums[2 * di] = s.s1;
                    sums[2 * di + 1] = s.s2;
                    /* every element is summed, so checked, by exactly one rank */
                    if (bad) {
                        io_set_err(err, errlen, "%s: dataset %s holds %llu non-finite values (NaN "
                                "or infinite) in elements [%llu, %llu): refusing to load it",
                                path, dpath, (unsigned long long)bad,
                                (unsigned long long)pv.tensor_offset,
                                (unsigned long long)(pv.tensor_offset + pv.count));
                        ok = 0;
                    }
                }
                ckpt_h5_close_dataset(&d);
                bytes += t->numel * sizeof(float);
                if (ranks_agree(comm, ok, err, errlen)) goto done;
            }
            fsdp_set_state(e, u, (fsdp_state_kind)k, buf);
        }
    }
    shlm_guard_phase("comparing the checksums");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 2 * nd, MPI_UINT64_T, MPI_SUM, comm));
    for (int i = 0; i < nd; i++) {
        ckpt_h5_sum s = {sums[2 * i], sums[2 * i + 1]};
        uint64_t got = ckpt_h5_sum_final(&s, tl[i % nt].t->numel);
        if (got != stored[i]) {
            io_set_err(err, errlen, "%s: dataset %s/%s is corrupt: checksum 0x%016llx, stored "
                    "0x%016llx", path, kind_group[i / nt], tl[i % nt].t->name,
                    (unsigned long long)got, (unsigned long long)stored[i]);
            goto done; /* the same verdict on every rank: the sums are global */
        }
    }
    const char *io_mode = f.io_mode;
    shlm_guard_phase("closing the file");
    ok = ckpt_h5_close(&f, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) goto done;
    if (rank == 0) {
        double dt = MPI_Wtime() - t0;
        printf("checkpoint: loaded %s of %s (step %lld, saved by %d ranks %s): %s in %.3f s "
               "= %.2f GB/s, checksums ok%s (%d ranks, %s)\n",
               what == CKPT_LOAD_ALL ? "weights and optimizer" : "weights", path,
               (long long)st.step, st.world_size, st.strategy, human((double)bytes).s, dt,
               bytes / 1e9 / dt,
               st.format_version < 2 ? ", format 1: the state has no checksum to compare" : "",
               topo->world_size, io_mode);
        fflush(stdout);
    }
    if (st_out) *st_out = st;
    rc = 0;
done:
    if (f.file >= 0) {
        char ignored[256];
        ckpt_h5_close(&f, ignored, sizeof ignored);
    }
    free(tl);
    free(sums);
    free(stored);
    free(buf);
    return rc;
}

int checkpoint_load(fsdp_engine *e, const topology *topo, const model_shape *mc,
                    const char *path, ckpt_load_what what, ckpt_state *st, char *err,
                    size_t errlen) {
    char text[200];
    snprintf(text, sizeof text, "checkpoint load of %s", base_name(path));
    guard_begin(text, layout_bytes(fsdp_layout(e), what == CKPT_LOAD_ALL ? N_KINDS : 1));
    const int rc = load(e, topo, mc, path, what, st, err, errlen);
    shlm_guard_end();
    return rc;
}

/* ---------------------------------------------------------------- resolve */

/* The file <dir>/latest names, as a path. Rank 0's side of checkpoint_resolve. `latest`
 * is the one-line regular file commit() writes; anything else there (a link, dangling
 * or not, a name that is not step_<N>.h5, a file that is gone) is an error, never "no
 * checkpoint": a run must not silently start again from step 0. */
static int read_latest(const char *dir, char *path, size_t pathlen, int must, char *err,
                       size_t errlen) {
    char lp[1100];
    snprintf(lp, sizeof lp, "%s/latest", dir);
    struct stat sb;
    if (lstat(lp, &sb) != 0) {
        if (errno == ENOENT && !must) {
            path[0] = '\0';
            return 0;
        }
        io_set_err(err, errlen, "%s: %s (no checkpoint to resume from there)", lp, strerror(errno));
        return -1;
    }
    if (safe_file_refuse_link(lp, err, errlen) != 0) return -1;
    if (!S_ISREG(sb.st_mode)) {
        io_set_err(err, errlen, "%s is not a regular file (shardlm writes it as one line naming "
                "a checkpoint file)", lp);
        return -1;
    }
    char text[128] = "";
    int fd = open(lp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
    if (got < 0) {
        io_set_err(err, errlen, "%s: %s", lp, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    text[got] = '\0';
    char *name = text;
    const size_t len = strcspn(name, "\r\n");
    const int one_line = len + strspn(text + len, "\r\n") == (size_t)got;
    name[len] = '\0';
    if (!one_line || !is_checkpoint_name(name)) {
        for (char *c = name; *c; c++)
            if (*c < 32 || *c > 126) *c = '?';
        io_set_err(err, errlen, "%s: expected one line naming a checkpoint file (step_<N>.h5), "
                "got '%.100s'", lp, one_line ? name : "more than one line");
        return -1;
    }
    snprintf(path, pathlen, "%s/%s", dir, name);
    if (access(path, R_OK) != 0) {
        io_set_err(err, errlen, "%s names %s, which cannot be read: %s", lp, path, strerror(errno));
        return -1;
    }
    return 0;
}

static int resolve(const char *dir, const char *resume, char *path, size_t pathlen, char *err,
                   size_t errlen) {
    int rank;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    char found[2048] = "";
    int ok = 1;
    if (rank == 0) {
        struct stat sb;
        if (strcmp(resume, "none") == 0) {
            found[0] = '\0';
        } else if (strcmp(resume, "auto") == 0) {
            if (dir[0]) ok = read_latest(dir, found, sizeof found, 0, err, errlen) == 0;
        } else if (stat(resume, &sb) != 0) {
            io_set_err(err, errlen, "no checkpoint at %s: %s", resume, strerror(errno));
            ok = 0;
        } else if (S_ISDIR(sb.st_mode)) {
            ok = read_latest(resume, found, sizeof found, 1, err, errlen) == 0;
        } else {
            snprintf(found, sizeof found, "%s", resume);
        }
    }
    if (ranks_agree(MPI_COMM_WORLD, ok, err, errlen)) return -1;
    MPI_CHECK(MPI_Bcast(found, (int)sizeof found, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (strlen(found) >= pathlen) {
        io_set_err(err, errlen, "checkpoint path too long: %s", found);
        return -1;
    }
    snprintf(path, pathlen, "%s", found);
    return 0;
}

int checkpoint_resolve(const char *dir, const char *resume, char *path, size_t pathlen,
                       char *err, size_t errlen) {
    guard_begin("finding the checkpoint to load", 0);
    const int rc = resolve(dir, resume, path, pathlen, err, errlen);
    shlm_guard_end();
    return rc;
}

/* ---------------------------------------------------------------- Hugging Face */

static int layout_has(const model_layout *lay, const char *name) {
    for (int u = 0; u < lay->n_units; u++)
        for (int k = 0; k < lay->units[u].n_tensors; k++)
            if (strcmp(lay->units[u].tensors[k].name, name) == 0) return 1;
    return 0;
}

/* Every tensor of the safetensors must be one the model reads: a parameter of the
 * layout, or one the family knows to be redundant (its hf_unused: a tied model's
 * lm_head.weight, RoPE's saved frequencies), which is skipped with a warning (printed when
 * `say`). Anything else is refused: a name this model does not have means another model.
 * Local. */
static int check_hf_names(const hf_weights *w, const model_layout *lay, const model_shape *m,
                          int say, char *err, size_t errlen) {
    for (int f = 0; f < w->n_files; f++) {
        const safetensors_file *sf = &w->files[f];
        for (int i = 0; i < sf->n_tensors; i++) {
            const char *name = sf->tensors[i].name;
            if (layout_has(lay, name)) continue;
            const char *why = m->family->hf_unused(model_shape_cdata(m), name);
            if (!why) {
                io_set_err(err, errlen, "%s: tensor %s is not a parameter of this %s model: "
                           "refusing a file of another model", sf->path, name, m->family->name);
                return -1;
            }
            if (say)
                fprintf(stderr, "shardlm: warning: %s: tensor %s is not used: %s\n", sf->path,
                        name, why);
        }
    }
    return 0;
}

static int import_hf(fsdp_engine *e, const topology *topo, const model_shape *mc,
                     const char *dir, char *err, size_t errlen) {
    MPI_Comm comm = topo->world;
    const double t0 = MPI_Wtime();
    model_shape hc;
    int ok = family_shape_from_hf(dir, &hc, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) return -1;
    /* config.json must say what the job's shape says of every key it holds */
    if (hc.family != mc->family) {
        io_set_err(err, errlen, "%s/config.json is a %s model but the job's is a %s model", dir,
                   hc.family->name, mc->family->name);
        ok = 0;
    }
    const model_family *fam = mc->family;
    for (int i = 0; ok && i < fam->n_keys; i++) {
        if (!fam->hf_names[i] ||
            key_equal(&fam->keys[i], model_shape_cdata(&hc), model_shape_cdata(mc)))
            continue;
        char theirs[64], mine[64];
        key_format(&fam->keys[i], model_shape_cdata(&hc), theirs, sizeof theirs);
        key_format(&fam->keys[i], model_shape_cdata(mc), mine, sizeof mine);
        io_set_err(err, errlen, "%s/config.json: %s = %s but the job's [model] %s = %s: the job "
                   "must describe the same model (set %s = %s)", dir, fam->hf_names[i], theirs,
                   fam->keys[i].key, mine, fam->keys[i].key, theirs);
        ok = 0;
    }
    if (ranks_agree(comm, ok, err, errlen)) return -1;

    hf_weights w;
    ok = hf_weights_open(&w, dir, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) return -1;
    const model_layout *lay = fsdp_layout(e);
    ok = check_hf_names(&w, lay, &hc, topo->world_rank == 0, err, errlen) == 0;
    if (ranks_agree(comm, ok, err, errlen)) {
        hf_weights_close(&w);
        return -1;
    }
    float *buf = malloc(max_shard_numel(e) * sizeof(float));
    SHLM_CHECK_ALLOC(buf);
    uint64_t bytes = 0;
    for (int u = 0; u < lay->n_units; u++) {
        size_t sb, se;
        fsdp_shard_range(e, u, &sb, &se);
        memset(buf, 0, (se - sb) * sizeof(float));
        const model_unit *lu = &lay->units[u];
        for (int i = 0; ok && i < lu->n_tensors; i++) {
            const model_tensor *t = &lu->tensors[i];
            shard_overlap ov;
            if (!shard_intersect(sb, se, t->offset, t->numel, &ov)) continue;
            const char *name = t->name; /* tied: the layout has no lm_head.weight */
            safetensors_file *sf;
            const safetensors_tensor *st;
            ok = hf_weights_find(&w, name, &sf, &st, err, errlen) == 0;
            if (ok && (st->ndim != t->ndim || st->shape[0] != t->shape[0] ||
                       (t->ndim == 2 && st->shape[1] != t->shape[1]))) {
                io_set_err(err, errlen, "%s: tensor %s has shape %s, the model needs %s", sf->path,
                        name, shape_text(st->ndim, st->shape).s, shape_text(t->ndim, t->shape).s);
                ok = 0;
            }
            if (ok)
                ok = safetensors_read_f32(sf, st, ov.tensor_offset, ov.count,
                                          buf + (ov.flat_offset - sb), err, errlen) == 0;
            /* after the conversion to fp32: an F64 beyond FLT_MAX is infinite too */
            const uint64_t bad = ok ? count_nonfinite(buf + (ov.flat_offset - sb), ov.count) : 0;
            if (bad) {
                io_set_err(err, errlen, "%s: tensor %s holds %llu non-finite values (NaN or "
                        "infinite) in elements [%llu, %llu): refusing to load it", sf->path, name,
                        (unsigned long long)bad, (unsigned long long)ov.tensor_offset,
                        (unsigned long long)(ov.tensor_offset + ov.count));
                ok = 0;
            }
            bytes += ov.count * sizeof(float);
        }
        if (ranks_agree(comm, ok, err, errlen)) {
            ok = 0;
            break;
        }
        fsdp_set_state(e, u, FSDP_STATE_MASTER, buf);
    }
    hf_weights_close(&w);
    free(buf);
    if (!ok) return -1;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_UINT64_T, MPI_SUM, comm));
    if (topo->world_rank == 0) {
        double dt = MPI_Wtime() - t0;
        printf("checkpoint: imported Hugging Face weights from %s: %s read by %d ranks in %.3f s "
               "= %.2f GB/s\n", dir, human((double)bytes).s, topo->world_size, dt, bytes / 1e9 / dt);
        fflush(stdout);
    }
    return 0;
}

int checkpoint_import_hf(fsdp_engine *e, const topology *topo, const model_shape *mc,
                         const char *dir, char *err, size_t errlen) {
    char what[200];
    snprintf(what, sizeof what, "import of the Hugging Face weights in %s", base_name(dir));
    guard_begin(what, layout_bytes(fsdp_layout(e), 1));
    const int rc = import_hf(e, topo, mc, dir, err, errlen);
    shlm_guard_end();
    return rc;
}

int checkpoint_init_from(fsdp_engine *e, const topology *topo, const model_shape *mc,
                         const char *src, char *err, size_t errlen) {
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", src);
    int hf = access(cfg, R_OK) == 0;
    guard_begin("finding the weights to load", 0);
    MPI_CHECK(MPI_Bcast(&hf, 1, MPI_INT, 0, topo->world));
    shlm_guard_end();
    if (hf) return checkpoint_import_hf(e, topo, mc, src, err, errlen);
    char path[2048];
    if (checkpoint_resolve("", src, path, sizeof path, err, errlen) != 0) return -1;
    return checkpoint_load(e, topo, mc, path, CKPT_LOAD_WEIGHTS, NULL, err, errlen);
}
