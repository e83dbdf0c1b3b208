#!/bin/sh
# Node, shard and replica groups of every strategy on 4 ranks (tests/test_topology.c).
exec sh "$SHLM_SRCDIR/tests/mpi_test.sh" 4 "$SHLM_BUILDDIR/tests/test_topology"
