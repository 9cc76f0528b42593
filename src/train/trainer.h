/* trainer: the step loop. A step runs the micro-batches of this rank's
 * slice of global batch k (gradient accumulation; with pp > 1 through the
 * pipeline executor, in the schedule's order), lets the ZeRO engine
 * reduce the gradients over the data-parallel group, clips by the global
 * norm and applies AdamW to this rank's range. The loss of a step is the
 * mean over every token of the global batch, whatever the layout. The
 * trainer also connects the model's unit hooks to the ZeRO engine and
 * keeps a tied head on the last pipeline stage equal to the embedding on
 * the first: its gradient is added to the embedding's (the sum over the
 * embedding group), and the updated embedding is sent back to it. */
#ifndef ZT_TRAINER_H
#define ZT_TRAINER_H

#include <stdint.h>

#include "parallel/grid.h"
#include "parallel/schedule.h"
#include "parallel/zero.h"
#include "src/data/data.h"
#include "src/model/model.h"
#include "src/train/optim.h"
#include "src/train/pipe.h"
#include "src/train/scaler.h"

typedef struct zt_train_cfg {
  int micro_batch, global_batch, accum; /* global = micro * accum * dp */
  int64_t steps;
  zt_optim_cfg optim;
  uint64_t seed;
  int log_every, eval_every;
  double peak_gflops; /* for MFU; 0 = measure at start */
  int max_bad_steps;  /* non-finite steps in a row that stop the run */
  zt_scaler_cfg loss_scale;
  zt_dtype precision; /* of activations and the weights computed with (model.precision) */
  zt_dtype grad_reduce; /* gradients summed over dp in this (zero.reduce_dtype) */
} zt_train_cfg;

typedef struct zt_step_stats {
  int64_t step; /* 1-based: optimizer steps done after this one */
  double loss, lr, grad_norm, ms;
  int64_t tokens;                /* tokens in this step's global batch */
  uint64_t bytes_dp, bytes_tp;   /* bytes this rank moved on each group */
  uint64_t bytes_dp_inter, bytes_tp_inter; /* of those, sent to another node (ring model: all
                                            * when the group's next member is on one) */
  int64_t state_bytes;           /* model states held by this rank */
  int64_t buffer_bytes;          /* ZeRO gather and bucket buffers */
  int64_t act_bytes;             /* activation slots and scratch (zt_model.act_bytes) */
  /* pp > 1: idle share of the pipeline's makespan over all ranks,
   * measured, and simulated with this step's mean action times */
  int pipeline;
  double bubble, bubble_sim;
  /* a step whose loss or gradient norm is not finite applies no update */
  int skipped;
  /* the loss scale this step ran with and the next one's (both 1: none);
   * overflow: skipped for non-finite gradients that a lower scale may
   * avoid, which is no bad step unless the scale was at its minimum */
  int scaling; /* 0: no scaling, 1: a static scale, 2: dynamic */
  double loss_scale, next_scale;
  int overflow, bad;
  int64_t bad_run;     /* bad steps in a row, this one included */
  int bad_limit;       /* cfg.max_bad_steps */
  char nonfinite[192]; /* skipped: where the first non-finite value is, if found */
} zt_step_stats;

typedef struct zt_trainer {
  zt_train_cfg cfg;
  zt_model *model;
  zt_grid *grid;
  zt_zero *zero;    /* owns the model states */
  int64_t t;        /* steps taken: global batch t is the next one */
  int64_t skipped;  /* of those, skipped as non-finite: AdamW's clock and
                       the LR schedule count the t - skipped updates */
  int64_t bad_run;  /* bad steps in a row, up to the last step */
  zt_scaler scaler; /* loss scaling (train.loss_scale); a checkpoint keeps it */
  zt_step_sums *sums; /* device: the step's reductions, read back once */
  int64_t nan_step, nan_last; /* test hook ZT_TEST_NAN_AT_STEP=STEP[-LAST][:RANK] */
  int nan_rank;
  zt_loader train, val;
  int has_val;
  int32_t *inputs, *targets; /* host, one micro-batch */

  /* pp > 1 */
  int piped;
  zt_pipe pipe;
  const zt_schedule *sched;
  /* tied embedding over pipeline ends: 1 on the first stage (it owns the
   * tensor), 2 on the last (it holds the copy m->tied_w); 0 elsewhere */
  int tied_end, tied_stale;
  /* the engine's PARAM lags its masters (zt_zero_sync_params): after
   * initialisation and a load */
  int params_stale;
  /* the offload policy puts some state in nvme files (on any rank): the
   * update's outcome is agreed on, so that a failing file stops all */
  int offload_files;
  int64_t tied_n;                 /* elements of this TP rank's embed.tokens */
  int *tied_counts, *tied_displs; /* what each dp rank of the first stage owns of it */
  float *tied_part;
} zt_trainer;

/* Sets up the ZeRO engine, which allocates the model states, initialises
 * the weights from cfg->seed (zt_model_init_weights), connects the model's
 * hooks, and with pp > 1 the executor for schedule `sched` (whose
 * micro-batches are cfg->accum). A load into the engine's states may
 * follow before the first step (the weights computed with are made from
 * the masters at the first pass, the tied copy at each step). */
int zt_trainer_init(zt_trainer *t, const zt_train_cfg *cfg, zt_model *m,
                    zt_grid *grid, const zt_zero_cfg *zero, const zt_schedule *sched,
                    const zt_data *train, const zt_data *val, int shuffle,
                    zt_err *e);
void zt_trainer_free(zt_trainer *t);

/* One step on global batch t->t; fills *st. A step whose loss or global
 * gradient norm is not finite is skipped: no rank updates weights or
 * moments, but t->t advances (the data position). The loss gradient is
 * multiplied by the loss scale and the gradients divided by it again in
 * the update (through the clipping coefficient). A dynamic scale halves on
 * overflow; such a step is bad only when the scale is already at its
 * minimum, a non-finite loss always. Fails (ZT_ERUNTIME, the same on every
 * rank) after cfg.max_bad_steps bad steps in a row, and when an update
 * leaves a weight non-finite; the message names the step and the first
 * tensor concerned. */
int zt_trainer_step(zt_trainer *t, zt_step_stats *st, zt_err *e);

/* The ZeRO engine's view of model m as zt_trainer_init gives it:
 * units (group: room for m->n_units, which units->group points at) and
 * the engine's policy, zero's with the model's dtype. The planner sizes
 * the engine from the same. */
void zt_trainer_zero_of(const zt_model *m, const zt_zero_cfg *zero, int *group,
                        zt_zero_units *units, zt_zero_cfg *zc);
/* Bytes zt_trainer_init allocates itself for m (a model from
 * zt_model_plan or zt_model_init) in a pipeline of pp stages: the batch
 * arrays, the step's sums and, on a tied model's end stages, the buffer of
 * the tied embedding's gradient part. */
int64_t zt_trainer_own_bytes(const zt_model *m, int pp, int micro_batch);

/* Bytes of this rank's model states (the engine's and a tied copy's) and
 * of the engine's gather and bucket buffers. */
void zt_trainer_bytes(const zt_trainer *t, int64_t *states, int64_t *buffers);

/* Mean loss per token over the first `batches` global batches of the
 * validation data (in file order). */
double zt_trainer_eval(zt_trainer *t, int batches);

#endif
