/* optim: AdamW with PyTorch's semantics, the learning-rate schedule and
 * clipping by the global L2 norm. It updates a flat range [lo, hi) of the
 * model's parameter layout — all of it on one rank, this rank's ZeRO shard
 * otherwise — with the gradients and moments of that range, which the ZeRO
 * engine (parallel/zero.h) owns. */
#ifndef ZT_OPTIM_H
#define ZT_OPTIM_H

#include <stdint.h>

#include "src/core/err.h"
#include "parallel/zero.h"
#include "src/model/model.h"

typedef enum { ZT_LR_CONSTANT = 0, ZT_LR_COSINE = 1, ZT_LR_DEEPSPEED = 2 } zt_lr_kind;
/* DeepSpeed's schedule classes (deepspeed/runtime/lr_schedules.py) */
typedef enum { ZT_DS_WARMUP = 0, ZT_DS_WARMUP_DECAY = 1, ZT_DS_WARMUP_COSINE = 2 } zt_ds_lr_type;

typedef struct zt_lr {
  zt_lr_kind kind;
  double value;              /* constant */
  double peak, final;        /* cosine */
  int64_t warmup, decay_steps;
  struct {                   /* deepspeed: its parameters, as named there */
    zt_ds_lr_type type;
    int log;                 /* warmup_type "log" (else "linear") */
    int64_t warmup_num_steps, total_num_steps;
    double warmup_min_lr, warmup_max_lr;        /* WarmupLR, WarmupDecayLR */
    double lr, warmup_min_ratio, cos_min_ratio; /* WarmupCosineLR */
  } ds;
} zt_lr;

/* LR for optimizer step `step` (0-based): linear warmup to peak over
 * `warmup` steps ((step+1)/warmup), then cosine to `final` at decay_steps,
 * then flat. deepspeed: the LR DeepSpeed 0.16 gives its update `step`
 * (see optim.c). */
double zt_lr_at(const zt_lr *s, int64_t step);

typedef struct zt_optim_cfg {
  zt_lr lr;
  double weight_decay, beta1, beta2, eps;
  double clip; /* max global L2 norm; 0 = off */
} zt_optim_cfg;

/* A range of the flat layout with its buffers, as the ZeRO engine hands
 * it out (zt_zero_grads_end): fp32 masters, gradients and moments, and
 * where the rounded 16-bit weights go (w16, NULL in fp32). */
typedef zt_zero_range zt_optim_range;

/* The step's reductions run on the device into a zt_step_sums in device
 * memory (kernels.h), which the caller reads back once.
 * sums->sumsq += the squared gradients over the range, counting each logical element
 * once across the grid: a piece held by several TP ranks (a whole tensor,
 * a replicated kv head) counts only on its designated holder
 * (zt_shard_counts_here), and the caller passes count_any = 0 on ranks
 * whose range duplicates another's (data parallelism without sharding). */
void zt_optim_sumsq(const zt_model *m, const zt_optim_range *r, int count_any,
                    zt_step_sums *sums);

/* Clipping by the global norm sqrt(global_sumsq), as clip_grad_norm_:
 * returns the norm and sets *gscale to the coefficient the gradients are
 * to be multiplied by (1 when they are not clipped), which
 * zt_optim_update applies as it reads them. */
double zt_optim_clip(const zt_optim_cfg *c, double global_sumsq, float *gscale);

/* One AdamW update of the range (or of a piece of it, as zt_zero_update
 * hands them out) at step `t` (1-based, after this update: the count of
 * applied updates, which skipped steps do not advance), run where x says;
 * returns the LR used. Weight decay applies to tensors of two or more
 * dimensions only. x->sums->nonfinite += the weights this update left
 * non-finite (zt_optim_first_nonfinite then says where). With r->w16 the
 * range's weights rounded to r->dt16 are written there in the same pass. */
double zt_optim_update(const zt_optim_cfg *c, const zt_model *m, const zt_update_exec *x,
                       const zt_optim_range *r, int64_t t, float gscale);

/* Where the range (or piece) first holds a non-finite value, in
 * parameter-table order, weights before gradients: i for a weight of
 * tensor i, n_params + i for its gradient, 2 * n_params for none; the
 * minimum over pieces is the range's answer. A scan reading back a count
 * per tensor (x->sums as scratch), that only a failing step pays for. */
int zt_optim_first_nonfinite(const zt_model *m, const zt_update_exec *x, const zt_optim_range *r);

/* Test hook: sets one gradient element of the last tensor piece in the
 * range that counts towards the norm (as zt_optim_sumsq counts) to NaN;
 * returns that tensor's index, or -1 when the range counts none. */
int zt_optim_test_poison(const zt_model *m, const zt_optim_range *r, int count_any);

#endif
