/* Fuzzes a Hugging Face config.json (io/hf_model.c hf_config_read). Input: the file's
 * text. A config that reads is written back (hf_config_write) and must read back the
 * same; one that does not must fail with one line that starts with its path. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "io/hf_model.h"
#include "tests/fuzz/fuzz.h"

static int same(const hf_config *a, const hf_config *b) {
    return a->hidden_size == b->hidden_size && a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads &&
           a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
           a->intermediate_size == b->intermediate_size && a->vocab_size == b->vocab_size &&
           a->max_position_embeddings == b->max_position_embeddings &&
           a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
           a->tie_word_embeddings == b->tie_word_embeddings;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("config.json", data, size);
    hf_config c, back;
    char err[1536] = "";
    int rc = hf_config_read(fuzz_dir(), &c, err, sizeof err);
    fuzz_check_error(rc, err, path, "hf_config_read");
    if (rc != 0) return 0;
    char out[600];
    snprintf(out, sizeof out, "%s/out", fuzz_dir());
    mkdir(out, 0700);
    rc = hf_config_write(out, &c, "float32", NULL, err, sizeof err);
    fuzz_check_error(rc, err, NULL, "hf_config_write");
    rc = rc == 0 ? hf_config_read(out, &back, err, sizeof err) : rc;
    fuzz_check_error(rc, err, NULL, "hf_config_read of what hf_config_write wrote");
    if (rc == 0 && !same(&c, &back))
        fuzz_fail("hf_config_write", "a config read, written and read again changed");
    return 0;
}
