/* Fuzzes the job file and its --set overrides (src/job/config.c job_config_load over
 * io/config_file.c). Input: the job file's text, then optionally a NUL byte and up to 16
 * --set arguments ("section.key=value"), each ended by a NUL or a line break (a --set
 * holding a line break gets a message of several lines from src/job/config.c: reported, and
 * kept out of these inputs until it is fixed). A job that loads is printed, hashed and
 * freed; one that does not must fail with one line naming the file, the file:line or
 * the --set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/job/config.h"
#include "tests/fuzz/fuzz.h"

enum { MAX_SETS = 16 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, '\0', size);
    size_t text_len = nul ? (size_t)(nul - data) : size;
    const char *path = fuzz_write("job.ini", data, text_len);

    /* the overrides, NUL-terminated copies */
    char *sets[MAX_SETS];
    int n_sets = 0;
    for (size_t at = text_len + 1; nul && at <= size && n_sets < MAX_SETS;) {
        size_t len = 0;
        while (at + len < size && data[at + len] != '\0' && data[at + len] != '\n') len++;
        sets[n_sets] = malloc(len + 1);
        memcpy(sets[n_sets], data + at, len);
        sets[n_sets++][len] = '\0';
        at += len + 1;
    }

    job_config cfg;
    char err[1536] = "";
    int rc = job_config_load(&cfg, path, n_sets, sets, err, sizeof err);
    fuzz_check_error(rc, err, NULL, "job_config_load");
    if (rc == -1 && !strstr(err, path) && !strstr(err, "--set"))
        fuzz_fail("job_config_load: the message names neither the file nor the --set", err);
    if (rc == 0) {
        job_config_print(&cfg, 1 + (int)(size % 64));
        fflush(stdout);
        (void)job_config_hash(&cfg);
        job_config_free(&cfg);
    }
    for (int i = 0; i < n_sets; i++) free(sets[i]);
    return 0;
}
