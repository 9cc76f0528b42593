/* trainer: see trainer.h. */
#include "src/train/trainer.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/timer.h"

static void hook_before(void *ctx, zt_model *m, int unit, zt_phase ph) {
  zt_zero_before(ctx, unit, ph == ZT_PHASE_BWD, &m->unit_w[unit], &m->unit_g[unit]);
}

static void hook_after(void *ctx, zt_model *m, int unit, zt_phase ph) {
  (void)m;
  zt_zero_after(ctx, unit, ph == ZT_PHASE_BWD);
}

int zt_trainer_init(zt_trainer *t, const zt_train_cfg *cfg, zt_model *m,
                    zt_grid *grid, const zt_zero_cfg *zero,
                    const zt_tokens *train, const zt_tokens *val, int shuffle,
                    zt_err *e) {
  memset(t, 0, sizeof *t);
  t->cfg = *cfg;
  t->model = m;
  t->grid = grid;
  zt_zero_units units = {
      .n = m->n_units, .start = m->unit_start, .numel = m->unit_numel,
      .tied_unit = m->param_unit[m->head] != m->n_units - 1 ? m->param_unit[m->head] : -1,
      .final_unit = m->n_units - 1};
  int rc = zt_zero_init(&t->zero, zero, m->be, &grid->dp_comm, m->numel, &units, m->w,
                        m->g, e);
  if (rc) return rc;
  /* State the engine shards away is freed here: that is the point of ZeRO. */
  if (zero->stage >= 2) {
    m->be->free(m->g);
    m->g = NULL;
  }
  if (zero->stage >= 3) {
    zt_zero_shard_weights(&t->zero);
    m->be->free(m->w);
    m->w = NULL;
  }
  m->hooks = (zt_model_hooks){.ctx = &t->zero, .before = hook_before, .after = hook_after};

  size_t n = (size_t)cfg->micro_batch * m->cfg.seq;
  t->inputs = malloc(n * sizeof *t->inputs);
  t->targets = malloc(n * sizeof *t->targets);
  if (!t->inputs || !t->targets)
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for batch buffers");
  rc = zt_loader_init(&t->train, train, shuffle, cfg->seed, e);
  if (!rc && val) {
    rc = zt_loader_init(&t->val, val, 0, cfg->seed, e);
    t->has_val = 1;
  }
  return rc;
}

void zt_trainer_free(zt_trainer *t) {
  if (t->model) t->model->hooks = (zt_model_hooks){0};
  zt_zero_free(&t->zero);
  zt_loader_free(&t->train);
  if (t->has_val) zt_loader_free(&t->val);
  free(t->inputs);
  free(t->targets);
  memset(t, 0, sizeof *t);
}

/* Runs micro-batch a of this rank's slice of global batch k. */
static double micro_batch(zt_trainer *t, zt_loader *ld, int64_t k, int a, int backward,
                          float dscale) {
  const zt_train_cfg *c = &t->cfg;
  int slice = c->global_batch / t->grid->dp;
  zt_loader_fill(ld, k, c->global_batch, t->grid->dp_rank * slice + a * c->micro_batch,
                 c->micro_batch, t->inputs, t->targets);
  zt_zero_microbatch_begin(&t->zero);
  return zt_model_step(t->model, t->inputs, t->targets, backward, dscale);
}

void zt_trainer_step(zt_trainer *t, zt_step_stats *st) {
  zt_model *m = t->model;
  zt_grid *g = t->grid;
  const zt_train_cfg *c = &t->cfg;
  double t0 = zt_timer_now();
  uint64_t dp0 = zt_comm_total_bytes(&g->dp_comm), tp0 = zt_model_tp_bytes(m);
  int64_t tokens = (int64_t)c->global_batch * m->cfg.seq;

  zt_zero_grads_begin(&t->zero);
  double loss = 0;
  for (int a = 0; a < c->accum; a++)
    loss += micro_batch(t, &t->train, t->t, a, 1, (float)(1.0 / tokens));
  zt_optim_range r = {.m = t->zero.m, .v = t->zero.v};
  zt_zero_grads_end(&t->zero, &r.w, &r.g);
  r.lo = t->zero.cfg.stage == 0 ? 0 : t->zero.lo;
  r.hi = t->zero.cfg.stage == 0 ? m->numel : t->zero.hi;

  /* One reduction over the world of [loss, grad sumsq], each counted once:
   * the loss by TP rank 0 of each data-parallel rank, gradients by their
   * owner (all DP ranks hold all of them at stage 0: rank 0 counts). */
  double sums[2] = {g->tp_rank == 0 ? loss : 0,
                    zt_optim_sumsq(m, &r, t->zero.cfg.stage > 0 || g->dp_rank == 0)};
  zt_comm_allreduce_f64(&g->world, sums, 2);
  st->grad_norm = zt_optim_clip(&c->optim, m, &r, sums[1]);
  st->lr = zt_optim_update(&c->optim, m, &r, ++t->t);
  zt_zero_params_sync(&t->zero);

  st->loss = sums[0] / (double)tokens;
  st->step = t->t;
  st->tokens = tokens;
  st->bytes_dp = zt_comm_total_bytes(&g->dp_comm) - dp0;
  st->bytes_tp = zt_model_tp_bytes(m) - tp0;
  st->ms = 1e3 * (zt_timer_now() - t0);
}

double zt_trainer_eval(zt_trainer *t, int batches) {
  const zt_train_cfg *c = &t->cfg;
  double sum = 0;
  for (int k = 0; k < batches; k++)
    for (int a = 0; a < c->accum; a++) sum += micro_batch(t, &t->val, k, a, 0, 0);
  if (t->grid->tp_rank != 0) sum = 0;
  zt_comm_allreduce_f64(&t->grid->world, &sum, 1);
  return sum / ((double)batches * c->global_batch * t->model->cfg.seq);
}
