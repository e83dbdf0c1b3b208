/* Token data files: a fixed 32-byte little-endian header followed by the tokens.
 *
 *   offset size field
 *   0      8    magic "SHLMTOK\0"
 *   8      4    version (1)
 *   12     4    token width in bytes (2 or 4)
 *   16     8    token count
 *   24     4    vocab size (every token id is < this)
 *   28     4    reserved (0)
 *   32     ...  tokens, uint16 or uint32 little-endian
 */
#ifndef SHLM_TOKENS_H
#define SHLM_TOKENS_H

#include <stddef.h>
#include <stdint.h>

enum { TOKENS_HEADER_BYTES = 32, TOKENS_VERSION = 1 };
#define TOKENS_MAGIC "SHLMTOK"

typedef struct token_file {
    char path[1024];
    int width;          /* 2 or 4 */
    uint64_t count;     /* tokens in the file */
    uint32_t vocab_size;
    /* The file, open for pread (token_file_open); -1 when closed or when the tokens are
     * held in memory. Windows are read where the loader needs them, so a corpus larger
     * than memory costs no more than the windows in use. */
    int fd;
    /* what the file was at open, for token_file_check */
    uint64_t dev, ino, size;
    int64_t mtime_ns;
    int32_t *tokens;    /* tokens held in memory instead (tests build these by hand) */
} token_file;

/* Opens and fully validates a token file: magic, version, width, that the body holds
 * exactly `count` tokens, and that every id is < vocab_size. On error writes one line
 * naming the file and the problem into err and returns -1. */
int token_file_open(token_file *tf, const char *path, char *err, size_t errlen);
void token_file_close(token_file *tf);

/* Tokens [first, first + n) (first + n <= count) into out, as int32, each id checked
 * against vocab_size again. Returns 0, or -1 with one line naming the file: a short read
 * (the file was truncated after it was opened), an I/O error, an id out of range (the
 * file was rewritten in place). Never a signal: the file is read, not mapped. */
int token_file_read(const token_file *tf, uint64_t first, size_t n, int32_t *out, char *err,
                    size_t errlen);

/* 0 when the file under tf->path is still the one opened: same device and inode (not
 * replaced, e.g. by a rename), same size and modification time (not truncated or
 * rewritten). Else -1 with one line saying what changed. One stat(2); always 0 for
 * tokens held in memory. */
int token_file_check(const token_file *tf, char *err, size_t errlen);

/* Writes n tokens (each < vocab_size) with the given width, under a temporary name renamed
 * onto path (io/safe_file.h: a link at path is refused). Returns 0, or -1 with err. */
int token_file_write(const char *path, const int32_t *tokens, uint64_t n, int width,
                     uint32_t vocab_size, char *err, size_t errlen);

/* The byte tokenizer: token = byte value, vocab 256. */
enum { BYTE_VOCAB_SIZE = 256 };

#endif
