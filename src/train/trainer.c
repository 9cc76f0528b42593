/* trainer: see trainer.h. */
#include "src/train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/timer.h"
#include "src/core/trace.h"

/* The model's phases are the engine's passes, in the same order. */
_Static_assert(ZT_PHASE_FWD == (int)ZT_ZERO_FWD && ZT_PHASE_BWD == (int)ZT_ZERO_BWD &&
                   ZT_PHASE_BWD_INPUT == (int)ZT_ZERO_BWD_INPUT &&
                   ZT_PHASE_BWD_WEIGHT == (int)ZT_ZERO_BWD_WEIGHT,
               "zt_phase and zt_zero_pass differ");

static void hook_before(void *ctx, zt_model *m, int unit, zt_phase ph) {
  /* unit_w holds the compute weights, of the model's dtype */
  zt_zero_before(ctx, unit, (zt_zero_pass)ph, &m->unit_w[unit], &m->unit_g[unit]);
}

static void hook_after(void *ctx, zt_model *m, int unit, zt_phase ph) {
  (void)m;
  zt_zero_after(ctx, unit, (zt_zero_pass)ph);
}

/* ---- tied embedding over the pipeline's ends -------------------------- */

/* Both ends learn how the first stage's ZeRO partition cuts embed.tokens
 * (offset 0 of its flat buffer, tied_n elements on this TP rank). */
static int tied_init(zt_trainer *t, zt_err *e) {
  zt_model *m = t->model;
  zt_grid *g = t->grid;
  if (!m->cfg.tied || g->pp == 1 || (g->pp_rank != 0 && g->pp_rank != g->pp - 1)) return ZT_OK;
  t->tied_end = g->pp_rank == 0 ? 1 : 2;
  t->tied_n = m->params[m->embed_tok].t.numel;
  int64_t first_numel = m->numel;
  zt_comm_bcast(&g->embed_comm, &first_numel, 1, ZT_I64, 0);
  t->tied_counts = malloc((size_t)g->dp * sizeof *t->tied_counts);
  t->tied_displs = malloc((size_t)g->dp * sizeof *t->tied_displs);
  t->tied_part = m->be->alloc(ZT_MEM_DEVICE, (size_t)t->tied_n * sizeof(float));
  if (!t->tied_counts || !t->tied_displs || !t->tied_part)
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for the tied embedding");
  for (int r = 0; r < g->dp; r++) {
    int64_t from;
    t->tied_counts[r] = (int)zt_zero_part(first_numel, g->dp, r, 0, t->tied_n, &from);
    t->tied_displs[r] = t->tied_counts[r] ? (int)from : 0;
  }
  t->tied_stale = 1;
  return ZT_OK;
}

/* The last stage's copy := the first stage's current embedding: each dp
 * rank of the first stage sends the part it owns to its partner, and the
 * last stage's dp group gathers the parts. */
static void tied_refresh(zt_trainer *t) {
  if (!t->tied_end || !t->tied_stale) return;
  zt_grid *g = t->grid;
  int r = g->dp_rank;
  size_t n_part = (size_t)t->tied_counts[r];
  if (t->tied_end == 1) {
    int64_t from, n;
    const float *w = zt_zero_owned_weights(t->zero, 0, t->tied_n, &from, &n);
    zt_comm_bcast(&g->embed_comm, (void *)w, n_part, ZT_F32, 0);
  } else {
    zt_comm_bcast(&g->embed_comm, t->model->tied_w + t->tied_displs[r], n_part, ZT_F32, 0);
    zt_req q;
    zt_comm_iallgather(&g->dp_comm, t->model->tied_w, t->tied_counts, t->tied_displs, ZT_F32,
                       &q);
    zt_comm_wait(&q);
    zt_model_sync_tied(t->model); /* 16 bits: the copy computed with, rounded */
  }
  t->tied_stale = 0;
}

/* The copy's gradient joins the embedding's: summed over the last stage's
 * dp group into the parts the first stage's ranks own, each part sent to
 * its owner, which adds it (before its own reduction at ZeRO 0-1, into
 * the reduced shard at 2-3: the engine knows which). */
static void tied_grads(zt_trainer *t) {
  zt_grid *g = t->grid;
  int r = g->dp_rank;
  size_t n_part = (size_t)t->tied_counts[r];
  if (t->tied_end == 2) {
    zt_req q;
    zt_comm_ireduce_scatter(&g->dp_comm, t->model->tied_g, t->tied_part, t->tied_counts, ZT_F32,
                            ZT_SUM, &q);
    zt_comm_wait(&q);
    zt_comm_bcast(&g->embed_comm, t->tied_part, n_part, ZT_F32, 1);
  } else if (t->tied_end == 1) {
    zt_comm_bcast(&g->embed_comm, t->tied_part, n_part, ZT_F32, 1);
    zt_zero_add_grad(t->zero, t->tied_displs[r], t->tied_counts[r], t->tied_part);
  }
}

/* ---- the optimizer over the engine's pieces (offload runs some on the host) */

typedef struct {
  const zt_optim_cfg *c;
  const zt_model *m;
  int64_t t;
  float gscale;
  int first;
} piece_ctx;

static void update_piece(void *ctx, const zt_update_exec *x, const zt_zero_range *r) {
  piece_ctx *p = ctx;
  zt_optim_update(p->c, p->m, x, r, p->t, p->gscale);
}

static void scan_piece(void *ctx, const zt_update_exec *x, const zt_zero_range *r) {
  piece_ctx *p = ctx;
  int f = zt_optim_first_nonfinite(p->m, x, r);
  if (f < p->first) p->first = f;
}

/* Where range r first holds a non-finite value (zt_optim_first_nonfinite). */
static int first_nonfinite(zt_trainer *t, const zt_optim_range *r) {
  piece_ctx p = {.m = t->model, .first = 2 * t->model->n_params};
  uint64_t ignored = 0;
  zt_err e;
  zt_zero_update(t->zero, r, 0, scan_piece, &p, t->sums, &ignored, &e);
  return p.first;
}

/* ---- setup ---------------------------------------------------------------- */

void zt_trainer_zero_of(const zt_model *m, const zt_zero_cfg *zero, int *group,
                        zt_zero_units *units, zt_zero_cfg *zc) {
  /* a stage's chunks run as separate actions: their units never share a
   * bucket or a prefetch */
  for (int u = 0; u < m->n_units; u++) group[u] = -1;
  int last = m->n_chunks - 1, fin = m->n_units - 1;
  for (int c = 0; c < m->n_chunks; c++)
    for (int l = m->chunks[c].first; l <= m->chunks[c].last; l++) group[l + 1] = c;
  group[0] = 0;
  group[fin] = last;
  int hu = m->param_unit[m->head];
  /* a tied copy (m->bytes.tied_copy) replaces the head's use of unit 0 */
  *units = (zt_zero_units){
      .n = m->n_units, .start = m->unit_start, .numel = m->unit_numel, .group = group,
      .tied_unit = m->chunks[last].head && !m->bytes.tied_copy && hu != fin ? hu : -1,
      .final_unit = fin};
  *zc = *zero;
  zc->param_dtype = m->dt;
}

int64_t zt_trainer_own_bytes(const zt_model *m, int pp, int micro_batch) {
  int64_t n = 2 * (int64_t)micro_batch * m->cfg.seq * (int64_t)sizeof(int32_t); /* batch */
  int tied_end = m->cfg.tied && pp > 1 && (m->chunks[0].embed || m->chunks[m->n_chunks - 1].head);
  if (tied_end) n += m->params[m->embed_tok].t.numel * (int64_t)sizeof(float); /* tied_part */
  return n + (int64_t)sizeof(zt_step_sums);
}

int zt_trainer_init(zt_trainer *t, const zt_train_cfg *cfg, zt_model *m,
                    zt_grid *grid, const zt_zero_cfg *zero, const zt_schedule *sched,
                    const zt_data *train, const zt_data *val, int shuffle,
                    zt_err *e) {
  memset(t, 0, sizeof *t);
  t->cfg = *cfg;
  t->model = m;
  t->grid = grid;
  int *group = malloc((size_t)m->n_units * sizeof *group);
  if (!group) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  zt_zero_units units;
  zt_zero_cfg zc;
  zt_trainer_zero_of(m, zero, group, &units, &zc);
  zc.microbatches = cfg->accum;
  t->offload_files = zt_offload_uses(&zero->offload, ZT_PLACE_NVME);
  t->zero = zt_zero_new(&zc, m->be, m->stream, &grid->dp_comm, m->numel, &units, e);
  free(group); /* the engine keeps a copy */
  if (!t->zero) return e->code;
  /* the initial weights, of the part of the masters this rank holds (at
   * ZeRO-3, and in 16 bits from ZeRO-1, its shard only) */
  zt_state_view w = zt_zero_state(t->zero, ZT_STATE_MASTER);
  int rc = ZT_OK;
  if (w.data) {
    rc = zt_model_init_weights(m, cfg->seed, w.data, w.lo, w.hi, e);
  } else { /* spread over memories or in a file: a slice at a time, so that
            * host memory never holds all of what the policy put elsewhere */
    const int64_t slice = (int64_t)1 << 20;
    float *host = malloc((size_t)slice * sizeof *host);
    if (!host) return zt_err_set(e, ZT_ERUNTIME, "out of host memory for the initial weights");
    for (int64_t a = w.lo; !rc && a < w.hi; a += slice) {
      int64_t b = w.hi - a < slice ? w.hi : a + slice;
      rc = zt_model_init_weights(m, cfg->seed, host, a, b, e);
      if (!rc) rc = zt_zero_state_write(t->zero, ZT_STATE_MASTER, a, b - a, host, e);
    }
    free(host);
  }
  if (rc) return rc;
  m->hooks = (zt_model_hooks){.ctx = t->zero, .before = hook_before, .after = hook_after};
  t->params_stale = 1; /* initial values or a load: rounded and gathered at the first pass */

  size_t n = (size_t)cfg->micro_batch * m->cfg.seq;
  t->inputs = malloc(n * sizeof *t->inputs);
  t->targets = malloc(n * sizeof *t->targets);
  if (!t->inputs || !t->targets)
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for batch buffers");
  if (grid->pp > 1) {
    t->piped = 1;
    t->sched = sched;
    rc = zt_pipe_init(&t->pipe, m, &grid->pp_comm, sched, e);
    if (!rc) rc = tied_init(t, e);
    if (rc) return rc;
  }
  zt_scaler_init(&t->scaler, &cfg->loss_scale);
  t->sums = m->be->alloc(ZT_MEM_DEVICE, sizeof *t->sums);
  if (!t->sums) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  const char *nan_at = getenv("ZT_TEST_NAN_AT_STEP"); /* test hook: STEP[-LAST][:RANK] */
  if (nan_at) {
    char *end;
    t->nan_step = t->nan_last = strtoll(nan_at, &end, 10);
    if (*end == '-') t->nan_last = strtoll(end + 1, &end, 10);
    t->nan_rank = *end == ':' ? atoi(end + 1) : 0;
  }
  rc = zt_loader_init_data(&t->train, train, shuffle, cfg->seed, e);
  if (!rc && val) {
    rc = zt_loader_init_data(&t->val, val, 0, cfg->seed, e);
    t->has_val = 1;
  }
  return rc;
}

void zt_trainer_free(zt_trainer *t) {
  if (t->model) t->model->hooks = (zt_model_hooks){0};
  if (t->tied_part) t->model->be->free(ZT_MEM_DEVICE, t->tied_part);
  if (t->sums) t->model->be->free(ZT_MEM_DEVICE, t->sums);
  free(t->tied_counts);
  free(t->tied_displs);
  if (t->piped) zt_pipe_free(&t->pipe);
  zt_zero_free(t->zero);
  zt_loader_free(&t->train);
  if (t->has_val) zt_loader_free(&t->val);
  free(t->inputs);
  free(t->targets);
  memset(t, 0, sizeof *t);
}

/* ---- micro-batches ----------------------------------------------------- */

typedef struct { zt_trainer *t; zt_loader *ld; int64_t k; } batch_ctx;

/* Micro-batch a of this rank's slice of global batch k. */
static void fill(void *ctx, int a, int32_t *inputs, int32_t *targets) {
  batch_ctx *b = ctx;
  const zt_train_cfg *c = &b->t->cfg;
  int slice = c->global_batch / b->t->grid->dp;
  zt_loader_fill(b->ld, b->k, c->global_batch, b->t->grid->dp_rank * slice + a * c->micro_batch,
                 c->micro_batch, inputs, targets);
}

static void before_action(void *ctx) { zt_zero_microbatch_begin(((batch_ctx *)ctx)->t->zero); }

/* All micro-batches of this rank's slice of global batch k; returns the
 * sum of their per-token losses (0 on ranks without the loss). */
static double run_batch(zt_trainer *t, zt_loader *ld, int64_t k, int backward, float dscale) {
  batch_ctx b = {t, ld, k};
  if (t->piped) tied_refresh(t);
  if (t->params_stale) {
    zt_err e;
    /* fails only reading an nvme file, which the step's own reads of
     * the same file then report */
    zt_zero_sync_params(t->zero, &e);
    t->params_stale = 0;
  }
  if (t->piped) {
    return zt_pipe_run(&t->pipe, !backward, dscale, fill, before_action, &b);
  }
  double loss = 0;
  for (int a = 0; a < t->cfg.accum; a++) {
    fill(&b, a, t->inputs, t->targets);
    zt_zero_microbatch_begin(t->zero);
    loss += zt_model_step(t->model, t->inputs, t->targets, backward, dscale);
  }
  return loss;
}

/* Measured bubble over all ranks (1 - busy / (ranks * makespan)) and the
 * simulator's for this step's mean time of each action kind on each stage
 * (the first and last stages carry the embedding and the head: their
 * actions cost more, which the makespan feels). */
static void bubbles(zt_trainer *t, zt_step_stats *st) {
  const zt_pipe_stats *p = &t->pipe.st;
  zt_comm *w = &t->grid->world;
  int P = t->grid->pp, me = t->grid->pp_rank;
  /* [busy, then per stage: time of F, B, W, then count of F, B, W] */
  double *sums = calloc((size_t)(1 + 6 * P), sizeof *sums), span = p->window;
  double *cost = malloc((size_t)(3 * P) * sizeof *cost);
  if (!sums || !cost) {
    free(sums);
    free(cost);
    st->bubble = st->bubble_sim = -1;
    return;
  }
  sums[0] = p->busy;
  for (int op = 0; op < 3; op++) {
    sums[1 + 6 * me + op] = p->cost[op];
    sums[1 + 6 * me + 3 + op] = p->count[op];
  }
  zt_comm_allreduce(w, sums, (size_t)(1 + 6 * P), ZT_F64, ZT_SUM);
  zt_comm_allreduce(w, &span, 1, ZT_F64, ZT_MAX);
  st->bubble = span > 0 ? 1 - sums[0] / (w->size * span) : 0;
  for (int s = 0; s < P; s++)
    for (int op = 0; op < 3; op++) {
      double n = sums[1 + 6 * s + 3 + op];
      cost[3 * s + op] = n > 0 ? sums[1 + 6 * s + op] / n : 0;
    }
  zt_schedule s = *t->sched;
  s.stage_cost = cost;
  zt_schedule_report r;
  zt_err e = {0};
  st->bubble_sim = zt_schedule_check(&s, &r, &e) ? -1 : r.bubble;
  if (!e.code) zt_schedule_report_free(&r);
  free(sums);
  free(cost);
}

/* The first non-finite value of the step over the world, in
 * parameter-table order, weights before gradients, described in *st; the
 * answer is the same on every rank. */
static void find_nonfinite(zt_trainer *t, const zt_optim_range *r, zt_step_stats *st) {
  const zt_model *m = t->model;
  int np = m->n_params;
  double key = -(double)first_nonfinite(t, r); /* the minimum, as a maximum */
  zt_comm_allreduce(&t->grid->world, &key, 1, ZT_F64, ZT_MAX);
  int first = (int)-key;
  if (first < np)
    snprintf(st->nonfinite, sizeof st->nonfinite, "weights of %s are not finite",
             m->params[first].t.name);
  else if (first < 2 * np)
    snprintf(st->nonfinite, sizeof st->nonfinite,
             "the gradient of %s is the first non-finite one", m->params[first - np].t.name);
  else
    snprintf(st->nonfinite, sizeof st->nonfinite,
             "every weight and gradient is finite, only the loss is not");
}

int zt_trainer_step(zt_trainer *t, zt_step_stats *st, zt_err *e) {
  zt_model *m = t->model;
  zt_grid *g = t->grid;
  const zt_train_cfg *c = &t->cfg;
  double t0 = zt_timer_now();
  uint64_t dp0 = zt_comm_total_bytes(&g->dp_comm), tp0 = zt_model_tp_bytes(m);
  int64_t tokens = (int64_t)c->global_batch * m->cfg.seq;

  zt_zero_grads_begin(t->zero);
  if (m->tied_g) m->be->memzero(m->stream, m->tied_g, (size_t)t->tied_n * sizeof(float));
  /* a power-of-two scale multiplies every gradient exactly (until one
   * overflows): the unscaled run's gradients times the scale, bit for bit */
  double scale = t->scaler.scale;
  double loss = run_batch(t, &t->train, t->t, 1, (float)(scale / tokens));
  int stage = zt_zero_stage(t->zero);
  int early = stage < 2; /* the tied gradient joins before the reduction */
  if (t->tied_end && early) tied_grads(t);
  zt_optim_range r;
  zt_zero_grads_end(t->zero, &r);
  if (t->tied_end && !early) tied_grads(t);
  int count_any = stage > 0 || g->dp_rank == 0;
  if (t->nan_step && t->nan_step <= t->t + 1 && t->t + 1 <= t->nan_last &&
      g->world.rank == t->nan_rank) {
    int i = zt_optim_test_poison(m, &r, count_any);
    zt_zero_grads_written(t->zero, r.lo, r.hi - r.lo);
    fprintf(stderr, "ztrain: test hook: rank %d: step %lld: gradient of %s set to NaN\n",
            g->world.rank, (long long)t->t + 1, i >= 0 ? m->params[i].t.name : "(none here)");
  }

  /* One reduction over the world of [loss, grad sumsq], each counted once:
   * the loss by TP rank 0 of each data-parallel rank (and only the last
   * pipeline stage has one), gradients by their owner (all DP ranks hold
   * all of them at stage 0: rank 0 counts; the stages hold disjoint
   * tensors). */
  zt_step_sums dev;
  m->be->memzero(m->stream, t->sums, sizeof *t->sums);
  zt_optim_sumsq(m, &r, count_any, t->sums);
  m->be->copy(m->stream, &dev, t->sums, sizeof dev); /* the step's one read-back */
  m->be->stream_sync(m->stream);
  /* a device reports failures late and ops return nothing: its first
   * failure is read here, once a step, and travels with the sums */
  char why[200];
  int failed = m->be->error(why, sizeof why) != 0;
  double sums[3] = {g->tp_rank == 0 ? loss : 0, dev.sumsq, failed};
  zt_comm_allreduce(&g->world, sums, 3, ZT_F64, ZT_SUM);
  if (sums[2] > 0) { /* every rank sees it: all stop alike, with the failing rank's words */
    *st = (zt_step_stats){.step = t->t + 1, .loss = NAN, .grad_norm = NAN, .skipped = 1,
                          .tokens = tokens};
    return zt_comm_agree(&g->world,
                         failed ? zt_err_set(e, ZT_ERUNTIME, "step %lld: the %s backend failed "
                                             "on rank %d: %s", (long long)t->t + 1, m->be->name,
                                             g->world.rank, why)
                                : ZT_OK, e);
  }
  /* Every rank holds the same sums, so every rank decides alike. A skipped
   * step still advances t: the next step takes the next global batch. */
  int rc = ZT_OK;
  st->overflow = !isfinite(sums[1]);
  st->skipped = !isfinite(sums[0]) || st->overflow;
  st->scaling = !zt_scaler_active(&t->scaler) ? 0 : t->scaler.cfg.dynamic ? 2 : 1;
  st->loss_scale = scale;
  /* the scaler sees every step; an overflow it can still answer by a
   * lower scale is no bad step */
  int at_min = zt_scaler_update(&t->scaler, st->overflow);
  st->next_scale = t->scaler.scale;
  st->bad = !isfinite(sums[0]) || at_min;
  st->nonfinite[0] = 0;
  t->t++;
  double t_opt = zt_timer_now();
  t->bad_run = st->bad ? t->bad_run + 1 : 0;
  if (st->skipped) {
    t->skipped++;
    st->grad_norm = sqrt(sums[1]) / scale;
    st->lr = zt_lr_at(&c->optim.lr, t->t - t->skipped); /* the next update's */
    find_nonfinite(t, &r, st);
    if (t->bad_run >= c->max_bad_steps)
      rc = zt_err_set(e, ZT_ERUNTIME,
                      "step %lld: %lld step%s in a row with a non-finite loss or gradient norm "
                      "(train.max_bad_steps = %d)%s: %s",
                      (long long)t->t, (long long)t->bad_run, t->bad_run > 1 ? "s" : "",
                      c->max_bad_steps,
                      t->scaler.cfg.dynamic ? ", the loss scale at its minimum "
                                              "(train.loss_scale.min_loss_scale)" : "",
                      st->nonfinite);
  } else {
    /* the clipping coefficient is applied inside AdamW: one pass less
     * over the gradients (a 124M model: 1 GB of memory traffic a step);
     * the loss scale comes off in the same product, exactly for a power
     * of two */
    float gscale;
    st->grad_norm = zt_optim_clip(&c->optim, sums[1] / (scale * scale), &gscale);
    gscale = (float)(gscale / scale);
    m->be->memzero(m->stream, t->sums, sizeof *t->sums);
    /* AdamW writes the range's 16-bit weights in its own pass (r.w16);
     * params_sync gathers them where other ranks updated the rest */
    piece_ctx pc = {.c = &c->optim, .m = m, .t = t->t - t->skipped, .gscale = gscale};
    uint64_t host_nonfinite = 0;
    rc = zt_zero_update(t->zero, &r, 1, update_piece, &pc, t->sums, &host_nonfinite, e);
    /* an nvme file that fails (a full disk) stops every rank alike; the
     * policy is the same everywhere, so every rank takes part or none */
    if (t->offload_files && (rc = zt_comm_agree(&g->world, rc, e))) return rc;
    st->lr = zt_lr_at(&c->optim.lr, pc.t - 1);
    m->be->copy(m->stream, &dev, t->sums, sizeof dev);
    m->be->stream_sync(m->stream);
    dev.nonfinite += host_nonfinite;
    /* Finite gradients can still make non-finite weights (a huge learning
     * rate); they must stop the run before any checkpoint holds them. */
    int first = dev.nonfinite ? first_nonfinite(t, &r) : m->n_params;
    double key = -(first < m->n_params ? first : m->n_params);
    zt_comm_allreduce(&g->world, &key, 1, ZT_F64, ZT_MAX);
    if ((int)-key < m->n_params)
      rc = zt_err_set(e, ZT_ERUNTIME,
                      "step %lld: the update made weights of %s non-finite (learning rate %g, "
                      "gradient norm %g); stopping before they reach a checkpoint",
                      (long long)t->t, m->params[(int)-key].t.name, st->lr, st->grad_norm);
    zt_zero_params_sync(t->zero);
    t->tied_stale = 1;
  }
  zt_trace_slice("compute", "optimizer", NULL, t_opt, zt_timer_now(), NULL, 0, NULL, 0);
  st->bad_run = t->bad_run;
  st->bad_limit = c->max_bad_steps;

  st->loss = sums[0] / (double)tokens;
  st->step = t->t;
  st->tokens = tokens;
  st->bytes_dp = zt_comm_total_bytes(&g->dp_comm) - dp0;
  st->bytes_tp = zt_model_tp_bytes(m) - tp0;
  /* a ring's sends go to the next member: across the network or not */
  st->bytes_dp_inter = g->dp_inter ? st->bytes_dp : 0;
  st->bytes_tp_inter = g->tp_inter ? st->bytes_tp : 0;
  st->bubble = st->bubble_sim = 0;
  st->pipeline = t->piped;
  if (t->piped) bubbles(t, st);
  double t1 = zt_timer_now();
  st->ms = 1e3 * (t1 - t0);
  zt_trace_slice("step", "step", NULL, t0, t1, "step", (long long)st->step, NULL, 0);
  return rc;
}

void zt_trainer_bytes(const zt_trainer *t, int64_t *states, int64_t *buffers) {
  zt_zero_bytes(t->zero, states, buffers);
  *states += zt_model_state_bytes(t->model);
}

double zt_trainer_eval(zt_trainer *t, int batches) {
  double sum = 0;
  for (int k = 0; k < batches; k++) sum += run_batch(t, &t->val, k, 0, 0);
  if (t->grid->tp_rank != 0) sum = 0;
  zt_comm_allreduce(&t->grid->world, &sum, 1, ZT_F64, ZT_SUM);
  return sum / ((double)batches * t->cfg.global_batch * t->model->cfg.seq);
}
