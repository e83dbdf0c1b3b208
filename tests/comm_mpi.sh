#!/bin/sh
# Every collective of the MPI comm backend on 4 ranks (tests/test_comm_mpi.c).
exec sh "$SHLM_SRCDIR/tests/mpi_test.sh" 4 "$SHLM_BUILDDIR/tests/test_comm_mpi"
