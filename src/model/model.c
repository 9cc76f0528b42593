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
 * head (backward), and two small ones ([N] max, [2N] sum) for the loss.
 * A kv head replicated over kv_rep ranks (tp > kv_heads) adds, per block
 * in backward, one all-reduce of its k and v weight gradient [2*hd, C]
 * over the kv group.
 * Sequence parallelism (Megatron-LM, "Reducing Activation Recomputation"
 * 4.2.2) keeps the residual stream, the norms and the adds on this rank's
 * rows only, Ns = N/tp rows from n0 = tp_rank*Ns: each [N, C] all-reduce
 * becomes a reduce-scatter of the partial sums into the rows (after the
 * row-parallel layers, the embedding and the head's input gradient), and
 * each column-parallel layer (qkv, up/gate, head) gets its [N, C] input by
 * an all-gather of the norm's rows (backward: the row-parallel layers and
 * the embedding all-gather the residual gradient). Same bytes as the
 * all-reduces; the norms' weight gradients are then partial sums per rank,
 * summed over tp once per unit. */
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

/* Residual stream, norm inputs and statistics: Ns rows (this rank's share
 * with sequence parallelism); norm outputs, the inputs of column-parallel
 * layers: all N rows. */
static void carve_acts(zt_model *m, carver *cv) {
  const zt_model_cfg *c = &m->cfg;
  size_t N = (size_t)m->B * c->seq, Ns = (size_t)m->Ns, C = c->dim, f = sizeof(float);
  size_t P = (size_t)m->B * m->heads * c->seq * c->seq;
  for (int l = 0; l <= c->layers; l++) m->res[l] = carve(cv, Ns * C * f);
  for (int l = 0; l < c->layers; l++) {
    zt_block_acts *a = &m->acts[l];
    a->ln1 = carve(cv, N * C * f);
    a->ln1_mean = carve(cv, Ns * f);
    a->ln1_rstd = carve(cv, Ns * f);
    a->qkv = carve(cv, N * m->qkv_rows * f);
    a->att = carve(cv, N * m->att_dim * f);
    a->probs = carve(cv, P * f);
    a->mid = carve(cv, Ns * C * f);
    a->ln2 = carve(cv, N * C * f);
    a->ln2_mean = carve(cv, Ns * f);
    a->ln2_rstd = carve(cv, Ns * f);
    a->fc = carve(cv, N * m->fc_rows * f);
    a->act = carve(cv, N * m->hidden * f);
  }
  m->lnf = carve(cv, N * C * f);
  m->lnf_mean = carve(cv, Ns * f);
  m->lnf_rstd = carve(cv, Ns * f);
  m->logits = carve(cv, N * m->vocab_local * f);
  m->losses = carve(cv, N * f);
  m->xent_stats = carve(cv, 3 * N * f);
  m->dres = carve(cv, Ns * C * f);
  m->dln = carve(cv, N * C * f);
  m->datt = carve(cv, N * m->att_dim * f);
  m->dqkv = carve(cv, N * m->qkv_rows * f);
  m->dfc = carve(cv, N * m->fc_rows * f);
  m->dact = carve(cv, N * m->hidden * f);
  m->dprobs = carve(cv, P * f);
  m->dkv_w = carve(cv, m->kv_rep > 1 ? (size_t)(m->qkv_rows - m->att_dim) * C * f : 0);
  m->dnorm = carve(cv, m->sp ? 4 * C * f : 0);
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
  if (!rc) rc = zt_model_sp_check(cfg, micro_batch, m->tp_size, e);
  if (rc) return rc;
  m->tp = tp;
  m->be = be;
  int N = micro_batch * cfg->seq;
  m->sp = cfg->sequence_parallel && m->tp_size > 1;
  m->Ns = m->sp ? N / m->tp_size : N;
  m->n0 = m->sp ? m->tp_rank * m->Ns : 0;
  if (m->kv_rep > 1) { /* ranks tp_rank / kv_rep share kv head tp_rank / kv_rep */
    MPI_Comm kv;
    MPI_Comm_split(tp->mpi, m->tp_rank / m->kv_rep, m->tp_rank, &kv);
    m->kv = malloc(sizeof *m->kv);
    if (m->kv) zt_comm_wrap(m->kv, "tp.kv", kv, 1);
    else MPI_Comm_free(&kv);
  }
  m->B = micro_batch;
  m->res = calloc((size_t)cfg->layers + 1, sizeof *m->res);
  m->acts = calloc((size_t)cfg->layers, sizeof *m->acts);
  m->host_losses = malloc((size_t)micro_batch * cfg->seq * sizeof(float));
  if (m->sp) { /* every rank's rows of an [N, C] tensor, for the collectives */
    m->sp_counts = malloc((size_t)m->tp_size * sizeof *m->sp_counts);
    m->sp_displs = malloc((size_t)m->tp_size * sizeof *m->sp_displs);
    for (int r = 0; m->sp_counts && m->sp_displs && r < m->tp_size; r++) {
      m->sp_counts[r] = m->Ns * cfg->dim;
      m->sp_displs[r] = r * m->Ns * cfg->dim;
    }
  }
  carver cv = {0};
  carve_acts(m, &cv);
  size_t wbytes = (size_t)m->numel * sizeof(float);
  m->w = be->alloc(wbytes);
  m->g = be->alloc(wbytes);
  m->arena = be->alloc(cv.used);
  if (!m->res || !m->acts || !m->host_losses || !m->w || !m->g || !m->arena ||
      (m->kv_rep > 1 && !m->kv) || (m->sp && (!m->sp_counts || !m->sp_displs))) {
    double gib = (2.0 * wbytes + cv.used) / (1 << 30);
    zt_model_free(m);
    return zt_err_set(e, ZT_ERUNTIME,
                      "out of memory: the model needs %.2f GiB on backend %s "
                      "(weights and gradients %.2f GiB, activations for "
                      "micro_batch %d: %.2f GiB); try a smaller micro_batch",
                      gib, be->name, 2.0 * wbytes / (1 << 30), micro_batch,
                      (double)cv.used / (1 << 30));
  }
  m->act_bytes = cv.used;
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
  if (m->kv) zt_comm_free(m->kv);
  free(m->kv);
  free(m->sp_counts);
  free(m->sp_displs);
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

/* Sequence parallelism: full[N, C] = every rank's rows, this rank's being
 * `mine` [Ns, C] (not copied when it already sits at its rows of full).
 * One all-gather over tp; host memory as in tp_sum. */
static void seq_gather(zt_model *m, float *full, const float *mine) {
  size_t C = (size_t)m->cfg.dim;
  float *at = full + (size_t)m->n0 * C;
  if (at != mine) m->be->copy(at, mine, (size_t)m->Ns * C);
  zt_req r;
  zt_comm_iallgather_f32(m->tp, full, m->sp_counts, m->sp_displs, &r);
  zt_comm_wait(&r);
}

/* Partial sums x[N, C] of a TP layer's output (each rank's share of a sum
 * over the group) made whole: summed over tp in place, or with sequence
 * parallelism reduce-scattered, this rank's rows of the sum [Ns, C] then
 * landing at the start of x (or in `rows` when given). */
static void tp_reduce_rows(zt_model *m, float *x, float *rows) {
  if (!m->sp) {
    tp_sum(m, x, (size_t)m->B * m->cfg.seq * m->cfg.dim);
    if (rows && rows != x) m->be->copy(rows, x, (size_t)m->Ns * m->cfg.dim);
    return;
  }
  zt_req r;
  zt_comm_ireduce_scatter_f32(m->tp, x, rows ? rows : x, m->sp_counts, &r);
  zt_comm_wait(&r);
}

/* All N rows of a residual-stream tensor x [Ns, C], for the layers that
 * need them (row-parallel backward, the embedding's backward): x itself,
 * or with sequence parallelism the rows gathered into the scratch dln. */
static const float *rows_all(zt_model *m, const float *x) {
  if (!m->sp) return x;
  seq_gather(m, m->dln, x);
  return m->dln;
}

/* out[N, C] = norm(x) for the column-parallel layer after it: this rank
 * normalises its Ns rows of x (all of them without sequence parallelism)
 * into its rows of out, and one all-gather fills in the others. */
static void norm_fwd(zt_model *m, float *out, float *mean, float *rstd,
                     const float *x, int wi, int bi) {
  int Ns = m->Ns, C = m->cfg.dim;
  float *mine = out + (size_t)m->n0 * C;
  if (m->cfg.arch == ZT_ARCH_GPT)
    m->be->layernorm_fwd(mine, mean, rstd, x, W(m, wi), W(m, bi), Ns,
                         C, m->cfg.norm_eps);
  else
    m->be->rmsnorm_fwd(mine, rstd, x, W(m, wi), Ns, C, m->cfg.norm_eps);
  if (m->sp) seq_gather(m, out, mine);
}

/* dx[Ns, C] += the norm's input gradient from dout [Ns, C]. Weight (and
 * bias) gradients go into the model's gradient; with sequence parallelism
 * they are partial sums over this rank's rows, so they go to slots `slot`
 * (and slot + 1) of the scratch dnorm, which norm_grads_sum adds up over
 * tp at the end of the unit. */
static void norm_bwd(zt_model *m, float *dx, const float *dout,
                     const float *x, const float *mean, const float *rstd,
                     int wi, int bi, int slot) {
  int Ns = m->Ns, C = m->cfg.dim;
  float *dw = m->sp ? m->dnorm + (size_t)slot * C : G(m, wi);
  float *db = bi < 0 ? NULL : m->sp ? m->dnorm + (size_t)(slot + 1) * C : G(m, bi);
  if (m->cfg.arch == ZT_ARCH_GPT)
    m->be->layernorm_bwd(dx, dw, db, dout, x, W(m, wi), mean, rstd, Ns, C);
  else
    m->be->rmsnorm_bwd(dx, dw, dout, x, W(m, wi), rstd, Ns, C);
}

/* Sequence parallelism: sums the unit's partial norm gradients over tp and
 * adds them to the model's gradient, then clears the scratch. ids lists
 * the unit's norm parameters (-1: an absent bias); the k-th present one is
 * in slot k of dnorm. Only this micro-batch's part is summed: the
 * accumulated gradient is already whole. */
static void norm_grads_sum(zt_model *m, const int *ids, int n) {
  if (!m->sp) return;
  size_t C = (size_t)m->cfg.dim, used = 0;
  for (int k = 0; k < n; k++) used += ids[k] >= 0;
  tp_sum(m, m->dnorm, used * C);
  for (int k = 0, slot = 0; k < n; k++)
    if (ids[k] >= 0) m->be->add(G(m, ids[k]), m->dnorm + (size_t)slot++ * C, C);
  m->be->zero(m->dnorm, used * C);
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

/* y[Ns,C] = res + x[N,in] W^T + b for a row-parallel layer (attn.out,
 * mlp.down): with TP, W is this rank's [C, in] slice of input columns, so
 * x W^T is a partial sum; it is summed over the group (with sequence
 * parallelism: reduce-scattered from the scratch dln into this rank's rows)
 * before the whole bias and the residual are added once. Without TP the
 * GEMM accumulates straight onto a copy of the residual (no extra pass). */
static void row_parallel_fwd(zt_model *m, float *y, const float *x, int wi,
                             int bi, const float *res, int in) {
  int Ns = m->Ns, C = m->cfg.dim;
  size_t NsC = (size_t)Ns * C;
  if (!tp_on(m)) {
    m->be->copy(y, res, NsC);
    linear_fwd(m, y, x, wi, bi, C, in, 1);
    return;
  }
  float *part = m->sp ? m->dln : y; /* [N, C] partial sums */
  linear_fwd(m, part, x, wi, -1, C, in, 0);
  tp_reduce_rows(m, part, y);
  m->be->add(y, res, NsC);
  if (bi >= 0) m->be->bias_fwd(y, W(m, bi), Ns, C);
}

/* Backward of the column-parallel qkv projection: weight gradient and the
 * partial input gradient dln. A kv head replicated over kv_rep ranks gets
 * a partial weight gradient on each of them (from their own query heads),
 * so this micro-batch's k, v part is computed into a scratch and summed
 * over the kv group there before it joins the accumulated gradient:
 * summing the accumulated one would count earlier micro-batches kv_rep
 * times. dln needs no such care: each rank's partial dK, dV times the
 * (replicated) weight is its own share of the sum over tp. */
static void qkv_bwd(zt_model *m, const zt_block_params *b, const zt_block_acts *a) {
  int N = m->B * m->cfg.seq, C = m->cfg.dim, Q = m->qkv_rows;
  if (m->kv_rep == 1) {
    linear_bwd(m, m->dln, m->dqkv, a->ln1, b->qkv_w, b->qkv_b, Q, C);
    return;
  }
  /* llama, no bias: rows [0, A) of the local weight are q, [A, Q) k and v */
  int A = m->att_dim, KV = Q - A;
  float *dw = G(m, b->qkv_w);
  m->be->gemm(1, 0, A, C, N, 1, m->dqkv, Q, a->ln1, C, 1, dw, C);
  m->be->gemm(1, 0, KV, C, N, 1, m->dqkv + A, Q, a->ln1, C, 0, m->dkv_w, C);
  zt_comm_allreduce_f32(m->kv, m->dkv_w, (size_t)KV * C); /* host memory: see tp_sum */
  m->be->add(dw + (size_t)A * C, m->dkv_w, (size_t)KV * C);
  m->be->gemm(0, 0, N, C, Q, 1, m->dqkv, Q, W(m, b->qkv_w), C, 0, m->dln, C);
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
 * gradients identical on all ranks. With sequence parallelism dres holds
 * this rank's rows: all-gathered for each row-parallel layer (which then
 * computes its bias gradient from all rows, identical on every rank), and
 * dln is reduce-scattered into the rows; the norms' gradients are summed
 * over tp at the end. */
static void block_bwd(zt_model *m, int l) {
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = m->be;
  const zt_block_params *b = &m->blocks[l];
  zt_block_acts *a = &m->acts[l];
  int N = m->B * c->seq, C = c->dim;

  linear_bwd(m, m->dact, rows_all(m, m->dres), a->act, b->down_w, b->down_b, C, m->hidden);
  if (c->arch == ZT_ARCH_GPT)
    be->gelu_bwd(m->dfc, a->fc, m->dact, (size_t)N * m->hidden);
  else
    be->swiglu_bwd(m->dfc, a->fc, m->dact, N, m->hidden);
  linear_bwd(m, m->dln, m->dfc, a->ln2, b->fc_w, b->fc_b, m->fc_rows, C);
  tp_reduce_rows(m, m->dln, NULL);
  norm_bwd(m, m->dres, m->dln, a->mid, a->ln2_mean, a->ln2_rstd, b->norm2_w, b->norm2_b, 0);

  linear_bwd(m, m->datt, rows_all(m, m->dres), a->att, b->out_w, b->out_b, C, m->att_dim);
  be->attn_bwd(m->dqkv, m->dprobs, m->datt, a->qkv, a->probs, m->B, c->seq,
               m->heads, m->kv_heads, m->hd);
  if (c->arch == ZT_ARCH_LLAMA)
    be->rope_bwd(m->dqkv, m->rope_cs, N, c->seq, m->heads + m->kv_heads, m->hd,
                 m->qkv_rows);
  qkv_bwd(m, b, a);
  tp_reduce_rows(m, m->dln, NULL);
  int s1 = b->norm2_b >= 0 ? 2 : 1; /* norm1's slots follow norm2's */
  norm_bwd(m, m->dres, m->dln, m->res[l], a->ln1_mean, a->ln1_rstd, b->norm1_w, b->norm1_b, s1);
  int norms[4] = {b->norm2_w, b->norm2_b, b->norm1_w, b->norm1_b};
  norm_grads_sum(m, norms, 4);
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

  /* unit of the head weight: the final unit, or unit 0 when tied */
  int L = c->layers, fin = L + 1, hu = m->param_unit[m->head];
  be->upload(m->tokens, tokens, (size_t)N * sizeof *tokens);
  be->upload(m->targets, targets, (size_t)N * sizeof *targets);
  before(m, 0, ZT_PHASE_FWD);
  /* vocab-parallel: each rank looks up the tokens in its rows and rank 0
   * adds the positions, so the sum over the group is the lookup exactly
   * (with sequence parallelism: [N, C] in the scratch dln, summed into this
   * rank's rows) */
  float *emb = m->sp ? m->dln : m->res[0];
  be->embed_fwd(emb, m->tokens, W(m, m->embed_tok),
                m->tp_rank == 0 ? W(m, m->embed_pos) : NULL, m->B, c->seq, C,
                m->vocab_start, Vl);
  tp_reduce_rows(m, emb, m->res[0]);
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
  tp_reduce_rows(m, m->dln, NULL); /* a partial sum over the group's vocab rows */
  be->zero(m->dres, (size_t)m->Ns * C);
  norm_bwd(m, m->dres, m->dln, m->res[L], m->lnf_mean, m->lnf_rstd,
           m->final_w, m->final_b, 0);
  int norms[2] = {m->final_w, m->final_b};
  norm_grads_sum(m, norms, 2);
  after(m, fin, ZT_PHASE_BWD);
  if (hu != fin) after(m, hu, ZT_PHASE_BWD);
  for (int l = L - 1; l >= 0; l--) {
    before(m, l + 1, ZT_PHASE_BWD);
    block_bwd(m, l);
    after(m, l + 1, ZT_PHASE_BWD);
  }
  before(m, 0, ZT_PHASE_BWD);
  be->embed_bwd(G(m, m->embed_tok), G(m, m->embed_pos), m->tokens,
                rows_all(m, m->dres), m->B, c->seq, C, m->vocab_start, Vl);
  after(m, 0, ZT_PHASE_BWD);
  return sum;
}

uint64_t zt_model_tp_bytes(const zt_model *m) {
  return (m->tp ? zt_comm_total_bytes(m->tp) : 0) + (m->kv ? zt_comm_total_bytes(m->kv) : 0);
}
