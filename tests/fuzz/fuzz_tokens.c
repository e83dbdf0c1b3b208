/* Fuzzes token files (io/tokens.c token_file_open, token_file_read, token_file_read_flags,
 * token_file_check) and the data loader over them. Input: the file's bytes. A file that
 * opens must hold what its header says: its size, every token readable and below
 * vocab_size, as many document starts and trained tokens as the header counts, windows of
 * a small seq_len batched (with and without doc_mask: targets in the vocabulary or -1,
 * document starts inside their row); one that does not must fail with one line that
 * starts with its path. Seeds of versions 1 and 2 are in corpus/tokens/. */
#include <stdlib.h>
#include <string.h>

#include "io/tokens.h"
#include "src/data/data_loader.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("tokens.bin", data, size);
    token_file tf;
    char err[1536] = "";
    int rc = token_file_open(&tf, path, err, sizeof err);
    fuzz_check_error(rc, err, path, "token_file_open");
    if (rc != 0) return 0;
    const uint64_t body = tf.version == 1 ? tf.count * tf.width
                                          : (tf.count * tf.width + 7) / 8 * 8 +
                                                16 * ((tf.count + 63) / 64);
    if ((tf.width != 2 && tf.width != 4) ||
        (tf.version == 1 ? TOKENS_HEADER_V1_BYTES : TOKENS_HEADER_BYTES) + body != size)
        fuzz_fail("token_file_open", "open file breaks its header's promises");
    int32_t *all = malloc((tf.count + 1) * sizeof *all);
    uint8_t *flags = malloc(tf.count + 1);
    rc = token_file_read(&tf, 0, tf.count, all, err, sizeof err);
    fuzz_check_error(rc, err, path, "token_file_read");
    for (uint64_t i = 0; rc == 0 && i < tf.count; i++)
        if (all[i] < 0 || (uint32_t)all[i] >= tf.vocab_size)
            fuzz_fail("token_file_read", "a token read back is outside the vocabulary");
    rc = token_file_read_flags(&tf, 0, tf.count, flags, err, sizeof err);
    fuzz_check_error(rc, err, path, "token_file_read_flags");
    uint64_t docs = 0, trained = 0;
    for (uint64_t i = 0; rc == 0 && i < tf.count; i++) {
        docs += (flags[i] & TOKEN_DOC_START) != 0;
        trained += (flags[i] & TOKEN_TRAINED) != 0;
        if (flags[i] & ~(TOKEN_TRAINED | TOKEN_DOC_START))
            fuzz_fail("token_file_read_flags", "a flag outside TOKEN_TRAINED | TOKEN_DOC_START");
    }
    if (rc == 0 && (docs != tf.documents || trained != tf.trained ||
                    (tf.count > 0 && !(flags[0] & TOKEN_DOC_START))))
        fuzz_fail("token_file_read_flags", "the bits read back differ from the header's counts");
    rc = token_file_check(&tf, err, sizeof err);
    fuzz_check_error(rc, err, path, "token_file_check");
    if (rc != 0) fuzz_fail("token_file_check", "the file as opened fails the check");
    /* a loader over it: shuffled windows of 7, two ranks' first batches, the second rank
     * with doc_mask */
    data_loader dl;
    for (int r = 0; r < 2; r++) {
        if (data_loader_init(&dl, &tf, 7, 1, (uint64_t)size, r, 2, 2, err, sizeof err) != 0) break;
        dl.doc_mask = r;
        int32_t in[14], tg[14], ds[14];
        rc = data_loader_batch(&dl, 0, 0, in, tg, ds, err, sizeof err);
        fuzz_check_error(rc, err, path, "data_loader_batch");
        for (int i = 0; rc == 0 && i < 14; i++) {
            if ((uint32_t)in[i] >= tf.vocab_size || tg[i] < -1 || tg[i] >= (int32_t)tf.vocab_size)
                fuzz_fail("data_loader_batch", "a batch holds a token outside the vocabulary");
            if (r && (ds[i] < 0 || ds[i] > i % 7 || (i % 7 && ds[i] < ds[i - 1])))
                fuzz_fail("data_loader_batch", "a document start outside its row or decreasing");
        }
        int64_t count = 0;
        rc = data_loader_count_targets(&dl, 0, 4, &count, err, sizeof err);
        fuzz_check_error(rc, err, path, "data_loader_count_targets");
        if (rc == 0 && (count < 0 || count > 4 * 7))
            fuzz_fail("data_loader_count_targets", "more trained targets than targets");
        data_loader_free(&dl);
    }
    free(all);
    free(flags);
    token_file_close(&tf);
    return 0;
}
