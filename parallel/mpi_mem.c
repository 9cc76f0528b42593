/* mpi_mem: see mpi_mem.h. The figures follow Open MPI 4.1's sources:
 *   allreduce, tuned ring (ompi_coll_base_allreduce_intra_ring): inbuf[0]
 *     of one block (ceil(count/size) elements), inbuf[1] too when size > 2;
 *   reduce_scatter, tuned ring (ompi_coll_base_reduce_scatter_intra_ring):
 *     accumbuf of the whole vector (the input copied into it) and the same
 *     one or two blocks;
 *   ireduce_scatter, libnbc (nbc_reduce_scatter_init): a binomial reduce
 *     to member 0 then a scatter, in one malloc of two whole vectors, of
 *     which a member touches one per round in which it receives (at most
 *     two: the rounds alternate between them); a leaf touches none.
 * The tuned component runs the ring algorithms for vectors of the sizes
 * that matter here (megabytes). */
#include "parallel/mpi_mem.h"

#include <mpi.h>
#include <string.h>

int64_t zt_mpimem_temp(zt_mpimem_op op, int64_t bytes, int size, int rank) {
  if (size <= 1 || bytes <= 0) return 0;
  int64_t block = (bytes + size - 1) / size, blocks = (size > 2 ? 2 : 1) * block;
  switch (op) {
    case ZT_MPIMEM_ALLREDUCE: return blocks;
    case ZT_MPIMEM_REDUCE_SCATTER: return bytes + blocks;
    case ZT_MPIMEM_IREDUCE_SCATTER: {
      int rounds = 0;
      for (int r = 1; (1 << (r - 1)) < size; r++) {
        if (rank % (1 << r)) break; /* sends this round, then leaves */
        if (rank + (1 << (r - 1)) < size) rounds++;
      }
      return (rounds > 2 ? 2 : rounds) * bytes;
    }
  }
  return 0;
}

const char *zt_mpimem_library(void) {
  static char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int n = 0;
  if (!v[0] && MPI_Get_library_version(v, &n) == MPI_SUCCESS) v[strcspn(v, ",\n")] = 0;
  return v;
}
