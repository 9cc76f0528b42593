/* layers: see layers.h. Shapes: N = B*T rows, C = dim, Q = qkv_rows,
 * A = att_dim, Fi = fc_rows, Fh = hidden, Vl = vocab_local (all of them
 * this TP rank's part; see model.h). Linear layers keep PyTorch's [out, in]
 * weights, so every GEMM is a plain BLAS call with no transposed copy:
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
 * summed over tp once per unit.
 * Split backward: B runs every input-gradient GEMM and the norms' backward
 * (whose weight gradients, a by-product, go to the slot); W runs the
 * weight-gradient GEMMs and bias sums from the output gradients B saved,
 * and adds the norms' gradients. The arithmetic is the same as the whole
 * backward's, only later. */
#include "src/model/layers.h"

#include <string.h>

/* Weights and gradient of parameter i (NULL when absent), wherever its
 * unit currently lives. A tied head on a stage without the embedding is
 * the copy tied_w. */
static void *W(const zt_model *m, int i) {
  if (i < 0) return NULL;
  if (i == m->head && m->tied_wc) return m->tied_wc;
  int u = m->param_unit[i];
  return (char *)m->unit_w[u] +
         (size_t)(m->params[i].t.offset - m->unit_start[u]) * zt_dtype_size(m->dt);
}

static float *G(const zt_model *m, int i) {
  if (i < 0) return NULL;
  if (i == m->head && m->tied_g) return m->tied_g;
  int u = m->param_unit[i];
  return m->unit_g[u] + (m->params[i].t.offset - m->unit_start[u]);
}

static int rows(const zt_model *m) { return m->B * m->cfg.seq; }

/* n activations (dtype m->dt) from src to dst, on the model's stream. */
static void copy_acts(const zt_model *m, void *dst, const void *src, size_t n) {
  m->be->copy(m->stream, dst, src, n * zt_dtype_size(m->dt));
}

/* The activation i elements into p. */
static void *acts_at(const zt_model *m, const void *p, size_t i) {
  return (char *)p + i * zt_dtype_size(m->dt);
}

/* Whether the model is cut over a TP group of more than one rank. */
static int tp_on(const zt_model *m) { return m->tp && m->tp_size > 1; }

/* x[n] = its sum over the TP group. zt_comm's MPI path takes host memory,
 * which the CPU backend's device pointers are; the CUDA backend will hand
 * device memory to an NCCL communicator here instead. */
static void tp_sum(zt_model *m, void *x, size_t n, zt_dtype t) {
  if (tp_on(m)) zt_comm_allreduce(m->tp, x, n, t, ZT_SUM);
}

/* Sequence parallelism: full[N, C] = every rank's rows, this rank's being
 * `mine` [Ns, C] (not copied when it already sits at its rows of full).
 * One all-gather over tp; host memory as in tp_sum. */
static void seq_gather(zt_model *m, void *full, const void *mine) {
  size_t C = (size_t)m->cfg.dim;
  void *at = acts_at(m, full, (size_t)m->n0 * C);
  if (at != mine) copy_acts(m, at, mine, (size_t)m->Ns * C);
  zt_req r;
  zt_comm_iallgather(m->tp, full, m->sp_counts, m->sp_displs, m->dt, &r);
  zt_comm_wait(&r);
}

/* Partial sums x[N, C] of a TP layer's output (each rank's share of a sum
 * over the group) made whole: summed over tp in place, or with sequence
 * parallelism reduce-scattered, this rank's rows of the sum [Ns, C] then
 * landing at the start of x (or in `rows` when given). */
static void tp_reduce_rows(zt_model *m, void *x, void *out) {
  if (!m->sp) {
    tp_sum(m, x, (size_t)rows(m) * m->cfg.dim, m->dt);
    if (out && out != x) copy_acts(m, out, x, (size_t)m->Ns * m->cfg.dim);
    return;
  }
  zt_req r;
  zt_comm_ireduce_scatter(m->tp, x, out ? out : x, m->sp_counts, m->dt, ZT_SUM, &r);
  zt_comm_wait(&r);
}

const void *zt_layers_rows_all(zt_model *m, const void *x) {
  if (!m->sp) return x;
  seq_gather(m, m->dln, x);
  return m->dln;
}

/* out[N, C] = norm(x) for the column-parallel layer after it: this rank
 * normalises its Ns rows of x (all of them without sequence parallelism)
 * into its rows of out, and one all-gather fills in the others. */
static void norm_fwd(zt_model *m, void *out, float *mean, float *rstd,
                     const void *x, int wi, int bi) {
  int Ns = m->Ns, C = m->cfg.dim;
  void *mine = acts_at(m, out, (size_t)m->n0 * C);
  if (m->cfg.arch == ZT_ARCH_GPT)
    m->be->layernorm_fwd(m->stream, m->dt, mine, mean, rstd, x, W(m, wi), W(m, bi), Ns, C, m->cfg.norm_eps);
  else
    m->be->rmsnorm_fwd(m->stream, m->dt, mine, rstd, x, W(m, wi), Ns, C, m->cfg.norm_eps);
  if (m->sp) seq_gather(m, out, mine);
}

/* dx[Ns, C] += the norm's input gradient from dout [Ns, C]. The weight
 * (and bias) gradients go to `buf` slots `slot` (and slot + 1) when
 * given — split backward, or sequence parallelism, where they are partial
 * sums over this rank's rows that norm_grads_add sums over tp — else
 * straight into the model's gradient. */
static void norm_bwd(zt_model *m, void *dx, const void *dout, const void *x,
                     const float *mean, const float *rstd, int wi, int bi, float *buf,
                     int slot) {
  int Ns = m->Ns, C = m->cfg.dim;
  float *dw = buf ? buf + (size_t)slot * C : G(m, wi);
  float *db = bi < 0 ? NULL : buf ? buf + (size_t)(slot + 1) * C : G(m, bi);
  if (m->cfg.arch == ZT_ARCH_GPT)
    m->be->layernorm_bwd(m->stream, m->dt, dx, dw, db, dout, x, W(m, wi), mean, rstd, Ns, C);
  else
    m->be->rmsnorm_bwd(m->stream, m->dt, dx, dw, dout, x, W(m, wi), rstd, Ns, C);
}

/* Adds the norm gradients collected in buf to the model's gradient (summed
 * over tp first with sequence parallelism: only this micro-batch's part,
 * the accumulated gradient being whole already), then clears buf. ids
 * lists the unit's norm parameters (-1: an absent bias); the k-th present
 * one is in slot k of buf. */
static void norm_grads_add(zt_model *m, float *buf, const int *ids, int n) {
  size_t C = (size_t)m->cfg.dim, used = 0;
  for (int k = 0; k < n; k++) used += ids[k] >= 0;
  if (m->sp) tp_sum(m, buf, used * C, ZT_F32);
  for (int k = 0, slot = 0; k < n; k++)
    if (ids[k] >= 0) m->be->add(m->stream, ZT_F32, G(m, ids[k]), buf + (size_t)slot++ * C, C);
  m->be->memzero(m->stream, buf, used * C * sizeof *buf);
}

/* y[N,out] (= or +=) x[N,in] W^T + b */
static void linear_fwd(const zt_model *m, void *y, const void *x, int wi, int bi, int out,
                       int in, float beta) {
  int N = rows(m);
  m->be->gemm(m->stream, m->dt, m->dt, 0, 1, N, out, in, 1, x, in, W(m, wi), in, beta, y, out);
  if (bi >= 0) m->be->bias_fwd(m->stream, m->dt, y, W(m, bi), N, out);
}

/* dW += dy^T x; db += colsum(dy) */
static void linear_dw(const zt_model *m, const void *dy, const void *x, int wi, int bi,
                      int out, int in) {
  int N = rows(m);
  m->be->gemm(m->stream, m->dt, ZT_F32, 1, 0, out, in, N, 1, dy, out, x, in, 1, G(m, wi), in);
  if (bi >= 0) m->be->bias_bwd(m->stream, m->dt, G(m, bi), dy, N, out);
}

/* dx = dy W */
static void linear_dx(const zt_model *m, void *dx, const void *dy, int wi, int out, int in) {
  m->be->gemm(m->stream, m->dt, m->dt, 0, 0, rows(m), in, out, 1, dy, out, W(m, wi), in, 0, dx, in);
}

/* y[Ns,C] = res + x[N,in] W^T + b for a row-parallel layer (attn.out,
 * mlp.down): with TP, W is this rank's [C, in] slice of input columns, so
 * x W^T is a partial sum; it is summed over the group (with sequence
 * parallelism: reduce-scattered from the scratch dln into this rank's rows)
 * before the whole bias and the residual are added once. Without TP the
 * GEMM accumulates straight onto a copy of the residual (no extra pass). */
static void row_parallel_fwd(zt_model *m, void *y, const void *x, int wi, int bi,
                             const void *res, int in) {
  int Ns = m->Ns, C = m->cfg.dim;
  size_t NsC = (size_t)Ns * C;
  if (!tp_on(m)) {
    copy_acts(m, y, res, NsC);
    linear_fwd(m, y, x, wi, bi, C, in, 1);
    return;
  }
  void *part = m->sp ? m->dln : y; /* [N, C] partial sums */
  linear_fwd(m, part, x, wi, -1, C, in, 0);
  tp_reduce_rows(m, part, y);
  m->be->add(m->stream, m->dt, y, res, NsC);
  if (bi >= 0) m->be->bias_fwd(m->stream, m->dt, y, W(m, bi), Ns, C);
}

/* Weight gradient of the column-parallel qkv projection. A kv head
 * replicated over kv_rep ranks gets a partial weight gradient on each of
 * them (from their own query heads), so this micro-batch's k, v part is
 * computed into a scratch and summed over the kv group there before it
 * joins the accumulated gradient: summing the accumulated one would count
 * earlier micro-batches kv_rep times. The input gradient needs no such
 * care: each rank's partial dK, dV times the (replicated) weight is its
 * own share of the sum over tp. */
static void qkv_dw(zt_model *m, const zt_block_params *b, const void *dqkv, const void *ln1) {
  int N = rows(m), C = m->cfg.dim, Q = m->qkv_rows;
  if (m->kv_rep == 1) {
    linear_dw(m, dqkv, ln1, b->qkv_w, b->qkv_b, Q, C);
    return;
  }
  /* llama, no bias: rows [0, A) of the local weight are q, [A, Q) k and v */
  int A = m->att_dim, KV = Q - A;
  float *dw = G(m, b->qkv_w);
  m->be->gemm(m->stream, m->dt, ZT_F32, 1, 0, A, C, N, 1, dqkv, Q, ln1, C, 1, dw, C);
  m->be->gemm(m->stream, m->dt, ZT_F32, 1, 0, KV, C, N, 1, acts_at(m, dqkv, A), Q, ln1, C, 0,
              m->dkv_w, C);
  /* host memory: see tp_sum */
  zt_comm_allreduce(m->kv, m->dkv_w, (size_t)KV * C, ZT_F32, ZT_SUM);
  m->be->add(m->stream, ZT_F32, dw + (size_t)A * C, m->dkv_w, (size_t)KV * C);
}

void zt_layers_embed_fwd(zt_model *m, zt_slot *s) {
  const zt_model_cfg *c = &m->cfg;
  /* vocab-parallel: each rank looks up the tokens in its rows and rank 0
   * adds the positions, so the sum over the group is the lookup exactly
   * (with sequence parallelism: [N, C] in the scratch dln, summed into this
   * rank's rows) */
  void *emb = m->sp ? m->dln : s->res[0];
  m->be->embed_fwd(m->stream, m->dt, emb, s->tokens, W(m, m->embed_tok),
                   m->tp_rank == 0 ? W(m, m->embed_pos) : NULL, m->B, c->seq, c->dim,
                   m->vocab_start, m->vocab_local);
  tp_reduce_rows(m, emb, s->res[0]);
}

void zt_layers_embed_wgrad(zt_model *m, zt_slot *s, const void *dy) {
  const zt_model_cfg *c = &m->cfg;
  m->be->embed_bwd(m->stream, m->dt, G(m, m->embed_tok), G(m, m->embed_pos), s->tokens, dy, m->B, c->seq,
                   c->dim, m->vocab_start, m->vocab_local);
}

void zt_layers_block_fwd(zt_model *m, zt_slot *s, int i, int l, int recompute) {
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = m->be;
  const zt_block_params *b = &m->blocks[l];
  zt_block_acts *a = &s->acts[i];
  int N = rows(m), C = c->dim;

  /* column-parallel qkv: this rank's heads only */
  norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, s->res[i], b->norm1_w, b->norm1_b);
  linear_fwd(m, a->qkv, a->ln1, b->qkv_w, b->qkv_b, m->qkv_rows, C, 0);
  if (c->arch == ZT_ARCH_LLAMA) /* q and k heads are the first H+KVH of a row */
    be->rope_fwd(m->stream, m->dt, a->qkv, m->rope_cs, N, c->seq, m->heads + m->kv_heads, m->hd, m->qkv_rows);
  be->attn_fwd(m->stream, m->dt, a->att, a->lse, a->qkv, m->B, c->seq, m->heads, m->kv_heads, m->hd);
  row_parallel_fwd(m, a->mid, a->att, b->out_w, b->out_b, s->res[i], m->att_dim);

  norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->mid, b->norm2_w, b->norm2_b);
  linear_fwd(m, a->fc, a->ln2, b->fc_w, b->fc_b, m->fc_rows, C, 0);
  if (c->arch == ZT_ARCH_GPT)
    be->gelu_fwd(m->stream, m->dt, a->act, a->fc, (size_t)N * m->hidden);
  else
    be->swiglu_fwd(m->stream, m->dt, a->act, a->fc, N, m->hidden);
  if (recompute) return;
  row_parallel_fwd(m, s->res[i + 1], a->act, b->down_w, b->down_b, a->mid, m->hidden);
}

/* On entry m->dres holds d(res[i+1]); on exit d(res[i]). The residual
 * gradient is accumulated in place: the norms' backward adds into it. With
 * TP, dres is whole and the same on every rank; a row-parallel layer's
 * input gradient is then this rank's own columns, while a column-parallel
 * layer's (dln) is a partial sum over the group's rows: summed before the
 * norm's backward, which keeps dres, the norms' and the row-parallel biases'
 * gradients identical on all ranks. With sequence parallelism dres holds
 * this rank's rows: all-gathered for each row-parallel layer (which then
 * computes its bias gradient from all rows, identical on every rank), and
 * dln is reduce-scattered into the rows; the norms' gradients are summed
 * over tp at the end. input_only: the output gradients of the four linear
 * layers and the norms' gradients go to the slot for W. */
void zt_layers_block_bwd(zt_model *m, zt_slot *s, int i, int l, int input_only) {
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = m->be;
  const zt_block_params *b = &m->blocks[l];
  zt_block_acts *a = &s->acts[i];
  zt_block_saved *sv = input_only ? &s->saved[i] : NULL;
  int N = rows(m), C = c->dim;
  size_t NC = (size_t)N * C;
  void *dfc = sv ? sv->dfc : m->dfc, *dqkv = sv ? sv->dqkv : m->dqkv;
  float *nbuf = sv ? sv->dnorm : m->sp ? m->dnorm : NULL;

  const void *dy = zt_layers_rows_all(m, m->dres);
  if (sv) copy_acts(m, sv->dy_down, dy, NC);
  else linear_dw(m, dy, a->act, b->down_w, b->down_b, C, m->hidden);
  linear_dx(m, m->dact, dy, b->down_w, C, m->hidden);
  if (c->arch == ZT_ARCH_GPT)
    be->gelu_bwd(m->stream, m->dt, dfc, a->fc, m->dact, (size_t)N * m->hidden);
  else
    be->swiglu_bwd(m->stream, m->dt, dfc, a->fc, m->dact, N, m->hidden);
  if (!sv) linear_dw(m, dfc, a->ln2, b->fc_w, b->fc_b, m->fc_rows, C);
  linear_dx(m, m->dln, dfc, b->fc_w, m->fc_rows, C);
  tp_reduce_rows(m, m->dln, NULL);
  norm_bwd(m, m->dres, m->dln, a->mid, a->ln2_mean, a->ln2_rstd, b->norm2_w, b->norm2_b,
           nbuf, 0);

  dy = zt_layers_rows_all(m, m->dres);
  if (sv) copy_acts(m, sv->dy_out, dy, NC);
  else linear_dw(m, dy, a->att, b->out_w, b->out_b, C, m->att_dim);
  linear_dx(m, m->datt, dy, b->out_w, C, m->att_dim);
  be->attn_bwd(m->stream, m->dt, dqkv, m->datt, a->qkv, a->att, a->lse, m->B, c->seq, m->heads, m->kv_heads,
               m->hd);
  if (c->arch == ZT_ARCH_LLAMA)
    be->rope_bwd(m->stream, m->dt, dqkv, m->rope_cs, N, c->seq, m->heads + m->kv_heads, m->hd, m->qkv_rows);
  if (!sv) qkv_dw(m, b, dqkv, a->ln1);
  linear_dx(m, m->dln, dqkv, b->qkv_w, m->qkv_rows, C);
  tp_reduce_rows(m, m->dln, NULL);
  int s1 = b->norm2_b >= 0 ? 2 : 1; /* norm1's slots follow norm2's */
  norm_bwd(m, m->dres, m->dln, s->res[i], a->ln1_mean, a->ln1_rstd, b->norm1_w, b->norm1_b,
           nbuf, s1);
  if (!sv && m->sp) {
    int norms[4] = {b->norm2_w, b->norm2_b, b->norm1_w, b->norm1_b};
    norm_grads_add(m, m->dnorm, norms, 4);
  }
}

void zt_layers_block_wgrad(zt_model *m, zt_slot *s, int i, int l) {
  const zt_block_params *b = &m->blocks[l];
  const zt_block_acts *a = &s->acts[i];
  zt_block_saved *sv = &s->saved[i];
  int C = m->cfg.dim;
  linear_dw(m, sv->dy_down, a->act, b->down_w, b->down_b, C, m->hidden);
  linear_dw(m, sv->dfc, a->ln2, b->fc_w, b->fc_b, m->fc_rows, C);
  linear_dw(m, sv->dy_out, a->att, b->out_w, b->out_b, C, m->att_dim);
  qkv_dw(m, b, sv->dqkv, a->ln1);
  int norms[4] = {b->norm2_w, b->norm2_b, b->norm1_w, b->norm1_b};
  norm_grads_add(m, sv->dnorm, norms, 4);
}

/* Per-row loss and dlogits (scaled by dscale) from s->logits. With a
 * vocab-parallel head each rank holds Vl columns of the rows: the max and
 * the sums of exp and of the target logit are combined over the group, so
 * no rank ever holds the full [N, V] logits. */
static void loss_fwd_bwd(zt_model *m, zt_slot *s, float dscale) {
  const zt_backend *be = m->be;
  int N = rows(m), Vl = m->vocab_local, v0 = m->vocab_start;
  float *st = m->xent_stats;
  if (!tp_on(m)) {
    be->xent_fwd_bwd(m->stream, m->dt, s->logits, s->losses, s->targets, N, Vl, dscale);
    return;
  }
  be->xent_max(m->stream, m->dt, st, s->logits, N, Vl);
  zt_comm_allreduce(m->tp, st, (size_t)N, ZT_F32, ZT_MAX); /* host memory: see tp_sum */
  be->xent_sumexp(m->stream, m->dt, st, s->logits, s->targets, N, Vl, v0);
  tp_sum(m, st + N, 2 * (size_t)N, ZT_F32);
  be->xent_finish(m->stream, m->dt, s->logits, s->losses, st, s->targets, N, Vl, v0, dscale);
}

double zt_layers_head_fwd(zt_model *m, zt_slot *s, int nb, float dscale) {
  int N = rows(m);
  norm_fwd(m, s->lnf, s->lnf_mean, s->lnf_rstd, s->res[nb], m->final_w, m->final_b);
  linear_fwd(m, s->logits, s->lnf, m->head, -1, m->vocab_local, m->cfg.dim, 0);
  loss_fwd_bwd(m, s, dscale);
  m->be->copy(m->stream, m->host_losses, s->losses, (size_t)N * sizeof(float));
  m->be->stream_sync(m->stream); /* the host reads them now */
  double sum = 0;
  for (int i = 0; i < N; i++) sum += m->host_losses[i];
  return sum;
}

void zt_layers_head_bwd(zt_model *m, zt_slot *s, int nb, int input_only) {
  int C = m->cfg.dim, Vl = m->vocab_local;
  /* logits now hold dlogits */
  if (!input_only) linear_dw(m, s->logits, s->lnf, m->head, -1, Vl, C);
  linear_dx(m, m->dln, s->logits, m->head, Vl, C);
  tp_reduce_rows(m, m->dln, NULL); /* a partial sum over the group's vocab rows */
  m->be->memzero(m->stream, m->dres, (size_t)m->Ns * C * zt_dtype_size(m->dt));
  float *nbuf = input_only ? s->dnorm_final : m->sp ? m->dnorm : NULL;
  norm_bwd(m, m->dres, m->dln, s->res[nb], s->lnf_mean, s->lnf_rstd, m->final_w, m->final_b,
           nbuf, 0);
  if (!input_only && m->sp) {
    int norms[2] = {m->final_w, m->final_b};
    norm_grads_add(m, m->dnorm, norms, 2);
  }
}

void zt_layers_head_wgrad(zt_model *m, zt_slot *s) {
  linear_dw(m, s->logits, s->lnf, m->head, -1, m->vocab_local, m->cfg.dim);
  int norms[2] = {m->final_w, m->final_b};
  norm_grads_add(m, s->dnorm_final, norms, 2);
}
