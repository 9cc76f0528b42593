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
 * as separate pipeline actions) never share a bucket or a prefetch.
 * The engine owns the model states (weights, fp32 masters, gradients,
 * moments) under one policy (zt_zero_cfg): it allocates them as its stage
 * shards them and frees them; the model computes with what zt_zero_before
 * hands it, the optimizer updates a zt_zero_range, and initialisation and
 * checkpoints read and write through zt_zero_state. */
#ifndef ZT_ZERO_H
#define ZT_ZERO_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "parallel/offload.h"
#include "src/core/err.h"

typedef struct zt_zero_cfg {
  int stage;
  int64_t bucket_bytes; /* stage >= 2: gradient bucket size */
  int overlap;          /* stage >= 2: reduce while backward goes on */
  /* The policy of the state group (this rank's flat buffer, Ψ elements).
   * param_dtype: the weights the passes compute with (the model's dtype);
   * in 16 bits they are a rounded copy of fp32 master weights, else the
   * masters themselves. reduce_dtype: what gradients are summed in over dp
   * (ZT_F32, the default, or ZT_BF16 / ZT_F16: half the bytes, each partial
   * sum rounded to 16 bits); they are accumulated and kept in fp32 either
   * way. The masters, gradients and AdamW moments are fp32. offload:
   * where each unit's masters and moments live (parallel/offload.h; all on
   * the device when n_units is 0), and at stage 3 its params (PARAM, the
   * shard: "cpu" keeps the unit's piece in pinned host memory, copied
   * down ahead of each gather); the engine refuses other kinds. */
  zt_dtype param_dtype;
  zt_dtype reduce_dtype;
  zt_offload_cfg offload;
  /* backward passes per step (each bucket is reduced once in each: the
   * last reduction's sum is final); 0: unknown, then nothing is taken as
   * final before the step */
  int microbatches;
} zt_zero_cfg;

typedef struct zt_zero_units {
  int n;
  const int64_t *start, *numel; /* flat range of each unit */
  const int *group;             /* group of each unit; NULL: all one group */
  int tied_unit;                /* unit used again by the final unit (tied head), or -1 */
  int final_unit;               /* the unit whose phases use tied_unit */
} zt_zero_units;

/* The engine; its internals are zero.c's. */
typedef struct zt_zero zt_zero;

/* The model states the engine owns. Whole (flat range [0, Ψ)) or this
 * rank's shard [lo, hi) as the stage says:
 *   PARAM        whole at stages 0-2, the shard at 3 (gathered per unit);
 *   MASTER       PARAM itself in fp32; in 16 bits whole at stage 0 and the
 *                shard from stage 1 (the optimizer updates only its range);
 *   GRAD         whole at stages 0-1, the shard from 2;
 *   EXP_AVG(_SQ) whole at stage 0, the shard from 1. */
typedef enum {
  ZT_STATE_PARAM = 0,
  ZT_STATE_MASTER,
  ZT_STATE_GRAD,
  ZT_STATE_EXP_AVG,
  ZT_STATE_EXP_AVG_SQ,
  ZT_STATE_KINDS
} zt_state_kind;

/* One state on this rank: flat elements [lo, hi), element lo at data, in
 * memory of kind mem. data is NULL where an offload policy spread the
 * state over several memories or put it in a file: zt_zero_state_read
 * and zt_zero_state_write then move its ranges to and from the host. */
typedef struct zt_state_view {
  void *data;
  int64_t lo, hi;
  zt_dtype dtype;
  zt_mem_kind mem;
} zt_state_view;

/* What one optimizer step updates on this rank (all of Ψ at stage 0, the
 * shard otherwise), every pointer at element lo: fp32 master weights,
 * summed gradients and moments; w16 is where the update writes the
 * weights rounded to param_dtype in the same pass (NULL in fp32). */
typedef zt_update_range zt_zero_range;

/* Allocates every state of the stage under cfg's policy (PARAM, MASTER,
 * GRAD, the moments: zeroed) and the buffers the stage needs; the caller
 * then fills MASTER (initial values or a load) and calls
 * zt_zero_sync_params. NULL with *e set on failure. */
zt_zero *zt_zero_new(const zt_zero_cfg *cfg, const zt_backend *be, zt_stream *stream,
                     zt_comm *dp, int64_t numel, const zt_zero_units *units, zt_err *e);
void zt_zero_free(zt_zero *z);

int zt_zero_stage(const zt_zero *z);
/* The NVMe engine of this rank's offload file (zt_nvme_engine_name), or
 * NULL when the policy placed nothing on nvme. */
const char *zt_zero_nvme_engine(const zt_zero *z);
zt_state_view zt_zero_state(const zt_zero *z, zt_state_kind kind);
/* This rank's shard [lo, hi) of the flat buffer (its ZeRO partition). */
void zt_zero_shard(const zt_zero *z, int64_t *lo, int64_t *hi);
/* Bytes of the model states (every buffer of zt_zero_state, once: device
 * and pinned host memory, not an offload file) and of the gather and
 * bucket buffers. */
void zt_zero_bytes(const zt_zero *z, int64_t *states, int64_t *buffers);

/* What zt_zero_new allocates on dp rank dp_rank of dp for numel elements
 * in units (the same functions size both: the planner's figures are the
 * allocation's). Bytes unless said otherwise. */
typedef struct zt_zero_sizes {
  int64_t elems[ZT_STATE_KINDS]; /* elements of each state (whole or the shard) */
  int64_t state[ZT_STATE_KINDS]; /* bytes in memory (device and host); 0 for an
                                  * alias (fp32 MASTER is PARAM) */
  int64_t placed[ZT_STATE_KINDS][ZT_PLACES]; /* the same bytes per placement, and
                                              * the nvme file's (padded) */
  int64_t offload_staging;                   /* pinned chunks of the host update */
  int64_t bucket_elems, recv_elems;  /* stage >= 2: largest bucket, largest owned part */
  int64_t bucket_next;               /* stage >= 2: the second largest bucket */
  int64_t buckets;  /* stage >= 2: the gradient bucket buffers (fp32, and 16-bit to reduce) */
  int64_t reduce16; /* stage < 2, 16-bit reduce: the gradients converted */
  int64_t gather_elems;
  int64_t gather;   /* stage 3: the gather buffers (largest unit each) */
  int64_t param_stage; /* stage 3, params on the host: the device buffers their
                        * pieces are copied down to */
} zt_zero_sizes;
/* The buckets' reductions in flight at once (stage >= 2): all buffers but
 * the one backward writes. */
#define ZT_ZERO_BUCKETS_IN_FLIGHT 2
/* 0, or -1 when out of memory for its tables. */
int zt_zero_plan_bytes(const zt_zero_cfg *cfg, int dp, int dp_rank, int64_t numel,
                       const zt_zero_units *units, zt_zero_sizes *out);

/* PARAM made equal to MASTER after MASTER changed other than by an update
 * (initial values, a load): rounded to param_dtype and, at stages 1-2 in
 * 16 bits, all-gathered over dp (collective). Nothing in fp32 at stage
 * 0-2 or 3 (PARAM is MASTER). */
int zt_zero_sync_params(zt_zero *z, zt_err *e);

/* Flat elements [a, a + n) of state `kind` (fp32: MASTER or the moments,
 * or GRAD) to or from host memory, wherever they live; synchronous. */
int zt_zero_state_read(zt_zero *z, zt_state_kind kind, int64_t a, int64_t n, float *dst,
                       zt_err *e);
int zt_zero_state_write(zt_zero *z, zt_state_kind kind, int64_t a, int64_t n, const float *src,
                        zt_err *e);

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

/* Around each use of a unit; return where its weights (param_dtype) and
 * gradients (fp32) are (NULL for what the pass does not use). */
void zt_zero_before(zt_zero *z, int unit, zt_zero_pass pass, void **w, float **g);
void zt_zero_after(zt_zero *z, int unit, zt_zero_pass pass);

/* Start of a step: zero the gradients this rank accumulates. */
void zt_zero_grads_begin(zt_zero *z);
/* After the last micro-batch: finish the gradient reduction; *r is what
 * this rank's optimizer step updates. */
void zt_zero_grads_end(zt_zero *z, zt_zero_range *r);
/* Runs fn over range r (from zt_zero_grads_end) as the states' placement
 * asks: at once on the model's stream when all of them are on the device,
 * else piece by piece, offloaded pieces on the host (offload.h); with
 * `update` their new weights go back to the device. fn's pieces count
 * non-finite weights into their exec's sums: `sums` (device memory) for
 * device pieces, *host_nonfinite for host ones. r's w, m, v and w16 are
 * NULL when anything is offloaded: only the pieces reach them. */
int zt_zero_update(zt_zero *z, const zt_zero_range *r, int update, zt_update_fn fn, void *ctx,
                   zt_step_sums *sums, uint64_t *host_nonfinite, zt_err *e);
/* After the optimizer: make every rank's PARAM current again (stages 1
 * and 2: all-gathered in param_dtype; at 0 and 3 the update wrote it). */
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
/* The caller wrote the reduced gradients of [a, a + n) itself (after
 * zt_zero_grads_end): a copy of them taken before is stale. */
void zt_zero_grads_written(zt_zero *z, int64_t a, int64_t n);
/* The current fp32 weights of this rank's part of [a, b) (NULL when none). */
const float *zt_zero_owned_weights(const zt_zero *z, int64_t a, int64_t b, int64_t *from,
                                   int64_t *n);

#endif
