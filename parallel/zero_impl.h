/* zero_impl: what the ZeRO engine (zero.c) and its sizing (zero_layout.c)
 * share, and nothing else includes: the bucket record, the buffer pools'
 * sizes, and the pure functions that lay states and buckets out, which
 * zt_zero_new allocates by and zt_zero_plan_bytes counts by (one source
 * of truth for the memory planner). */
#ifndef ZT_ZERO_IMPL_H
#define ZT_ZERO_IMPL_H

#include "parallel/zero.h"

typedef struct zt_bucket {
  int first, last;     /* units, first > last (backward order) or equal */
  int64_t lo, hi;      /* flat range */
  int pending;         /* units whose last backward use is still to come */
  int open;            /* backward is writing its gradients */
  int buf;             /* pool buffer while open or in flight, else -1 */
  int *counts;         /* per dp rank: part of [lo, hi) it owns */
  zt_req req;
  int in_flight;
  int reduced;         /* reductions finished this step (one per micro-batch) */
} zt_bucket;

#define GRAD_BUFFERS (ZT_ZERO_BUCKETS_IN_FLIGHT + 1) /* and the one backward writes */
#define GATHER_BUFFERS 3 /* stage 3: current, prefetched next, tied unit */
/* stage 3, params on the host: device buffers their pieces are copied
 * down to ahead of the gather (the unit gathered and the one after) */
#define PARAM_STAGE_BUFFERS ZT_OFFLOAD_PARAM_SLOTS /* and, params on nvme, the host
                                                  * buffers their pieces are read into */

/* Packs u's units into buckets of at most bucket_bytes (b[] has room for
 * u->n), bucket_of[unit] its bucket or -1; returns how many. */
int zt_zero_pack_buckets(const zt_zero_units *u, int64_t bucket_bytes, zt_bucket *bk,
                         int *bucket_of);
/* Largest bucket, and largest part of one that dp rank `rank` owns (elements). */
void zt_zero_bucket_extent(const zt_bucket *bk, int nb, int64_t numel, int dp, int rank,
                           int64_t *buf, int64_t *recv);
/* Whether the policy moves any state off the device. */
int zt_zero_offloads(const zt_offload_cfg *c);
/* The offload store's layout for dp rank r (param and rank left to fill). */
zt_offload_layout zt_zero_offload_layout(const zt_zero_cfg *c, const zt_zero_units *u,
                                         int64_t numel, int dp, int r);
/* Stage 3 with a policy placing params off the device: elements of this
 * rank's PARAM (dp rank r) at each placement (n[ZT_PLACE_DEVICE], _CPU,
 * _NVME), and the largest off-device unit's piece (*stage, the staging
 * buffers' size). 0 (and zeros) when the params are not placed. */
int zt_zero_param_split(const zt_zero_cfg *c, const zt_zero_units *u, int64_t numel, int dp,
                        int r, int64_t n[ZT_PLACES], int64_t *stage);
/* How the stage holds state k without offload: whole or the shard, dtype,
 * memory, and whether it is another state's memory. */
void zt_zero_state_layout(const zt_zero_cfg *c, zt_state_kind k, int *whole, zt_dtype *dt,
                          zt_mem_kind *mem, int *alias);

#endif
