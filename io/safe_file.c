/* Exclusive creation, atomic replacement and link-refusing appends (see safe_file.h). */
#include "io/safe_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/errmsg.h"

/* Fresh names tried before giving up: a collision of 64 random bits means someone is
 * creating names on purpose. */
enum { TEMP_TRIES = 8, PROBE_BYTES = 4096 };

/* The message for a symbolic link found where a file is written. */
static void link_message(const char *path, char *err, size_t errlen) {
    char target[512];
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    io_set_err(err, errlen, "%s is a symbolic link (to %s): shardlm never writes through or "
            "replaces a link; remove it or choose another path", path, n > 0 ? target : "?");
}

int safe_file_refuse_link(const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return 0;
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISLNK(sb.st_mode)) return 0;
    link_message(path, err, errlen);
    return -1;
}

const char *safe_file_kind(unsigned mode) {
    return S_ISREG(mode)    ? "a regular file"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISLNK(mode)  ? "a symbolic link"
           : S_ISFIFO(mode) ? "a FIFO (named pipe)"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
                            : "not a regular file";
}

/* The message for something other than a regular file or a link at a name written. */
static void kind_message(const char *path, unsigned mode, char *err, size_t errlen) {
    io_set_err(err, errlen, "%s is %s: shardlm writes only regular files and never replaces "
            "anything else; remove it or choose another path", path, safe_file_kind(mode));
}

int safe_file_remove(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    return S_ISREG(sb.st_mode) && unlink(path) == 0 ? 0 : -1;
}

int safe_file_check_target(const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return 0;
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(sb.st_mode)) return 0;
    if (S_ISLNK(sb.st_mode)) link_message(path, err, errlen);
    else kind_message(path, sb.st_mode, err, errlen);
    return -1;
}

/* 64 bits from the kernel's random source, as 16 hex digits. */
static int random_hex(char out[17]) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) return -1;
    snprintf(out, 17, "%016llx", (unsigned long long)v);
    return 0;
}

int safe_file_temp_name(const char *path, char *tmp, size_t tmplen, char *err,
                        size_t errlen) {
    char hex[17];
    if (random_hex(hex) != 0) {
        io_set_err(err, errlen, "%s: no random bytes for a temporary name: %s", path,
                strerror(errno));
        return -1;
    }
    if ((size_t)snprintf(tmp, tmplen, "%s.tmp.%s", path, hex) >= tmplen) {
        io_set_err(err, errlen, "%.200s...: path too long (%zu characters)", path, strlen(path));
        return -1;
    }
    return 0;
}

int safe_file_is_temp_of(const char *name, const char *base) {
    const size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp", 4) != 0) return 0;
    const char *rest = name + n + 4;
    if (*rest == '\0') return 1;
    if (*rest != '.' || strlen(rest + 1) != 16) return 0;
    for (const char *p = rest + 1; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

/* The directory part of path ("." when there is none). */
static void dir_of(const char *path, char *dir, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, len, ".");
    else if (slash == path) snprintf(dir, len, "/");
    else snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

int safe_file_rename(const char *tmp, const char *path, char *err, size_t errlen) {
    if (safe_file_check_target(path, err, errlen) != 0) return -1;
    if (rename(tmp, path) != 0) {
        io_set_err(err, errlen, "%s: cannot rename %s onto it: %s", path, tmp, strerror(errno));
        return -1;
    }
    char dir[SAFE_FILE_PATH_MAX];
    dir_of(path, dir, sizeof dir);
    return safe_file_fsync(dir, 1, err, errlen);
}

int safe_file_fsync(const char *path, int directory, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : O_NOFOLLOW));
    if (fd < 0 || fsync(fd) != 0) {
        io_set_err(err, errlen, "%s: fsync%s failed: %s", path, directory ? " of the directory" : "",
                   strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

int safe_file_begin(safe_file *s, const char *path, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    if ((size_t)snprintf(s->path, sizeof s->path, "%s", path) >= sizeof s->path) {
        io_set_err(err, errlen, "%.200s...: path too long (%zu characters)", path, strlen(path));
        return -1;
    }
    if (safe_file_check_target(path, err, errlen) != 0) return -1;
    int fd = -1;
    for (int i = 0; fd < 0 && i < TEMP_TRIES; i++) {
        if (safe_file_temp_name(path, s->tmp, sizeof s->tmp, err, errlen) != 0) return -1;
        fd = open(s->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        io_set_err(err, errlen, "%s: cannot create %s: %s", path, s->tmp, strerror(errno));
        s->tmp[0] = '\0';
        return -1;
    }
    s->fp = fdopen(fd, "wb");
    if (!s->fp) {
        io_set_err(err, errlen, "%s: %s", s->tmp, strerror(errno));
        close(fd);
        unlink(s->tmp);
        s->tmp[0] = '\0';
        return -1;
    }
    return 0;
}

int safe_file_begin_output(safe_file *s, const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !(S_ISFIFO(sb.st_mode) || S_ISCHR(sb.st_mode)))
        return safe_file_begin(s, path, err, errlen);
    memset(s, 0, sizeof *s);
    if ((size_t)snprintf(s->path, sizeof s->path, "%s", path) >= sizeof s->path) {
        io_set_err(err, errlen, "%.200s...: path too long (%zu characters)", path, strlen(path));
        return -1;
    }
    /* opened as it is: nothing created or truncated (a FIFO waits here for its reader) */
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        io_set_err(err, errlen, "%s: cannot open for writing: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &sb) != 0 || !(S_ISFIFO(sb.st_mode) || S_ISCHR(sb.st_mode))) {
        io_set_err(err, errlen, "%s changed while it was opened: refusing to write to it", path);
        close(fd);
        return -1;
    }
    s->fp = fdopen(fd, "wb");
    if (!s->fp) {
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    s->direct = 1;
    return 0;
}

int safe_file_finish(safe_file *s, char *err, size_t errlen) {
    if (!s->fp) {
        io_set_err(err, errlen, "%s: not open for writing", s->path);
        return -1;
    }
    if (s->direct) {
        int bad = fflush(s->fp) != 0 || ferror(s->fp);
        int saved = errno;
        if (fclose(s->fp) != 0 && !bad) bad = 1, saved = errno;
        s->fp = NULL;
        if (bad) io_set_err(err, errlen, "%s: writing failed: %s", s->path, strerror(saved));
        return bad ? -1 : 0;
    }
    int bad = fflush(s->fp) != 0 || ferror(s->fp);
    int saved = errno;
    if (!bad && fsync(fileno(s->fp)) != 0) bad = 1, saved = errno;
    if (fclose(s->fp) != 0 && !bad) bad = 1, saved = errno;
    s->fp = NULL;
    if (bad) {
        io_set_err(err, errlen, "%s: writing %s failed: %s", s->path, s->tmp, strerror(saved));
        safe_file_abort(s);
        return -1;
    }
    if (safe_file_rename(s->tmp, s->path, err, errlen) != 0) {
        safe_file_abort(s);
        return -1;
    }
    s->tmp[0] = '\0';
    return 0;
}

void safe_file_abort(safe_file *s) {
    if (s->fp) fclose(s->fp);
    s->fp = NULL;
    if (s->tmp[0]) unlink(s->tmp);
    s->tmp[0] = '\0';
}

int safe_file_write_all(const char *path, const void *data, size_t len, char *err,
                        size_t errlen) {
    safe_file s;
    if (safe_file_begin(&s, path, err, errlen) != 0) return -1;
    if (len > 0 && fwrite(data, 1, len, s.fp) != len) {
        io_set_err(err, errlen, "%s: writing %s failed: %s", path, s.tmp, strerror(errno));
        safe_file_abort(&s);
        return -1;
    }
    return safe_file_finish(&s, err, errlen);
}

/* Opens path with flags | O_NOFOLLOW | O_NONBLOCK (a FIFO planted there must not
 * block) and checks it is a regular file with one link; O_NONBLOCK is then cleared. */
static int open_own_file(const char *path, int flags, char *err, size_t errlen) {
    /* a device is not even opened (opening one can act: a tape rewinds) */
    if (safe_file_check_target(path, err, errlen) != 0) return -1;
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0) {
        if (errno == ELOOP) link_message(path, err, errlen);
        else io_set_err(err, errlen, "%s: cannot open for writing: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        kind_message(path, sb.st_mode, err, errlen);
    } else if (sb.st_nlink != 1) {
        io_set_err(err, errlen, "%s has %lu hard links: refusing to write to a file that "
                "another name shares", path, (unsigned long)sb.st_nlink);
    } else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
    } else {
        return fd;
    }
    close(fd);
    return -1;
}

FILE *safe_file_read_own(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        io_set_err(err, errlen, "%s: %s", path, strerror(e));
        errno = e;
        return NULL;
    }
    struct stat sb;
    FILE *f = NULL;
    if (fstat(fd, &sb) != 0) {
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        io_set_err(err, errlen, "%s is %s, not a file shardlm wrote", path,
                   safe_file_kind(sb.st_mode));
        errno = EINVAL;
    } else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
               !(f = fdopen(fd, "r"))) {
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
    }
    if (!f) {
        const int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

FILE *safe_file_append(const char *path, char *err, size_t errlen) {
    int fd = open_own_file(path, O_WRONLY | O_APPEND | O_CREAT, err, errlen);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "a");
    if (!f) {
        io_set_err(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

/* 0 when path is a directory (or a link to one); errno ENOENT when missing. */
static int is_dir(const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path, &sb) != 0) return -1;
    if (S_ISDIR(sb.st_mode)) return 0;
    io_set_err(err, errlen, "cannot create directory %s: it exists and is not a directory", path);
    errno = ENOTDIR;
    return -1;
}

int safe_file_mkdir_p(const char *dir, char *err, size_t errlen) {
    char tmp[SAFE_FILE_PATH_MAX];
    if (!dir[0]) {
        io_set_err(err, errlen, "cannot create a directory with an empty name");
        return -1;
    }
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", dir) >= sizeof tmp) {
        io_set_err(err, errlen, "%.200s...: path too long (%zu characters)", dir, strlen(dir));
        return -1;
    }
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        const char c = *p;
        *p = '\0';
        if (is_dir(tmp, err, errlen) != 0) {
            if (errno != ENOENT) {
                if (errno != ENOTDIR)
                    io_set_err(err, errlen, "cannot create directory %s: %s", tmp, strerror(errno));
                return -1;
            }
            if (mkdir(tmp, 0777) != 0 && (errno != EEXIST || is_dir(tmp, err, errlen) != 0)) {
                if (errno != ENOTDIR)
                    io_set_err(err, errlen, "cannot create directory %s: %s", tmp, strerror(errno));
                return -1;
            }
        }
        *p = c;
        if (c == '\0') return 0;
    }
}

int safe_file_same(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int safe_file_probe_dir(const char *dir, char *err, size_t errlen) {
    char path[SAFE_FILE_PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/.shardlm-probe", dir) >= sizeof path) {
        io_set_err(err, errlen, "%.200s...: path too long (%zu characters)", dir, strlen(dir));
        return -1;
    }
    safe_file s;
    if (safe_file_begin(&s, path, err, errlen) != 0) return -1;
    static const char zeros[PROBE_BYTES];
    int bad = fwrite(zeros, 1, sizeof zeros, s.fp) != sizeof zeros || fflush(s.fp) != 0 ||
              fsync(fileno(s.fp)) != 0;
    if (bad) io_set_err(err, errlen, "cannot write %d bytes to %s: %s", PROBE_BYTES, s.tmp,
                     strerror(errno));
    safe_file_abort(&s);
    return bad ? -1 : 0;
}

int safe_file_lock(const char *path, const char *owner, int *fd, char *err, size_t errlen) {
    *fd = open_own_file(path, O_RDWR | O_CREAT, err, errlen);
    if (*fd < 0) return -1;
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        if (e == EWOULDBLOCK) {
            char holder[256] = "";
            ssize_t n = pread(*fd, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            holder[strcspn(holder, "\r\n")] = '\0';
            io_set_err(err, errlen, "%s is held by %s", path, holder[0] ? holder : "another process");
        } else if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS) {
            io_set_err(err, errlen, "%s: the file system does not support flock (%s): two runs "
                    "sharing this directory will not be detected", path, strerror(e));
        } else {
            io_set_err(err, errlen, "%s: flock failed: %s", path, strerror(e));
        }
        close(*fd);
        *fd = -1;
        return e == EWOULDBLOCK ? -2 : e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS ? 1 : -1;
    }
    const size_t n = strlen(owner);
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, owner, n, 0) != (ssize_t)n ||
        pwrite(*fd, "\n", 1, (off_t)n) != 1) {
        io_set_err(err, errlen, "%s: cannot write the lock's owner: %s", path, strerror(errno));
        close(*fd);
        *fd = -1;
        return -1;
    }
    return 0;
}
