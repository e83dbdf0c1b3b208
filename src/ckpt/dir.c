/* checkpoint.dir and the files in it: the run's lock and the checks before step 1, the
 * space a save needs, the commit (rename, `latest`), pruning, and resolving what to resume
 * from. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "io/errmsg.h"
#include "io/safe_file.h"
#include "kernels/check.h"
#include "kernels/comm/comm_watchdog.h"
#include "src/base/agree.h"
#include "src/ckpt/ckpt_internal.h"

/* 1 when name is a checkpoint file's name as `latest` may give it: step_<N>.h5 with N
 * decimal digits (no sign, no path, never "." or ".."). */
static int is_checkpoint_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return 0;
    const char *p = name + 5;
    size_t digits = strspn(p, "0123456789");
    return digits >= 1 && digits <= 19 && strcmp(p + digits, ".h5") == 0;
}

/* Both renames refuse a symbolic link at the name they replace (io/safe_file.h). */
int ckpt_dir_commit(const char *dir, const char *tmp, const char *final, const char *name,
                    char *err, size_t errlen) {
    if (safe_file_fsync(tmp, 0, err, errlen) != 0) return -1;
    if (safe_file_rename(tmp, final, err, errlen) != 0) return -1;
    char latest[1100], line[80];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(line, sizeof line, "%s\n", name);
    return safe_file_write_all(latest, line, strlen(line), err, errlen);
}

static int cmp_i64_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Removes the temporary files of failed saves and commits (step_<N>.h5.tmp.*,
 * latest.tmp.*, .shardlm-probe.tmp.*: regular files only, a link is neither followed nor
 * removed) and, with keep > 0, the step_*.h5 beyond the newest `keep` (never `saved`).
 * Rank 0 only, after a commit, under the directory's lock (no other run's files are
 * there); problems are printed, not fatal. */
void ckpt_dir_prune(const char *dir, int keep, int64_t saved) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    char path[2100];
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        long long s;
        char canon[64] = "";
        if (sscanf(nm, "step_%lld.h5", &s) == 1) snprintf(canon, sizeof canon, "step_%lld.h5", s);
        if (canon[0] && strcmp(nm, canon) == 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                int64_t *g = realloc(steps, cap * sizeof *steps);
                if (!g) break;
                steps = g;
            }
            steps[n++] = s;
            continue;
        }
        if (!(canon[0] && safe_file_is_temp_of(nm, canon)) && !safe_file_is_temp_of(nm, "latest") &&
            !safe_file_is_temp_of(nm, ".shardlm-probe"))
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), nm, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        if (unlink(path) == 0) printf("checkpoint: removed %s (left by a failed save)\n", path);
    }
    closedir(d);
    if (keep > 0 && n > (size_t)keep) {
        qsort(steps, n, sizeof *steps, cmp_i64_desc);
        for (size_t i = (size_t)keep; i < n; i++) {
            if (steps[i] == saved) continue;
            snprintf(path, sizeof path, "%s/step_%lld.h5", dir, (long long)steps[i]);
            if (unlink(path) == 0) printf("checkpoint: removed %s (checkpoint.keep = %d)\n", path, keep);
            else fprintf(stderr, "shardlm: warning: cannot remove %s: %s\n", path, strerror(errno));
        }
    }
    free(steps);
}

/* A disk that fills up during the save still fails it cleanly (ckpt_h5_flush); this only
 * says so sooner and more clearly. */
int ckpt_dir_check_space(const char *dir, int rank, uint64_t need, char *err, size_t errlen) {
    if (ckpt_fault_no_space_check()) return 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (uint64_t)rl.rlim_cur < need) {
        io_set_err(err, errlen, "the checkpoint needs about %s but this process may write files "
                   "of at most %s (ulimit -f)", ckpt_bytes_str((double)need).s,
                   ckpt_bytes_str((double)rl.rlim_cur).s);
        return -1;
    }
    struct statvfs sv;
    if (rank == 0 && statvfs(dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < need) {
        io_set_err(err, errlen, "not enough space in %s: the checkpoint needs about %s, %s are "
                   "free", dir, ckpt_bytes_str((double)need).s,
                   ckpt_bytes_str((double)sv.f_bavail * sv.f_frsize).s);
        return -1;
    }
    return 0;
}

/* The longest name a save creates in checkpoint.dir, its unpredictable suffix included. */
#define LONGEST_CKPT_NAME "/step_9223372036854775807.h5.tmp.0123456789abcdef"

/* Refuses a symbolic link at `latest` or at any step_<N>.h5 in dir (rank 0): a save would
 * replace it, and whoever made it expects the write to go through it. */
static int refuse_links(const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        io_set_err(err, errlen, "checkpoint.dir = %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        struct stat sb;
        if (strcmp(de->d_name, "latest") != 0 && !is_checkpoint_name(de->d_name)) continue;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(sb.st_mode))
            continue;
        char path[2100];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        rc = safe_file_refuse_link(path, err, errlen);
    }
    closedir(d);
    return rc;
}

/* Rank 0's side of checkpoint_dir_open: creates dir, takes its lock (*lock_fd), refuses
 * links where a save writes, and probes that a file can be written there. 1 when all
 * went well, else 0 with err. */
static int claim_dir(const job_config *cfg, int *lock_fd, char *err, size_t errlen) {
    const char *dir = cfg->ckpt_dir;
    char lock[1100], owner[1400], why[1536] = "";
    snprintf(lock, sizeof lock, "%s/shardlm.lock", dir);
    snprintf(owner, sizeof owner, "host %s pid %ld job %016llx (%s)", shlm_host(),
             (long)getpid(), (unsigned long long)job_config_hash(cfg), cfg->path);
    int ok = safe_file_mkdir_p(dir, why, sizeof why) == 0;
    if (!ok) {
        io_set_err(err, errlen, "checkpoint.dir = %s: %s", dir, why);
    } else {
        int lr = safe_file_lock(lock, owner, lock_fd, why, sizeof why);
        if (lr == 1) fprintf(stderr, "shardlm: warning: %s\n", why);
        if (lr == -2)
            io_set_err(err, errlen, "checkpoint.dir = %s is in use by another run (%s): two "
                    "runs must not share a checkpoint directory", dir, why);
        else if (lr == -1)
            io_set_err(err, errlen, "checkpoint.dir = %s: %s", dir, why);
        ok = lr >= 0;
    }
    if (ok) ok = refuse_links(dir, err, errlen) == 0;
    if (ok && safe_file_probe_dir(dir, why, sizeof why) != 0) {
        ok = 0;
        io_set_err(err, errlen, "checkpoint.dir = %s is not writable: %s", dir, why);
    }
    return ok;
}

static int dir_open(fsdp_engine *e, const topology *topo, const job_config *cfg,
                    const hf_files *hf, int *lock_fd, char *err, size_t errlen) {
    const char *dir = cfg->ckpt_dir;
    const int rank = topo->world_rank;
    *lock_fd = -1;
    if (!dir[0]) return 0;
    const size_t most = sizeof(((ckpt_h5_file *)0)->path) - 1 - strlen(LONGEST_CKPT_NAME);
    if (strlen(dir) > most) {
        io_set_err(err, errlen, "checkpoint.dir is %zu characters long, at most %zu fit (its "
                "files' paths must stay under %zu characters)", strlen(dir), most,
                sizeof(((ckpt_h5_file *)0)->path));
        return -1;
    }
    const int ok = rank != 0 || claim_dir(cfg, lock_fd, err, errlen);
    if (ranks_agree(topo->world, ok, err, errlen) == 0) {
        /* what each save checks again: the file (an upper bound) must fit */
        const int fits =
            ckpt_dir_check_space(dir, rank, ckpt_save_bytes(e, cfg, hf), err, errlen) == 0;
        if (ranks_agree(topo->world, fits, err, errlen) == 0) return 0;
    }
    checkpoint_dir_close(lock_fd);
    return -1;
}

int checkpoint_dir_open(fsdp_engine *e, const topology *topo, const job_config *cfg,
                        const hf_files *hf, int *lock_fd, char *err, size_t errlen) {
    ckpt_guard_begin("opening checkpoint.dir", 0);
    const int rc = dir_open(e, topo, cfg, hf, lock_fd, err, errlen);
    shlm_guard_end();
    return rc;
}

void checkpoint_dir_close(int *lock_fd) {
    if (*lock_fd >= 0) close(*lock_fd);
    *lock_fd = -1;
}

/* ---------------------------------------------------------------- resolve */

/* The file <dir>/latest names, as a path. Rank 0's side of checkpoint_resolve. `latest`
 * is the one-line regular file ckpt_dir_commit writes; anything else there (a link, dangling
 * or not, a name that is not step_<N>.h5, a file that is gone) is an error, never "no
 * checkpoint": a run must not silently start again from step 0. */
static int read_latest(const char *dir, char *path, size_t pathlen, int must, char *err,
                       size_t errlen) {
    char lp[1100];
    snprintf(lp, sizeof lp, "%s/latest", dir);
    struct stat sb;
    if (lstat(lp, &sb) != 0) {
        if (errno == ENOENT && !must) {
            path[0] = '\0';
            return 0;
        }
        io_set_err(err, errlen, "%s: %s (no checkpoint to resume from there)", lp, strerror(errno));
        return -1;
    }
    if (safe_file_refuse_link(lp, err, errlen) != 0) return -1;
    if (!S_ISREG(sb.st_mode)) {
        io_set_err(err, errlen, "%s is not a regular file (shardlm writes it as one line naming "
                "a checkpoint file)", lp);
        return -1;
    }
    char text[128] = "";
    int fd = open(lp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
    if (got < 0) {
        io_set_err(err, errlen, "%s: %s", lp, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    text[got] = '\0';
    char *name = text;
    const size_t len = strcspn(name, "\r\n");
    const int one_line = len + strspn(text + len, "\r\n") == (size_t)got;
    name[len] = '\0';
    if (!one_line || !is_checkpoint_name(name)) {
        for (char *c = name; *c; c++)
            if (*c < 32 || *c > 126) *c = '?';
        io_set_err(err, errlen, "%s: expected one line naming a checkpoint file (step_<N>.h5), "
                "got '%.100s'", lp, one_line ? name : "more than one line");
        return -1;
    }
    snprintf(path, pathlen, "%s/%s", dir, name);
    if (access(path, R_OK) != 0) {
        io_set_err(err, errlen, "%s names %s, which cannot be read: %s", lp, path, strerror(errno));
        return -1;
    }
    return 0;
}

static int resolve(const char *dir, const char *resume, char *path, size_t pathlen, char *err,
                   size_t errlen) {
    int rank;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    char found[2048] = "";
    int ok = 1;
    if (rank == 0) {
        struct stat sb;
        if (strcmp(resume, "none") == 0) {
            found[0] = '\0';
        } else if (strcmp(resume, "auto") == 0) {
            if (dir[0]) ok = read_latest(dir, found, sizeof found, 0, err, errlen) == 0;
        } else if (stat(resume, &sb) != 0) {
            io_set_err(err, errlen, "no checkpoint at %s: %s", resume, strerror(errno));
            ok = 0;
        } else if (S_ISDIR(sb.st_mode)) {
            ok = read_latest(resume, found, sizeof found, 1, err, errlen) == 0;
        } else {
            snprintf(found, sizeof found, "%s", resume);
        }
    }
    if (ranks_agree(MPI_COMM_WORLD, ok, err, errlen)) return -1;
    MPI_CHECK(MPI_Bcast(found, (int)sizeof found, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (strlen(found) >= pathlen) {
        io_set_err(err, errlen, "checkpoint path too long: %s", found);
        return -1;
    }
    snprintf(path, pathlen, "%s", found);
    return 0;
}

int checkpoint_resolve(const char *dir, const char *resume, char *path, size_t pathlen,
                       char *err, size_t errlen) {
    ckpt_guard_begin("finding the checkpoint to load", 0);
    const int rc = resolve(dir, resume, path, pathlen, err, errlen);
    shlm_guard_end();
    return rc;
}
