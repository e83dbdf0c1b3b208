/* The fuzz harnesses' shared helpers (fuzz.h). */
#include "tests/fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void remove_dir(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (dir[0] && system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", dir);
}

const char *fuzz_dir(void) {
    if (!dir[0]) {
        /* short: Open MPI's MPI-IO aborts on long paths (FIELD-NOTES) */
        snprintf(dir, sizeof dir, "/tmp/shlm-fuzz-XXXXXX");
        if (!mkdtemp(dir)) {
            perror(dir);
            abort();
        }
        atexit(remove_dir);
    }
    return dir;
}

const char *fuzz_write(const char *name, const void *data, size_t size) {
    static char path[8][512];
    static const char *names[8];
    int slot = 0;
    while (slot < 7 && names[slot] && strcmp(names[slot], name) != 0) slot++;
    names[slot] = name;
    snprintf(path[slot], sizeof path[slot], "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path[slot], "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path[slot]);
        abort();
    }
    return path[slot];
}

void fuzz_check_error(int rc, const char *err, const char *prefix, const char *what) {
    const char *why = NULL;
    if (rc != 0 && rc != -1) why = "returned neither 0 nor -1";
    else if (rc == -1 && !err[0]) why = "failed with an empty message";
    else if (rc == -1 && strchr(err, '\n')) why = "failed with a message of several lines";
    else if (rc == -1 && prefix && strncmp(err, prefix, strlen(prefix)) != 0)
        why = "failed with a message that does not start with its file";
    if (!why) return;
    fprintf(stderr, "fuzz: %s %s (rc %d): \"%s\"\n", what, why, rc, err);
    abort();
}
