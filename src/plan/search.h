/* search: the layouts of a model on a world of N ranks, ranked by the
 * predicted step time (cost.h) among those whose peak memory fits a rank.
 * It enumerates tp (dividing the model, zt_model_tp_check, and at most a
 * node), pp (dividing the layers: balanced stages), dp = N/(tp·pp), ZeRO
 * stage 0-3, micro-batch sizes dividing global_batch/dp, the schedule
 * (1F1B, or interleaved with 2 chunks where every stage has an even number
 * of blocks and the micro-batches are a multiple of pp), recomputation
 * (none or full) and the moments' placement (device or cpu). It has no
 * memory estimate of its own: peak memory comes from the peak_bytes
 * callback (the memory planner), and the pipeline's action lists from the
 * pipeline callback (the config layer running the schedule's Lua), so
 * that what it ranks is what a run would allocate and execute. */
#ifndef ZT_PLAN_SEARCH_H
#define ZT_PLAN_SEARCH_H

#include <stdint.h>

#include "src/plan/cost.h"

typedef enum { ZT_SCHED_1F1B = 0, ZT_SCHED_INTERLEAVED = 1 } zt_sched_kind;

typedef struct zt_candidate {
  zt_layout layout; /* tp, pp, dp, zero, micro_batch, global_batch, sp, moments */
  zt_sched_kind schedule;
  int chunks;     /* 1 for 1F1B */
  int recompute;  /* every block recomputed in backward */
  /* during the search only (NULL in the result): the candidate's checked
   * pipeline, from the pipeline callback, set before peak_bytes is called
   * so that the memory planner can read the schedule's in-flight
   * micro-batches per stage (report.peak) and the partition */
  const zt_pipeline_cfg *pipeline;
  int64_t peak_bytes; /* from peak_bytes */
  zt_cost cost;
} zt_candidate;

/* Peak bytes one rank of candidate c holds (the worst rank); c->pipeline
 * is set. */
typedef int (*zt_peak_fn)(const zt_candidate *c, void *ctx, int64_t *bytes, zt_err *e);
/* The checked pipeline of c (partition and action lists of c's pp, chunks,
 * schedule and global/(micro·dp) micro-batches), owned by the callback and
 * kept until the search returns; the search asks once per distinct
 * (pp, chunks, schedule, micro-batch, dp). */
typedef int (*zt_pipeline_fn)(const zt_candidate *c, void *ctx, zt_pipeline_cfg **out, zt_err *e);

typedef struct zt_search_cfg {
  const zt_model_cfg *model; /* its recompute flags are replaced by each candidate's */
  int world;
  int64_t mem_per_rank; /* bytes */
  int global_batch;
  int sp;                   /* sequence parallel where it divides (tp > 1) */
  int act_bytes, grad_bytes; /* as zt_layout */
  int zero_overlap;
  zt_hw hw;
  zt_peak_fn peak_bytes;
  void *peak_ctx;
  zt_pipeline_fn pipeline;
  void *pipeline_ctx;
} zt_search_cfg;

typedef struct zt_search_result {
  int n;            /* candidates that fit, fastest first */
  zt_candidate *c;
  int tried;        /* layouts enumerated that the model and world allow */
  int too_big;      /* of those, over mem_per_rank */
  int64_t least_peak; /* smallest peak seen (for the message when none fits) */
} zt_search_result;

/* ZT_EINPUT with the numbers when the world or the batch admits no layout
 * at all; a result with n = 0 when layouts exist but none fits. */
int zt_search_run(const zt_search_cfg *cfg, zt_search_result *r, zt_err *e);
void zt_search_result_free(zt_search_result *r);

/* "tp=8 pp=4 dp=2 zero=1 mb=1 interleaved:2 recompute=full moments=device" */
void zt_candidate_describe(const zt_candidate *c, char *buf, size_t size);

#endif
