/* comm: the collective interface. Every collective goes through a zt_comm,
 * which names its group and counts calls and bytes per operation, so tests
 * and the step log can compare traffic with the theoretical volume. Today
 * the only backend is MPI over host memory; NCCL over device memory will be
 * a second implementation of these calls. */
#ifndef ZT_COMM_H
#define ZT_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  ZT_OP_ALLREDUCE = 0,
  ZT_OP_BCAST,
  ZT_OP_COUNT
} zt_comm_op;

typedef struct zt_comm {
  char name[16]; /* "world", later "dp", "tp", "pp" */
  MPI_Comm mpi;
  int rank, size;
  uint64_t calls[ZT_OP_COUNT];
  uint64_t bytes[ZT_OP_COUNT]; /* payload bytes this rank passed in */
} zt_comm;

/* Wraps an existing communicator (not duplicated, not freed). */
void zt_comm_wrap(zt_comm *c, const char *name, MPI_Comm mpi);

/* In-place sum over the group. */
void zt_comm_allreduce_f32(zt_comm *c, float *x, size_t n);
void zt_comm_allreduce_f64(zt_comm *c, double *x, size_t n);
void zt_comm_bcast(zt_comm *c, void *buf, size_t bytes, int root);

#endif
