/* Fuzzes `data prepare`'s input formats (src/data/data_prepare.c prepare_file, the JSONL
 * records, src/data/chat_template.c chat_render, src/data/doc_pieces.c) on the byte tokenizer, with
 * ChatML and Llama-2 templates whose special tokens are ids 256.. of a pretend vocabulary.
 * Input: the file's bytes, read as each format in turn (and chat with both templates,
 * prompt-response with and without one, with and without a document limit). A file that
 * prepares must give what the token file promises: one document start per kept record,
 * at each document's first token, lengths within the limit, ids in the vocabulary; one
 * that does not must fail with one line that starts with its path. */
#include <stdlib.h>
#include <string.h>

#include "src/data/data_prepare.h"
#include "tests/fuzz/fuzz.h"

static void check_prepared(const prepared *p, uint64_t max) {
    uint64_t docs = 0, len = 0;
    for (size_t i = 0; i < p->ids.n; i++) {
        const uint8_t f = (uint8_t)p->flags.data[i];
        if (p->ids.ids[i] < 0 || p->ids.ids[i] >= 260 || (f & ~(TOKEN_TRAINED | TOKEN_DOC_START)))
            fuzz_fail("prepare_file", "an id or flag a token file cannot hold");
        if (f & TOKEN_DOC_START) docs++, len = 0;
        else if (i == 0) fuzz_fail("prepare_file", "the first token starts no document");
        if (max && ++len > max) fuzz_fail("prepare_file", "a document over max_doc_len");
    }
    if (p->flags.n != p->ids.n || docs != p->records - p->dropped)
        fuzz_fail("prepare_file", "documents and records disagree");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("records.jsonl", data, size);
    tokenizer *tok;
    char err[1536] = "";
    if (tokenizer_open(&tok, "bytes", err, sizeof err) != 0) fuzz_fail("tokenizer_open", err);
    chat_template chatml = {.format = CHAT_CHATML, .default_system = "Be brief.",
                            .open_id = 256, .close_id = 257};
    chat_template llama2 = {.format = CHAT_LLAMA2, .bos = "<s>", .eos = "</s>",
                            .open_id = 258, .close_id = 259};
    const prepare_options runs[] = {
        {TOKEN_FORMAT_TEXT, NULL, 0, 0},
        {TOKEN_FORMAT_JSONL_TEXT, NULL, 7, 1},
        {TOKEN_FORMAT_PROMPT_RESPONSE, NULL, 0, 0},
        {TOKEN_FORMAT_PROMPT_RESPONSE, &chatml, 16, 0},
        {TOKEN_FORMAT_CHAT, &chatml, 0, 0},
        {TOKEN_FORMAT_CHAT, &llama2, 9, 1},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        if (size == 0) break; /* data prepare refuses an empty file before reading it */
        prepared p = {0};
        err[0] = '\0';
        int rc = prepare_file(tok, &runs[k], path, (const char *)data, size, &p, err, sizeof err);
        fuzz_check_error(rc, err, path, "prepare_file");
        if (rc == 0) check_prepared(&p, runs[k].max_doc_len);
        prepared_free(&p);
    }
    tokenizer_free(tok);
    return 0;
}
