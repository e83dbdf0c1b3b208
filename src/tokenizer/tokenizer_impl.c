/* What the implementations share (tokenizer_impl.h): reading a file, one-line errors. */
#include "src/tokenizer/tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/errmsg.h"

void tokenizer_set_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    io_set_errv(err, errlen, fmt, ap); /* a token string may hold a line break */
    va_end(ap);
}

char *tokenizer_read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        tokenizer_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        if (f) fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    size_t got = buf ? fread(buf, 1, n, f) : 0;
    int bad = !buf || got != n || ferror(f);
    fclose(f);
    if (bad) {
        tokenizer_set_err(err, errlen, "%s: %s", path,
                          buf ? "cannot read the whole file" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
