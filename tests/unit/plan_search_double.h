/* TEST DOUBLE for the search's peak_bytes callback (src/plan/search.h):
 * a made-up, monotone function of the layout so that the search's
 * filtering and ranking can be tested before the memory planner is
 * connected. It is NOT a memory estimate and nothing outside tests/ uses
 * it: 16 bytes per parameter of the rank's share (ZeRO >= 1 divides 12 of
 * them over dp, offloaded moments drop 8), plus the in-flight activations
 * of pp micro-batches, 34·mb·seq·dim bytes per block, or 2·mb·seq·dim
 * bytes per block with recomputation. */
#ifndef ZT_TEST_PLAN_SEARCH_DOUBLE_H
#define ZT_TEST_PLAN_SEARCH_DOUBLE_H

#include "src/plan/search.h"

static int test_double_peak(const zt_candidate *c, void *ctx, int64_t *bytes, zt_err *e) {
  const zt_model_cfg *m = ctx;
  const zt_layout *l = &c->layout;
  (void)e;
  double psi = (12.0 * m->layers * m->dim * m->dim + (double)m->vocab * m->dim) / (l->tp * l->pp);
  double per = l->zero >= 1 ? 4 + 12.0 / l->dp : 16;
  if (l->moments != ZT_PLACE_DEVICE) per -= l->zero >= 1 ? 8.0 / l->dp : 8;
  double act = (c->recompute ? 2.0 : 34.0) * l->micro_batch * m->seq * m->dim / l->tp * m->layers;
  *bytes = (int64_t)(psi * per + act);
  return ZT_OK;
}

#endif
