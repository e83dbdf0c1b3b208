/* Job-file reading (see config_file.h): slurp the file, then run inih over the text with
 * a line reader of our own, which is how the callback learns each entry's line number. */
#include "io/config_file.h"

#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shlm_config.h"

int config_file_read(const char *path, char **text, char *err, size_t errlen) {
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            snprintf(err, errlen, "%s: out of memory reading the file", path);
            return -1;
        }
        len += fread(buf + len, 1, cap - len - 1, f);
        if (len < cap - 1) break;
        /* a job file is a page or two; the cap only stops a wrong path (a checkpoint,
         * a device) from eating the memory of every rank */
        if (cap >= (64u << 20)) {
            free(buf);
            fclose(f);
            snprintf(err, errlen, "%s: larger than 64 MiB, not a job file", path);
            return -1;
        }
        char *grown = realloc(buf, cap * 2);
        if (!grown) free(buf);
        buf = grown;
        cap *= 2;
    }
    int failed = ferror(f);
    int saved = errno;
    fclose(f);
    if (failed) {
        free(buf);
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(saved));
        return -1;
    }
    buf[len] = '\0';
    if (memchr(buf, '\0', len)) {
        free(buf);
        snprintf(err, errlen, "%s: contains NUL bytes, not a text job file", path);
        return -1;
    }
    *text = buf;
    return 0;
}

typedef struct parse_state {
    const char *p;         /* next unread character of the text */
    const char *name;
    int line;              /* line number of the line last handed to inih */
    config_file_entry_fn fn;
    void *user;
    int failed_line;       /* first line whose callback (or length check) failed; 0 = none */
    char msg[1024];        /* its message */
} parse_state;

static void fail_at(parse_state *st, int line, const char *msg) {
    if (st->failed_line) return;
    st->failed_line = line;
    snprintf(st->msg, sizeof st->msg, "%s", msg);
}

/* inih's reader: hands over one line at a time (with its '\n'), without leading blanks.
 * Dropping the indentation is what switches multi-line values off whatever inih was
 * built with: inih treats an indented line as a continuation of the previous value. */
static char *read_line(char *str, int num, void *stream) {
    parse_state *st = stream;
    if (*st->p == '\0') return NULL;
    const char *end = strchr(st->p, '\n');
    size_t len = end ? (size_t)(end - st->p) + 1 : strlen(st->p);
    const char *s = st->p;
    st->p += len;
    st->line++;
    /* a UTF-8 byte-order mark would hide a first-line section header from the check below */
    if (st->line == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3, len -= 3;
    while (len > 0 && (*s == ' ' || *s == '\t')) s++, len--;

    if (len + 1 > (size_t)num) {
        /* inih's line buffer is fixed; a longer line would be split into two entries */
        char msg[256];
        snprintf(msg, sizeof msg, "%s:%d: line too long (over %d characters)", st->name,
                 st->line, num - 3);
        fail_at(st, st->line, msg);
        strcpy(str, "\n");
        return str;
    }
    memcpy(str, s, len);
    str[len] = '\0';

    /* a section header: tell the callback, so an empty unknown section is reported */
    if (str[0] == '[' && !st->failed_line) {
        char *close = strchr(str, ']');
        if (close) {
            char section[256];
            size_t n = (size_t)(close - str - 1);
            if (n >= sizeof section) n = sizeof section - 1;
            memcpy(section, str + 1, n);
            section[n] = '\0';
            char msg[1024] = "";
            if (st->fn(st->user, section, NULL, NULL, st->line, msg, sizeof msg) != 0)
                fail_at(st, st->line, msg);
        }
    }
    return str;
}

static int on_entry(void *user, const char *section, const char *name, const char *value) {
    parse_state *st = user;
    if (st->failed_line) return 1;
    char msg[1024] = "";
    if (st->fn(st->user, section, name, value, st->line, msg, sizeof msg) != 0)
        fail_at(st, st->line, msg);
    /* always "success" to inih: its error line is then purely a syntax error, and the
     * two kinds are told apart by line number below */
    return 1;
}

#if HAVE_INIH_RUNTIME_LINE
/* The length of the longest line of text, '\n' not counted. */
static size_t longest_line(const char *text) {
    size_t most = 0;
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        if (n > most) most = n;
        p += n + (p[n] == '\n');
    }
    return most;
}
#endif

int config_file_parse(const char *text, const char *name, config_file_entry_fn fn, void *user,
                      char *err, size_t errlen) {
    parse_state st = {.p = text, .name = name, .fn = fn, .user = user};
#if HAVE_INIH_RUNTIME_LINE
    /* inih's line buffer is INI_MAX_LINE (200) bytes on the stack unless the library is
     * told otherwise at run time, as Debian's can be: a heap buffer that holds the
     * longest line (+ '\r', '\n', NUL), so a line with a 1023-character path parses */
    size_t need = longest_line(text) + 3;
    if (need > (size_t)ini_max_line) {
        ini_use_stack = 0;
        ini_max_line = ini_initial_alloc = (int)need;
    }
#endif
    int rc = ini_parse_stream(read_line, &st, on_entry, &st);
    if (rc == -2) {
        snprintf(err, errlen, "%s: out of memory while parsing", name);
        return -1;
    }
    if (rc > 0 && (!st.failed_line || rc < st.failed_line)) {
        snprintf(err, errlen,
                 "%s:%d: syntax error: expected '[section]', 'key = value' or a comment",
                 name, rc);
        return -1;
    }
    if (st.failed_line) {
        snprintf(err, errlen, "%s", st.msg);
        return -1;
    }
    return 0;
}
