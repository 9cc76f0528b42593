/* model: memory of a model instance and the forward/backward pass of one
 * micro-batch. Shapes: N = B*T rows, C = dim, Q = qkv_rows, A = att_dim,
 * Fi = fc_rows, Fh = hidden, Vl = vocab_local (all of them this TP rank's
 * part; see model.h). Linear layers keep PyTorch's [out, in] weights, so
 * every GEMM is a plain BLAS call with no transposed copy:
 *   y = x W^T       gemm(0,1)   dW += dy^T x   gemm(1,0)   dx = dy W   gemm(0,0)
 * Tensor parallelism (Megatron) adds all-reduces of [N, C] over the TP
 * group: per block two in forward (after the row-parallel attn.out and
 * mlp.down) and two in backward (the input gradients of the column-parallel
 * qkv and up/gate), one each for the vocab-parallel embedding (forward) and
 * head (backward), and two small ones ([N] max, [2N] sum) for the loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/model.h"

/* Carves consecutive pieces out of one allocation: one pass with base NULL
 * measures, the second assigns. */
typedef struct { char *base; size_t used; } carver;

static void *carve(carver *cv, size_t bytes) {
  void *p = cv->base ? cv->base + cv->used : NULL;
  cv->used += (bytes + 63) / 64 * 64;
  return p;
}

static void carve_acts(zt_model *m, carver *cv) {
  const zt_model_cfg *c = &m->cfg;
  size_t N = (size_t)m->B * c->seq, C = c->dim, f = sizeof(float);
  size_t P = (size_t)m->B * m->heads * c->seq * c->seq;
  for (int l = 0; l <= c->layers; l++) m->res[l] = carve(cv, N * C * f);
  for (int l = 0; l < c->layers; l++) {
    zt_block_acts *a = &m->acts[l];
    a->ln1 = carve(cv, N * C * f);
    a->ln1_mean = carve(cv, N * f);
    a->ln1_rstd = carve(cv, N * f);
    a->qkv = carve(cv, N * m->qkv_rows * f);
    a->att = carve(cv, N * m->att_dim * f);
    a->probs = carve(cv, P * f);
    a->mid = carve(cv, N * C * f);
    a->ln2 = carve(cv, N * C * f);
    a->ln2_mean = carve(cv, N * f);
    a->ln2_rstd = carve(cv, N * f);
    a->fc = carve(cv, N * m->fc_rows * f);
    a->act = carve(cv, N * m->hidden * f);
  }
  m->lnf = carve(cv, N * C * f);
  m->lnf_mean = carve(cv, N * f);
  m->lnf_rstd = carve(cv, N * f);
  m->logits = carve(cv, N * m->vocab_local * f);
  m->losses = carve(cv, N * f);
  m->xent_stats = carve(cv, 3 * N * f);
  m->dres = carve(cv, N * C * f);
  m->dln = carve(cv, N * C * f);
  m->datt = carve(cv, N * m->att_dim * f);
  m->dqkv = carve(cv, N * m->qkv_rows * f);
  m->dfc = carve(cv, N * m->fc_rows * f);
  m->dact = carve(cv, N * m->hidden * f);
  m->dprobs = carve(cv, P * f);
  m->rope_cs = carve(cv, (size_t)c->seq * m->hd * f);
  m->tokens = carve(cv, N * sizeof(int32_t));
  m->targets = carve(cv, N * sizeof(int32_t));
}

/* cos then sin tables [T, hd/2]: freq_i = theta^(-2i/hd), angle = t*freq_i */
static void upload_rope(zt_model *m) {
  int T = m->cfg.seq, half = m->hd / 2;
  float *cs = malloc((size_t)T * m->hd * sizeof *cs);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double freq = pow((double)m->cfg.rope_theta, -2.0 * i / m->hd);
      cs[t * half + i] = (float)cos(t * freq);
      cs[(size_t)T * half + t * half + i] = (float)sin(t * freq);
    }
  m->be->upload(m->rope_cs, cs, (size_t)T * m->hd * sizeof *cs);
  free(cs);
}

int zt_model_init(zt_model *m, const zt_model_cfg *cfg, const zt_backend *be,
                  int micro_batch, zt_comm *tp, zt_err *e) {
  int rc = zt_model_layout(m, cfg, tp ? tp->size : 1, tp ? tp->rank : 0, e);
  if (rc) return rc;
  m->tp = tp;
  m->be = be;
  m->B = micro_batch;
  m->res = calloc((size_t)cfg->layers + 1, sizeof *m->res);
  m->acts = calloc((size_t)cfg->layers, sizeof *m->acts);
  m->host_losses = malloc((size_t)micro_batch * cfg->seq * sizeof(float));
  carver cv = {0};
  carve_acts(m, &cv);
  size_t wbytes = (size_t)m->numel * sizeof(float);
  m->w = be->alloc(wbytes);
  m->g = be->alloc(wbytes);
  m->arena = be->alloc(cv.used);
  if (!m->res || !m->acts || !m->host_losses || !m->w || !m->g || !m->arena) {
    double gib = (2.0 * wbytes + cv.used) / (1 << 30);
    zt_model_free(m);
    return zt_err_set(e, ZT_ERUNTIME,
                      "out of memory: the model needs %.2f GiB on backend %s "
                      "(weights and gradients %.2f GiB, activations for "
                      "micro_batch %d: %.2f GiB); try a smaller micro_batch",
                      gib, be->name, 2.0 * wbytes / (1 << 30), micro_batch,
                      (double)cv.used / (1 << 30));
  }
  cv = (carver){.base = (char *)m->arena};
  carve_acts(m, &cv);
  for (int u = 0; u < m->n_units; u++) {
    m->unit_w[u] = m->w + m->unit_start[u];
    m->unit_g[u] = m->g + m->unit_start[u];
  }
  if (cfg->arch == ZT_ARCH_LLAMA) upload_rope(m);
  return ZT_OK;
}

void zt_model_free(zt_model *m) {
  if (m->be) {
    m->be->free(m->w);
    m->be->free(m->g);
    m->be->free(m->arena);
  }
  free(m->params);
  free(m->param_unit);
  free(m->blocks);
  free(m->unit_start);
  free(m->unit_numel);
  free(m->unit_w);
  free(m->unit_g);
  free(m->res);
  free(m->acts);
  free(m->host_losses);
  memset(m, 0, sizeof *m);
}

/* Weights and gradient of parameter i (NULL when absent), wherever its
 * unit currently lives. */
static float *W(const zt_model *m, int i) {
  if (i < 0) return NULL;
  int u = m->param_unit[i];
  return m->unit_w[u] + (m->params[i].t.offset - m->unit_start[u]);
}

static float *G(const zt_model *m, int i) {
  if (i < 0) return NULL;
  int u = m->param_unit[i];
  return m->unit_g[u] + (m->params[i].t.offset - m->unit_start[u]);
}

/* Whether the model is cut over a TP group of more than one rank. */
static int tp_on(const zt_model *m) { return m->tp && m->tp_size > 1; }

/* x[n] = its sum over the TP group. zt_comm's MPI path takes host memory,
 * which the CPU backend's device pointers are; the CUDA backend will hand
 * device memory to an NCCL communicator here instead. */
static void tp_sum(zt_model *m, float *x, size_t n) {
  if (tp_on(m)) zt_comm_allreduce_f32(m->tp, x, n);
}

static void before(zt_model *m, int unit, zt_phase ph) {
  if (m->hooks.before) m->hooks.before(m->hooks.ctx, m, unit, ph);
}

static void after(zt_model *m, int unit, zt_phase ph) {
  if (m->hooks.after) m->hooks.after(m->hooks.ctx, m, unit, ph);
}

static void norm_fwd(const zt_model *m, float *out, float *mean, float *rstd,
                     const float *x, int wi, int bi) {
  int N = m->B * m->cfg.seq, C = m->cfg.dim;
  if (m->cfg.arch == ZT_ARCH_GPT)
    m->be->layernorm_fwd(out, mean, rstd, x, W(m, wi), W(m, bi), N,
                         C, m->cfg.norm_eps);
  else
    m->be->rmsnorm_fwd(out, rstd, x, W(m, wi), N, C, m->cfg.norm_eps);
}

static void norm_bwd(const zt_model *m, float *dx, const float *dout,
                     const float *x, const float *mean, const float *rstd,
                     int wi, int bi) {
  int N = m->B * m->cfg.seq, C = m->cfg.dim;
  if (m->cfg.arch == ZT_ARCH_GPT)
    m->be->layernorm_bwd(dx, G(m, wi), G(m, bi), dout, x,
                         W(m, wi), mean, rstd, N, C);
  else
    m->be->rmsnorm_bwd(dx, G(m, wi), dout, x, W(m, wi), rstd, N, C);
}

/* y[N,out] (= or +=) x[N,in] W^T + b */
static void linear_fwd(const zt_model *m, float *y, const float *x, int wi,
                       int bi, int out, int in, float beta) {
  int N = m->B * m->cfg.seq;
  m->be->gemm(0, 1, N, out, in, 1, x, in, W(m, wi), in, beta, y, out);
  if (bi >= 0) m->be->bias_fwd(y, W(m, bi), N, out);
}

/* dW += dy^T x; db += colsum(dy); dx = dy W (dx may be NULL) */
static void linear_bwd(const zt_model *m, float *dx, const float *dy,
                       const float *x, int wi, int bi, int out, int in) {
  int N = m->B * m->cfg.seq;
  m->be->gemm(1, 0, out, in, N, 1, dy, out, x, in, 1, G(m, wi), in);
  if (bi >= 0) m->be->bias_bwd(G(m, bi), dy, N, out);
  if (dx) m->be->gemm(0, 0, N, in, out, 1, dy, out, W(m, wi), in, 0, dx, in);
}

/* y[N,C] = res + x[N,in] W^T + b for a row-parallel layer (attn.out,
 * mlp.down): with TP, W is this rank's [C, in] slice of input columns, so
 * x W^T is a partial sum; it is summed over the group before the whole bias
 * and the residual are added once. Without TP the GEMM accumulates straight
 * onto a copy of the residual (no extra pass). */
static void row_parallel_fwd(zt_model *m, float *y, const float *x, int wi,
                             int bi, const float *res, int in) {
  int N = m->B * m->cfg.seq, C = m->cfg.dim;
  size_t NC = (size_t)N * C;
  if (!tp_on(m)) {
    m->be->copy(y, res, NC);
    linear_fwd(m, y, x, wi, bi, C, in, 1);
    return;
  }
  linear_fwd(m, y, x, wi, -1, C, in, 0);
  tp_sum(m, y, NC);
  m->be->add(y, res, NC);
  if (bi >= 0) m->be->bias_fwd(y, W(m, bi), N, C);
}

static void block_fwd(zt_model *m, int l) {
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = m->be;
  const zt_block_params *b = &m->blocks[l];
  zt_block_acts *a = &m->acts[l];
  int N = m->B * c->seq, C = c->dim;

  /* column-parallel qkv: this rank's heads only */
  norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, m->res[l], b->norm1_w, b->norm1_b);
  linear_fwd(m, a->qkv, a->ln1, b->qkv_w, b->qkv_b, m->qkv_rows, C, 0);
  if (c->arch == ZT_ARCH_LLAMA) /* q and k heads are the first H+KVH of a row */
    be->rope_fwd(a->qkv, m->rope_cs, N, c->seq, m->heads + m->kv_heads, m->hd,
                 m->qkv_rows);
  be->attn_fwd(a->att, a->probs, a->qkv, m->B, c->seq, m->heads, m->kv_heads, m->hd);
  row_parallel_fwd(m, a->mid, a->att, b->out_w, b->out_b, m->res[l], m->att_dim);

  norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->mid, b->norm2_w, b->norm2_b);
  linear_fwd(m, a->fc, a->ln2, b->fc_w, b->fc_b, m->fc_rows, C, 0);
  if (c->arch == ZT_ARCH_GPT)
    be->gelu_fwd(a->act, a->fc, (size_t)N * m->hidden);
  else
    be->swiglu_fwd(a->act, a->fc, N, m->hidden);
  row_parallel_fwd(m, m->res[l + 1], a->act, b->down_w, b->down_b, a->mid, m->hidden);
}

/* On entry m->dres holds d(res[l+1]); on exit d(res[l]). The residual
 * gradient is accumulated in place: the norms' backward adds into it. With
 * TP, dres is whole and the same on every rank; a row-parallel layer's
 * input gradient is then this rank's own columns, while a column-parallel
 * layer's (dln) is a partial sum over the group's rows: summed before the
 * norm's backward, which keeps dres, the norms' and the row-parallel biases'
 * gradients identical on all ranks. */
static void block_bwd(zt_model *m, int l) {
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = m->be;
  const zt_block_params *b = &m->blocks[l];
  zt_block_acts *a = &m->acts[l];
  int N = m->B * c->seq, C = c->dim;

  linear_bwd(m, m->dact, m->dres, a->act, b->down_w, b->down_b, C, m->hidden);
  if (c->arch == ZT_ARCH_GPT)
    be->gelu_bwd(m->dfc, a->fc, m->dact, (size_t)N * m->hidden);
  else
    be->swiglu_bwd(m->dfc, a->fc, m->dact, N, m->hidden);
  linear_bwd(m, m->dln, m->dfc, a->ln2, b->fc_w, b->fc_b, m->fc_rows, C);
  tp_sum(m, m->dln, (size_t)N * C);
  norm_bwd(m, m->dres, m->dln, a->mid, a->ln2_mean, a->ln2_rstd, b->norm2_w, b->norm2_b);

  linear_bwd(m, m->datt, m->dres, a->att, b->out_w, b->out_b, C, m->att_dim);
  be->attn_bwd(m->dqkv, m->dprobs, m->datt, a->qkv, a->probs, m->B, c->seq,
               m->heads, m->kv_heads, m->hd);
  if (c->arch == ZT_ARCH_LLAMA)
    be->rope_bwd(m->dqkv, m->rope_cs, N, c->seq, m->heads + m->kv_heads, m->hd,
                 m->qkv_rows);
  linear_bwd(m, m->dln, m->dqkv, a->ln1, b->qkv_w, b->qkv_b, m->qkv_rows, C);
  tp_sum(m, m->dln, (size_t)N * C);
  norm_bwd(m, m->dres, m->dln, m->res[l], a->ln1_mean, a->ln1_rstd, b->norm1_w, b->norm1_b);
}

/* Per-row loss and dlogits (scaled by dscale) from m->logits. With a
 * vocab-parallel head each rank holds Vl columns of the rows: the max and
 * the sums of exp and of the target logit are combined over the group, so
 * no rank ever holds the full [N, V] logits. */
static void loss_fwd_bwd(zt_model *m, float dscale) {
  const zt_backend *be = m->be;
  int N = m->B * m->cfg.seq, Vl = m->vocab_local, v0 = m->vocab_start;
  float *st = m->xent_stats;
  if (!tp_on(m)) {
    be->xent_fwd_bwd(m->logits, m->losses, m->targets, N, Vl, dscale);
    return;
  }
  be->xent_max(st, m->logits, N, Vl);
  zt_comm_allreduce_max_f32(m->tp, st, (size_t)N); /* host memory: see tp_sum */
  be->xent_sumexp(st, m->logits, m->targets, N, Vl, v0);
  tp_sum(m, st + N, 2 * (size_t)N);
  be->xent_finish(m->logits, m->losses, st, m->targets, N, Vl, v0, dscale);
}

double zt_model_step(zt_model *m, const int32_t *tokens, const int32_t *targets,
                     int backward, float dscale) {
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = m->be;
  int N = m->B * c->seq, C = c->dim, Vl = m->vocab_local;
  size_t NC = (size_t)N * C;

  /* unit of the head weight: the final unit, or unit 0 when tied */
  int L = c->layers, fin = L + 1, hu = m->param_unit[m->head];
  be->upload(m->tokens, tokens, (size_t)N * sizeof *tokens);
  be->upload(m->targets, targets, (size_t)N * sizeof *targets);
  before(m, 0, ZT_PHASE_FWD);
  /* vocab-parallel: each rank looks up the tokens in its rows and rank 0
   * adds the positions, so the sum over the group is the lookup exactly */
  be->embed_fwd(m->res[0], m->tokens, W(m, m->embed_tok),
                m->tp_rank == 0 ? W(m, m->embed_pos) : NULL, m->B, c->seq, C,
                m->vocab_start, Vl);
  tp_sum(m, m->res[0], NC);
  after(m, 0, ZT_PHASE_FWD);
  for (int l = 0; l < L; l++) {
    before(m, l + 1, ZT_PHASE_FWD);
    block_fwd(m, l);
    after(m, l + 1, ZT_PHASE_FWD);
  }
  before(m, fin, ZT_PHASE_FWD);
  if (hu != fin) before(m, hu, ZT_PHASE_FWD);
  norm_fwd(m, m->lnf, m->lnf_mean, m->lnf_rstd, m->res[L], m->final_w, m->final_b);
  linear_fwd(m, m->logits, m->lnf, m->head, -1, Vl, C, 0);
  loss_fwd_bwd(m, backward ? dscale : 0);
  after(m, fin, ZT_PHASE_FWD);
  if (hu != fin) after(m, hu, ZT_PHASE_FWD);

  be->download(m->host_losses, m->losses, (size_t)N * sizeof(float));
  double sum = 0;
  for (int i = 0; i < N; i++) sum += m->host_losses[i];
  if (!backward) return sum;

  /* logits now hold dlogits */
  before(m, fin, ZT_PHASE_BWD);
  if (hu != fin) before(m, hu, ZT_PHASE_BWD);
  linear_bwd(m, m->dln, m->logits, m->lnf, m->head, -1, Vl, C);
  tp_sum(m, m->dln, NC); /* a partial sum over the group's vocab rows */
  be->zero(m->dres, NC);
  norm_bwd(m, m->dres, m->dln, m->res[L], m->lnf_mean, m->lnf_rstd,
           m->final_w, m->final_b);
  after(m, fin, ZT_PHASE_BWD);
  if (hu != fin) after(m, hu, ZT_PHASE_BWD);
  for (int l = L - 1; l >= 0; l--) {
    before(m, l + 1, ZT_PHASE_BWD);
    block_bwd(m, l);
    after(m, l + 1, ZT_PHASE_BWD);
  }
  before(m, 0, ZT_PHASE_BWD);
  be->embed_bwd(G(m, m->embed_tok), G(m, m->embed_pos), m->tokens,
                m->dres, m->B, c->seq, C, m->vocab_start, Vl);
  after(m, 0, ZT_PHASE_BWD);
  return sum;
}
