/* params: the parameter table of a model: logical names, shapes, where each
 * tensor sits in the flat buffer, how it is initialised. Names and layouts
 * follow PyTorch (nn.Linear weight is [out, in]). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/rng.h"
#include "src/model/model.h"

int zt_model_cfg_check(const zt_model_cfg *c, zt_err *e) {
  const char *k = c->arch == ZT_ARCH_GPT ? "zt.gpt" : "zt.llama";
  struct { const char *name; int v; } pos[] = {
      {"vocab", c->vocab}, {"seq", c->seq}, {"dim", c->dim},
      {"layers", c->layers}, {"heads", c->heads}, {"kv_heads", c->kv_heads},
      {"ffn_dim", c->ffn_dim}};
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v <= 0)
      return zt_err_set(e, ZT_EINPUT, "%s: %s must be a positive integer, got %d",
                        k, pos[i].name, pos[i].v);
  if (c->dim % c->heads)
    return zt_err_set(e, ZT_EINPUT,
                      "%s: dim %d is not divisible by heads %d (head_dim would "
                      "be %.2f); try heads = %d or dim = %d",
                      k, c->dim, c->heads, (double)c->dim / c->heads,
                      c->dim % 64 == 0 ? c->dim / 64 : 1,
                      (c->dim / c->heads + 1) * c->heads);
  if ((c->dim / c->heads) % 2 && c->arch == ZT_ARCH_LLAMA)
    return zt_err_set(e, ZT_EINPUT,
                      "%s: head_dim %d (dim %d / heads %d) must be even for "
                      "rotary embeddings", k, c->dim / c->heads, c->dim, c->heads);
  if (c->heads % c->kv_heads)
    return zt_err_set(e, ZT_EINPUT,
                      "%s: heads %d is not divisible by kv_heads %d; each kv "
                      "head must serve the same number of query heads",
                      k, c->heads, c->kv_heads);
  if (!(c->norm_eps > 0))
    return zt_err_set(e, ZT_EINPUT, "%s: norm_eps must be > 0, got %g", k,
                      (double)c->norm_eps);
  if (c->arch == ZT_ARCH_LLAMA && !(c->rope_theta > 0))
    return zt_err_set(e, ZT_EINPUT, "%s: rope_theta must be > 0, got %g", k,
                      (double)c->rope_theta);
  return ZT_OK;
}

/* Appends one tensor; returns its index. */
static int add(zt_model *m, zt_init_kind init, float std, int ndim, int64_t d0,
               int64_t d1, const char *fmt, int layer) {
  zt_param *p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  snprintf(p->t.name, sizeof p->t.name, fmt, layer);
  p->t.dtype = ZT_F32;
  p->t.ndim = ndim;
  p->t.shape[0] = d0;
  p->t.shape[1] = d1;
  p->t.shard.dim = -1;
  p->t.shard.groups = 1;
  p->t.offset = m->numel;
  p->t.numel = zt_tensor_numel(&p->t);
  p->init = init;
  p->std = std;
  m->param_unit[m->n_params] = m->n_units - 1;
  m->unit_numel[m->n_units - 1] += p->t.numel;
  m->numel += p->t.numel;
  return m->n_params++;
}

/* Parameters added after this belong to a new unit. */
static void start_unit(zt_model *m) {
  m->unit_start[m->n_units] = m->numel;
  m->n_units++;
}

int zt_model_layout(zt_model *m, const zt_model_cfg *cfg, int tp_size,
                    int tp_rank, zt_err *e) {
  int rc = zt_model_cfg_check(cfg, e);
  if (rc) return rc;
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  m->tp_size = tp_size;
  m->tp_rank = tp_rank;
  const zt_model_cfg *c = &m->cfg;
  int gpt = c->arch == ZT_ARCH_GPT, C = c->dim, L = c->layers;
  m->hd = C / c->heads;
  m->qkv_rows = (c->heads + 2 * c->kv_heads) * m->hd;
  m->hidden = c->ffn_dim;
  m->fc_rows = gpt ? c->ffn_dim : 2 * c->ffn_dim;
  size_t max_params = (size_t)(16 * L + 8), units = (size_t)L + 2;
  m->params = calloc(max_params, sizeof *m->params);
  m->param_unit = calloc(max_params, sizeof *m->param_unit);
  m->blocks = calloc((size_t)L, sizeof *m->blocks);
  m->unit_start = calloc(units, sizeof *m->unit_start);
  m->unit_numel = calloc(units, sizeof *m->unit_numel);
  m->unit_w = calloc(units, sizeof *m->unit_w);
  m->unit_g = calloc(units, sizeof *m->unit_g);
  if (!m->params || !m->param_unit || !m->blocks || !m->unit_start ||
      !m->unit_numel || !m->unit_w || !m->unit_g)
    return zt_err_set(e, ZT_ERUNTIME, "out of host memory for the model table");

  /* GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2L). */
  const float sd = 0.02f, sd_res = 0.02f / sqrtf(2.0f * (float)L);
  const int64_t kvr = (int64_t)c->kv_heads * m->hd;
  start_unit(m);
  m->embed_tok = add(m, ZT_INIT_NORMAL, sd, 2, c->vocab, C, "embed.tokens", 0);
  m->embed_pos = gpt ? add(m, ZT_INIT_NORMAL, sd, 2, c->seq, C, "embed.positions", 0) : -1;
  for (int l = 0; l < L; l++) {
    zt_block_params *b = &m->blocks[l];
    memset(b, 0xff, sizeof *b); /* every index -1 */
    start_unit(m);
    b->norm1_w = add(m, ZT_INIT_ONES, 0, 1, C, 0, "blocks.%d.norm1.weight", l);
    if (gpt) b->norm1_b = add(m, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.norm1.bias", l);
    if (gpt) {
      b->qkv_w = add(m, ZT_INIT_NORMAL, sd, 2, 3 * C, C, "blocks.%d.attn.qkv.weight", l);
      b->qkv_b = add(m, ZT_INIT_ZEROS, 0, 1, 3 * C, 0, "blocks.%d.attn.qkv.bias", l);
    } else { /* q, k, v adjacent: one GEMM computes all three */
      b->qkv_w = add(m, ZT_INIT_NORMAL, sd, 2, C, C, "blocks.%d.attn.q.weight", l);
      add(m, ZT_INIT_NORMAL, sd, 2, kvr, C, "blocks.%d.attn.k.weight", l);
      add(m, ZT_INIT_NORMAL, sd, 2, kvr, C, "blocks.%d.attn.v.weight", l);
    }
    b->out_w = add(m, ZT_INIT_NORMAL, sd_res, 2, C, C, "blocks.%d.attn.out.weight", l);
    if (gpt) b->out_b = add(m, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.attn.out.bias", l);
    b->norm2_w = add(m, ZT_INIT_ONES, 0, 1, C, 0, "blocks.%d.norm2.weight", l);
    if (gpt) b->norm2_b = add(m, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.norm2.bias", l);
    if (gpt) {
      b->fc_w = add(m, ZT_INIT_NORMAL, sd, 2, c->ffn_dim, C, "blocks.%d.mlp.up.weight", l);
      b->fc_b = add(m, ZT_INIT_ZEROS, 0, 1, c->ffn_dim, 0, "blocks.%d.mlp.up.bias", l);
    } else { /* gate, up adjacent: one GEMM computes both */
      b->fc_w = add(m, ZT_INIT_NORMAL, sd, 2, c->ffn_dim, C, "blocks.%d.mlp.gate.weight", l);
      add(m, ZT_INIT_NORMAL, sd, 2, c->ffn_dim, C, "blocks.%d.mlp.up.weight", l);
    }
    b->down_w = add(m, ZT_INIT_NORMAL, sd_res, 2, C, c->ffn_dim, "blocks.%d.mlp.down.weight", l);
    if (gpt) b->down_b = add(m, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.mlp.down.bias", l);
  }
  start_unit(m);
  m->final_w = add(m, ZT_INIT_ONES, 0, 1, C, 0, "final_norm.weight", 0);
  m->final_b = gpt ? add(m, ZT_INIT_ZEROS, 0, 1, C, 0, "final_norm.bias", 0) : -1;
  m->head = c->tied ? m->embed_tok
                    : add(m, ZT_INIT_NORMAL, sd, 2, c->vocab, C, "head.weight", 0);
  return ZT_OK;
}

void zt_model_init_weights(zt_model *m, uint64_t seed) {
  int64_t max = 0;
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i].t.numel > max) max = m->params[i].t.numel;
  float *host = malloc((size_t)max * sizeof *host);
  for (int i = 0; i < m->n_params; i++) {
    const zt_param *p = &m->params[i];
    uint64_t key = zt_rng_key(seed, p->t.name);
    /* each element depends only on its index: any thread order is the same */
#pragma omp parallel for
    for (int64_t j = 0; j < p->t.numel; j++)
      host[j] = p->init == ZT_INIT_ONES    ? 1.0f
                : p->init == ZT_INIT_ZEROS ? 0.0f
                                           : p->std * zt_rng_normal(key, (uint64_t)j);
    m->be->upload(m->w + p->t.offset, host, (size_t)p->t.numel * sizeof *host);
  }
  free(host);
}

int zt_model_find(const zt_model *m, const char *name) {
  for (int i = 0; i < m->n_params; i++)
    if (!strcmp(m->params[i].t.name, name)) return i;
  return -1;
}

double zt_model_flops_per_token(const zt_model *m) {
  /* PaLM appendix B: 6 per parameter that takes part in a matmul (everything
   * but embeddings and norms, head included) plus 12*L*C*T for attention
   * scores and values. */
  const zt_model_cfg *c = &m->cfg;
  double per_layer = (double)c->dim * (m->qkv_rows + c->dim + m->fc_rows + m->hidden);
  double matmul = c->layers * per_layer;
  matmul += (double)c->vocab * c->dim;
  return 6 * matmul + 12.0 * c->layers * c->dim * c->seq;
}
