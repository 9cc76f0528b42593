/* search: see search.h. */
#include "src/plan/search.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/model.h"

typedef struct pipe_key {
  int pp, chunks, mb, dp, kind; /* dp: the micro-batches per step depend on it */
  zt_pipeline_cfg *pc;
} pipe_key;

typedef struct state {
  const zt_search_cfg *cfg;
  pipe_key *keys;
  int n_keys, cap_keys;
  zt_search_result *r;
  int cap;
  unsigned char *all_recompute; /* one flag per block, all set */
} state;

/* Room for one more element in a growing array of *cap elements. */
static int grow(void **a, int n, int *cap, size_t size, zt_err *e) {
  if (n < *cap) return ZT_OK;
  int c = *cap ? 2 * *cap : 16;
  void *p = realloc(*a, (size_t)c * size);
  if (!p) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  *a = p, *cap = c;
  return ZT_OK;
}

static int pipeline_of(state *st, const zt_candidate *c, zt_pipeline_cfg **pc, zt_err *e) {
  for (int i = 0; i < st->n_keys; i++) {
    pipe_key *k = &st->keys[i];
    if (k->pp == c->layout.pp && k->chunks == c->chunks && k->mb == c->layout.micro_batch &&
        k->dp == c->layout.dp && k->kind == (int)c->schedule) {
      *pc = k->pc;
      return ZT_OK;
    }
  }
  int rc = st->cfg->pipeline(c, st->cfg->pipeline_ctx, pc, e);
  if (rc) return rc;
  if ((rc = grow((void **)&st->keys, st->n_keys, &st->cap_keys, sizeof *st->keys, e))) return rc;
  st->keys[st->n_keys++] =
      (pipe_key){c->layout.pp, c->chunks, c->layout.micro_batch, c->layout.dp, (int)c->schedule, *pc};
  return ZT_OK;
}

static int consider(state *st, zt_candidate *c, zt_err *e) {
  const zt_search_cfg *cfg = st->cfg;
  zt_search_result *r = st->r;
  r->tried++;
  zt_pipeline_cfg *pc;
  int rc = pipeline_of(st, c, &pc, e);
  if (rc) return rc;
  c->pipeline = pc; /* the memory planner needs its in-flight micro-batches */
  int64_t peak = 0;
  rc = cfg->peak_bytes(c, cfg->peak_ctx, &peak, e);
  if (rc) return rc;
  c->peak_bytes = peak;
  if (r->least_peak == 0 || peak < r->least_peak) r->least_peak = peak;
  if (peak > cfg->mem_per_rank) {
    r->too_big++;
    return ZT_OK;
  }
  zt_model_cfg m = *cfg->model;
  m.recompute = c->recompute ? st->all_recompute : NULL;
  m.sequence_parallel = c->layout.sp;
  rc = zt_cost_step(&m, &c->layout, pc, &cfg->hw, &c->cost, e);
  if (rc) return rc;
  if ((rc = grow((void **)&r->c, r->n, &st->cap, sizeof *r->c, e))) return rc;
  r->c[r->n] = *c;
  r->c[r->n++].pipeline = NULL; /* owned by the callback, gone after the search */
  return ZT_OK;
}

static int by_step(const void *a, const void *b) {
  double x = ((const zt_candidate *)a)->cost.step_s, y = ((const zt_candidate *)b)->cost.step_s;
  return x < y ? -1 : x > y;
}

int zt_search_run(const zt_search_cfg *cfg, zt_search_result *r, zt_err *e) {
  memset(r, 0, sizeof *r);
  const zt_model_cfg *m = cfg->model;
  if (cfg->world < 1 || cfg->global_batch < 1 || cfg->mem_per_rank <= 0)
    return zt_err_set(e, ZT_EINPUT, "plan search: world (%d), global batch (%d) and memory per rank "
                      "(%lld bytes) must be > 0", cfg->world, cfg->global_batch,
                      (long long)cfg->mem_per_rank);
  if (!cfg->peak_bytes || !cfg->pipeline)
    return zt_err_set(e, ZT_ERUNTIME, "plan search: no peak_bytes or pipeline callback");
  state st = {.cfg = cfg, .r = r};
  st.all_recompute = malloc((size_t)m->layers);
  if (!st.all_recompute) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  memset(st.all_recompute, 1, (size_t)m->layers);
  int rc = ZT_OK, layouts = 0;
  for (int tp = 1; !rc && tp <= cfg->world && tp <= cfg->hw.ranks_per_node; tp++) {
    zt_err ignore = {0};
    if (cfg->world % tp || zt_model_tp_check(m, tp, &ignore)) continue;
    for (int pp = 1; !rc && pp <= m->layers; pp++) {
      if (m->layers % pp || (cfg->world / tp) % pp) continue;
      int dp = cfg->world / (tp * pp);
      if (cfg->global_batch % dp) continue;
      int per_dp = cfg->global_batch / dp;
      for (int mb = 1; !rc && mb <= per_dp; mb++) {
        if (per_dp % mb) continue;
        int micro = per_dp / mb;
        int sp = cfg->sp && tp > 1 && !zt_model_sp_check(&(zt_model_cfg){.seq = m->seq, .sequence_parallel = 1},
                                                         mb, tp, &ignore);
        layouts++;
        for (int kind = 0; !rc && kind < 2; kind++) {
          int chunks = kind ? 2 : 1;
          if (kind && (pp < 2 || (m->layers / pp) % 2 || micro % pp)) continue;
          for (int zero = 0; !rc && zero <= 3; zero++)
            for (int rec = 0; !rc && rec < 2; rec++)
              for (int mom = 0; !rc && mom < 2; mom++) {
                zt_candidate c = {0};
                c.layout = (zt_layout){.tp = tp, .pp = pp, .dp = dp, .zero = zero,
                                       .zero_overlap = cfg->zero_overlap, .micro_batch = mb,
                                       .global_batch = cfg->global_batch, .sp = sp,
                                       .act_bytes = cfg->act_bytes, .grad_bytes = cfg->grad_bytes,
                                       .moments = mom ? ZT_PLACE_CPU : ZT_PLACE_DEVICE};
                c.schedule = kind ? ZT_SCHED_INTERLEAVED : ZT_SCHED_1F1B;
                c.chunks = chunks;
                c.recompute = rec;
                rc = consider(&st, &c, e);
              }
        }
      }
    }
  }
  free(st.all_recompute);
  free(st.keys);
  if (!rc && !layouts)
    rc = zt_err_set(e, ZT_EINPUT, "plan search: no layout of %d ranks divides this model and batch: "
                    "tp must divide the heads (%d) and be at most a node (%d ranks), pp the layers "
                    "(%d), and dp = world/(tp*pp) the global batch (%d)", cfg->world, m->heads,
                    cfg->hw.ranks_per_node, m->layers, cfg->global_batch);
  if (rc) {
    zt_search_result_free(r);
    return rc;
  }
  qsort(r->c, (size_t)r->n, sizeof *r->c, by_step);
  return ZT_OK;
}

void zt_search_result_free(zt_search_result *r) {
  free(r->c);
  memset(r, 0, sizeof *r);
}

void zt_candidate_describe(const zt_candidate *c, char *buf, size_t size) {
  const zt_layout *l = &c->layout;
  char sched[32];
  if (c->schedule == ZT_SCHED_INTERLEAVED) snprintf(sched, sizeof sched, "interleaved:%d", c->chunks);
  else snprintf(sched, sizeof sched, "1f1b");
  snprintf(buf, size, "tp=%d pp=%d dp=%d zero=%d mb=%d %s recompute=%s moments=%s%s", l->tp, l->pp,
           l->dp, l->zero, l->micro_batch, sched, c->recompute ? "full" : "none",
           l->moments == ZT_PLACE_CPU ? "cpu" : l->moments == ZT_PLACE_NVME ? "nvme" : "device",
           l->sp ? " sp" : "");
}
