/* Fuzzes a Hugging Face config.json through the registry and the family that claims it
 * (src/families/families.h family_shape_from_hf). Input: the file's text. A config that
 * reads is written back (the family's hf_write, io/hf_model.h hf_config_save) and must read
 * back the same shape; one that does not must fail with one line that starts with its
 * path. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "io/hf_model.h"
#include "src/families/families.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("config.json", data, size);
    model_shape c, back;
    char err[1536] = "";
    int rc = family_shape_from_hf(fuzz_dir(), &c, err, sizeof err);
    fuzz_check_error(rc, err, path, "family_shape_from_hf");
    if (rc != 0) return 0;
    char out[600];
    snprintf(out, sizeof out, "%s/out", fuzz_dir());
    mkdir(out, 0700);
    cJSON *j = cJSON_CreateObject();
    rc = c.family->hf_write(model_shape_cdata(&c), j, err, sizeof err);
    if (rc != 0) cJSON_Delete(j);
    else rc = hf_config_save(out, j, "float32", err, sizeof err);
    fuzz_check_error(rc, err, NULL, "hf_write + hf_config_save");
    rc = rc == 0 ? family_shape_from_hf(out, &back, err, sizeof err) : rc;
    fuzz_check_error(rc, err, NULL, "family_shape_from_hf of what hf_write wrote");
    if (rc == 0 && model_shape_diff(&c, &back, 0) != -1)
        fuzz_fail("hf_write", "a config read, written and read again changed");
    return 0;
}
