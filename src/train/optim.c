/* optim: see optim.h. */
#include "src/train/optim.h"

#include <math.h>
#include <string.h>

double zt_lr_at(const zt_lr *s, int64_t step) {
  if (s->kind == ZT_LR_CONSTANT) return s->value;
  if (step < s->warmup) return s->peak * (double)(step + 1) / (double)s->warmup;
  int64_t span = s->decay_steps - s->warmup;
  double progress = (double)(step - s->warmup) / (double)(span > 1 ? span : 1);
  if (progress > 1) progress = 1;
  return s->final + 0.5 * (s->peak - s->final) * (1 + cos(M_PI * progress));
}

int zt_optim_init(zt_optim *o, const zt_optim_cfg *cfg, const zt_model *m, zt_err *e) {
  memset(o, 0, sizeof *o);
  o->cfg = *cfg;
  size_t bytes = (size_t)m->numel * sizeof(float);
  o->m = m->be->alloc(bytes);
  o->v = m->be->alloc(bytes);
  if (!o->m || !o->v) {
    zt_optim_free(o, m);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for AdamW state (%.2f GiB)",
                      2.0 * bytes / (1 << 30));
  }
  return ZT_OK;
}

void zt_optim_free(zt_optim *o, const zt_model *m) {
  m->be->free(o->m);
  m->be->free(o->v);
  o->m = o->v = NULL;
}

double zt_optim_clip(zt_optim *o, zt_model *m, double grad_sumsq) {
  double norm = sqrt(grad_sumsq);
  if (o->cfg.clip > 0) {
    /* the same coefficient and epsilon as clip_grad_norm_ */
    double coef = o->cfg.clip / (norm + 1e-6);
    if (coef < 1) m->be->scale(m->g, (float)coef, (size_t)m->numel);
  }
  return norm;
}

double zt_optim_step(zt_optim *o, zt_model *m) {
  const zt_optim_cfg *c = &o->cfg;
  double lr = zt_lr_at(&c->lr, o->t);
  o->t++;
  zt_adamw_args a = {
      .b1 = (float)c->beta1, .c1 = (float)(1 - c->beta1),
      .b2 = (float)c->beta2, .c2 = (float)(1 - c->beta2),
      .eps = (float)c->eps,
      .step = (float)(lr / (1 - pow(c->beta1, (double)o->t))),
      .bc2_sqrt = (float)sqrt(1 - pow(c->beta2, (double)o->t))};
  for (int i = 0; i < m->n_params; i++) {
    const zt_tensor_desc *t = &m->params[i].t;
    a.decay = (float)(1 - lr * (t->ndim >= 2 ? c->weight_decay : 0));
    m->be->adamw(m->w + t->offset, m->g + t->offset, o->m + t->offset,
                 o->v + t->offset, (size_t)t->numel, &a);
  }
  return lr;
}
