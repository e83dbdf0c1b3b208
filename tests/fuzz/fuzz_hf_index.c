/* Fuzzes model.safetensors.index.json (io/hf_model.c hf_weights_open, hf_weights_find)
 * over two valid shards the harness writes once. Input: the index's text. An index that
 * opens has its tensors found and read; one that does not must fail with one line that
 * starts with the directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hf_model.h"
#include "tests/fuzz/fuzz.h"

static const char *const names[] = {"a", "b", "c", "model.embed_tokens.weight", "missing"};

static void write_shard(const char *file, int n, const char *const *tnames,
                        const safetensors_dtype *dt, const int *nd, const int64_t *const *shape,
                        const void *const *bytes) {
    char path[600], err[1536] = "";
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), file);
    if (safetensors_write(path, n, tnames, dt, nd, shape, bytes, 0, NULL, NULL, err,
                          sizeof err) != 0) {
        fprintf(stderr, "fuzz_hf_index: %s\n", err);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static const float a[6] = {1, 2, 3, 4, 5, 6}, emb[8] = {0.5f, -1, 2, 3, 4, 5, 6, 7};
    static const uint16_t b[4] = {0x3f80, 0x4000, 0xbf80, 0}, c[2] = {0x3c00, 0xc000};
    static const int64_t sa[2] = {2, 3}, sb[1] = {4}, sc[1] = {2}, se[2] = {4, 2};
    const char *n1[2] = {"a", "b"}, *n2[2] = {"c", "model.embed_tokens.weight"};
    const safetensors_dtype d1[2] = {SAFETENSORS_F32, SAFETENSORS_BF16},
                            d2[2] = {SAFETENSORS_F16, SAFETENSORS_F32};
    const int nd1[2] = {2, 1}, nd2[2] = {1, 2};
    const int64_t *s1[2] = {sa, sb}, *s2[2] = {sc, se};
    const void *b1[2] = {a, b}, *b2[2] = {c, emb};
    write_shard("model-00001-of-00002.safetensors", 2, n1, d1, nd1, s1, b1);
    write_shard("model-00002-of-00002.safetensors", 2, n2, d2, nd2, s2, b2);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("model.safetensors.index.json", data, size);
    hf_weights w;
    char err[1536] = "";
    int rc = hf_weights_open(&w, fuzz_dir(), err, sizeof err);
    fuzz_check_error(rc, err, fuzz_dir(), "hf_weights_open");
    if (rc != 0) return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        safetensors_file *file = NULL;
        const safetensors_tensor *t = NULL;
        rc = hf_weights_find(&w, names[i], &file, &t, err, sizeof err);
        fuzz_check_error(rc, err, NULL, "hf_weights_find");
        if (rc != 0) continue;
        float x[8];
        if (t->numel <= 8) {
            rc = safetensors_read_f32(file, t, 0, t->numel, x, err, sizeof err);
            fuzz_check_error(rc, err, NULL, "safetensors_read_f32");
        }
    }
    hf_weights_close(&w);
    return 0;
}
