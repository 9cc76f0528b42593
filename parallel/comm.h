/* comm: the collective interface. Every collective goes through a zt_comm,
 * which names its group, numbers its collectives (a sequence number per
 * group, the same on every member) and counts calls and bytes per
 * operation and per element type, so tests and the step log can compare
 * traffic with the theoretical volume. Bytes are the ring-algorithm volume
 * one rank sends, as in the ZeRO paper: all-reduce of n bytes 2n(p-1)/p,
 * reduce-scatter and all-gather of n bytes in all n - (this rank's part),
 * broadcast n (on every member), gather and send what this rank sends; n
 * bytes = elements times zt_dtype_size. Each call's volume is rounded to
 * whole bytes once and added to both its operation's and its type's
 * total, so the two kinds of totals add up to the same sum.
 *
 * Every data-moving call takes its buffer as (void *, element count,
 * zt_dtype): what is reduced in which precision is the caller's policy,
 * not a function name. bf16 and fp16 (bit patterns, src/core/half.h) have
 * no MPI type: they travel as 2-byte MPI types made at zt_comm_init, and
 * sum, max and min are reduction operators of this module that widen to
 * float, operate and round back. Each step of MPI's reduction tree or ring
 * is then correctly rounded (float's 24 bits suffice for one exact
 * rounding of a 16-bit sum), but a sum over p ranks is rounded p - 1
 * times, in an order MPI picks: that is why gradients are reduced in fp32
 * unless a precision policy asks otherwise. A NaN in any input makes a
 * 16-bit sum, max or min NaN. Integer sums wrap (u64 modulo 2^64).
 * Today's backend is MPI over host memory; buffers in a device's memory
 * (zt_comm_set_device) travel through host copies. NCCL over device
 * memory will be a second implementation of these calls. This folder is the only place
 * that calls MPI (a CI check enforces it; HDF5's MPI-IO file property is
 * the one exception): every blocking call and every wait goes through
 * here and is watched by the watchdog (watchdog.h), start-up and shut-down
 * included. */
#ifndef ZT_COMM_H
#define ZT_COMM_H

#include <mpi.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/tensor.h"

typedef enum {
  ZT_OP_ALLREDUCE = 0,
  ZT_OP_REDUCE_SCATTER,
  ZT_OP_ALLGATHER,
  ZT_OP_BCAST,
  ZT_OP_GATHER,
  ZT_OP_SPLIT,   /* creating a sub-group (a blocking collective) */
  ZT_OP_BARRIER,
  ZT_OP_PHASE,   /* a collective phase MPI cannot watch (HDF5 I/O) */
  ZT_OP_SEND, /* point-to-point (pipeline); numbered apart from the collectives */
  ZT_OP_RECV,
  ZT_OP_COUNT
} zt_comm_op;

extern const char *const zt_comm_op_names[ZT_OP_COUNT];

typedef struct zt_comm {
  char name[16]; /* "world", "dp", "tp", "pp", "mp", "embed" */
  int id;        /* creation order: the same group has the same id everywhere */
  int own;       /* free the communicator with the zt_comm */
  MPI_Comm mpi;
  int rank, size;
  int *world_ranks;       /* world rank of each member, for reports */
  _Atomic uint64_t seq;   /* collectives started on this group */
  uint64_t p2p;           /* point-to-point transfers this rank started */
  uint64_t calls[ZT_OP_COUNT];
  uint64_t bytes[ZT_OP_COUNT];
  uint64_t bytes_dtype[ZT_DTYPE_COUNT]; /* the same bytes by element type */
} zt_comm;

/* A non-blocking collective in flight. */
typedef struct zt_req {
  MPI_Request mpi;
  zt_comm *c;
  zt_comm_op op;
  uint64_t seq;
  double t0; /* posted at (zt_timer_now), for the trace */
  /* device buffers staged through host memory (zt_comm_set_device): what
   * completion copies back to stage_dev and frees */
  void *stage_send, *stage_recv, *stage_dev;
  size_t stage_bytes;
} zt_req;

typedef enum { ZT_SUM = 0, ZT_MAX, ZT_MIN } zt_redop;

/* Starts MPI (with thread support for the watchdog), makes the bf16 and
 * fp16 MPI types and operators, wraps the world as `name` and starts the
 * watchdog with timeout_s (the default until the run's script says
 * otherwise). Returns 0; -1 when the watchdog cannot
 * run (no MPI thread support: *why says so and the run goes on
 * unwatched); -2 when the ranks did not all start (*why: 256 bytes). */
int zt_comm_init(int *argc, char ***argv, zt_comm *world, const char *name,
                 double timeout_s, char *why);
/* Ends MPI: a watched barrier first, so that a rank that never arrives is
 * reported instead of waited for inside MPI_Finalize; frees the types and
 * operators zt_comm_init made. */
void zt_comm_finalize(zt_comm *world);
/* Ends every rank of the job now with exit code `code`. */
void zt_comm_abort(int code) __attribute__((noreturn));

/* Ranks on this node (sharing memory with this one), this rank's index
 * among them, and the node's id (its lowest world rank); from zt_comm_init. */
int zt_comm_node_size(void);
int zt_comm_node_rank(void);
int zt_comm_node_id(void);
/* Ranks of this node whose CPU affinity overlaps this rank's (itself
 * included): those that share its cores. The node's size unless the
 * launcher bound ranks to cores of their own. */
int zt_comm_node_sharing(void);

/* From now on, buffers in `be`'s device memory (be->is_device) travel
 * through host copies around MPI; nothing to do where that memory is host
 * memory (be->host_visible), the only case before this call. */
void zt_comm_set_device(const zt_backend *be);

/* Wraps a communicator: `own` = the zt_comm frees it in zt_comm_free.
 * Every member must create its groups in the same order. */
void zt_comm_wrap(zt_comm *c, const char *name, MPI_Comm mpi, int own);
void zt_comm_free(zt_comm *c);

/* Collective over parent, watched: *out becomes the group of the members
 * that pass the same color, ordered by key; color < 0: this rank is in
 * none (*out is empty, out->mpi MPI_COMM_NULL). Every rank consumes a
 * group id, member or not, so ids stay equal across ranks. */
void zt_comm_split(zt_comm *parent, const char *name, int color, int key, zt_comm *out);
/* A private copy of c (its collectives never meet c's), watched. */
void zt_comm_dup(zt_comm *c, const char *name, zt_comm *out);

/* The largest tag point-to-point transfers may use. */
int zt_comm_tag_ub(const zt_comm *c);

/* Waits until every member has arrived, watched. */
void zt_comm_barrier(zt_comm *c);

/* Every member learns the first failing member's status and message
 * (rc: this member's), so all return alike and one can print it. */
int zt_comm_agree(zt_comm *c, int rc, zt_err *e);

/* A collective phase that MPI cannot watch (an HDF5 collective write):
 * numbered on c like a collective, so that a report can tell which
 * members have not reached it or are still in it; `what` names it. */
void zt_comm_phase_begin(zt_comm *c, const char *what);
void zt_comm_phase_end(zt_comm *c);

/* Total bytes over all operations; bytes of one element type. */
uint64_t zt_comm_total_bytes(const zt_comm *c);
uint64_t zt_comm_dtype_bytes(const zt_comm *c, zt_dtype t);

/* Data-moving calls. Counts are in elements of t. Blocking calls are
 * watched; the non-blocking ones (zt_comm_i*) are watched in
 * zt_comm_wait. The blocking all-reduce and broadcast take any n; the
 * others move fewer than 2^31 elements per member (MPI's int counts). */

/* In place: x[n] := its reduction over the group. */
void zt_comm_allreduce(zt_comm *c, void *x, size_t n, zt_dtype t, zt_redop op);
void zt_comm_iallreduce(zt_comm *c, void *x, size_t n, zt_dtype t, zt_redop op, zt_req *r);

/* Reduces `send` (sum of counts elements) and leaves member r's part
 * (counts[r] elements, in member order) in `recv`; send == recv: in place,
 * the part lands at the start of the buffer. */
void zt_comm_reduce_scatter(zt_comm *c, const void *send, void *recv, const int *counts,
                            zt_dtype t, zt_redop op);
void zt_comm_ireduce_scatter(zt_comm *c, const void *send, void *recv, const int *counts,
                             zt_dtype t, zt_redop op, zt_req *r);

/* In place: member r's counts[r] elements, already at buf + displs[r] on
 * member r, end up at the same place on every member. */
void zt_comm_allgather(zt_comm *c, void *buf, const int *counts, const int *displs, zt_dtype t);
void zt_comm_iallgather(zt_comm *c, void *buf, const int *counts, const int *displs, zt_dtype t,
                        zt_req *r);

/* buf[n] of root to every member (ZT_U8 for a struct or a string). */
void zt_comm_bcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root);

/* To root: n elements of every member (recv: size*n, member order), or
 * counts[r] elements of member r into recv + displs[r]. */
void zt_comm_gather(zt_comm *c, const void *send, void *recv, size_t n, zt_dtype t, int root);
void zt_comm_gatherv(zt_comm *c, const void *send, void *recv, const int *counts,
                     const int *displs, zt_dtype t, int root);

/* Point-to-point (pipeline activations and gradients): n elements to or
 * from member `peer` with `tag`. Bytes are counted on the sender. */
void zt_comm_isend(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer, int tag,
                   zt_req *r);
void zt_comm_irecv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer, int tag, zt_req *r);

/* A thread other than the main one says it makes MPI calls from now on
 * (a background checkpoint writer) and when it stops: while one does, the
 * main thread's collectives drop the lock between tests instead of
 * blocking in MPI. */
void zt_comm_thread_attach(void);
void zt_comm_thread_detach(void);

/* The lock every MPI call of the process is made under (the watchdog
 * thread takes it too). */
void zt_comm_lock(void);
void zt_comm_unlock(void);

/* Completes a request under the watchdog, napping between tests once the
 * wait is long (a pipeline stage in its bubble, a rank behind the others
 * leave the core to the rest); test progresses it and says if done. */
void zt_comm_wait(zt_req *r);
int zt_comm_test(zt_req *r);

#endif
