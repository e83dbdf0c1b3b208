/* How shardlm creates, replaces and appends to files: never through a link planted at a
 * name it writes, never into a file it did not create, always whole or not at all. */
#ifndef SHLM_SAFE_FILE_H
#define SHLM_SAFE_FILE_H

/*
 * The rules, in one place (every file the program writes goes through here, or, for
 * HDF5 checkpoints and plot's PNGs, through a temporary name made here, created
 * exclusively, written by the library or gnuplot, then safe_file_rename):
 *   - A file is written under a temporary name in its target directory,
 *     "<path>.tmp.<16 random hex digits>", created with O_CREAT|O_EXCL|O_NOFOLLOW:
 *     nothing already there (file, link, dangling link) is opened, truncated or
 *     followed, and the name cannot be guessed in advance. The finished file is
 *     fsynced and renamed onto <path>, and the directory fsynced: a reader sees the
 *     old file or the whole new one.
 *   - Only a regular file at <path> is replaced. A symbolic link there is refused with
 *     a clear message (rename would replace the name, never what the link points to,
 *     but someone put it there, and a user who made it expects the write to go through
 *     it); so is anything else (a FIFO, a device, a socket, a directory), named by what
 *     it is: a rename would put a regular file in the place of /dev/null or of a pipe
 *     someone reads. Outputs a user may point at a stream on purpose
 *     (safe_file_begin_output) write into an existing FIFO or character device as it
 *     is, without a temporary name.
 *   - Files that grow across runs (metrics.jsonl) are opened O_APPEND|O_NOFOLLOW and
 *     must be regular files with one link (no hard link to something else).
 * Local functions (no MPI). Each returns 0, or -1 with one line in err naming the file
 * and, where a system call failed, its errno message.
 */

#include <stddef.h>
#include <stdio.h>

/* The longest path these functions take (a temporary name adds TEMP_SUFFIX_MAX). */
enum { SAFE_FILE_PATH_MAX = 1024, SAFE_FILE_TEMP_SUFFIX_MAX = 22 };

/* A file being written under a temporary name. */
typedef struct safe_file {
    FILE *fp;                                       /* write here; NULL once closed */
    char path[SAFE_FILE_PATH_MAX];                  /* the name it will have */
    char tmp[SAFE_FILE_PATH_MAX + SAFE_FILE_TEMP_SUFFIX_MAX]; /* the name it has now */
    int direct; /* fp writes into path itself (safe_file_begin_output); tmp is empty */
} safe_file;

/* Creates a fresh temporary file for path (refusing at once, before anything is written,
 * anything at path that is not a regular file: safe_file_check_target). */
int safe_file_begin(safe_file *s, const char *path, char *err, size_t errlen);
/* For an output a user may send to a stream (generate --dump-logits): when path names,
 * through links too, an existing FIFO or character device (a pipe, /dev/stdout on a pipe
 * or a terminal, /dev/null), opens it for writing as it is: nothing is created, replaced
 * or truncated, and finish only flushes and closes. Any other path: safe_file_begin. */
int safe_file_begin_output(safe_file *s, const char *path, char *err, size_t errlen);
/* Flushes, fsyncs and closes the temporary file, then renames it onto path
 * (safe_file_rename). On failure the temporary file is removed. A direct output
 * (safe_file_begin_output) is flushed and closed. */
int safe_file_finish(safe_file *s, char *err, size_t errlen);
/* Closes and removes the temporary file (after a failure; safe after finish). */
void safe_file_abort(safe_file *s);
/* begin + one write + finish. */
int safe_file_write_all(const char *path, const void *data, size_t len, char *err,
                        size_t errlen);

/* A fresh unpredictable temporary name for path, "<path>.tmp.<16 hex>", for writers
 * that create the file themselves, exclusively (HDF5's H5F_ACC_EXCL). */
int safe_file_temp_name(const char *path, char *tmp, size_t tmplen, char *err,
                        size_t errlen);
/* 1 when name is a temporary name of base: "<base>.tmp" (older shardlm) or
 * "<base>.tmp.<16 hex>"; else 0. Names only, no directory. */
int safe_file_is_temp_of(const char *name, const char *base);

/* 0 when path does not exist or is not a symbolic link; -1 when it is one (dangling
 * or not), with a message naming it and its target, or when lstat fails otherwise. */
int safe_file_refuse_link(const char *path, char *err, size_t errlen);
/* 0 when path does not exist or is a regular file (what a write may replace); -1 with a
 * message naming path and what it is (a symbolic link and its target, a FIFO, a
 * character or block device, a socket, a directory), or when lstat fails otherwise. */
int safe_file_check_target(const char *path, char *err, size_t errlen);
/* What a file of st_mode `mode` is, for messages: "a FIFO (named pipe)", "a socket",
 * "a character device", "a directory", ... */
const char *safe_file_kind(unsigned mode);
/* Removes path when it is a regular file (what shardlm wrote there); anything else at path
 * (a FIFO, a device, a link, a directory) is left alone. 0 when it was removed or absent,
 * -1 otherwise. */
int safe_file_remove(const char *path);
/* Renames tmp onto path (refusing anything but a regular file at path:
 * safe_file_check_target) and fsyncs the directory. */
int safe_file_rename(const char *tmp, const char *path, char *err, size_t errlen);
/* fsync of a file (never through a symbolic link) or, with directory, of a directory, by
 * path: what a rename-based commit needs to be durable. */
int safe_file_fsync(const char *path, int directory, char *err, size_t errlen);

/* Opens path for appending (created if missing): refuses a symbolic link, anything
 * but a regular file (named by what it is, never opened), and a file with more than one
 * hard link. */
FILE *safe_file_append(const char *path, char *err, size_t errlen);

/* Opens for reading a file shardlm writes and reads back (metrics.jsonl): only a regular
 * file (a link to one is followed), never waiting on a FIFO planted there. NULL with err
 * (and errno: ENOENT when there is nothing at path). */
FILE *safe_file_read_own(const char *path, char *err, size_t errlen);

/* mkdir -p: every missing component is created; an existing component that is not a
 * directory (or a link to one) is an error naming it. */
int safe_file_mkdir_p(const char *dir, char *err, size_t errlen);

/* 1 when both paths exist and are the same file (same device and inode, whatever the
 * names: a second path, a hard link, a symbolic link), else 0. */
int safe_file_same(const char *a, const char *b);

/* Whether files can be created and written in dir: creates a temporary file there,
 * writes and fsyncs 4 KiB, removes it. The error carries errno's own words (EROFS,
 * EACCES, ENOSPC, EDQUOT). */
int safe_file_probe_dir(const char *dir, char *err, size_t errlen);

/* Takes an exclusive flock on the lock file path (created if missing; a symbolic link,
 * a non-regular file or one with several hard links is refused) and writes owner (one
 * line) into it. *fd holds the lock until close (or the process's exit: a dead
 * holder's lock is free again). Returns 0 when taken; -2 when another process holds
 * it (err: "<path> is held by <what the file says>"); -1 on any other error; 1 when
 * the file system does not support flock (err holds a warning, *fd = -1). */
int safe_file_lock(const char *path, const char *owner, int *fd, char *err, size_t errlen);

#endif
