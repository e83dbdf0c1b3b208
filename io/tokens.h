/* Token data files: a little-endian header, the token ids, then (version 2) per token a
 * loss-mask bit and a document-start bit.
 *
 * Version 2 (what every writer makes):
 *   offset size field
 *   0      8    magic "SHLMTOK\0"
 *   8      4    version (2)
 *   12     4    token width in bytes (2 or 4)
 *   16     8    token count n
 *   24     4    vocab size (every token id is < this)
 *   28     4    reserved (0)
 *   32     8    documents: document-start bits set
 *   40     8    trained tokens: loss-mask bits set
 *   48     8    longest document, in tokens
 *   56     8    documents truncated to max_doc_len when the file was made
 *   64     8    documents dropped for being longer than max_doc_len
 *   72     8    max_doc_len applied (0: none)
 *   80     4    source format (token_file_format)
 *   84     4    chat template (token_file_template)
 *   88     8    reserved (0)
 *   96     ...  n ids, uint16 or uint32, then zero bytes up to a multiple of 8
 *   then   ...  ceil(n/64) groups of two uint64: the loss-mask bits, then the
 *               document-start bits, of tokens 64g .. 64g+63 (bit i = token 64g+i);
 *               bits past token n-1 are 0
 * Loss-mask bit of token i: the loss covers predicting token i (from the tokens before
 * it): it is a trained target. Document-start bit: token i is the first token of a
 * document; token 0's is set. The header's counts are what the bits say (checked at
 * open), so `shardlm data info` reads them from the header alone.
 *
 * Version 1 (still read): the first 32 bytes as above with version 1, the ids right
 * after them, no bits: every token trained, one document.
 */
#ifndef SHLM_TOKENS_H
#define SHLM_TOKENS_H

#include <stddef.h>
#include <stdint.h>

enum {
    TOKENS_HEADER_V1_BYTES = 32,
    TOKENS_HEADER_BYTES = 96, /* version 2 */
    TOKENS_VERSION = 2,
    TOKENS_GROUP = 64,        /* tokens per pair of bit words */
    TOKENS_FINGERPRINT_BLOCK = 1 << 20,
};
#define TOKENS_MAGIC "SHLMTOK"

/* A token's flags as token_file_read_flags hands them out (one byte per token). */
enum { TOKEN_TRAINED = 1, TOKEN_DOC_START = 2 };

/* What made the file (header fields 80 and 84), for `data info`. */
typedef enum token_file_format {
    TOKEN_FORMAT_OTHER = 0, /* written by a program (data random, tests) */
    TOKEN_FORMAT_TEXT = 1,
    TOKEN_FORMAT_JSONL_TEXT = 2,
    TOKEN_FORMAT_PROMPT_RESPONSE = 3,
    TOKEN_FORMAT_CHAT = 4,
    TOKEN_FORMAT_N
} token_file_format;
typedef enum token_file_template {
    TOKEN_TEMPLATE_NONE = 0,
    TOKEN_TEMPLATE_CHATML = 1,
    TOKEN_TEMPLATE_LLAMA2 = 2,
    TOKEN_TEMPLATE_LLAMA3 = 3,
    TOKEN_TEMPLATE_N
} token_file_template;
/* "text", "jsonl-text", ...; "none", "chatml", "llama2", "llama3" (NULL outside the enums). */
const char *token_file_format_name(uint32_t format);
const char *token_file_template_name(uint32_t tmpl);

/* What a writer says about how the documents were made (header fields 56..87). */
typedef struct token_file_meta {
    uint64_t truncated, dropped; /* documents cut to / left out for max_doc_len */
    uint64_t max_doc_len;        /* 0: no limit */
    uint32_t format;             /* token_file_format */
    uint32_t chat_template;      /* token_file_template */
} token_file_meta;

typedef struct token_file {
    char path[1024];
    int version;        /* 1 or 2 */
    int width;          /* 2 or 4 */
    uint64_t count;     /* tokens in the file */
    uint32_t vocab_size;
    uint64_t documents, trained, longest; /* the header's counts (v1: 1, count, count) */
    token_file_meta meta;                 /* v1: zeros */
    uint64_t ids_offset, flags_offset;    /* where the ids and the bit groups start */
    /* The file, open for pread (token_file_open); -1 when closed or when the tokens are
     * held in memory. Windows are read where the loader needs them, so a corpus larger
     * than memory costs no more than the windows in use. */
    int fd;
    /* what the file was at open, for token_file_check */
    uint64_t dev, ino, size;
    int64_t mtime_ns;
    /* which file it is, for a checkpoint to recognise on resume: FNV-1a 64 (io/hash.h) of
     * its first and its last TOKENS_FINGERPRINT_BLOCK bytes (the header among them; the
     * whole file once when it is shorter than two blocks), with `size`; 0 for tokens held
     * in memory */
    uint64_t fingerprint;
    int32_t *tokens;    /* tokens held in memory instead (tests build these by hand) */
    uint8_t *flags;     /* with tokens: their TOKEN_* flags, or NULL (every token trained,
                         * one document) */
} token_file;

/* Opens and fully validates a token file: magic, version, width, that the body holds
 * exactly `count` tokens (and, version 2, their bits, zero padding), that every id is
 * < vocab_size, and that the header's documents, trained tokens and longest document are
 * what the bits say. On error writes one line naming the file and the problem into err
 * and returns -1. */
int token_file_open(token_file *tf, const char *path, char *err, size_t errlen);
void token_file_close(token_file *tf);

/* Tokens [first, first + n) (first + n <= count) into out, as int32, each id checked
 * against vocab_size again. Returns 0, or -1 with one line naming the file: a short read
 * (the file was truncated after it was opened), an I/O error, an id out of range (the
 * file was rewritten in place). Never a signal: the file is read, not mapped. */
int token_file_read(const token_file *tf, uint64_t first, size_t n, int32_t *out, char *err,
                    size_t errlen);

/* The TOKEN_* flags of tokens [first, first + n) into out (one byte each); version 1:
 * TOKEN_TRAINED everywhere, TOKEN_DOC_START on token 0. Errors as token_file_read. */
int token_file_read_flags(const token_file *tf, uint64_t first, size_t n, uint8_t *out,
                          char *err, size_t errlen);
/* The same bits as words, for counting: bit i of trained[k] and of doc[k] (ceil(n/64)
 * words each) belongs to token first + 64k + i; bits past the range are 0. */
int token_file_read_bits(const token_file *tf, uint64_t first, size_t n, uint64_t *trained,
                         uint64_t *doc, char *err, size_t errlen);

/* 0 when the file under tf->path is still the one opened: same device and inode (not
 * replaced, e.g. by a rename), same size and modification time (not truncated or
 * rewritten). Else -1 with one line saying what changed. One stat(2); always 0 for
 * tokens held in memory. */
int token_file_check(const token_file *tf, char *err, size_t errlen);

/* Writes a version-2 file of n tokens (each < vocab_size) with the given width, under a
 * temporary name renamed onto path (io/safe_file.h: a link at path is refused). flags:
 * each token's TOKEN_* bits (token 0 must start a document), or NULL for one document
 * trained throughout; the header's counts are computed from them. meta: NULL for zeros.
 * Returns 0, or -1 with err (nothing is created when the arguments are wrong). */
int token_file_write(const char *path, const int32_t *tokens, const uint8_t *flags, uint64_t n,
                     int width, uint32_t vocab_size, const token_file_meta *meta, char *err,
                     size_t errlen);

/* The byte tokenizer: token = byte value, vocab 256. */
enum { BYTE_VOCAB_SIZE = 256 };

#endif
