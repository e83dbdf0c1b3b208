/* Fuzzes one safetensors file (io/safetensors.c safetensors_open and its reads). Input:
 * the file's bytes. A file that opens has every tensor found by name and read, raw and
 * (for the float dtypes) as fp32, whole and a middle range; one that does not must fail
 * with one line that starts with its path. */
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("model.safetensors", data, size);
    safetensors_file f;
    char err[1536] = "";
    int rc = safetensors_open(&f, path, err, sizeof err);
    fuzz_check_error(rc, err, path, "safetensors_open");
    if (rc != 0) return 0;
    for (int i = 0; i < f.n_meta; i++)
        if (safetensors_metadata(&f, f.meta_keys[i]) == NULL)
            fuzz_fail("safetensors_metadata", "a metadata key is not found");
    for (int i = 0; i < f.n_tensors; i++) {
        const safetensors_tensor *t = &f.tensors[i];
        if (safetensors_find(&f, t->name) != t)
            fuzz_fail("safetensors_find", "a tensor is not found by its name");
        if (t->end - t->begin > size)
            fuzz_fail("safetensors_open", "a tensor is larger than the file");
        size_t bytes = (size_t)(t->end - t->begin);
        void *raw = malloc(bytes + 1);
        rc = safetensors_read_raw(&f, t, raw, bytes, err, sizeof err);
        fuzz_check_error(rc, err, NULL, "safetensors_read_raw");
        free(raw);
        float *x = malloc((size_t)t->numel * sizeof *x + 1);
        rc = safetensors_read_f32(&f, t, 0, t->numel, x, err, sizeof err);
        fuzz_check_error(rc, err, NULL, "safetensors_read_f32");
        if (t->numel > 2)
            rc = safetensors_read_f32(&f, t, 1, t->numel - 2, x, err, sizeof err);
        fuzz_check_error(rc, err, NULL, "safetensors_read_f32 (a range)");
        free(x);
    }
    safetensors_close(&f);
    return 0;
}
