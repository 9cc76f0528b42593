/* trainer: the step loop. A step runs the micro-batches of this rank's
 * slice of global batch k (gradient accumulation), reduces gradients and
 * the loss over the data-parallel group, clips by the global norm and
 * applies AdamW. The loss of a step is the mean over every token of the
 * global batch, whatever the layout. */
#ifndef ZT_TRAINER_H
#define ZT_TRAINER_H

#include <stdint.h>

#include "parallel/comm.h"
#include "src/data/data.h"
#include "src/model/model.h"
#include "src/train/optim.h"

typedef struct zt_train_cfg {
  int micro_batch, global_batch, accum; /* global = micro * accum * dp */
  int64_t steps;
  zt_optim_cfg optim;
  uint64_t seed;
  int log_every, eval_every;
  double peak_gflops; /* for MFU; 0 = measure at start */
} zt_train_cfg;

typedef struct zt_step_stats {
  int64_t step; /* 1-based: optimizer steps done after this one */
  double loss, lr, grad_norm, ms;
  int64_t tokens; /* tokens in this step's global batch */
} zt_step_stats;

typedef struct zt_trainer {
  zt_train_cfg cfg;
  zt_model *model;
  zt_optim *optim;
  zt_comm *dp; /* data-parallel group */
  zt_loader train, val;
  int has_val;
  int32_t *inputs, *targets; /* host, one micro-batch */
} zt_trainer;

int zt_trainer_init(zt_trainer *t, const zt_train_cfg *cfg, zt_model *m,
                    zt_optim *o, zt_comm *dp, const zt_tokens *train,
                    const zt_tokens *val, int shuffle, zt_err *e);
void zt_trainer_free(zt_trainer *t);

/* One optimizer step on global batch o->t; fills *st. */
void zt_trainer_step(zt_trainer *t, zt_step_stats *st);

/* Mean loss per token over the first `batches` global batches of the
 * validation data (in file order). */
double zt_trainer_eval(zt_trainer *t, int batches);

#endif
