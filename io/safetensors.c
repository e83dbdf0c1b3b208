/* safetensors reader and writer: header parsing and validation with cJSON, raw and
 * fp32-converted reads, and a streaming writer that renames into place when done. */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "kernels/bf16.h"

/* The reference implementation refuses headers over 100 MB; so do we, which also
 * bounds what a corrupt length field can make us allocate. */
#define SAFETENSORS_MAX_HEADER 100000000ull
/* Integers above 2^53 do not survive cJSON's double. No real file comes near. */
#define SAFETENSORS_MAX_JSON_INT 9007199254740992.0
/* Elements converted per read in safetensors_read_f32. */
#define SAFETENSORS_CHUNK 65536

static const struct {
    const char *name;
    size_t size;
} dtype_info[SAFETENSORS_N_DTYPES] = {
    [SAFETENSORS_BOOL] = {"BOOL", 1}, [SAFETENSORS_U8] = {"U8", 1},
    [SAFETENSORS_I8] = {"I8", 1},     [SAFETENSORS_I16] = {"I16", 2},
    [SAFETENSORS_U16] = {"U16", 2},   [SAFETENSORS_F16] = {"F16", 2},
    [SAFETENSORS_BF16] = {"BF16", 2}, [SAFETENSORS_I32] = {"I32", 4},
    [SAFETENSORS_U32] = {"U32", 4},   [SAFETENSORS_F32] = {"F32", 4},
    [SAFETENSORS_I64] = {"I64", 8},   [SAFETENSORS_U64] = {"U64", 8},
    [SAFETENSORS_F64] = {"F64", 8},
};

const char *safetensors_dtype_name(safetensors_dtype t) {
    return (t >= 0 && t < SAFETENSORS_N_DTYPES) ? dtype_info[t].name : "?";
}

size_t safetensors_dtype_size(safetensors_dtype t) {
    return (t >= 0 && t < SAFETENSORS_N_DTYPES) ? dtype_info[t].size : 0;
}

int safetensors_dtype_parse(const char *name, safetensors_dtype *out) {
    for (int i = 0; i < SAFETENSORS_N_DTYPES; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (safetensors_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* names and keys read from the file go into messages: one line whatever they hold */
#define set_err io_set_err

/* ---- fp16 / bf16 ---- */

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float safetensors_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

float safetensors_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) { /* zero or subnormal: mant · 2^-24 */
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, nan */
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t safetensors_f32_to_bf16(float x) { return shlm_f32_to_bf16(x); }

uint16_t safetensors_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0);
    if (a >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                      /* below 2^-14: subnormal half */
        /* exact scaling by 2^24, then round to nearest even (default mode) */
        return sign | (uint16_t)nearbyintf(bits_f32(a) * 16777216.0f);
    }
    uint32_t h = (((a >> 23) - 112) << 10) | ((a & 0x7fffffu) >> 13);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry into exp is right */
    return sign | (uint16_t)h;
}

/* ---- reader ---- */

static void free_contents(safetensors_file *f) {
    if (f->fp) fclose(f->fp);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    memset(f, 0, sizeof(*f));
}

void safetensors_close(safetensors_file *f) {
    if (f) free_contents(f);
}

/* A JSON number that is a non-negative integer we can hold exactly. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0.0) || d > SAFETENSORS_MAX_JSON_INT || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int cmp_by_offset(const void *pa, const void *pb) {
    const safetensors_tensor *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return 0;
}

static int cmp_str_ptr(const void *pa, const void *pb) {
    return strcmp(*(const char *const *)pa, *(const char *const *)pb);
}

/* First duplicate among n names, or NULL. */
static const char *find_duplicate(const char *const *names, int n) {
    if (n < 2) return NULL;
    const char **sorted = malloc((size_t)n * sizeof(*sorted));
    if (!sorted) return NULL;
    memcpy(sorted, names, (size_t)n * sizeof(*sorted));
    qsort(sorted, (size_t)n, sizeof(*sorted), cmp_str_ptr);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) dup = sorted[i];
    free(sorted);
    return dup;
}

/* Parses one tensor entry into *t (name already set). */
static int parse_entry(const safetensors_file *f, const cJSON *e, safetensors_tensor *t,
                       uint64_t data_bytes, char *err, size_t errlen) {
    const char *P = f->path, *N = t->name;
    if (!cJSON_IsObject(e)) {
        set_err(err, errlen, "%s: tensor '%s': header entry is not a JSON object", P, N);
        return -1;
    }
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo)) {
        set_err(err, errlen,
                "%s: tensor '%s': entry needs \"dtype\" (string), \"shape\" (array) and "
                "\"data_offsets\" (array)", P, N);
        return -1;
    }
    if (safetensors_dtype_parse(jd->valuestring, &t->dtype) != 0) {
        set_err(err, errlen, "%s: tensor '%s': unknown dtype \"%.32s\"", P, N, jd->valuestring);
        return -1;
    }
    int nd = cJSON_GetArraySize(js);
    if (nd > SAFETENSORS_MAX_DIMS) {
        set_err(err, errlen, "%s: tensor '%s': %d dimensions (at most %d supported)", P, N, nd,
                SAFETENSORS_MAX_DIMS);
        return -1;
    }
    t->ndim = nd;
    t->numel = 1;
    int overflow = 0;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (json_uint(cJSON_GetArrayItem(js, i), &d) != 0) {
            set_err(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", P,
                    N, i);
            return -1;
        }
        t->shape[i] = (int64_t)d;
        if (d != 0 && t->numel > UINT64_MAX / d) overflow = 1;
        else t->numel *= d;
    }
    size_t es = safetensors_dtype_size(t->dtype);
    if (overflow || t->numel > UINT64_MAX / es) {
        set_err(err, errlen, "%s: tensor '%s': shape's size overflows", P, N);
        return -1;
    }
    if (cJSON_GetArraySize(jo) != 2 || json_uint(cJSON_GetArrayItem(jo, 0), &t->begin) != 0 ||
        json_uint(cJSON_GetArrayItem(jo, 1), &t->end) != 0) {
        set_err(err, errlen,
                "%s: tensor '%s': data_offsets must be two non-negative integers [begin, end]",
                P, N);
        return -1;
    }
    if (t->begin > t->end) {
        set_err(err, errlen, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                "] has begin > end", P, N, t->begin, t->end);
        return -1;
    }
    if (t->end - t->begin != t->numel * es) {
        set_err(err, errlen, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                "] span %" PRIu64 " bytes but %s shape needs %" PRIu64, P, N, t->begin, t->end,
                t->end - t->begin, dtype_info[t->dtype].name, t->numel * es);
        return -1;
    }
    if (t->end > data_bytes) {
        set_err(err, errlen, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                "] run past the end of the data (%" PRIu64 " bytes: file truncated?)", P, N,
                t->begin, t->end, data_bytes);
        return -1;
    }
    return 0;
}

static int parse_metadata(safetensors_file *f, const cJSON *m, char *err, size_t errlen) {
    if (!cJSON_IsObject(m)) {
        set_err(err, errlen, "%s: __metadata__ is not a JSON object", f->path);
        return -1;
    }
    int n = cJSON_GetArraySize(m);
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) {
        set_err(err, errlen, "%s: out of memory reading __metadata__", f->path);
        return -1;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, m) {
        if (!cJSON_IsString(e)) {
            set_err(err, errlen, "%s: __metadata__ value of '%s' is not a string", f->path,
                    e->string ? e->string : "?");
            return -1;
        }
        f->meta_keys[f->n_meta] = strdup(e->string ? e->string : "");
        f->meta_values[f->n_meta] = strdup(e->valuestring);
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1]) {
            set_err(err, errlen, "%s: out of memory reading __metadata__", f->path);
            return -1;
        }
    }
    if (find_duplicate((const char *const *)f->meta_keys, f->n_meta)) {
        set_err(err, errlen, "%s: __metadata__ has key '%s' twice", f->path,
                find_duplicate((const char *const *)f->meta_keys, f->n_meta));
        return -1;
    }
    return 0;
}

/* Parses and validates the JSON header (json, len bytes). */
static int parse_header(safetensors_file *f, const char *json, size_t len, char *err,
                        size_t errlen) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = (end && end >= json) ? (size_t)(end - json) : 0;
        set_err(err, errlen, "%s: header is not valid JSON (near byte %zu of %zu)", f->path,
                at, len);
        return -1;
    }
    int rc = -1;
    /* The format allows the header to be padded with spaces after the object. */
    for (const char *p = end; p && p < json + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            set_err(err, errlen, "%s: header has bytes after its JSON object (at byte %zu)",
                    f->path, (size_t)(p - json));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        set_err(err, errlen, "%s: header is not a JSON object", f->path);
        goto done;
    }
    uint64_t data_bytes = f->file_size - f->data_start;
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) if (!e->string || strcmp(e->string, "__metadata__") != 0) n++;
    f->tensors = calloc((size_t)n + 1, sizeof(*f->tensors));
    if (!f->tensors) {
        set_err(err, errlen, "%s: out of memory for %d tensor entries", f->path, n);
        goto done;
    }
    int n_meta_objects = 0;
    cJSON_ArrayForEach(e, root) {
        if (e->string && strcmp(e->string, "__metadata__") == 0) {
            if (n_meta_objects++ > 0) {
                set_err(err, errlen, "%s: header has __metadata__ twice", f->path);
                goto done;
            }
            if (parse_metadata(f, e, err, errlen) != 0) goto done;
            continue;
        }
        safetensors_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(e->string ? e->string : "");
        if (!t->name) {
            set_err(err, errlen, "%s: out of memory", f->path);
            goto done;
        }
        f->n_tensors++;
        if (parse_entry(f, e, t, data_bytes, err, errlen) != 0) goto done;
    }
    /* Unique names. */
    {
        const char **names = malloc(((size_t)f->n_tensors + 1) * sizeof(char *));
        if (!names) {
            set_err(err, errlen, "%s: out of memory", f->path);
            goto done;
        }
        for (int i = 0; i < f->n_tensors; i++) names[i] = f->tensors[i].name;
        const char *dup = find_duplicate(names, f->n_tensors);
        if (dup) set_err(err, errlen, "%s: tensor '%s' appears twice in the header", f->path, dup);
        free(names);
        if (dup) goto done;
    }
    /* The data must be exactly the tensors, back to back: no overlap, no hole. */
    qsort(f->tensors, (size_t)f->n_tensors, sizeof(*f->tensors), cmp_by_offset);
    uint64_t expect = 0;
    const char *prev = NULL;
    for (int i = 0; i < f->n_tensors; i++) {
        const safetensors_tensor *t = &f->tensors[i];
        if (t->begin < expect) {
            set_err(err, errlen, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                    "] overlap tensor '%s' (which ends at %" PRIu64 ")", f->path, t->name,
                    t->begin, t->end, prev ? prev : "?", expect);
            goto done;
        }
        if (t->begin > expect) {
            set_err(err, errlen, "%s: tensor '%s': data_offsets begin at %" PRIu64
                    " but the previous tensor ends at %" PRIu64 " (a hole in the data)",
                    f->path, t->name, t->begin, expect);
            goto done;
        }
        expect = t->end;
        prev = t->name;
    }
    if (expect != data_bytes) {
        set_err(err, errlen, "%s: the tensors cover %" PRIu64 " bytes of data but the file "
                "holds %" PRIu64 " after the header", f->path, expect, data_bytes);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

int safetensors_open(safetensors_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    snprintf(f->path, sizeof(f->path), "%s", path);
    f->fp = fopen(path, "rb");
    if (!f->fp) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f->fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        set_err(err, errlen, "%s: not a regular file", path);
        free_contents(f);
        return -1;
    }
    f->file_size = (uint64_t)st.st_size;
    unsigned char lenbuf[8];
    if (f->file_size < 8 || fread(lenbuf, 1, 8, f->fp) != 8) {
        set_err(err, errlen, "%s: too short for a safetensors file (%" PRIu64 " bytes; the "
                "8-byte header length is missing)", path, f->file_size);
        free_contents(f);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenbuf[i];
    if (n > SAFETENSORS_MAX_HEADER || n > f->file_size - 8) {
        set_err(err, errlen, "%s: header length %" PRIu64 " is impossible (file is %" PRIu64
                " bytes%s)", path, n, f->file_size,
                n > SAFETENSORS_MAX_HEADER ? ", limit 100000000" : "");
        free_contents(f);
        return -1;
    }
    if (n < 2) {
        set_err(err, errlen, "%s: header length %" PRIu64 " is too small for a JSON object",
                path, n);
        free_contents(f);
        return -1;
    }
    f->header_len = n;
    f->data_start = 8 + n;
    char *json = malloc((size_t)n + 1);
    if (!json) {
        set_err(err, errlen, "%s: out of memory for a %" PRIu64 "-byte header", path, n);
        free_contents(f);
        return -1;
    }
    if (fread(json, 1, (size_t)n, f->fp) != (size_t)n) {
        set_err(err, errlen, "%s: short read of the %" PRIu64 "-byte header", path, n);
        free(json);
        free_contents(f);
        return -1;
    }
    json[n] = '\0';
    int rc = parse_header(f, json, (size_t)n, err, errlen);
    free(json);
    if (rc != 0) free_contents(f);
    return rc;
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *safetensors_metadata(const safetensors_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* Reads nbytes at data offset off. */
static int read_at(safetensors_file *f, const safetensors_tensor *t, uint64_t off, void *buf,
                   size_t nbytes, char *err, size_t errlen) {
    if (nbytes == 0) return 0;
    if (!f->fp) {
        set_err(err, errlen, "%s: tensor '%s': file is not open", f->path, t->name);
        return -1;
    }
    if (fseeko(f->fp, (off_t)(f->data_start + off), SEEK_SET) != 0 ||
        fread(buf, 1, nbytes, f->fp) != nbytes) {
        set_err(err, errlen, "%s: tensor '%s': short read of %zu bytes at data offset %" PRIu64
                " (file changed or truncated since it was opened?)", f->path, t->name, nbytes,
                off);
        return -1;
    }
    return 0;
}

int safetensors_read_raw(safetensors_file *f, const safetensors_tensor *t, void *buf,
                         size_t buf_bytes, char *err, size_t errlen) {
    uint64_t nbytes = t->end - t->begin;
    if (buf_bytes < nbytes) {
        set_err(err, errlen, "%s: tensor '%s': buffer of %zu bytes is smaller than the "
                "tensor's %" PRIu64, f->path, t->name, buf_bytes, nbytes);
        return -1;
    }
    return read_at(f, t, t->begin, buf, (size_t)nbytes, err, errlen);
}

int safetensors_read_f32(safetensors_file *f, const safetensors_tensor *t, uint64_t first,
                         uint64_t count, float *out, char *err, size_t errlen) {
    if (first > t->numel || count > t->numel - first) {
        set_err(err, errlen, "%s: tensor '%s': elements [%" PRIu64 ", %" PRIu64
                ") are outside its %" PRIu64, f->path, t->name, first, first + count, t->numel);
        return -1;
    }
    size_t es = safetensors_dtype_size(t->dtype);
    uint64_t off = t->begin + first * es;
    switch (t->dtype) {
    case SAFETENSORS_F32:
        return read_at(f, t, off, out, (size_t)count * 4, err, errlen);
    case SAFETENSORS_BF16:
    case SAFETENSORS_F16:
    case SAFETENSORS_F64: {
        size_t chunk = count < SAFETENSORS_CHUNK ? (size_t)count : SAFETENSORS_CHUNK;
        void *tmp = malloc(chunk * es + 1);
        if (!tmp) {
            set_err(err, errlen, "%s: tensor '%s': out of memory", f->path, t->name);
            return -1;
        }
        for (uint64_t done = 0; done < count;) {
            size_t k = (count - done) < chunk ? (size_t)(count - done) : chunk;
            if (read_at(f, t, off + done * es, tmp, k * es, err, errlen) != 0) {
                free(tmp);
                return -1;
            }
            if (t->dtype == SAFETENSORS_F64) {
                for (size_t i = 0; i < k; i++) {
                    double d;
                    memcpy(&d, (const char *)tmp + 8 * i, 8);
                    out[done + i] = (float)d;
                }
            } else {
                const uint16_t *h = tmp;
                if (t->dtype == SAFETENSORS_BF16)
                    for (size_t i = 0; i < k; i++) out[done + i] = safetensors_bf16_to_f32(h[i]);
                else
                    for (size_t i = 0; i < k; i++) out[done + i] = safetensors_f16_to_f32(h[i]);
            }
            done += k;
        }
        free(tmp);
        return 0;
    }
    default:
        set_err(err, errlen, "%s: tensor '%s': dtype %s cannot be read as fp32", f->path,
                t->name, safetensors_dtype_name(t->dtype));
        return -1;
    }
}

/* ---- writer ---- */

static cJSON *json_uint_raw(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRIu64, v); /* exact, never an exponent */
    return cJSON_CreateRaw(buf);
}

/* Checks one tensor's description and returns its byte size in *bytes. */
static int check_spec(const char *path, const char *name, safetensors_dtype dt, int ndim,
                      const int64_t *shape, uint64_t *bytes, char *err, size_t errlen) {
    if (!name) {
        set_err(err, errlen, "%s: a tensor has no name", path);
        return -1;
    }
    if (strcmp(name, "__metadata__") == 0) {
        set_err(err, errlen, "%s: '__metadata__' cannot be a tensor name", path);
        return -1;
    }
    if (dt < 0 || dt >= SAFETENSORS_N_DTYPES) {
        set_err(err, errlen, "%s: tensor '%s': invalid dtype %d", path, name, (int)dt);
        return -1;
    }
    if (ndim < 0 || ndim > SAFETENSORS_MAX_DIMS || (ndim > 0 && !shape)) {
        set_err(err, errlen, "%s: tensor '%s': invalid ndim %d", path, name, ndim);
        return -1;
    }
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            set_err(err, errlen, "%s: tensor '%s': negative shape[%d]", path, name, d);
            return -1;
        }
        uint64_t s = (uint64_t)shape[d];
        if (s != 0 && numel > UINT64_MAX / s) {
            set_err(err, errlen, "%s: tensor '%s': shape's size overflows", path, name);
            return -1;
        }
        numel *= s;
    }
    size_t es = safetensors_dtype_size(dt);
    if (numel > UINT64_MAX / es) {
        set_err(err, errlen, "%s: tensor '%s': shape's size overflows", path, name);
        return -1;
    }
    *bytes = numel * es;
    return 0;
}

/* The name the writer's bytes go to now: the temporary file, or path for a direct
 * output. */
static const char *writing_to(const safetensors_writer *w) {
    return w->out.tmp[0] ? w->out.tmp : w->path;
}

/* safetensors_writer_begin; output: the file may be a stream (safe_file_begin_output). */
static int begin_writer(safetensors_writer *w, const char *path, int n,
                        const char *const *names, const safetensors_dtype *dtypes,
                        const int *ndims, const int64_t *const *shapes, int n_meta,
                        const char *const *meta_keys, const char *const *meta_values,
                        int output, char *err, size_t errlen) {
    memset(w, 0, sizeof(*w));
    snprintf(w->path, sizeof(w->path), "%s", path);
    if (n < 0 || n_meta < 0) {
        set_err(err, errlen, "%s: negative tensor or metadata count", path);
        return -1;
    }
    const char *dup = find_duplicate(names, n);
    if (dup) {
        set_err(err, errlen, "%s: tensor '%s' given twice", path, dup);
        return -1;
    }
    if (n_meta > 0) {
        for (int i = 0; i < n_meta; i++) {
            if (!meta_keys[i] || !meta_values[i]) {
                set_err(err, errlen, "%s: __metadata__ entry %d is NULL", path, i);
                return -1;
            }
        }
        dup = find_duplicate(meta_keys, n_meta);
        if (dup) {
            set_err(err, errlen, "%s: __metadata__ key '%s' given twice", path, dup);
            return -1;
        }
    }
    int rc = -1;
    char *json = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) goto oom;
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m) goto oom;
        for (int i = 0; i < n_meta; i++)
            if (!cJSON_AddStringToObject(m, meta_keys[i], meta_values[i])) goto oom;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes;
        if (check_spec(path, names[i], dtypes[i], ndims[i], shapes ? shapes[i] : NULL, &bytes,
                       err, errlen) != 0)
            goto done;
        cJSON *e = cJSON_AddObjectToObject(root, names[i]);
        if (!e || !cJSON_AddStringToObject(e, "dtype", safetensors_dtype_name(dtypes[i])))
            goto oom;
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        if (!sh || !of) goto oom;
        for (int d = 0; d < ndims[i]; d++) {
            cJSON *v = json_uint_raw((uint64_t)shapes[i][d]);
            if (!v) goto oom;
            cJSON_AddItemToArray(sh, v);
        }
        cJSON *b = json_uint_raw(off), *en = json_uint_raw(off + bytes);
        if (!b || !en) {
            cJSON_Delete(b);
            cJSON_Delete(en);
            goto oom;
        }
        cJSON_AddItemToArray(of, b);
        cJSON_AddItemToArray(of, en);
        off += bytes;
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) goto oom;
    size_t len = strlen(json);
    /* Pad with spaces so the data start at a multiple of 8, as the reference writer
     * does: then every tensor of a naturally ordered file is aligned in an mmap. */
    size_t padded = (len + 7) & ~(size_t)7;
    if ((output ? safe_file_begin_output : safe_file_begin)(&w->out, path, err, errlen) != 0)
        goto done;
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    FILE *fp = w->out.fp;
    int ok = fwrite(lenbuf, 1, 8, fp) == 8 && fwrite(json, 1, len, fp) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
    if (!ok) {
        set_err(err, errlen, "%s: writing the header to %s: %s", path, writing_to(w),
                strerror(errno));
        safetensors_writer_abort(w);
        goto done;
    }
    w->total_bytes = off;
    rc = 0;
    goto done;
oom:
    set_err(err, errlen, "%s: out of memory building the header", path);
done:
    free(json);
    cJSON_Delete(root);
    return rc;
}

int safetensors_writer_begin(safetensors_writer *w, const char *path, int n,
                             const char *const *names, const safetensors_dtype *dtypes,
                             const int *ndims, const int64_t *const *shapes, int n_meta,
                             const char *const *meta_keys, const char *const *meta_values,
                             char *err, size_t errlen) {
    return begin_writer(w, path, n, names, dtypes, ndims, shapes, n_meta, meta_keys,
                        meta_values, 0, err, errlen);
}

int safetensors_writer_append(safetensors_writer *w, const void *bytes, size_t nbytes,
                              char *err, size_t errlen) {
    if (!w->out.fp) {
        set_err(err, errlen, "%s: writer is not open", w->path);
        return -1;
    }
    if (nbytes > w->total_bytes - w->written_bytes) {
        set_err(err, errlen, "%s: %zu more bytes would pass the %" PRIu64 " the header declares",
                w->path, nbytes, w->total_bytes);
        return -1;
    }
    if (nbytes > 0 && fwrite(bytes, 1, nbytes, w->out.fp) != nbytes) {
        set_err(err, errlen, "%s: writing %s failed: %s", w->path, writing_to(w),
                strerror(errno));
        return -1;
    }
    w->written_bytes += nbytes;
    return 0;
}

int safetensors_writer_finish(safetensors_writer *w, char *err, size_t errlen) {
    if (!w->out.fp) {
        set_err(err, errlen, "%s: writer is not open", w->path);
        return -1;
    }
    if (w->written_bytes != w->total_bytes) {
        set_err(err, errlen, "%s: %" PRIu64 " data bytes written but the header declares %"
                PRIu64, w->path, w->written_bytes, w->total_bytes);
        return -1;
    }
    return safe_file_finish(&w->out, err, errlen);
}

void safetensors_writer_abort(safetensors_writer *w) { safe_file_abort(&w->out); }

/* safetensors_write and safetensors_write_output (output). */
static int write_whole(const char *path, int n, const char *const *names,
                       const safetensors_dtype *dtypes, const int *ndims,
                       const int64_t *const *shapes, const void *const *data, int n_meta,
                       const char *const *meta_keys, const char *const *meta_values, int output,
                       char *err, size_t errlen) {
    safetensors_writer w;
    if (begin_writer(&w, path, n, names, dtypes, ndims, shapes, n_meta, meta_keys, meta_values,
                     output, err, errlen) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = 0;
        check_spec(path, names[i], dtypes[i], ndims[i], shapes ? shapes[i] : NULL, &bytes, NULL,
                   0); /* already checked by begin */
        if (bytes > 0 && !data[i]) {
            set_err(err, errlen, "%s: tensor '%s': data pointer is NULL", path, names[i]);
            safetensors_writer_abort(&w);
            return -1;
        }
        if (safetensors_writer_append(&w, data[i], (size_t)bytes, err, errlen) != 0) {
            safetensors_writer_abort(&w);
            return -1;
        }
    }
    if (safetensors_writer_finish(&w, err, errlen) != 0) {
        safetensors_writer_abort(&w);
        return -1;
    }
    return 0;
}

int safetensors_write(const char *path, int n, const char *const *names,
                      const safetensors_dtype *dtypes, const int *ndims,
                      const int64_t *const *shapes, const void *const *data, int n_meta,
                      const char *const *meta_keys, const char *const *meta_values,
                      char *err, size_t errlen) {
    return write_whole(path, n, names, dtypes, ndims, shapes, data, n_meta, meta_keys,
                       meta_values, 0, err, errlen);
}

int safetensors_write_output(const char *path, int n, const char *const *names,
                             const safetensors_dtype *dtypes, const int *ndims,
                             const int64_t *const *shapes, const void *const *data, int n_meta,
                             const char *const *meta_keys, const char *const *meta_values,
                             char *err, size_t errlen) {
    return write_whole(path, n, names, dtypes, ndims, shapes, data, n_meta, meta_keys,
                       meta_values, 1, err, errlen);
}
