/* The one-line check of the unit tests that count their checks: "ok   - what" or
 * "FAIL - what", counted into n_checks / n_failed, which main() reports and turns into
 * the exit status. */
#ifndef SHLM_TESTS_CHECK_H
#define SHLM_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int n_checks, n_failed;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s - ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_checks++;
    n_failed += !ok;
}

#endif
