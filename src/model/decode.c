/* decode: see decode.h. The order of operations per block is layers.c's
 * at tp = 1 (block_fwd, row_parallel_fwd without TP, head_fwd), on the
 * new rows only. */
#include "src/model/decode.h"

#include <stdlib.h>
#include <string.h>

/* Weights of parameter i (a tied head reads the embedding: m->head is
 * its index then). */
static const void *W(const zt_decode *d, int i) {
  if (i < 0) return NULL;
  return (const char *)d->w + (size_t)d->m->params[i].t.offset * zt_dtype_size(d->dt);
}

static void *at(const zt_decode *d, void *p, size_t i) {
  return (char *)p + i * zt_dtype_size(d->dt);
}

int zt_decode_init(zt_decode *d, const zt_model *m, const zt_backend *be, const void *w, int cap,
                   zt_err *e) {
  memset(d, 0, sizeof *d);
  const zt_model_cfg *c = &m->cfg;
  if (m->tp_size != 1 || cap < 1 || cap > c->seq)
    return zt_err_set(e, ZT_EINPUT, "decoding runs one process at tp = 1 with 1..%d rows a "
                      "call (got tp %d, %d rows)", c->seq, m->tp_size, cap);
  d->m = m;
  d->be = be;
  d->w = w;
  d->cap = cap;
  d->dt = c->precision;
  size_t x = zt_dtype_size(d->dt), C = (size_t)c->dim, n = (size_t)cap, f = sizeof(float);
  int widest = m->fc_rows > m->qkv_rows ? m->fc_rows : m->qkv_rows;
  d->stream = be->stream_new();
  d->cache = be->alloc(ZT_MEM_DEVICE, (size_t)c->layers * c->seq * m->qkv_rows * x);
  d->x = be->alloc(ZT_MEM_DEVICE, n * C * x);
  d->ln = be->alloc(ZT_MEM_DEVICE, n * C * x);
  d->mid = be->alloc(ZT_MEM_DEVICE, n * C * x);
  d->att = be->alloc(ZT_MEM_DEVICE, n * m->att_dim * x);
  d->fc = be->alloc(ZT_MEM_DEVICE, n * widest * x);
  d->act = be->alloc(ZT_MEM_DEVICE, n * m->hidden * x);
  d->logits = be->alloc(ZT_MEM_DEVICE, n * c->vocab * x);
  d->logits32 = d->dt == ZT_F32 ? d->logits : be->alloc(ZT_MEM_DEVICE, n * c->vocab * f);
  d->stats = be->alloc(ZT_MEM_DEVICE, 2 * n * f);
  d->cs = be->alloc(ZT_MEM_DEVICE, n * m->hd * f);
  d->host_cs = malloc(n * m->hd * f);
  d->tok = be->alloc(ZT_MEM_DEVICE, n * sizeof(int32_t));
  if (!d->stream || !d->cache || !d->x || !d->ln || !d->mid || !d->att || !d->fc || !d->act ||
      !d->logits || !d->logits32 || !d->stats || !d->cs || !d->host_cs || !d->tok) {
    zt_decode_free(d);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for the KV cache (%.1f MiB) and "
                      "decoding buffers", (double)c->layers * c->seq * m->qkv_rows * x / 1048576);
  }
  return ZT_OK;
}

void zt_decode_free(zt_decode *d) {
  const zt_backend *be = d->be;
  if (!be) return;
  void *dev[] = {d->cache, d->x, d->ln, d->mid, d->att, d->fc, d->act, d->stats, d->cs, d->tok,
                 d->logits, d->logits32 != d->logits ? d->logits32 : NULL};
  for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
    if (dev[i]) be->free(ZT_MEM_DEVICE, dev[i]);
  if (d->stream) be->stream_free(d->stream);
  free(d->host_cs);
  memset(d, 0, sizeof *d);
}

/* out[n, C] = norm(x) with weight wi (and bias bi: LayerNorm, gpt) */
static void norm(zt_decode *d, void *out, const void *x, int wi, int bi, int n) {
  const zt_model_cfg *c = &d->m->cfg;
  float *mean = d->stats, *rstd = d->stats + d->cap;
  if (c->arch == ZT_ARCH_GPT)
    d->be->layernorm_fwd(d->stream, d->dt, out, mean, rstd, x, W(d, wi), W(d, bi), n, c->dim,
                         c->norm_eps);
  else
    d->be->rmsnorm_fwd(d->stream, d->dt, out, rstd, x, W(d, wi), n, c->dim, c->norm_eps);
}

/* y[n, out] (= or += with beta 1) x[n, in] W^T + b */
static void linear(zt_decode *d, void *y, const void *x, int wi, int bi, int out, int in,
                   float beta, int n) {
  d->be->gemm(d->stream, d->dt, d->dt, 0, 1, n, out, in, 1, x, in, W(d, wi), in, beta, y, out);
  if (bi >= 0) d->be->bias_fwd(d->stream, d->dt, y, W(d, bi), n, out);
}

/* Block l on the n new rows of d->x, in place. */
static void block(zt_decode *d, int l, int n) {
  const zt_model *m = d->m;
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = d->be;
  const zt_block_params *b = &m->blocks[l];
  int C = c->dim, Q = m->qkv_rows;
  size_t NC = (size_t)n * C;
  void *cache = at(d, d->cache, (size_t)l * c->seq * Q), *qkv = at(d, cache, (size_t)d->pos * Q);
  norm(d, d->ln, d->x, b->norm1_w, b->norm1_b, n);
  linear(d, qkv, d->ln, b->qkv_w, b->qkv_b, Q, C, 0, n);
  if (c->arch == ZT_ARCH_LLAMA)
    be->rope_fwd(d->stream, d->dt, qkv, d->cs, n, n, m->heads + m->kv_heads, m->hd, Q);
  be->attn_decode(d->stream, d->dt, d->att, cache, d->pos + n, n, m->heads, m->kv_heads, m->hd);
  be->copy(d->stream, d->mid, d->x, NC * zt_dtype_size(d->dt));
  linear(d, d->mid, d->att, b->out_w, b->out_b, C, m->att_dim, 1, n);
  norm(d, d->ln, d->mid, b->norm2_w, b->norm2_b, n);
  linear(d, d->fc, d->ln, b->fc_w, b->fc_b, m->fc_rows, C, 0, n);
  if (c->arch == ZT_ARCH_GPT)
    be->gelu_fwd(d->stream, d->dt, d->act, d->fc, (size_t)n * m->hidden);
  else
    be->swiglu_fwd(d->stream, d->dt, d->act, d->fc, n, m->hidden);
  be->copy(d->stream, d->x, d->mid, NC * zt_dtype_size(d->dt));
  linear(d, d->x, d->act, b->down_w, b->down_b, C, m->hidden, 1, n);
}

int zt_decode_step(zt_decode *d, const int32_t *tokens, int n, int rows, float *logits,
                   zt_err *e) {
  const zt_model *m = d->m;
  const zt_model_cfg *c = &m->cfg;
  const zt_backend *be = d->be;
  if (n < 1 || n > d->cap || rows < 1 || rows > n || d->pos + n > c->seq)
    return zt_err_set(e, ZT_EINPUT, "decoding %d tokens (%d logit rows) at position %d: at most "
                      "%d a call and %d positions in all", n, rows, d->pos, d->cap, c->seq);
  for (int i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= c->vocab)
      return zt_err_set(e, ZT_EINPUT, "token %d at position %d is outside the vocab (%d)",
                        tokens[i], d->pos + i, c->vocab);
  size_t x = zt_dtype_size(d->dt);
  be->copy(d->stream, d->tok, tokens, (size_t)n * sizeof *tokens);
  if (c->arch == ZT_ARCH_LLAMA) { /* the rotary rows of these positions */
    zt_model_rope_rows(m, d->pos, n, d->host_cs);
    be->copy(d->stream, d->cs, d->host_cs, (size_t)n * m->hd * sizeof(float));
  }
  /* gpt adds positions pos..: the table from row pos on */
  const void *wpe = m->embed_pos >= 0 ? (const char *)W(d, m->embed_pos) + (size_t)d->pos * c->dim * x
                                      : NULL;
  be->embed_fwd(d->stream, d->dt, d->x, d->tok, W(d, m->embed_tok), wpe, 1, n, c->dim, 0,
                c->vocab);
  for (int l = 0; l < c->layers; l++) block(d, l, n);
  /* the head on the last `rows` rows only */
  void *last = at(d, d->x, (size_t)(n - rows) * c->dim);
  norm(d, d->ln, last, m->final_w, m->final_b, rows);
  linear(d, d->logits, d->ln, m->head, -1, c->vocab, c->dim, 0, rows);
  size_t nv = (size_t)rows * c->vocab;
  if (d->dt != ZT_F32) be->convert(d->stream, ZT_F32, d->logits32, d->dt, d->logits, nv);
  be->copy(d->stream, logits, d->logits32, nv * sizeof(float));
  be->stream_sync(d->stream); /* the host reads logits, and tokens may be refilled */
  d->pos += n;
  char why[200];
  if (be->error(why, sizeof why))
    return zt_err_set(e, ZT_ERUNTIME, "the %s backend failed while decoding: %s", be->name, why);
  return ZT_OK;
}
