/* cost: see cost.h; the derivation of every constant is in docs/plan.md. */
#include "src/plan/cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/model.h"

/* Ring collective over n ranks moving `frac`·bytes per rank in `steps`
 * latency steps on a link of bandwidth bw. */
static double ring(double bytes, int n, double steps_per_rank, double frac, double bw, double lat) {
  if (n <= 1 || bytes <= 0) return 0;
  return frac * bytes * (n - 1) / n / bw + steps_per_rank * (n - 1) * lat;
}

static double allreduce(double bytes, int n, double bw, double lat) {
  return ring(bytes, n, 2, 2, bw, lat);
}

/* reduce-scatter or all-gather: half an all-reduce */
static double half_ring(double bytes, int n, double bw, double lat) {
  return ring(bytes, n, 1, 1, bw, lat);
}

/* The work of one block for one micro-batch on one rank. */
typedef struct block_work {
  double fwd_flops, wgrad_flops, dgrad_flops; /* GEMM */
  double elem_bytes;                          /* memory-bound, forward */
  double tp_bytes;                            /* one TP all-reduce */
  double params;                              /* on this rank */
} block_work;

static block_work block_of(const zt_model_cfg *c, const zt_layout *l) {
  block_work w;
  double t = l->tp, N = (double)l->micro_batch * c->seq, h = c->dim, f = c->ffn_dim;
  double d = (double)(c->dim / c->heads), g = c->arch == ZT_ARCH_GPT ? 1 : 2;
  double e = l->act_bytes;
  double mat = h * (c->heads + 2.0 * c->kv_heads) * d + h * h + h * f * g + f * h;
  double lin = 2 * N * mat / t;
  double att = 4 * N * c->seq * h / t;
  w.fwd_flops = lin + att;
  /* backward: the input gradient of the linear layers (lin) and both
   * operands' gradients of the attention products (2·att), then the
   * linear layers' weight gradients (lin, W's part when split) */
  w.dgrad_flops = lin + 2 * att;
  w.wgrad_flops = lin;
  double rows = l->sp && l->tp > 1 ? N / t : N;
  w.elem_bytes = ZT_COST_ELEM_PASSES * e * rows * h + ZT_COST_FFN_PASSES * e * N * f / t;
  w.tp_bytes = N * h * e;
  double norms = c->arch == ZT_ARCH_GPT ? 4 * h : 2 * h;
  double bias = c->arch == ZT_ARCH_GPT ? ((c->heads + 2.0 * c->kv_heads) * d + f) / t + 2 * h : 0;
  w.params = mat / t + norms + bias;
  return w;
}

static int bad(zt_err *e, const char *what, long long v) {
  return zt_err_set(e, ZT_EINPUT, "cost model: %s = %lld does not describe a layout", what, v);
}

int zt_cost_step(const zt_model_cfg *c, const zt_layout *l, zt_pipeline_cfg *pc, const zt_hw *hw,
                 zt_cost *out, zt_err *e) {
  memset(out, 0, sizeof *out);
  if (l->tp < 1) return bad(e, "tp", l->tp);
  if (l->pp < 1) return bad(e, "pp", l->pp);
  if (l->dp < 1) return bad(e, "dp", l->dp);
  if (l->micro_batch < 1) return bad(e, "micro_batch", l->micro_batch);
  zt_schedule *s = &pc->schedule;
  if (s->stages != l->pp) return bad(e, "schedule stages", s->stages);
  if ((long long)s->microbatches * l->micro_batch * l->dp != l->global_batch)
    return zt_err_set(e, ZT_EINPUT, "cost model: the pipeline runs %d micro-batches per step, the layout "
                      "%d (global_batch / (micro_batch * dp) = %d / (%d * %d))", s->microbatches,
                      l->global_batch / (l->micro_batch * l->dp), l->global_batch, l->micro_batch, l->dp);
  if (!(hw->peak_flops > 0 && hw->gemm_eff > 0 && hw->mem_bw > 0 && hw->intra_bw > 0 &&
        hw->inter_bw > 0 && hw->ranks_per_node > 0))
    return zt_err_set(e, ZT_EINPUT, "cost model: the hardware needs a peak, a GEMM efficiency, a memory "
                      "bandwidth, both link bandwidths and ranks per node, all > 0");
  int pp = l->pp, v = s->chunks, m = s->microbatches;
  double t = l->tp, N = (double)l->micro_batch * c->seq, h = c->dim, e_ = l->act_bytes;
  double rate = hw->peak_flops * hw->gemm_eff;
  int tp_intra = l->tp <= hw->ranks_per_node;
  double tbw = tp_intra ? hw->intra_bw : hw->inter_bw, tlat = tp_intra ? hw->intra_lat : hw->inter_lat;
  /* consecutive pipeline stages are tp·dp ranks apart (order tp-dp-pp) */
  int pp_intra = (long long)l->tp * l->dp * l->pp <= hw->ranks_per_node;
  double pbw = pp_intra ? hw->intra_bw : hw->inter_bw, plat = pp_intra ? hw->intra_lat : hw->inter_lat;
  block_work w = block_of(c, l);
  double ar = allreduce(w.tp_bytes, l->tp, tbw, tlat);
  double p2p = pp > 1 ? N * h * e_ / (l->sp && l->tp > 1 ? t : 1) / pbw + plat : 0;

  /* per stage: F, B (input gradient, and the recomputed forward), W */
  double *sc = calloc((size_t)pp * 3, sizeof *sc);
  double *params = calloc((size_t)pp, sizeof *params);
  double *gemm = calloc((size_t)pp, sizeof *gemm), *elem = calloc((size_t)pp, sizeof *elem);
  double *tpt = calloc((size_t)pp, sizeof *tpt), *flops = calloc((size_t)pp, sizeof *flops);
  if (!sc || !params || !gemm || !elem || !tpt || !flops) {
    free(sc), free(params), free(gemm), free(elem), free(tpt), free(flops);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  for (int vs = 0; vs < pc->n_virtual; vs++) {
    int st = vs % pp;
    double *F = &sc[st * 3], *B = F + 1, *W = F + 2;
    for (int b = pc->first[vs]; b <= pc->last[vs]; b++) {
      double re = c->recompute && c->recompute[b] ? 1 : 0; /* the forward again, in B */
      double eb = w.elem_bytes / hw->mem_bw, am = hw->attn_matrix_bytes * N * c->seq * c->heads / t / hw->mem_bw;
      *F += w.fwd_flops / rate + eb + am + 2 * ar;
      *B += (w.dgrad_flops + re * w.fwd_flops) / rate + (2 + re) * (eb + am) + (2 + 2 * re) * ar;
      *W += w.wgrad_flops / rate;
      gemm[st] += (w.fwd_flops * (1 + re) + w.dgrad_flops + w.wgrad_flops) / rate;
      elem[st] += (3 + re) * (eb + am);
      tpt[st] += (4 + 2 * re) * ar;
      flops[st] += w.fwd_flops * (1 + re) + w.dgrad_flops + w.wgrad_flops;
      params[st] += w.params;
    }
    if (vs == 0) { /* embedding: a gather, and its TP all-reduce each way */
      double eb = 2 * N * h * e_ / hw->mem_bw;
      *F += eb + ar, *B += eb + ar;
      elem[st] += 2 * eb, tpt[st] += 2 * ar;
      params[st] += (double)c->vocab * h / t + (c->arch == ZT_ARCH_GPT ? (double)c->seq * h : 0);
    }
    if (vs == pc->n_virtual - 1) { /* final norm, head, loss */
      double hf = 2 * N * h * c->vocab / t;
      double eb = (ZT_COST_ELEM_PASSES / 2 * N * h + 3 * N * c->vocab / t) * e_ / hw->mem_bw;
      *F += hf / rate + eb + ar;
      *B += hf / rate + 2 * eb + ar;
      *W += hf / rate;
      gemm[st] += 3 * hf / rate, elem[st] += 3 * eb, tpt[st] += 2 * ar;
      flops[st] += 3 * hf;
      params[st] += (c->tied ? 0 : (double)c->vocab * h / t) + h;
    }
    if (vs > 0) *F += p2p;                 /* receive the input */
    if (vs < pc->n_virtual - 1) *B += p2p; /* receive the output's gradient */
  }
  /* one action is one chunk: the stage's mean over its chunks */
  for (int i = 0; i < pp * 3; i++) sc[i] /= v;

  const double *saved_sc = s->stage_cost;
  double saved_cost[3];
  memcpy(saved_cost, s->cost, sizeof saved_cost);
  s->stage_cost = sc;
  zt_schedule_report r = {0};
  int rc = zt_schedule_check(s, &r, e);
  s->stage_cost = saved_sc;
  memcpy(s->cost, saved_cost, sizeof saved_cost);
  if (!rc) {
    out->pipe_s = r.makespan;
    out->bubble = r.bubble;
    zt_schedule_report_free(&r);
    int busy = 0;
    double psi = 0, fl = 0;
    for (int st = 0; st < pp; st++) {
      if (gemm[st] + elem[st] + tpt[st] > gemm[busy] + elem[busy] + tpt[busy]) busy = st;
      if (params[st] > psi) psi = params[st];
      fl += flops[st];
    }
    out->gemm_s = m * gemm[busy], out->elem_s = m * elem[busy], out->tp_s = m * tpt[busy];
    out->p2p_s = pp > 1 ? m * 2.0 * v * p2p : 0;

    /* data parallelism, docs/parallelism.md's volumes */
    int dp = l->dp, z = l->zero;
    int dp_intra = (long long)l->tp * l->dp <= hw->ranks_per_node;
    double dbw = dp_intra ? hw->intra_bw : hw->inter_bw, dlat = dp_intra ? hw->intra_lat : hw->inter_lat;
    double G = l->grad_bytes, P = l->act_bytes;
    double after = 0, during = 0; /* after the last backward; while compute goes on */
    if (z == 0) after = allreduce(psi * G, dp, dbw, dlat);
    else if (z == 1) after = half_ring(psi * G, dp, dbw, dlat) + half_ring(psi * P, dp, dbw, dlat);
    else {
      during = m * half_ring(psi * G, dp, dbw, dlat);
      if (z == 3) during += 2.0 * m * half_ring(psi * P, dp, dbw, dlat);
      else after = half_ring(psi * P, dp, dbw, dlat);
    }
    out->dp_s = after + during;
    double window = l->zero_overlap ? out->gemm_s : 0; /* compute it can hide behind */
    out->dp_exposed_s = after + (during > window ? during - window : 0);

    /* optimizer */
    double upd = z >= 1 ? psi / dp : psi;
    if (l->moments == ZT_PLACE_DEVICE) out->optim_s = upd * ZT_COST_ADAM_BYTES / hw->mem_bw;
    else {
      if (!(hw->host_bw > 0 && hw->host_mem_bw > 0) || (l->moments == ZT_PLACE_NVME && !(hw->nvme_bw > 0)))
        rc = zt_err_set(e, ZT_EINPUT, "cost model: offload needs the host link, host memory%s "
                        "bandwidths (> 0)", l->moments == ZT_PLACE_NVME ? " and NVMe" : "");
      else {
        out->optim_s = upd * 28.0 / hw->host_mem_bw; /* host AdamW: 28 bytes a parameter */
        out->offload_s = upd * (4.0 + P) / hw->host_bw; /* fp32 gradients down, weights up */
        if (l->moments == ZT_PLACE_NVME) out->offload_s += upd * 16.0 / hw->nvme_bw;
      }
    }
    out->step_s = out->pipe_s + out->dp_exposed_s + out->optim_s + out->offload_s;
    double ranks = (double)l->tp * l->pp * l->dp;
    out->hw_flops = fl * m * t * dp;
    out->model_flops = zt_model_cfg_flops_per_token(c) * (double)m * N * dp;
    out->tflops_gpu = out->hw_flops / (out->step_s * ranks) / 1e12;
    out->mfu = out->model_flops / (out->step_s * ranks * hw->peak_flops);
  }
  free(sc), free(params), free(gemm), free(elem), free(tpt), free(flops);
  return rc;
}

void zt_layout_from_plan(const zt_plan *p, zt_layout *l) {
  memset(l, 0, sizeof *l);
  l->tp = p->parallel.tp, l->pp = p->parallel.pp, l->dp = p->parallel.dp;
  l->zero = p->parallel.zero.stage, l->zero_overlap = p->parallel.zero.overlap;
  l->micro_batch = p->train.micro_batch, l->global_batch = p->train.global_batch;
  l->sp = p->parallel.sequence_parallel;
  l->act_bytes = p->train.precision == ZT_F32 ? 4 : 2;
  l->grad_bytes = p->train.grad_reduce == ZT_F32 ? 4 : 2;
  l->moments = ZT_PLACE_DEVICE;
}
