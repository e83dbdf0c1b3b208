#!/bin/sh
# How `make check` runs each test (Makefile.am's LOG_COMPILER and SH_LOG_COMPILER):
#   tests/run_test.sh CMD...   runs CMD and exits with its status, except that where
# SHLM_TESTS_REQUIRE_ALL=1 (./setup.sh check sets it when every test prerequisite is
# installed) a skip (77) becomes a failure: then nothing may be absent, and a test that
# skips says so above (its "SKIP: reason" line).
"$@"
rc=$?
if [ $rc -eq 77 ] && [ "${SHLM_TESTS_REQUIRE_ALL:-0}" = 1 ]; then
    echo "FAIL: skipped although SHLM_TESTS_REQUIRE_ALL=1 says every test prerequisite is installed (the SKIP line above names the missing one)"
    exit 1
fi
exit $rc
