/* zero: ZeRO data parallelism over one flat buffer of Ψ elements (this TP
 * rank's parameters). Data-parallel rank r owns the flat range
 * [r*S, (r+1)*S), S = ceil(Ψ/dp), of the optimizer state (stage >= 1), of
 * the gradients (stage >= 2) and of the parameters (stage 3).
 *   stage 0: full gradients, all-reduced after the last micro-batch;
 *   stage 1: full gradients, reduce-scattered once per step; the optimizer
 *            updates this rank's range; parameters all-gathered after;
 *   stage 2: gradients only as shards: each unit's gradients go to a bucket
 *            buffer, reduce-scattered (non-blocking, overlapped with the
 *            rest of backward) as soon as the bucket's units are final;
 *   stage 3: parameters sharded too: each unit is all-gathered just before
 *            use in forward and again in backward (the next unit prefetched)
 *            and released after use.
 * The engine knows units (contiguous flat ranges the model uses as a
 * whole), not models: the trainer connects the model's hooks to
 * zt_zero_before/after. A unit may be empty (a pipeline stage holds only
 * its own blocks); units of different groups (a stage's chunks, which run
 * as separate pipeline actions) never share a bucket or a prefetch. */
#ifndef ZT_ZERO_H
#define ZT_ZERO_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "src/core/err.h"

typedef struct zt_zero_cfg {
  int stage;
  int64_t bucket_bytes; /* stage >= 2: gradient bucket size */
  int overlap;          /* stage >= 2: reduce while backward goes on */
  /* The dtype gradients are summed in over dp (ZT_F32, the default, or
   * ZT_BF16 / ZT_F16: half the bytes, each partial sum rounded to 16 bits);
   * they are accumulated and kept in fp32 either way. */
  zt_dtype reduce_dtype;
  /* The dtype the passes compute with (the model's): at stage 3 the
   * weights are gathered in it, from a rounded copy of the fp32 shard. */
  zt_dtype compute_dtype;
} zt_zero_cfg;

typedef struct zt_zero_units {
  int n;
  const int64_t *start, *numel; /* flat range of each unit */
  const int *group;             /* group of each unit; NULL: all one group */
  int tied_unit;                /* unit used again by the final unit (tied head), or -1 */
  int final_unit;               /* the unit whose phases use tied_unit */
} zt_zero_units;

typedef struct zt_bucket {
  int first, last;     /* units, first > last (backward order) or equal */
  int64_t lo, hi;      /* flat range */
  int pending;         /* units whose last backward use is still to come */
  int open;            /* backward is writing its gradients */
  int buf;             /* pool buffer while open or in flight, else -1 */
  int *counts;         /* per dp rank: part of [lo, hi) it owns */
  zt_req req;
  int in_flight;
} zt_bucket;

typedef struct zt_zero {
  zt_zero_cfg cfg;
  const zt_backend *be;
  zt_stream *stream; /* where its copies and adds run: the model's */
  zt_comm *dp;
  zt_zero_units u;
  int64_t numel, S, lo, hi; /* Ψ, shard size, this rank's range */
  int *counts, *displs;     /* shard of each dp rank */

  float *w_full, *g_full;   /* stage < 3 / stage < 2; owned by the model */
  void *w_compute;          /* stage < 3: the weights the passes read (w_full,
                               or its 16-bit copy), of dtype dt */
  zt_dtype dt;
  float *w_shard, *g_shard; /* stage 3 / stage >= 2 */
  void *wc_shard;           /* stage 3, 16-bit: w_shard rounded, what is gathered */
  float *m, *v;             /* AdamW state for [lo, hi) (all of Ψ at stage 0) */

  /* stage >= 2: gradient buckets */
  int n_buckets, *bucket_of;
  zt_bucket *buckets;
  int n_bufs;
  float **bufs, **recv;
  int *buf_busy;
  int64_t buf_elems, recv_elems;
  void **hbufs, **hrecv; /* 16-bit reduce: the buckets converted, sent and received */
  void *hfull;           /* 16-bit reduce at stage < 2: the gradients converted */
  int *bwd_uses_left; /* per unit, this micro-batch */

  /* stage 3: gathered units */
  int n_gbufs;
  void **gbufs;       /* of the compute dtype */
  int *gbuf_unit;     /* unit in each gather buffer, -1 free */
  int *unit_gbuf;     /* gather buffer of each unit, -1 none */
  zt_req *unit_req;   /* gather in flight per unit */
  int *unit_gathering;
  int *unit_keep;     /* tied unit: stays until its last backward use */
  int *fwd_uses;      /* per unit, this micro-batch */
  int *unit_counts;   /* per unit: gather counts then displacements per dp rank */
  int64_t gbuf_elems;

  int64_t state_bytes, buffer_bytes; /* model states; gather + bucket buffers */
} zt_zero;

/* w_full/g_full: the model's full flat buffers (Ψ elements each). At stage
 * 3 the caller initialises or loads w_full, then calls zt_zero_shard_weights
 * and may free both; at stage 2 it may free g_full. */
int zt_zero_init(zt_zero *z, const zt_zero_cfg *cfg, const zt_backend *be,
                 zt_stream *stream, zt_comm *dp, int64_t numel, const zt_zero_units *units,
                 float *w_full, float *g_full, zt_err *e);
void zt_zero_free(zt_zero *z);

/* Stage 3: keeps this rank's range of w_full, which may then be freed. */
void zt_zero_shard_weights(zt_zero *z);

/* Stage 3 in 16 bits: the shard gathered from (wc_shard) made equal to the
 * fp32 one, rounded; after the shard changed other than by an update that
 * wrote it (a load). Nothing otherwise. */
void zt_zero_sync_compute(zt_zero *z);

/* Where an update of this rank's range writes its 16-bit copy in the same
 * pass: the stage-3 gather source, or NULL (zt_optim_update's w16). */
void *zt_zero_update_copy(zt_zero *z);

/* Start of a micro-batch (resets per-micro-batch use counts). */
void zt_zero_microbatch_begin(zt_zero *z);

/* What a pass does with a unit: forward uses its weights, a whole
 * backward weights and gradients, a split backward's B only the weights
 * (gathered at stage 3) and its W only the gradients (reduced at stage 2
 * and 3 when the unit's W is done). */
typedef enum {
  ZT_ZERO_FWD = 0,
  ZT_ZERO_BWD = 1,
  ZT_ZERO_BWD_INPUT = 2,
  ZT_ZERO_BWD_WEIGHT = 3
} zt_zero_pass;

/* Around each use of a unit; return where its weights/gradients are (NULL
 * for what the pass does not use). */
void zt_zero_before(zt_zero *z, int unit, zt_zero_pass pass, void **w, float **g);

/* Stage < 3: the passes compute with w (dtype dt), a copy of w_full kept
 * equal to it by the caller (16-bit training); by default w_full itself. */
void zt_zero_set_compute(zt_zero *z, void *w, zt_dtype dt);
void zt_zero_after(zt_zero *z, int unit, zt_zero_pass pass);

/* Start of a step: zero the gradients this rank accumulates. */
void zt_zero_grads_begin(zt_zero *z);
/* After the last micro-batch: finish the gradient reduction. Afterwards
 * *g points at the summed gradients of [z->lo, z->hi) (stage 0: of all Ψ,
 * lo = 0, hi = Ψ) and *w at the parameters of that range. */
void zt_zero_grads_end(zt_zero *z, float **w, float **g);
/* After the optimizer: make every rank's full parameters current again
 * (stages 1 and 2; nothing to do at 0 and 3). */
void zt_zero_params_sync(zt_zero *z);

/* The part of flat range [a, b) that dp rank r of `dp` ranks owns in a
 * buffer of `numel` elements (its first element in *from); any rank can
 * compute another group's partition with it. */
int64_t zt_zero_part(int64_t numel, int dp, int r, int64_t a, int64_t b, int64_t *from);

/* Adds src to the gradient of flat range [a, a + n), which this rank must
 * own: at stages 0 and 1 into the local gradient before zt_zero_grads_end
 * (the reduction then counts it once), at stages 2 and 3 into the reduced
 * shard after it. */
void zt_zero_add_grad(zt_zero *z, int64_t a, int64_t n, const float *src);
/* The current weights of this rank's part of [a, b) (NULL when none). */
const float *zt_zero_owned_weights(const zt_zero *z, int64_t a, int64_t b, int64_t *from,
                                   int64_t *n);

#endif
