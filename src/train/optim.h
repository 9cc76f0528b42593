/* optim: AdamW with PyTorch's semantics, the learning-rate schedule and
 * clipping by the global L2 norm. The optimizer state (exp_avg, exp_avg_sq)
 * lives in two flat buffers with the parameters' layout, so checkpoints and
 * ZeRO address it by the same tensor descriptors. */
#ifndef ZT_OPTIM_H
#define ZT_OPTIM_H

#include <stdint.h>

#include "src/core/err.h"
#include "src/model/model.h"

typedef enum { ZT_LR_CONSTANT = 0, ZT_LR_COSINE = 1 } zt_lr_kind;

typedef struct zt_lr {
  zt_lr_kind kind;
  double value;              /* constant */
  double peak, final;        /* cosine */
  int64_t warmup, decay_steps;
} zt_lr;

/* LR for optimizer step `step` (0-based): linear warmup to peak over
 * `warmup` steps ((step+1)/warmup), then cosine to `final` at decay_steps,
 * then flat. */
double zt_lr_at(const zt_lr *s, int64_t step);

typedef struct zt_optim_cfg {
  zt_lr lr;
  double weight_decay, beta1, beta2, eps;
  double clip; /* max global L2 norm; 0 = off */
} zt_optim_cfg;

typedef struct zt_optim {
  zt_optim_cfg cfg;
  float *m, *v;   /* device, the model's flat layout */
  int64_t t;      /* optimizer steps taken */
} zt_optim;

int zt_optim_init(zt_optim *o, const zt_optim_cfg *cfg, const zt_model *m, zt_err *e);
void zt_optim_free(zt_optim *o, const zt_model *m);

/* Global L2 norm of the gradients (as torch.nn.utils.clip_grad_norm_ reports
 * it), from a sum of squares the caller has already reduced over ranks. */
double zt_optim_clip(zt_optim *o, zt_model *m, double grad_sumsq);

/* One AdamW update at the schedule's LR for step o->t; returns the LR used.
 * Weight decay applies to tensors of two or more dimensions only. */
double zt_optim_step(zt_optim *o, zt_model *m);

#endif
