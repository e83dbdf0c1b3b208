/* Hugging Face model directories (see hf_model.h): config.json through cJSON, the
 * safetensors weights of one file or of an index's shards, index writing for exports. */
#include "io/hf_model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/json_text.h"
#include "io/safe_file.h"

/* names and keys read from the file go into messages: one line whatever they hold */
#define set_err io_set_err

/* Reads a whole (small) text file; NULL with err on failure. */
static char *read_text(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *g = realloc(buf, cap);
            if (!g) {
                free(buf);
                fclose(f);
                set_err(err, errlen, "%s: out of memory", path);
                return NULL;
            }
            buf = g;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        set_err(err, errlen, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

int hf_json_int(const cJSON *o, const char *key, int def, int *out, const char *path,
                   char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0) {
            set_err(err, errlen, "%s: \"%s\" is missing", path, key);
            return -1;
        }
        *out = def;
        return 0;
    }
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d > 2147483647.0) {
        set_err(err, errlen, "%s: \"%s\" must be a non-negative integer", path, key);
        return -1;
    }
    *out = (int)d;
    return 0;
}

int hf_json_double(const cJSON *o, const char *key, double def, double *out,
                      const char *path, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    /* cJSON reads 1e999 as infinity, which no writer can give back */
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0) {
        set_err(err, errlen, "%s: \"%s\" must be a positive finite number", path, key);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

int hf_json_bool(const cJSON *o, const char *key, int *out, const char *path, char *err,
                    size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) {
        set_err(err, errlen, "%s: \"%s\" must be true or false (JSON booleans, unquoted), "
                "got %s", path, key, cJSON_IsString(v) ? "a string" : "another type");
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Whether path names something that exists (a dangling link counts as nothing). */
static int exists(const char *dir, const char *name) {
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

int hf_source_kind(const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        set_err(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(sb.st_mode)) {
        if (exists(path, "config.json")) {
            if (exists(path, "model.safetensors") || exists(path, "model.safetensors.index.json"))
                return HF_SOURCE_HF_DIR;
            set_err(err, errlen, "%s has a config.json but no weights: neither model.safetensors "
                    "nor model.safetensors.index.json is there", path);
            return -1;
        }
        if (exists(path, "latest")) return HF_SOURCE_CHECKPOINT;
        set_err(err, errlen, "%s is a directory with neither config.json (a Hugging Face model) "
                "nor latest (a shardlm checkpoint directory)", path);
        return -1;
    }
    unsigned char head[16] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    static const unsigned char hdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    if (got >= 8 && memcmp(head, hdf5, 8) == 0) return HF_SOURCE_CHECKPOINT;
    const size_t n = strlen(path);
    /* safetensors: an 8-byte little-endian header length, then the JSON header */
    if ((n > 12 && strcmp(path + n - 12, ".safetensors") == 0) || (got >= 9 && head[8] == '{')) {
        set_err(err, errlen, "%s is a safetensors file: give the Hugging Face directory that "
                "holds it with its config.json", path);
        return -1;
    }
    if (got >= 4 && memcmp(head, "GGUF", 4) == 0) {
        set_err(err, errlen, "%s is a GGUF file (llama.cpp's format), which shardlm does not "
                "read: convert it to a Hugging Face directory (config.json + safetensors) first",
                path);
        return -1;
    }
    set_err(err, errlen, "%s is neither a Hugging Face model directory nor a shardlm checkpoint "
            "(no HDF5 signature)", path);
    return -1;
}

int hf_config_load(const char *dir, cJSON **out, char *path, size_t pathlen, char *err,
                   size_t errlen) {
    snprintf(path, pathlen, "%s/config.json", dir);
    return hf_json_load(path, out, err, errlen);
}

int hf_json_load(const char *path, cJSON **out, char *err, size_t errlen) {
    *out = NULL;
    char *text = read_text(path, err, errlen);
    if (!text) return -1;
    cJSON *j = json_text_parse_file(path, text, strlen(text), 0, err, errlen);
    free(text);
    if (!j) return -1;
    if (!cJSON_IsObject(j)) {
        set_err(err, errlen, "%s: valid JSON but not an object", path);
        cJSON_Delete(j);
        return -1;
    }
    *out = j;
    return 0;
}

/* The shortest decimal that reads back as the float v is (shardlm keeps rms_norm_eps and
 * rope_theta as floats): 1e-05 rather than 9.99999974737875e-06. */
double hf_float_decimal(double v) {
    const float f = (float)v;
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return v;
}

cJSON *hf_json_float(double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.9g", hf_float_decimal(v));
    if (!strpbrk(buf, ".e")) strcat(buf, ".0");
    return cJSON_CreateRaw(buf);
}

void hf_json_put(cJSON *j, const char *key, cJSON *item) {
    if (cJSON_GetObjectItemCaseSensitive(j, key)) cJSON_ReplaceItemInObjectCaseSensitive(j, key, item);
    else cJSON_AddItemToObject(j, key, item);
}

/* Writes j (deleted here, as a cJSON tree whatever happens) indented to dir/name, safely
 * (safe_file_write_all), with a final newline where newline is nonzero. */
static int write_json(cJSON *j, const char *dir, const char *name, int newline, char *err,
                      size_t errlen) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    const size_t n = text ? strlen(text) : 0;
    char *out = text ? malloc(n + 2) : NULL;
    int rc = -1;
    if (out) {
        memcpy(out, text, n);
        strcpy(out + n, newline ? "\n" : "");
        rc = safe_file_write_all(path, out, n + (newline ? 1 : 0), err, errlen);
    } else {
        set_err(err, errlen, "%s: out of memory", path);
    }
    free(out);
    free(text);
    return rc;
}

int hf_json_save(cJSON *j, const char *dir, const char *name, char *err, size_t errlen) {
    return write_json(j, dir, name, 1, err, errlen);
}

int hf_config_save(const char *dir, cJSON *j, const char *torch_dtype, char *err,
                   size_t errlen) {
    hf_json_put(j, "torch_dtype", cJSON_CreateString(torch_dtype));
    if (cJSON_GetObjectItemCaseSensitive(j, "dtype"))
        hf_json_put(j, "dtype", cJSON_CreateString(torch_dtype));
    return write_json(j, dir, "config.json", 1, err, errlen);
}

/* ---------------------------------------------------------------- weights */

static int add_file(hf_weights *w, const char *name, char *err, size_t errlen) {
    for (int i = 0; i < w->n_files; i++) {
        const char *base = strrchr(w->files[i].path, '/');
        if (strcmp(base ? base + 1 : w->files[i].path, name) == 0) return 0;
    }
    if (strchr(name, '/') || strcmp(name, "..") == 0) {
        set_err(err, errlen, "%s: index names a file outside the directory: %s", w->dir, name);
        return -1;
    }
    safetensors_file *g = realloc(w->files, (size_t)(w->n_files + 1) * sizeof *g);
    if (!g) {
        set_err(err, errlen, "%s: out of memory", w->dir);
        return -1;
    }
    w->files = g;
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    if (safetensors_open(&w->files[w->n_files], path, err, errlen) != 0) return -1;
    w->n_files++;
    return 0;
}

int hf_weights_open(hf_weights *w, const char *dir, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) {
        char *text = read_text(path, err, errlen);
        if (!text) return -1;
        cJSON *j = cJSON_Parse(text);
        free(text);
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
        if (!cJSON_IsObject(map)) {
            set_err(err, errlen, "%s: no \"weight_map\" object", path);
            cJSON_Delete(j);
            return -1;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, map) {
            if (!cJSON_IsString(e)) {
                set_err(err, errlen, "%s: weight_map[\"%s\"] is not a file name", path,
                        e->string);
                cJSON_Delete(j);
                hf_weights_close(w);
                return -1;
            }
            if (add_file(w, e->valuestring, err, errlen) != 0) {
                cJSON_Delete(j);
                hf_weights_close(w);
                return -1;
            }
        }
        cJSON_Delete(j);
        if (w->n_files == 0) {
            set_err(err, errlen, "%s: weight_map is empty", path);
            return -1;
        }
        return 0;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) != 0) {
        set_err(err, errlen, "%s: neither model.safetensors nor model.safetensors.index.json "
                "is there", dir);
        return -1;
    }
    if (add_file(w, "model.safetensors", err, errlen) != 0) {
        hf_weights_close(w);
        return -1;
    }
    return 0;
}

int hf_weights_open_file(hf_weights *w, const char *dir, const char *name, char *err,
                         size_t errlen) {
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    if (add_file(w, name, err, errlen) != 0) {
        hf_weights_close(w);
        return -1;
    }
    return 0;
}

void hf_weights_close(hf_weights *w) {
    for (int i = 0; i < w->n_files; i++) safetensors_close(&w->files[i]);
    free(w->files);
    w->files = NULL;
    w->n_files = 0;
}

int hf_weights_find(hf_weights *w, const char *name, safetensors_file **file,
                    const safetensors_tensor **t, char *err, size_t errlen) {
    for (int i = 0; i < w->n_files; i++) {
        const safetensors_tensor *x = safetensors_find(&w->files[i], name);
        if (x) {
            *file = &w->files[i];
            *t = x;
            return 0;
        }
    }
    set_err(err, errlen, "%s: no tensor %s in its safetensors", w->dir, name);
    return -1;
}

int hf_index_write(const char *dir, int n, const char *const *names,
                   const char *const *files, unsigned long long total_size, char *err,
                   size_t errlen) {
    cJSON *j = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(j, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total_size);
    cJSON *map = cJSON_AddObjectToObject(j, "weight_map");
    for (int i = 0; i < n; i++) cJSON_AddStringToObject(map, names[i], files[i]);
    return write_json(j, dir, "model.safetensors.index.json", 0, err, errlen);
}
