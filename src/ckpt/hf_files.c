/* The Hugging Face files a checkpoint keeps (see hf_files.h): which, read from where,
 * and shared between ranks. */
#include "src/ckpt/hf_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "kernels/check.h"
#include "src/tokenizer/tokenizer_impl.h"

static const char *const known[] = {"config.json",           "generation_config.json",
                                     "tokenizer.json",        "tokenizer.model",
                                     "tokenizer_config.json", "special_tokens_map.json",
                                     "chat_template.jinja",   "added_tokens.json"};
enum { N_KNOWN = sizeof known / sizeof known[0] };
/* the tokenizer's companions, read from its directory */
static const char *const tokenizer_files[] = {"tokenizer.json", "tokenizer.model",
                                              "tokenizer_config.json", "special_tokens_map.json",
                                              "chat_template.jinja", "added_tokens.json"};

/* messages quote names and text from files: one line whatever they hold */
#define set_err io_set_err

int hf_files_known(const char *name) {
    for (int i = 0; i < N_KNOWN; i++)
        if (strcmp(name, known[i]) == 0) return 1;
    return 0;
}

const hf_file *hf_files_get(const hf_files *b, const char *name) {
    for (int i = 0; i < b->n; i++)
        if (strcmp(b->f[i].name, name) == 0) return &b->f[i];
    return NULL;
}

int hf_files_add(hf_files *b, const char *name, const void *data, size_t size, char *err,
                 size_t errlen) {
    if (hf_files_get(b, name)) return 0;
    if (!hf_files_known(name) || b->n >= HF_FILES_MAX) {
        set_err(err, errlen, "%s: not a Hugging Face file a checkpoint keeps", name);
        return -1;
    }
    hf_file *f = &b->f[b->n];
    f->data = malloc(size + 1);
    if (!f->data) {
        set_err(err, errlen, "%s: out of memory for %zu bytes", name, size);
        return -1;
    }
    memcpy(f->data, data, size);
    f->data[size] = '\0';
    f->size = size;
    snprintf(f->name, sizeof f->name, "%s", name);
    b->n++;
    return 0;
}

/* Adds dir/file as name when it exists and b lacks name. */
static int add_from(hf_files *b, const char *dir, const char *file, const char *name,
                    char *err, size_t errlen) {
    if (hf_files_get(b, name)) return 0;
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (access(path, F_OK) != 0) return 0;
    size_t n = 0;
    char *buf = tokenizer_read_file(path, &n, err, errlen);
    if (!buf) return -1;
    int rc = hf_files_add(b, name, buf, n, err, errlen);
    free(buf);
    return rc;
}

int hf_files_collect(hf_files *b, const char *model_dir, const tokenizer *tok, char *err,
                     size_t errlen) {
    if (model_dir && model_dir[0] &&
        (add_from(b, model_dir, "config.json", "config.json", err, errlen) != 0 ||
         add_from(b, model_dir, "generation_config.json", "generation_config.json", err,
                  errlen) != 0))
        return -1;
    if (strcmp(tokenizer_kind(tok), "bytes") == 0) return 0;
    /* the tokenizer's own file under the name transformers looks for, then its directory */
    char dir[1100];
    const char *path = tokenizer_path(tok), *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    const char *name = strcmp(tokenizer_kind(tok), "sentencepiece") == 0 ? "tokenizer.model"
                                                                         : "tokenizer.json";
    if (add_from(b, dir, slash ? slash + 1 : path, name, err, errlen) != 0) return -1;
    for (size_t i = 0; i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++)
        if (add_from(b, dir, tokenizer_files[i], tokenizer_files[i], err, errlen) != 0) return -1;
    return add_from(b, dir, "generation_config.json", "generation_config.json", err, errlen);
}

void hf_files_free(hf_files *b) {
    for (int i = 0; i < b->n; i++) free(b->f[i].data);
    memset(b, 0, sizeof *b);
}

void hf_files_bcast(hf_files *b, int root, MPI_Comm comm) {
    int rank;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    int n = b->n;
    MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, root, comm));
    if (rank != root) {
        hf_files_free(b);
        b->n = n;
    }
    for (int i = 0; i < n; i++) {
        hf_file *f = &b->f[i];
        unsigned long long size = f->size;
        MPI_CHECK(MPI_Bcast(f->name, (int)sizeof f->name, MPI_CHAR, root, comm));
        MPI_CHECK(MPI_Bcast(&size, 1, MPI_UNSIGNED_LONG_LONG, root, comm));
        if (rank != root) {
            f->size = (size_t)size;
            f->data = malloc(f->size + 1);
            SHLM_CHECK_ALLOC(f->data);
            f->data[f->size] = '\0';
        }
        /* in pieces below INT_MAX bytes */
        for (size_t off = 0; off < f->size; off += 1u << 30) {
            size_t len = f->size - off < (1u << 30) ? f->size - off : (1u << 30);
            MPI_CHECK(MPI_Bcast(f->data + off, (int)len, MPI_CHAR, root, comm));
        }
    }
}
