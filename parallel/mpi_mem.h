/* mpi_mem: the memory the MPI library itself takes for ztrain's large
 * collectives — temporaries it allocates inside a call and frees after,
 * which count in the process's peak. Derived from the algorithms of the
 * library ztrain is built with (Open MPI 4.1: the `tuned` component runs
 * the blocking calls, `libnbc` the non-blocking ones), not measured: the
 * planner adds them to a rank's peak. */
#ifndef ZT_MPI_MEM_H
#define ZT_MPI_MEM_H

#include <stdint.h>

typedef enum {
  ZT_MPIMEM_ALLREDUCE = 0,      /* blocking, in place */
  ZT_MPIMEM_REDUCE_SCATTER,     /* blocking, in place or not */
  ZT_MPIMEM_IREDUCE_SCATTER     /* non-blocking */
} zt_mpimem_op;

/* Bytes of temporaries member `rank` of `size` touches in one call whose
 * whole buffer is `bytes` (the reduced vector; every member's part is at
 * most ceil(bytes / size)). 0 for one member. */
int64_t zt_mpimem_temp(zt_mpimem_op op, int64_t bytes, int size, int rank);

/* The library's name and version (MPI_Get_library_version's first line),
 * for the record; callable before MPI starts. */
const char *zt_mpimem_library(void);

#endif
