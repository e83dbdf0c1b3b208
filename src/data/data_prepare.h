/* The input formats of `shardlm data prepare`: a file read record by record into
 * documents (src/data/doc_pieces.h), and the documents tokenized into what a token file holds:
 * ids, per id a loss-mask bit and a document-start bit, and the counts `data info` shows;
 * and generate's prompt file, read with the same record rules (below).
 *
 *   text             the whole file is one document
 *   jsonl-text       {"text": ...} per line, each a document
 *   prompt-response  {"prompt", "response"} per line, or Alpaca's {"instruction", "input"
 *                    (optional), "output"}, whose prompt is the standard Alpaca prompt
 *                    (alpaca_prompt below); with a chat template the pair is a user turn and
 *                    an assistant turn of it, without one the document is bos (as the
 *                    model adds it), the prompt, the response and eos
 *   chat             {"messages": [{"role", "content"}, ...]} per line, rendered with the
 *                    chat template (src/data/chat_template.h)
 * Trained (the loss covers them): every token of text and jsonl-text documents; the
 * response and the eos that ends it; the assistant turns. Blank lines of a JSONL file are
 * skipped. A record that breaks the format is an error naming FILE:LINE. */
#ifndef SHLM_DATA_PREPARE_H
#define SHLM_DATA_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokens.h"
#include "src/data/chat_template.h"
#include "src/data/doc_pieces.h"
#include "src/tokenizer/tokenizer.h"

typedef struct prepare_options {
    token_file_format format;
    const chat_template *tmpl; /* prompt-response and chat (which needs one); NULL: none */
    uint64_t max_doc_len;      /* documents longer than this many tokens ...; 0: no limit */
    int drop_overlong;         /* ... are dropped (1) or truncated to it (0) */
} prepare_options;

/* Calls visit for each record's document, in file order, with its line (1 for text);
 * visit returns 0 to go on or -1 (with err set) to stop. Returns 0, or -1 with one line
 * in err naming path:line (or visit's). */
typedef int (*prepare_visit)(void *ctx, uint64_t line, const doc_pieces *doc, char *err,
                             size_t errlen);
int prepare_records(tokenizer *tok, const prepare_options *o, const char *path,
                    const char *data, size_t len, prepare_visit visit, void *ctx, char *err,
                    size_t errlen);

/* The documents of a whole input, tokenized. */
typedef struct prepared {
    token_ids ids;
    byte_buf flags;                   /* TOKEN_* of each id */
    uint64_t records;                 /* documents read (kept and dropped) */
    uint64_t truncated, dropped;      /* for max_doc_len */
    uint64_t overlong_first_line;     /* the first record over it (0: none) */
    uint64_t overlong_longest, overlong_longest_line; /* the longest of those */
    uint64_t untrained, untrained_first_line; /* kept documents without a trained token */
} prepared;

/* Reads and tokenizes the whole input into out (start from {0}; prepared_free after). */
int prepare_file(tokenizer *tok, const prepare_options *o, const char *path, const char *data,
                 size_t len, prepared *out, char *err, size_t errlen);
void prepared_free(prepared *p);

/* generate's prompt file (`generate --prompts`): JSONL, {"prompt": TEXT} or {"messages":
 * [{"role", "content"}, ...]} per line (the chat format's records), blank lines skipped.
 * Calls visit for each line in file order with its number and either its prompt (msgs
 * NULL) or its messages (prompt NULL; msgs[0, n) valid during the call); visit returns 0
 * to go on or -1 (with err set) to stop. Returns 0, or -1 with one line in err naming
 * path:line (or visit's): a line that is no JSON object, holds neither field or both, or
 * a message without a string role and content; a file of blank lines. */
typedef int (*prompt_visit)(void *ctx, uint64_t line, const char *prompt,
                            const chat_message *msgs, int n, char *err, size_t errlen);
int prompt_records(const char *path, const char *data, size_t len, prompt_visit visit,
                   void *ctx, char *err, size_t errlen);

/* The standard Alpaca prompt (Stanford Alpaca's PROMPT_DICT, as llama-recipes and
 * torchtune use it) for an instruction and an optional input ("" or NULL: none),
 * appended to out; -1 when memory runs out. */
int alpaca_prompt(byte_buf *out, const char *instruction, const char *input);

#endif
