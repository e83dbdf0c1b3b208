/* Job-file reading: the whole file as text, then an INI parse (inih) that calls back once
 * per entry with its line number. What the keys mean is src/job/config.c's business. */
#ifndef SHLM_CONFIG_FILE_H
#define SHLM_CONFIG_FILE_H

#include <stddef.h>

/* Called once per `[section]` header (key and value NULL, so that a section with no
 * keys is still seen) and once per `key = value` entry, in file order; line is 1-based.
 * Returns 0 to go on, or -1 after writing one line describing the problem into err
 * (the callback formats the whole message, file and line included). */
typedef int (*config_file_entry_fn)(void *user, const char *section, const char *key,
                                    const char *value, int line, char *err, size_t errlen);

/* Reads the whole file into a malloc'd, NUL-terminated string (*text, caller frees).
 * Returns 0, or -1 with "PATH: problem" in err (missing, unreadable, NUL bytes). */
int config_file_read(const char *path, char **text, char *err, size_t errlen);

/* Parses INI text; `name` is the file name used in messages. Lines are stripped of
 * leading blanks first, so indentation is allowed and no line ever continues the one
 * before (inih's multi-line values are off); comments start a line with ';' or '#', or
 * follow a value as " ; comment". Once the callback fails it is not called again.
 * Returns 0; or -1 with the first problem in err: the callback's message, or
 * "NAME:LINE: syntax error: ..." for a line that is neither a section, an entry nor a
 * comment, or "NAME:LINE: line too long ...". */
int config_file_parse(const char *text, const char *name, config_file_entry_fn fn, void *user,
                      char *err, size_t errlen);

#endif
