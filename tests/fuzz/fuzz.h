/* What the fuzz harnesses (tests/fuzz/fuzz_NAME.c) share. Each harness feeds one reader
 * of untrusted input and defines LLVMFuzzerTestOneInput (and LLVMFuzzerInitialize when
 * it needs set-up); it is linked with libFuzzer for `make fuzz` and with replay_main.c,
 * which runs it once over each file of a corpus, for `make check`. Both builds use
 * AddressSanitizer and UndefinedBehaviorSanitizer; a finding aborts the process. */
#ifndef SHLM_FUZZ_H
#define SHLM_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* This process's private directory, $TMPDIR/shlm-fuzz-PID (made on first use, removed
 * at exit; those of processes that are gone are removed then too). */
const char *fuzz_dir(void);

/* Writes size bytes to fuzz_dir()/name; returns the path (valid until the next call
 * with the same name). Aborts when the file cannot be written: the harness is broken. */
const char *fuzz_write(const char *name, const void *data, size_t size);

/* Reports a breached contract of `what` and aborts, so the fuzzer keeps the input. */
void fuzz_fail(const char *what, const char *why) __attribute__((noreturn));

/* A reader's error contract: rc is 0 or -1, and after -1 err is one non-empty line that
 * starts with `prefix` (the file it names) when prefix is not NULL. A breach aborts with
 * the message, so the fuzzer keeps the input. */
void fuzz_check_error(int rc, const char *err, const char *prefix, const char *what);

#endif
