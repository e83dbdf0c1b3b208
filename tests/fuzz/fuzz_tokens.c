/* Fuzzes token files (io/tokens.c token_file_open, token_file_read, token_file_check)
 * and the data loader over them. Input: the file's bytes. A file that opens must hold
 * what its header says: every token readable and below vocab_size, windows of a small
 * seq_len batched; one that does not must fail with one line that starts with its path.
 * Version 1 today; seeds of a new version go to corpus/tokens/ when its reader lands. */
#include <stdlib.h>
#include <string.h>

#include "io/tokens.h"
#include "src/data_loader.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("tokens.bin", data, size);
    token_file tf;
    char err[1536] = "";
    int rc = token_file_open(&tf, path, err, sizeof err);
    fuzz_check_error(rc, err, path, "token_file_open");
    if (rc != 0) return 0;
    if ((tf.width != 2 && tf.width != 4) || TOKENS_HEADER_BYTES + tf.count * tf.width != size)
        fuzz_fail("token_file_open", "open file breaks its header's promises");
    int32_t *all = malloc((tf.count + 1) * sizeof *all);
    rc = token_file_read(&tf, 0, tf.count, all, err, sizeof err);
    fuzz_check_error(rc, err, path, "token_file_read");
    for (uint64_t i = 0; rc == 0 && i < tf.count; i++)
        if (all[i] < 0 || (uint32_t)all[i] >= tf.vocab_size)
            fuzz_fail("token_file_read", "a token read back is outside the vocabulary");
    rc = token_file_check(&tf, err, sizeof err);
    fuzz_check_error(rc, err, path, "token_file_check");
    if (rc != 0) fuzz_fail("token_file_check", "the file as opened fails the check");
    /* a loader over it: shuffled windows of 7, two ranks' first batches */
    data_loader dl;
    for (int r = 0; r < 2; r++) {
        if (data_loader_init(&dl, &tf, 7, 1, (uint64_t)size, r, 2, 2, err, sizeof err) != 0) break;
        int32_t in[14], tg[14];
        rc = data_loader_batch(&dl, 0, 0, in, tg, err, sizeof err);
        fuzz_check_error(rc, err, path, "data_loader_batch");
        for (int i = 0; rc == 0 && i < 14; i++)
            if ((uint32_t)in[i] >= tf.vocab_size || (uint32_t)tg[i] >= tf.vocab_size)
                fuzz_fail("data_loader_batch", "a batch holds a token outside the vocabulary");
        data_loader_free(&dl);
    }
    free(all);
    token_file_close(&tf);
    return 0;
}
