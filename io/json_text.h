/* JSON texts read with cJSON, with what cJSON gets silently wrong refused and what it
 * refuses explained: the byte where, and the real cause. */
#ifndef SHLM_JSON_TEXT_H
#define SHLM_JSON_TEXT_H

#include <stddef.h>

#include <cjson/cJSON.h>

enum json_text_flags {
    /* refuse a raw NUL byte and the escape \u0000: cJSON's strings end at the first NUL,
     * so a text holding one would be cut short without a word */
    JSON_TEXT_NO_NUL = 1 << 0,
    /* refuse an object holding a key twice, at any depth: cJSON's lookups take the first,
     * Python's json (which made or checks most such files) the last */
    JSON_TEXT_UNIQUE_KEYS = 1 << 1,
};

/* Parses text[0, len) as one JSON value (blanks around it allowed). Returns the tree, or
 * NULL with one line in err saying why and *at the 0-based offset in text of the byte it
 * is about ((size_t)-1 when it is about no one byte: a duplicate key). Besides what the
 * flags refuse, the causes named are: a lone UTF-16 surrogate escape (\ud800 without its
 * pair: no character, which cJSON refuses as bad syntax), nesting deeper than cJSON's
 * CJSON_NESTING_LIMIT levels, text after the value, and any other syntax error (at the
 * byte cJSON stopped at). The message holds no position: callers say it their way
 * (io/errmsg.h, IO_AT_BYTE). */
cJSON *json_text_parse(const char *text, size_t len, int flags, size_t *at, char *err,
                       size_t errlen);
/* json_text_parse of a whole file's text, the message saying where: "PATH:LINE: why
 * (byte N of the line, counting from 1)", or "PATH: why". */
cJSON *json_text_parse_file(const char *path, const char *text, size_t len, int flags,
                            char *err, size_t errlen);

#endif
