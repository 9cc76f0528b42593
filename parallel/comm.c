/* comm: MPI backend of the collective interface. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_AND, CPU_COUNT */
#include "parallel/comm.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel/watchdog.h"
#include "src/core/half.h"
#include "src/core/timer.h"
#include "src/core/trace.h"

const char *const zt_comm_op_names[ZT_OP_COUNT] = {
    "allreduce", "reduce_scatter", "allgather", "bcast", "gather", "split",
    "barrier",   "phase",          "send",      "recv"};

static int next_id; /* groups are created in the same order on every rank */
static int node_size = 1, node_rank, node_id, node_sharing = 1;

static void half_init(void);

static void wrap_id(zt_comm *c, const char *name, MPI_Comm mpi, int own, int id) {
  half_init(); /* made at zt_comm_init; here for programs that start MPI themselves */
  memset(c, 0, sizeof *c);
  strncpy(c->name, name, sizeof c->name - 1);
  c->mpi = mpi;
  c->id = id;
  MPI_Comm_rank(mpi, &c->rank);
  MPI_Comm_size(mpi, &c->size);
  c->world_ranks = malloc((size_t)c->size * sizeof *c->world_ranks);
  int *mine = malloc((size_t)c->size * sizeof *mine);
  for (int i = 0; i < c->size; i++) mine[i] = i;
  MPI_Group g, w;
  MPI_Comm_group(mpi, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  MPI_Group_translate_ranks(g, c->size, mine, w, c->world_ranks);
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  free(mine);
  c->own = own;
  zt_watchdog_register(c);
}

void zt_comm_wrap(zt_comm *c, const char *name, MPI_Comm mpi, int own) {
  wrap_id(c, name, mpi, own, next_id++);
}

void zt_comm_free(zt_comm *c) {
  zt_watchdog_unregister(c);
  if (c->own && c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
  free(c->world_ranks);
  memset(c, 0, sizeof *c);
}

uint64_t zt_comm_total_bytes(const zt_comm *c) {
  uint64_t s = 0;
  for (int i = 0; i < ZT_OP_COUNT; i++) s += c->bytes[i];
  return s;
}

uint64_t zt_comm_dtype_bytes(const zt_comm *c, zt_dtype t) {
  return (unsigned)t < ZT_DTYPE_COUNT ? c->bytes_dtype[t] : 0;
}

/* Counts the call and its bytes (of elements of type t), returns its
 * sequence number. Calls that move no data pass ZT_U8 and 0. */
static uint64_t start(zt_comm *c, zt_comm_op op, zt_dtype t, double bytes) {
  uint64_t b = (uint64_t)(bytes + 0.5);
  c->calls[op]++;
  c->bytes[op] += b;
  c->bytes_dtype[t] += b;
  return atomic_fetch_add(&c->seq, 1) + 1;
}

static double ring_allreduce(const zt_comm *c, size_t bytes) {
  return 2.0 * (double)bytes * (c->size - 1) / c->size;
}

/* All MPI traffic of this module goes through one lock, and every wait is
 * a test loop that drops it between tests: the watchdog thread (which asks
 * and answers questions over MPI) then never runs MPI's progress engine at
 * the same time as this thread. Open MPI's non-blocking collectives
 * (libnbc) are not safe under concurrent progress even with
 * MPI_THREAD_MULTIPLE; this was seen as heap corruption in NBC_Progress. */
static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

void zt_comm_lock(void) { pthread_mutex_lock(&mpi_lock); }
void zt_comm_unlock(void) { pthread_mutex_unlock(&mpi_lock); }

static int test_locked(MPI_Request *r) {
  int done = 0;
  zt_comm_lock();
  MPI_Test(r, &done, MPI_STATUS_IGNORE);
  zt_comm_unlock();
  return done;
}

/* A finished collective or transfer on the trace: from post to done. */
static void traced(const zt_comm *c, zt_comm_op op, uint64_t seq, double t0) {
  if (zt_trace_on())
    zt_trace_slice(op >= ZT_OP_SEND ? "p2p" : "comm", zt_comm_op_names[op], c->name, t0,
                   zt_timer_now(), "seq", (long long)seq, NULL, 0);
}

/* Polls until the request completes, under the watchdog. A short spin
 * answers quick operations at once; then 20 us naps, which cost little
 * against waits that already took that long, and leave the core to other
 * ranks and threads where it is shared (more ranks than cores spent a
 * quarter of their time yielding to each other in an endless spin). */
static void wait_watched(zt_comm *c, zt_comm_op op, uint64_t seq, MPI_Request *r, double t0) {
  if (*r == MPI_REQUEST_NULL) return;
  zt_watchdog_enter(c, op, seq, NULL);
  const struct timespec nap = {0, 20000};
  for (int spins = 0; !test_locked(r); spins++)
    if (spins < 64) sched_yield();
    else nanosleep(&nap, NULL);
  zt_watchdog_leave();
  traced(c, op, seq, t0);
}

/* Threads other than the main one that make MPI calls now (a background
 * checkpoint writer). */
static _Atomic int sharers;

void zt_comm_thread_attach(void) { atomic_fetch_add(&sharers, 1); }
void zt_comm_thread_detach(void) { atomic_fetch_sub(&sharers, 1); }

/* A collective waited for at once, watched. Alone, the thread makes the
 * blocking call under the lock: Open MPI's blocking collectives (coll/tuned)
 * are several times faster than the non-blocking ones (libnbc: a 21 MB
 * all-reduce on 2 ranks takes 15 ms instead of 6), and the watchdog answers
 * over its own channel, so nothing needs the lock meanwhile. When another
 * thread makes MPI calls too, it posts the non-blocking call and waits in a
 * test loop that drops the lock between tests: that thread may be inside a
 * collective this rank's partners wait on in turn. */
#define WATCHED(c, op, seq, blocking, post)                        \
  do {                                                             \
    MPI_Request req_ = MPI_REQUEST_NULL;                           \
    double t0_ = zt_timer_now();                                   \
    if (zt_watchdog_should_skip(c, seq)) break;                    \
    if (atomic_load(&sharers) == 0) {                              \
      zt_watchdog_enter(c, op, seq, NULL);                         \
      zt_comm_lock();                                              \
      blocking;                                                    \
      zt_comm_unlock();                                            \
      zt_watchdog_leave();                                         \
      traced(c, op, seq, t0_);                                     \
      break;                                                       \
    }                                                              \
    zt_comm_lock();                                                \
    post;                                                          \
    zt_comm_unlock();                                              \
    wait_watched(c, op, seq, &req_, t0_);                          \
  } while (0)

/* MPI counts are int: large buffers go in slices. */
#define ZT_MPI_SLICE ((size_t)1 << 30)

/* ---- element types and reduction operators ------------------------------ */

/* bf16 and fp16 have no MPI type nor operators: 2-byte types of our own
 * and sum, max and min that widen to float, operate and round back. Made
 * once at start, freed at finalize. */
static MPI_Datatype half_types[2] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL}; /* bf16, fp16 */
static MPI_Op half_ops[2][3];                                              /* [type][redop] */
static int half_ready;

/* A NaN operand wins, as it would in a sum. */
static inline float half_apply(zt_redop op, float a, float b) {
  if (op == ZT_SUM) return a + b;
  if (op == ZT_MAX) return b > a || isnan(b) ? b : a;
  return b < a || isnan(b) ? b : a;
}

/* y[i] := op(y[i], x[i]) in float, rounded back once. */
static inline void bf16_reduce(const uint16_t *x, uint16_t *y, int n, zt_redop op) {
  for (int i = 0; i < n; i++)
    y[i] = zt_bf16_from_f32(half_apply(op, zt_bf16_to_f32(y[i]), zt_bf16_to_f32(x[i])));
}

static inline void f16_reduce(const uint16_t *x, uint16_t *y, int n, zt_redop op) {
  for (int i = 0; i < n; i++)
    y[i] = zt_f16_from_f32(half_apply(op, zt_f16_to_f32(y[i]), zt_f16_to_f32(x[i])));
}

/* MPI's signature for each (format, operator) pair. */
#define HALF_OP(fmt, op, name)                                         \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) { \
    (void)dt;                                                          \
    fmt##_reduce(in, inout, *len, op);                                 \
  }
HALF_OP(bf16, ZT_SUM, bf16_sum)
HALF_OP(bf16, ZT_MAX, bf16_max)
HALF_OP(bf16, ZT_MIN, bf16_min)
HALF_OP(f16, ZT_SUM, f16_sum)
HALF_OP(f16, ZT_MAX, f16_max)
HALF_OP(f16, ZT_MIN, f16_min)

static void half_init(void) {
  if (half_ready) return;
  MPI_User_function *fns[2][3] = {{bf16_sum, bf16_max, bf16_min}, {f16_sum, f16_max, f16_min}};
  for (int k = 0; k < 2; k++) {
    MPI_Type_contiguous(2, MPI_BYTE, &half_types[k]);
    MPI_Type_commit(&half_types[k]);
    for (int op = 0; op < 3; op++) MPI_Op_create(fns[k][op], 1, &half_ops[k][op]);
  }
  half_ready = 1;
}

static void half_free(void) {
  if (!half_ready) return;
  for (int k = 0; k < 2; k++) {
    for (int op = 0; op < 3; op++) MPI_Op_free(&half_ops[k][op]);
    MPI_Type_free(&half_types[k]);
  }
  half_ready = 0;
}

static MPI_Datatype mpi_type(zt_dtype t) {
  switch (t) {
    case ZT_F32: return MPI_FLOAT;
    case ZT_F64: return MPI_DOUBLE;
    case ZT_I32: return MPI_INT32_T;
    case ZT_I64: return MPI_INT64_T;
    case ZT_U64: return MPI_UINT64_T;
    case ZT_U8: return MPI_UINT8_T;
    case ZT_BF16: return half_types[0];
    case ZT_F16: return half_types[1];
    case ZT_DTYPE_COUNT: break;
  }
  return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(zt_dtype t, zt_redop op) {
  if (t == ZT_BF16 || t == ZT_F16) return half_ops[t == ZT_F16][op];
  return op == ZT_MAX ? MPI_MAX : op == ZT_MIN ? MPI_MIN : MPI_SUM;
}

/* ---- collectives ------------------------------------------------------------ */

static void mpi_allreduce(zt_comm *c, void *x, size_t n, zt_dtype t, zt_redop op) {
  size_t size = zt_dtype_size(t);
  uint64_t seq = start(c, ZT_OP_ALLREDUCE, t, ring_allreduce(c, n * size));
  if (c->size == 1) return;
  MPI_Datatype type = mpi_type(t);
  MPI_Op mop = mpi_op(t, op);
  for (size_t o = 0; o < n; o += ZT_MPI_SLICE) {
    size_t k = n - o < ZT_MPI_SLICE ? n - o : ZT_MPI_SLICE;
    WATCHED(c, ZT_OP_ALLREDUCE, seq,
            MPI_Allreduce(MPI_IN_PLACE, (char *)x + o * size, (int)k, type, mop, c->mpi),
            MPI_Iallreduce(MPI_IN_PLACE, (char *)x + o * size, (int)k, type, mop, c->mpi,
                           &req_));
  }
}

void zt_comm_barrier(zt_comm *c) {
  uint64_t seq = start(c, ZT_OP_BARRIER, ZT_U8, 0);
  if (c->size == 1) return;
  WATCHED(c, ZT_OP_BARRIER, seq, MPI_Barrier(c->mpi), MPI_Ibarrier(c->mpi, &req_));
}

int zt_comm_agree(zt_comm *c, int rc, zt_err *e) {
  int32_t first = rc ? c->rank : c->size;
  zt_comm_allreduce(c, &first, 1, ZT_I32, ZT_MIN);
  if (first == c->size) return ZT_OK;
  zt_comm_bcast(c, e, sizeof *e, ZT_U8, first);
  return e->code;
}

void zt_comm_phase_begin(zt_comm *c, const char *what) {
  uint64_t seq = start(c, ZT_OP_PHASE, ZT_U8, 0);
  zt_watchdog_enter(c, ZT_OP_PHASE, seq, what);
}

void zt_comm_phase_end(zt_comm *c) {
  (void)c;
  zt_watchdog_leave();
}

/* A blocking MPI call that creates a communicator, watched: the watchdog
 * answers over its own channel, so holding the lock here blocks nobody's
 * report (splits happen at start, before any background thread). */
void zt_comm_split(zt_comm *parent, const char *name, int color, int key, zt_comm *out) {
  uint64_t seq = start(parent, ZT_OP_SPLIT, ZT_U8, 0);
  int id = next_id++;
  MPI_Comm m = MPI_COMM_NULL;
  zt_watchdog_enter(parent, ZT_OP_SPLIT, seq, NULL);
  zt_comm_lock();
  MPI_Comm_split(parent->mpi, color < 0 ? MPI_UNDEFINED : color, key, &m);
  zt_comm_unlock();
  zt_watchdog_leave();
  if (m == MPI_COMM_NULL) {
    memset(out, 0, sizeof *out);
    out->mpi = MPI_COMM_NULL;
    out->id = id;
    return;
  }
  wrap_id(out, name, m, 1, id);
}

void zt_comm_dup(zt_comm *c, const char *name, zt_comm *out) {
  uint64_t seq = start(c, ZT_OP_SPLIT, ZT_U8, 0);
  int id = next_id++;
  MPI_Comm m;
  zt_watchdog_enter(c, ZT_OP_SPLIT, seq, NULL);
  zt_comm_lock();
  MPI_Comm_dup(c->mpi, &m);
  zt_comm_unlock();
  zt_watchdog_leave();
  wrap_id(out, name, m, 1, id);
}

int zt_comm_tag_ub(const zt_comm *c) {
  (void)c; /* MPI attaches the bound to the world; it holds for every group */
  int *ub, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  return flag ? *ub : 32767; /* the least MPI promises */
}

int zt_comm_node_size(void) { return node_size; }
int zt_comm_node_rank(void) { return node_rank; }
int zt_comm_node_id(void) { return node_id; }
int zt_comm_node_sharing(void) { return node_sharing; }

int zt_comm_init(int *argc, char ***argv, zt_comm *world, const char *name,
                 double timeout_s, char *why) {
  int provided;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  half_init();
  wrap_id(world, name, MPI_COMM_WORLD, 0, next_id++);
  /* the node: ranks that share memory with this one; its lowest rank names it */
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  node_id = world->rank;
  MPI_Allreduce(MPI_IN_PLACE, &node_id, 1, MPI_INT, MPI_MIN, node);
  /* ranks whose CPU affinity overlaps this one's compete for its cores
   * (all of the node's under --bind-to none); ranks the launcher bound to
   * cores of their own do not */
  cpu_set_t mine, *all = malloc((size_t)node_size * sizeof *all);
  if (sched_getaffinity(0, sizeof mine, &mine)) CPU_ZERO(&mine);
  node_sharing = node_size;
  if (all && MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, node) ==
                 MPI_SUCCESS && CPU_COUNT(&mine) > 0) {
    node_sharing = 0;
    for (int r = 0; r < node_size; r++) {
      cpu_set_t both;
      CPU_AND(&both, &mine, &all[r]);
      node_sharing += CPU_COUNT(&both) > 0;
    }
  }
  free(all);
  MPI_Comm_free(&node);
  int rc = zt_watchdog_start(world, timeout_s, why);
  return rc;
}

void zt_comm_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code); /* MPI_Abort does not return; the compiler cannot know */
}

void zt_comm_finalize(zt_comm *world) {
  zt_comm_barrier(world);
  zt_watchdog_stop();
  zt_comm_free(world);
  half_free();
  MPI_Finalize();
}

static void mpi_bcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root) {
  size_t size = zt_dtype_size(t);
  uint64_t seq = start(c, ZT_OP_BCAST, t, c->size > 1 ? (double)n * size : 0);
  if (c->size == 1) return;
  MPI_Datatype type = mpi_type(t);
  for (size_t o = 0; o < n; o += ZT_MPI_SLICE) {
    size_t k = n - o < ZT_MPI_SLICE ? n - o : ZT_MPI_SLICE;
    WATCHED(c, ZT_OP_BCAST, seq,
            MPI_Bcast((char *)buf + o * size, (int)k, type, root, c->mpi),
            MPI_Ibcast((char *)buf + o * size, (int)k, type, root, c->mpi, &req_));
  }
}

static void mpi_gather(zt_comm *c, const void *send, void *recv, size_t n, zt_dtype t, int root) {
  size_t size = zt_dtype_size(t);
  uint64_t seq = start(c, ZT_OP_GATHER, t, c->rank == root ? 0 : (double)n * size);
  if (c->size == 1) {
    memcpy(recv, send, n * size);
    return;
  }
  MPI_Datatype type = mpi_type(t);
  WATCHED(c, ZT_OP_GATHER, seq,
          MPI_Gather(send, (int)n, type, recv, (int)n, type, root, c->mpi),
          MPI_Igather(send, (int)n, type, recv, (int)n, type, root, c->mpi, &req_));
}

static void mpi_gatherv(zt_comm *c, const void *send, void *recv, const int *counts,
                     const int *displs, zt_dtype t, int root) {
  size_t size = zt_dtype_size(t);
  uint64_t seq =
      start(c, ZT_OP_GATHER, t, c->rank == root ? 0 : (double)counts[c->rank] * size);
  if (c->size == 1) {
    char *at = (char *)recv + (size_t)displs[0] * size;
    if (recv != send) memcpy(at, send, (size_t)counts[0] * size);
    return;
  }
  MPI_Datatype type = mpi_type(t);
  WATCHED(c, ZT_OP_GATHER, seq,
          MPI_Gatherv(send, counts[c->rank], type, recv, counts, displs, type, root, c->mpi),
          MPI_Igatherv(send, counts[c->rank], type, recv, counts, displs, type, root, c->mpi,
                       &req_));
}

static int64_t sum_counts(const zt_comm *c, const int *counts) {
  int64_t s = 0;
  for (int i = 0; i < c->size; i++) s += counts[i];
  return s;
}

/* Bytes of a reduce-scatter or all-gather: all parts but this rank's. */
static double others_bytes(const zt_comm *c, const int *counts, zt_dtype t) {
  return (double)(sum_counts(c, counts) - counts[c->rank]) * (double)zt_dtype_size(t);
}

/* Starts a non-blocking call: counts it and fills r (MPI's request still
 * null: posting is the caller's). */
static void start_req(zt_comm *c, zt_comm_op op, zt_dtype t, double bytes, zt_req *r) {
  r->c = c;
  r->op = op;
  r->seq = start(c, op, t, bytes);
  r->mpi = MPI_REQUEST_NULL;
  r->t0 = zt_timer_now();
}

static void mpi_iallreduce(zt_comm *c, void *x, size_t n, zt_dtype t, zt_redop op, zt_req *r) {
  start_req(c, ZT_OP_ALLREDUCE, t, ring_allreduce(c, n * zt_dtype_size(t)), r);
  if (c->size == 1 || zt_watchdog_should_skip(c, r->seq)) return;
  zt_comm_lock();
  MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, mpi_type(t), mpi_op(t, op), c->mpi, &r->mpi);
  zt_comm_unlock();
}

/* The single member's reduce-scatter: its part is the whole buffer. */
static void own_part(const zt_comm *c, const void *send, void *recv, const int *counts,
                     zt_dtype t) {
  if (recv != send) memcpy(recv, send, (size_t)sum_counts(c, counts) * zt_dtype_size(t));
}

static void mpi_ireduce_scatter(zt_comm *c, const void *send, void *recv, const int *counts,
                             zt_dtype t, zt_redop op, zt_req *r) {
  start_req(c, ZT_OP_REDUCE_SCATTER, t, others_bytes(c, counts, t), r);
  if (c->size == 1) {
    own_part(c, send, recv, counts, t);
    return;
  }
  if (zt_watchdog_should_skip(c, r->seq)) return;
  zt_comm_lock();
  MPI_Ireduce_scatter(send == recv ? MPI_IN_PLACE : send, recv, counts, mpi_type(t),
                      mpi_op(t, op), c->mpi, &r->mpi);
  zt_comm_unlock();
}

static void mpi_reduce_scatter(zt_comm *c, const void *send, void *recv, const int *counts,
                            zt_dtype t, zt_redop op) {
  uint64_t seq = start(c, ZT_OP_REDUCE_SCATTER, t, others_bytes(c, counts, t));
  if (c->size == 1) {
    own_part(c, send, recv, counts, t);
    return;
  }
  const void *in = send == recv ? MPI_IN_PLACE : send;
  MPI_Datatype type = mpi_type(t);
  MPI_Op mop = mpi_op(t, op);
  WATCHED(c, ZT_OP_REDUCE_SCATTER, seq,
          MPI_Reduce_scatter(in, recv, counts, type, mop, c->mpi),
          MPI_Ireduce_scatter(in, recv, counts, type, mop, c->mpi, &req_));
}

static void mpi_iallgather(zt_comm *c, void *buf, const int *counts, const int *displs, zt_dtype t,
                        zt_req *r) {
  start_req(c, ZT_OP_ALLGATHER, t, others_bytes(c, counts, t), r);
  if (c->size == 1 || zt_watchdog_should_skip(c, r->seq)) return;
  zt_comm_lock();
  MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, mpi_type(t), c->mpi,
                  &r->mpi);
  zt_comm_unlock();
}

static void mpi_allgather(zt_comm *c, void *buf, const int *counts, const int *displs, zt_dtype t) {
  uint64_t seq = start(c, ZT_OP_ALLGATHER, t, others_bytes(c, counts, t));
  if (c->size == 1) return;
  MPI_Datatype type = mpi_type(t);
  WATCHED(c, ZT_OP_ALLGATHER, seq,
          MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, type, c->mpi),
          MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, type, c->mpi,
                          &req_));
}

/* ---- point-to-point ----------------------------------------------------------- */

static void p2p(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer, int tag, zt_req *r,
                int send) {
  r->c = c;
  r->op = send ? ZT_OP_SEND : ZT_OP_RECV;
  r->seq = ++c->p2p;
  r->t0 = zt_timer_now();
  c->calls[r->op]++;
  if (send) {
    c->bytes[r->op] += n * zt_dtype_size(t);
    c->bytes_dtype[t] += n * zt_dtype_size(t);
  }
  r->mpi = MPI_REQUEST_NULL;
  if (send && zt_watchdog_should_skip_send(c)) return;
  zt_comm_lock();
  if (send) MPI_Isend(buf, (int)n, mpi_type(t), peer, tag, c->mpi, &r->mpi);
  else MPI_Irecv(buf, (int)n, mpi_type(t), peer, tag, c->mpi, &r->mpi);
  zt_comm_unlock();
}

static void mpi_isend(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer, int tag,
                   zt_req *r) {
  p2p(c, (void *)buf, n, t, peer, tag, r, 1);
}

static void mpi_irecv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer, int tag, zt_req *r) {
  p2p(c, buf, n, t, peer, tag, r, 0);
}

static void finish_stage(zt_req *r);

void zt_comm_wait(zt_req *r) {
  wait_watched(r->c, r->op, r->seq, &r->mpi, r->t0);
  finish_stage(r);
}

int zt_comm_test(zt_req *r) {
  if (r->mpi != MPI_REQUEST_NULL) {
    if (!test_locked(&r->mpi)) return 0;
    traced(r->c, r->op, r->seq, r->t0);
  }
  finish_stage(r);
  return 1;
}

/* ---- device buffers ------------------------------------------------------- */

/* MPI here reads and writes host memory. Where the backend's device memory
 * is not host memory (zt_comm_set_device), a device buffer travels through
 * a host copy: copied in before MPI reads it, copied back after MPI wrote
 * it (a non-blocking call's when it completes). The caller has synced the
 * stream that wrote the buffer, as it does before MPI reads one. A path
 * that needs no host copy (NCCL on device memory) replaces this one. */
static const zt_backend *dev_be;

void zt_comm_set_device(const zt_backend *be) { dev_be = be && !be->host_visible ? be : NULL; }

static int on_dev(const void *p) { return dev_be && p && dev_be->is_device(p); }

/* A collective cannot fail on one member alone without hanging the others:
 * out of host memory here ends the job, with the numbers. */
static void *host_buffer(size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  if (!h) {
    fprintf(stderr, "ztrain: out of host memory staging %zu bytes of device memory for MPI\n",
            bytes);
    zt_comm_abort(1);
  }
  return h;
}

/* A host copy of dev[bytes]: its contents copied in when `in`. */
static void *stage_in(const void *dev, size_t bytes, int in) {
  void *h = host_buffer(bytes);
  if (in && bytes) {
    dev_be->copy(NULL, h, dev, bytes);
    dev_be->stream_sync(NULL);
  }
  return h;
}

static void stage_out(void *dev, void *h, size_t bytes) {
  if (bytes) {
    dev_be->copy(NULL, dev, h, bytes);
    dev_be->stream_sync(NULL);
  }
  free(h);
}

/* What a non-blocking call staged: copied back (recv) and freed on completion. */
static void req_stage(zt_req *r, void *send_h, void *recv_h, void *recv_dev, size_t bytes) {
  r->stage_send = send_h;
  r->stage_recv = recv_h;
  r->stage_dev = recv_dev;
  r->stage_bytes = bytes;
}

static void finish_stage(zt_req *r) {
  if (r->stage_recv) stage_out(r->stage_dev, r->stage_recv, r->stage_bytes);
  if (r->stage_send != r->stage_recv) free(r->stage_send);
  req_stage(r, NULL, NULL, NULL, 0);
}

/* Elements an in-place gather's buffer spans. */
static size_t extent(const zt_comm *c, const int *counts, const int *displs) {
  size_t n = 0;
  for (int i = 0; i < c->size; i++)
    if (counts[i] && (size_t)displs[i] + (size_t)counts[i] > n)
      n = (size_t)displs[i] + (size_t)counts[i];
  return n;
}

void zt_comm_allreduce(zt_comm *c, void *x, size_t n, zt_dtype t, zt_redop op) {
  if (c->size == 1 || !on_dev(x)) {
    mpi_allreduce(c, x, n, t, op);
    return;
  }
  size_t b = n * zt_dtype_size(t);
  void *h = stage_in(x, b, 1);
  mpi_allreduce(c, h, n, t, op);
  stage_out(x, h, b);
}

void zt_comm_bcast(zt_comm *c, void *buf, size_t n, zt_dtype t, int root) {
  if (c->size == 1 || !on_dev(buf)) {
    mpi_bcast(c, buf, n, t, root);
    return;
  }
  size_t b = n * zt_dtype_size(t);
  void *h = stage_in(buf, b, c->rank == root);
  mpi_bcast(c, h, n, t, root);
  stage_out(buf, h, b);
}

void zt_comm_gather(zt_comm *c, const void *send, void *recv, size_t n, zt_dtype t, int root) {
  size_t b = n * zt_dtype_size(t);
  int sd = on_dev(send), rd = c->rank == root && on_dev(recv);
  const void *hs = sd ? stage_in(send, b, 1) : send;
  void *hr = rd ? stage_in(recv, b * (size_t)c->size, 0) : recv;
  mpi_gather(c, hs, hr, n, t, root);
  if (sd) free((void *)hs);
  if (rd) stage_out(recv, hr, b * (size_t)c->size);
}

void zt_comm_gatherv(zt_comm *c, const void *send, void *recv, const int *counts,
                     const int *displs, zt_dtype t, int root) {
  size_t x = zt_dtype_size(t), rb = extent(c, counts, displs) * x;
  int sd = on_dev(send) && send != recv, rd = c->rank == root && on_dev(recv);
  const void *hs = sd ? stage_in(send, (size_t)counts[c->rank] * x, 1) : send;
  /* what the members do not fill stays as it was: copied in too */
  void *hr = rd ? stage_in(recv, rb, 1) : recv;
  if (send == recv && rd) hs = hr;
  mpi_gatherv(c, hs, hr, counts, displs, t, root);
  if (sd) free((void *)hs);
  if (rd) stage_out(recv, hr, rb);
}

void zt_comm_reduce_scatter(zt_comm *c, const void *send, void *recv, const int *counts,
                            zt_dtype t, zt_redop op) {
  size_t x = zt_dtype_size(t), total = (size_t)sum_counts(c, counts) * x;
  size_t mine = (size_t)counts[c->rank] * x;
  if (send == recv) {
    if (c->size == 1 || !on_dev(recv)) {
      mpi_reduce_scatter(c, send, recv, counts, t, op);
      return;
    }
    void *h = stage_in(recv, total, 1);
    mpi_reduce_scatter(c, h, h, counts, t, op);
    stage_out(recv, h, mine);
    return;
  }
  int sd = on_dev(send), rd = on_dev(recv);
  const void *hs = sd ? stage_in(send, total, 1) : send;
  void *hr = rd ? stage_in(recv, c->size == 1 ? total : mine, 0) : recv;
  mpi_reduce_scatter(c, hs, hr, counts, t, op);
  if (sd) free((void *)hs);
  if (rd) stage_out(recv, hr, c->size == 1 ? total : mine);
}

void zt_comm_allgather(zt_comm *c, void *buf, const int *counts, const int *displs, zt_dtype t) {
  if (c->size == 1 || !on_dev(buf)) {
    mpi_allgather(c, buf, counts, displs, t);
    return;
  }
  size_t b = extent(c, counts, displs) * zt_dtype_size(t);
  void *h = stage_in(buf, b, 1);
  mpi_allgather(c, h, counts, displs, t);
  stage_out(buf, h, b);
}

void zt_comm_iallreduce(zt_comm *c, void *x, size_t n, zt_dtype t, zt_redop op, zt_req *r) {
  if (c->size == 1 || !on_dev(x)) {
    mpi_iallreduce(c, x, n, t, op, r);
    req_stage(r, NULL, NULL, NULL, 0);
    return;
  }
  size_t b = n * zt_dtype_size(t);
  void *h = stage_in(x, b, 1);
  mpi_iallreduce(c, h, n, t, op, r);
  req_stage(r, h, h, x, b);
}

void zt_comm_ireduce_scatter(zt_comm *c, const void *send, void *recv, const int *counts,
                             zt_dtype t, zt_redop op, zt_req *r) {
  size_t x = zt_dtype_size(t), total = (size_t)sum_counts(c, counts) * x;
  size_t mine = (size_t)counts[c->rank] * x;
  if (c->size == 1 || (!on_dev(send) && !on_dev(recv))) {
    /* the single member's part is a copy, device to device or host to host */
    if (c->size == 1 && send != recv && (on_dev(send) || on_dev(recv))) {
      start_req(c, ZT_OP_REDUCE_SCATTER, t, 0, r);
      dev_be->copy(NULL, recv, send, total);
      dev_be->stream_sync(NULL);
    } else {
      mpi_ireduce_scatter(c, send, recv, counts, t, op, r);
    }
    req_stage(r, NULL, NULL, NULL, 0);
    return;
  }
  if (send == recv) {
    void *h = stage_in(recv, total, 1);
    mpi_ireduce_scatter(c, h, h, counts, t, op, r);
    req_stage(r, h, h, recv, mine);
    return;
  }
  void *hs = on_dev(send) ? stage_in(send, total, 1) : (void *)send;
  void *hr = on_dev(recv) ? stage_in(recv, mine, 0) : recv;
  mpi_ireduce_scatter(c, hs, hr, counts, t, op, r);
  req_stage(r, hs != send ? hs : NULL, hr != recv ? hr : NULL, recv, mine);
}

void zt_comm_iallgather(zt_comm *c, void *buf, const int *counts, const int *displs, zt_dtype t,
                        zt_req *r) {
  if (c->size == 1 || !on_dev(buf)) {
    mpi_iallgather(c, buf, counts, displs, t, r);
    req_stage(r, NULL, NULL, NULL, 0);
    return;
  }
  size_t b = extent(c, counts, displs) * zt_dtype_size(t);
  void *h = stage_in(buf, b, 1);
  mpi_iallgather(c, h, counts, displs, t, r);
  req_stage(r, h, h, buf, b);
}

void zt_comm_isend(zt_comm *c, const void *buf, size_t n, zt_dtype t, int peer, int tag,
                   zt_req *r) {
  if (!on_dev(buf)) {
    mpi_isend(c, buf, n, t, peer, tag, r);
    req_stage(r, NULL, NULL, NULL, 0);
    return;
  }
  void *h = stage_in(buf, n * zt_dtype_size(t), 1);
  mpi_isend(c, h, n, t, peer, tag, r);
  req_stage(r, h, NULL, NULL, 0);
}

void zt_comm_irecv(zt_comm *c, void *buf, size_t n, zt_dtype t, int peer, int tag, zt_req *r) {
  if (!on_dev(buf)) {
    mpi_irecv(c, buf, n, t, peer, tag, r);
    req_stage(r, NULL, NULL, NULL, 0);
    return;
  }
  size_t b = n * zt_dtype_size(t);
  void *h = stage_in(buf, b, 0);
  mpi_irecv(c, h, n, t, peer, tag, r);
  req_stage(r, NULL, h, buf, b);
}
