#!/usr/bin/env bash
# Every MPI call of the program lives in parallel/, behind its lock, byte
# accounting and watchdog: outside it no file of the program (src/,
# kernels/) names an MPI function, type or constant, or includes mpi.h.
# The one exception is HDF5's MPI-IO file property (H5Pset_fapl_mpio),
# which needs the communicator a checkpoint is written over.
# Usage: layering.sh SOURCE_DIR
set -u
cd "$1"
hits=$(grep -rnE '\bMPI_[A-Za-z_]+|<mpi\.h>' src kernels \
         --include='*.c' --include='*.h' --include='*.cu' | grep -v 'H5Pset_fapl_mpio(')
if [ -n "$hits" ]; then
  echo "FAIL: MPI outside parallel/ (use parallel/comm.h):"
  echo "$hits" | sed 's/^/    /'
  echo "0 passed, 1 failed"
  exit 1
fi
n=$(grep -rlE '\bMPI_' parallel | wc -l)
echo "MPI is named in $n files, all under parallel/; 1 passed, 0 failed"
