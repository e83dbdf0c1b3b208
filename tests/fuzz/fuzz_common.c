/* The fuzz harnesses' shared helpers (fuzz.h). */
#include "tests/fuzz/fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void remove_tree(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", path);
}

static void remove_dir(void) { remove_tree(dir); }

/* libFuzzer's fork mode ends its jobs with _Exit (no atexit) and a crash ends them too:
 * the directories of processes that are gone are swept when the next one starts */
static void sweep_stale(const char *tmp) {
    DIR *d = opendir(tmp);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        long pid = 0;
        char rest = 0;
        if (sscanf(e->d_name, "shlm-fuzz-%ld%c", &pid, &rest) != 1 || pid <= 0) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        remove_tree(path);
    }
    if (d) closedir(d);
}

const char *fuzz_dir(void) {
    if (!dir[0]) {
        /* short: Open MPI's MPI-IO aborts on long paths (FIELD-NOTES) */
        const char *tmp = getenv("TMPDIR");
        tmp = tmp && tmp[0] ? tmp : "/tmp";
        sweep_stale(tmp);
        snprintf(dir, sizeof dir, "%s/shlm-fuzz-%ld", tmp, (long)getpid());
        remove_tree(dir); /* a dead process of the same pid */
        if (mkdir(dir, 0700) != 0) {
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

void fuzz_fail(const char *what, const char *why) {
    fprintf(stderr, "fuzz: %s: %s\n", what, why);
    abort();
}
