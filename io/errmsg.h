/* One-line error messages for the readers of io/: what a file says (a tensor name, a
 * shard name, a key) goes into messages, and a file may put line breaks in it; and how
 * a message says where in a text file it points. */
#ifndef SHLM_ERRMSG_H
#define SHLM_ERRMSG_H

#include <stdarg.h>
#include <stddef.h>

/* snprintf into err (errlen bytes, nothing when err is NULL or errlen 0), then every
 * control character of the result written as an escape (\n, \r, \t, \xNN), so the
 * message stays one line whatever the strings it quotes hold; cut to fit. */
void io_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same, from a va_list (for readers with their own error function). */
void io_set_errv(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* How a message points into a text: "FILE:LINE: what is wrong (byte N of the line,
 * counting from 1)", the line and the byte within it both counted from 1: one convention
 * for every reader (JSONL records, text to tokenize, tokenizer.json). IO_AT_BYTE is the
 * parenthesis, for one size_t. */
#define IO_AT_BYTE "(byte %zu of the line, counting from 1)"
/* The line ('\n'-separated) and the byte within it of text[off], both from 1. */
void io_text_position(const char *text, size_t off, unsigned long long *line, size_t *byte);

#endif
