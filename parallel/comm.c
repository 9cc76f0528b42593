/* comm: MPI backend of the collective interface. */
#include "parallel/comm.h"

#include <string.h>

void zt_comm_wrap(zt_comm *c, const char *name, MPI_Comm mpi) {
  memset(c, 0, sizeof *c);
  strncpy(c->name, name, sizeof c->name - 1);
  c->mpi = mpi;
  MPI_Comm_rank(mpi, &c->rank);
  MPI_Comm_size(mpi, &c->size);
}

static void count(zt_comm *c, zt_comm_op op, size_t bytes) {
  c->calls[op]++;
  c->bytes[op] += bytes;
}

/* MPI counts are int: large buffers go in slices. */
#define ZT_MPI_SLICE ((size_t)1 << 30)

static void allreduce_sum(zt_comm *c, void *x, size_t n, MPI_Datatype type,
                          size_t size) {
  count(c, ZT_OP_ALLREDUCE, n * size);
  if (c->size == 1) return;
  for (size_t o = 0; o < n; o += ZT_MPI_SLICE) {
    size_t k = n - o < ZT_MPI_SLICE ? n - o : ZT_MPI_SLICE;
    MPI_Allreduce(MPI_IN_PLACE, (char *)x + o * size, (int)k, type, MPI_SUM, c->mpi);
  }
}

void zt_comm_allreduce_f32(zt_comm *c, float *x, size_t n) {
  allreduce_sum(c, x, n, MPI_FLOAT, sizeof *x);
}

void zt_comm_allreduce_f64(zt_comm *c, double *x, size_t n) {
  allreduce_sum(c, x, n, MPI_DOUBLE, sizeof *x);
}

void zt_comm_bcast(zt_comm *c, void *buf, size_t bytes, int root) {
  count(c, ZT_OP_BCAST, bytes);
  if (c->size == 1) return;
  for (size_t o = 0; o < bytes; o += ZT_MPI_SLICE) {
    size_t k = bytes - o < ZT_MPI_SLICE ? bytes - o : ZT_MPI_SLICE;
    MPI_Bcast((char *)buf + o, (int)k, MPI_BYTE, root, c->mpi);
  }
}
