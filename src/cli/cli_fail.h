/* The commands' one error line: "shardlm: error: CMD: MSG". */
#ifndef SHLM_CLI_FAIL_H
#define SHLM_CLI_FAIL_H

/* Writes "shardlm: error: CMD: MSG" (cmd NULL: "shardlm: error: MSG", for a message that
 * names its own place) to stderr at once, from rank 0 of an MPI job (every rank holds the
 * same message) or from a plain process; returns status (usage problems 2, everything
 * else 1), so `return cli_fail("data", 2, "...", ...);`. */
int cli_fail(const char *cmd, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
