/* trainer: see trainer.h. */
#include "src/train/trainer.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/timer.h"

int zt_trainer_init(zt_trainer *t, const zt_train_cfg *cfg, zt_model *m,
                    zt_optim *o, zt_comm *dp, const zt_tokens *train,
                    const zt_tokens *val, int shuffle, zt_err *e) {
  memset(t, 0, sizeof *t);
  t->cfg = *cfg;
  t->model = m;
  t->optim = o;
  t->dp = dp;
  size_t n = (size_t)cfg->micro_batch * m->cfg.seq;
  t->inputs = malloc(n * sizeof *t->inputs);
  t->targets = malloc(n * sizeof *t->targets);
  if (!t->inputs || !t->targets)
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for batch buffers");
  int rc = zt_loader_init(&t->train, train, shuffle, cfg->seed, e);
  if (!rc && val) {
    rc = zt_loader_init(&t->val, val, 0, cfg->seed, e);
    t->has_val = 1;
  }
  return rc;
}

void zt_trainer_free(zt_trainer *t) {
  zt_loader_free(&t->train);
  if (t->has_val) zt_loader_free(&t->val);
  free(t->inputs);
  free(t->targets);
  memset(t, 0, sizeof *t);
}

void zt_trainer_step(zt_trainer *t, zt_step_stats *st) {
  zt_model *m = t->model;
  const zt_train_cfg *c = &t->cfg;
  double t0 = zt_timer_now();
  int64_t k = t->optim->t;
  int G = c->global_batch, B = c->micro_batch;
  int64_t tokens = (int64_t)G * m->cfg.seq;
  int slice = G / t->dp->size; /* this DP rank's samples of the batch */

  m->be->zero(m->g, (size_t)m->numel);
  double loss_sum = 0;
  for (int a = 0; a < c->accum; a++) {
    zt_loader_fill(&t->train, k, G, t->dp->rank * slice + a * B, B, t->inputs,
                   t->targets);
    loss_sum += zt_model_step(m, t->inputs, t->targets, 1, (float)(1.0 / tokens));
  }
  /* every rank scaled by the global token count: the sum is the mean */
  zt_comm_allreduce_f32(t->dp, m->g, (size_t)m->numel);
  zt_comm_allreduce_f64(t->dp, &loss_sum, 1);
  double sumsq = m->be->sumsq(m->g, (size_t)m->numel);

  st->grad_norm = zt_optim_clip(t->optim, m, sumsq);
  st->lr = zt_optim_step(t->optim, m);
  st->loss = loss_sum / (double)tokens;
  st->step = t->optim->t;
  st->tokens = tokens;
  st->ms = 1e3 * (zt_timer_now() - t0);
}

double zt_trainer_eval(zt_trainer *t, int batches) {
  zt_model *m = t->model;
  const zt_train_cfg *c = &t->cfg;
  int G = c->global_batch, B = c->micro_batch, slice = G / t->dp->size;
  double sum = 0;
  for (int k = 0; k < batches; k++)
    for (int a = 0; a < c->accum; a++) {
      zt_loader_fill(&t->val, k, G, t->dp->rank * slice + a * B, B, t->inputs,
                     t->targets);
      sum += zt_model_step(m, t->inputs, t->targets, 0, 0);
    }
  zt_comm_allreduce_f64(t->dp, &sum, 1);
  return sum / ((double)batches * G * m->cfg.seq);
}
