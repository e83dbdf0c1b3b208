/* One-line error messages and positions in texts (errmsg.h). */
#include "io/errmsg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void io_set_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    io_set_errv(err, errlen, fmt, ap);
    va_end(ap);
}

void io_set_errv(char *err, size_t errlen, const char *fmt, va_list ap) {
    if (!err || errlen == 0) return;
    char *raw = malloc(errlen);
    vsnprintf(raw ? raw : err, errlen, fmt, ap);
    if (!raw) return; /* out of memory: the message as it came */
    size_t n = 0;
    for (const unsigned char *s = (const unsigned char *)raw; *s && n + 1 < errlen; s++) {
        char esc[5];
        if (*s >= 0x20 && *s != 0x7f) {
            err[n++] = (char)*s;
            continue;
        }
        snprintf(esc, sizeof esc, *s == '\n' ? "\\n" : *s == '\r' ? "\\r" : *s == '\t' ? "\\t"
                                                                                      : "\\x%02x",
                 *s);
        for (const char *e = esc; *e && n + 1 < errlen; e++) err[n++] = *e;
    }
    err[n] = '\0';
    free(raw);
}

void io_text_position(const char *text, size_t off, unsigned long long *line, size_t *byte) {
    size_t start = 0;
    *line = 1;
    for (size_t i = 0; i < off; i++)
        if (text[i] == '\n') (*line)++, start = i + 1;
    *byte = off - start + 1;
}
