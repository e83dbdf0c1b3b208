#!/bin/sh
# The checkpoint file layer (tests/test_ckpt_hdf5.c) on 1 and 3 ranks: range blocks,
# checksum properties, ragged collective writes and reads, attributes, error messages.
sh "$SHLM_SRCDIR/tests/mpi_test.sh" 1 "$SHLM_BUILDDIR/tests/test_ckpt_hdf5" || exit $?
exec sh "$SHLM_SRCDIR/tests/mpi_test.sh" 3 "$SHLM_BUILDDIR/tests/test_ckpt_hdf5"
