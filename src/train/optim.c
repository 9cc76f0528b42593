/* optim: see optim.h. */
#include "src/train/optim.h"

#include <math.h>

/* DeepSpeed 0.16's WarmupLR / WarmupDecayLR / WarmupCosineLR. Their
 * constructors set the optimizer's LR to get_lr() at last_batch_iteration
 * -1, and the engine calls step() (last_batch_iteration += 1) after each
 * applied update (not after an fp16 overflow's skipped one), so update
 * `step` (0-based, applied ones counted, as zt_lr_at's `step`) runs at
 * get_lr() with last_batch_iteration i = step - 1. The expressions are
 * DeepSpeed's, in its order of operations. */
static double deepspeed_lr(const zt_lr *s, int64_t step) {
  int64_t i = step - 1;
  int64_t w = s->ds.warmup_num_steps > 2 ? s->ds.warmup_num_steps : 2; /* max(2, warmup_num_steps) */
  int64_t total = s->ds.total_num_steps;
  double gamma = 1.0; /* of the warmup: 0 to 1 */
  if (i >= 0 && i < w)
    gamma = s->ds.log ? 1.0 / log((double)w) * log((double)(i + 1)) : (double)i / (double)w;
  if (s->ds.type == ZT_DS_WARMUP_COSINE) {
    if (i < 0) return 0.0; /* get_lr()'s [0.0] before the first step() */
    double ratio;
    if (i < w) {
      ratio = s->ds.warmup_min_ratio + gamma * (1. - s->ds.warmup_min_ratio);
    } else {
      int64_t last = i - w + 1, span = total - w;
      ratio = (1 + cos(M_PI * (double)last / (double)span)) / 2;
      ratio = fmax(0.0, s->ds.cos_min_ratio + (1. - s->ds.cos_min_ratio) * ratio);
    }
    return s->ds.lr * ratio;
  }
  if (i < 0) return s->ds.warmup_min_lr; /* get_lr()'s min_lrs before the first step() */
  if (i >= w)
    gamma = s->ds.type == ZT_DS_WARMUP ? 1.0
            : fmax(0.0, (double)(total - i) / fmax(1.0, (double)(total - w)));
  return s->ds.warmup_min_lr + (s->ds.warmup_max_lr - s->ds.warmup_min_lr) * gamma;
}

double zt_lr_at(const zt_lr *s, int64_t step) {
  if (s->kind == ZT_LR_CONSTANT) return s->value;
  if (s->kind == ZT_LR_DEEPSPEED) return deepspeed_lr(s, step);
  if (step < s->warmup) return s->peak * (double)(step + 1) / (double)s->warmup;
  int64_t span = s->decay_steps - s->warmup;
  double progress = (double)(step - s->warmup) / (double)(span > 1 ? span : 1);
  if (progress > 1) progress = 1;
  return s->final + 0.5 * (s->peak - s->final) * (1 + cos(M_PI * progress));
}

/* Calls fn for the part of each tensor inside [r->lo, r->hi). */
#define FOR_EACH_PIECE(m, r, desc, a, n, body)                              \
  for (int i_ = 0; i_ < (m)->n_params; i_++) {                              \
    const zt_tensor_desc *desc = &(m)->params[i_].t;                        \
    if (!(m)->params[i_].here) continue;                                    \
    int64_t s_ = desc->offset > (r)->lo ? desc->offset : (r)->lo;           \
    int64_t e_ = desc->offset + desc->numel < (r)->hi ? desc->offset + desc->numel : (r)->hi; \
    if (e_ <= s_) continue;                                                 \
    int64_t a = s_ - (r)->lo, n = e_ - s_;                                  \
    body                                                                    \
  }

void zt_optim_sumsq(const zt_model *m, const zt_optim_range *r, int count_any,
                    zt_step_sums *sums) {
  if (!count_any) return;
  FOR_EACH_PIECE(m, r, t, a, n, {
    if (zt_shard_counts_here(t, m->tp_rank, m->tp_size))
      m->be->sumsq(m->stream, sums, r->g + a, (size_t)n);
  })
}

double zt_optim_clip(const zt_optim_cfg *c, double global_sumsq, float *gscale) {
  double norm = sqrt(global_sumsq);
  *gscale = 1;
  if (c->clip > 0) {
    /* the same coefficient and epsilon as clip_grad_norm_ */
    double coef = c->clip / (norm + 1e-6);
    if (coef < 1) *gscale = (float)coef;
  }
  return norm;
}

double zt_optim_update(const zt_optim_cfg *c, const zt_model *m, const zt_update_exec *x,
                       const zt_optim_range *r, int64_t t, float gscale) {
  double lr = zt_lr_at(&c->lr, t - 1);
  zt_adamw_args args = {
      .b1 = (float)c->beta1, .c1 = (float)(1 - c->beta1),
      .b2 = (float)c->beta2, .c2 = (float)(1 - c->beta2),
      .eps = (float)c->eps,
      .step = (float)(lr / (1 - pow(c->beta1, (double)t))),
      .bc2_sqrt = (float)sqrt(1 - pow(c->beta2, (double)t)),
      .gscale = gscale};
  FOR_EACH_PIECE(m, r, tensor, a, n, {
    args.decay = (float)(1 - lr * (tensor->ndim >= 2 ? c->weight_decay : 0));
    void *p16 = r->w16 ? (char *)r->w16 + (size_t)a * zt_dtype_size(r->dt16) : NULL;
    x->be->adamw(x->stream, r->w + a, r->g + a, r->m + a, r->v + a, (size_t)n, &args, x->sums,
                 p16, r->dt16);
  })
  return lr;
}

/* Whether x[n] holds a non-finite element: counted on the device, read back. */
static int any_nonfinite(const zt_update_exec *x, const float *p, size_t n) {
  zt_step_sums h = {0};
  x->be->memzero(x->stream, x->sums, sizeof *x->sums);
  x->be->count_nonfinite(x->stream, x->sums, p, n);
  x->be->copy(x->stream, &h, x->sums, sizeof h);
  x->be->stream_sync(x->stream);
  return h.nonfinite > 0;
}

int zt_optim_first_nonfinite(const zt_model *m, const zt_update_exec *x, const zt_optim_range *r) {
  int np = m->n_params;
  FOR_EACH_PIECE(m, r, t, a, n, {
    (void)t;
    if (any_nonfinite(x, r->w + a, (size_t)n)) return i_;
  })
  FOR_EACH_PIECE(m, r, t, a, n, {
    (void)t;
    if (any_nonfinite(x, r->g + a, (size_t)n)) return np + i_;
  })
  return 2 * np;
}

int zt_optim_test_poison(const zt_model *m, const zt_optim_range *r, int count_any) {
  int found = -1;
  int64_t at = 0;
  if (!count_any) return -1;
  FOR_EACH_PIECE(m, r, t, a, n, {
    (void)n;
    if (zt_shard_counts_here(t, m->tp_rank, m->tp_size)) {
      found = i_;
      at = a;
    }
  })
  if (found >= 0) {
    float nan = NAN;
    m->be->copy(m->stream, r->g + at, &nan, sizeof nan);
    m->be->stream_sync(m->stream);
  }
  return found;
}
