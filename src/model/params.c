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

/* llama's kv heads fit tp when each rank gets whole kv heads (kv_heads a
 * multiple of tp) or when each kv head is shared by tp/kv_heads ranks. */
static int kv_fits(int kv_heads, int tp) { return kv_heads % tp == 0 || tp % kv_heads == 0; }

/* Whether tensor parallelism over tp ranks divides the model. */
static int tp_fits(const zt_model_cfg *c, int tp) {
  return c->heads % tp == 0 && c->ffn_dim % tp == 0 && c->vocab % tp == 0 &&
         (c->arch == ZT_ARCH_GPT || kv_fits(c->kv_heads, tp));
}

int zt_model_tp_check(const zt_model_cfg *c, int tp, zt_err *e) {
  const char *k = c->arch == ZT_ARCH_GPT ? "zt.gpt" : "zt.llama";
  if (tp < 1) return zt_err_set(e, ZT_EINPUT, "%s: tp must be >= 1, got %d", k, tp);
  if (tp_fits(c, tp)) return ZT_OK;
  /* every working tp divides heads: list them all */
  char ok[512] = "", why[256] = "", pad[96] = "";
  size_t len = 0;
  for (int t = 1; t <= c->heads && len < sizeof ok - 16; t++)
    if (tp_fits(c, t))
      len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", t);
  /* kv_heads is heads in gpt: reporting it would only repeat heads */
  struct { const char *name; int v; int fits; } need[] = {
      {"heads", c->heads, c->heads % tp == 0},
      {"kv_heads", c->kv_heads, c->arch == ZT_ARCH_GPT || kv_fits(c->kv_heads, tp)},
      {"ffn_dim", c->ffn_dim, c->ffn_dim % tp == 0},
      {"vocab", c->vocab, c->vocab % tp == 0}};
  int i = 0;
  while (need[i].fits) i++;
  if (!strcmp(need[i].name, "kv_heads"))
    snprintf(why, sizeof why,
             " (kv_heads must be a multiple of tp, each TP rank then holding "
             "kv_heads/tp kv heads, or tp a multiple of kv_heads, each kv head "
             "then replicated over tp/kv_heads ranks)");
  if (!strcmp(need[i].name, "vocab"))
    snprintf(pad, sizeof pad, "; or pad vocab to %d, a multiple of %d",
             (c->vocab + tp - 1) / tp * tp, tp);
  return zt_err_set(e, ZT_EINPUT,
                    "%s: tp = %d does not divide %s = %d%s; tp values that "
                    "work for this model: %s%s",
                    k, tp, need[i].name, need[i].v, why, ok, pad);
}

int zt_model_sp_check(const zt_model_cfg *c, int micro_batch, int tp, zt_err *e) {
  int N = micro_batch * c->seq;
  if (!c->sequence_parallel || tp <= 1 || N % tp == 0) return ZT_OK;
  return zt_err_set(e, ZT_EINPUT,
                    "parallel.sequence_parallel: the %d rows of a micro-batch "
                    "(micro_batch %d * seq %d) do not split evenly over tp = %d "
                    "ranks; use a micro_batch or seq that makes micro_batch*seq "
                    "a multiple of %d, or sequence_parallel = false",
                    N, micro_batch, c->seq, tp, tp);
}

/* How the TP group cuts a tensor (Megatron): whole on every rank; by output
 * rows (column-parallel, and vocab-parallel tables); by output rows in
 * q,k,v thirds (gpt's fused qkv); by input columns (row-parallel); by kv
 * heads (llama's k and v: in tp slices, or in kv_heads slices each
 * replicated over tp/kv_heads ranks when tp > kv_heads). */
typedef enum { WHOLE, ROWS, ROWS_QKV, COLS, ROWS_KV } cut;

/* Appends one tensor; returns its index. */
static int add(zt_model *m, cut how, zt_init_kind init, float std, int ndim,
               int64_t d0, int64_t d1, const char *fmt, int layer) {
  zt_param *p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  snprintf(p->t.name, sizeof p->t.name, fmt, layer);
  p->t.dtype = ZT_F32;
  p->t.ndim = ndim;
  p->t.shape[0] = d0;
  p->t.shape[1] = d1;
  int count = how == WHOLE ? 1 : how == ROWS_KV ? m->tp_size / m->kv_rep : m->tp_size;
  p->t.shard = (zt_shard){.dim = how == WHOLE ? -1 : how == COLS, .count = count,
                          .groups = how == ROWS_QKV ? 3 : 1};
  p->t.shard.index = zt_shard_index_at(&p->t, m->tp_rank, m->tp_size);
  p->t.offset = m->numel;
  p->here = 1;
  int64_t ls[ZT_MAX_DIMS];
  zt_shard_local_shape(&p->t, ls);
  p->t.numel = ls[0] * ls[1] * ls[2] * ls[3];
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
  if (!rc) rc = zt_model_tp_check(cfg, tp_size, e);
  if (rc) return rc;
  if (tp_rank < 0 || tp_rank >= tp_size)
    return zt_err_set(e, ZT_ERUNTIME, "tp rank %d outside the group of %d", tp_rank, tp_size);
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  m->tp_size = tp_size;
  m->tp_rank = tp_rank;
  const zt_model_cfg *c = &m->cfg;
  int gpt = c->arch == ZT_ARCH_GPT, C = c->dim, L = c->layers, F = c->ffn_dim;
  m->hd = C / c->heads;
  m->heads = c->heads / tp_size;
  /* tp > kv_heads (llama): one kv head, shared with the tp/kv_heads ranks
   * whose query heads read it */
  m->kv_rep = c->kv_heads < tp_size ? tp_size / c->kv_heads : 1;
  m->kv_heads = c->kv_heads * m->kv_rep / tp_size;
  m->att_dim = m->heads * m->hd;
  m->qkv_rows = (m->heads + 2 * m->kv_heads) * m->hd;
  m->hidden = F / tp_size;
  m->fc_rows = gpt ? m->hidden : 2 * m->hidden;
  m->vocab_local = c->vocab / tp_size;
  m->vocab_start = tp_rank * m->vocab_local;
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
  m->embed_tok = add(m, ROWS, ZT_INIT_NORMAL, sd, 2, c->vocab, C, "embed.tokens", 0);
  m->embed_pos = gpt ? add(m, WHOLE, ZT_INIT_NORMAL, sd, 2, c->seq, C, "embed.positions", 0) : -1;
  for (int l = 0; l < L; l++) {
    zt_block_params *b = &m->blocks[l];
    memset(b, 0xff, sizeof *b); /* every index -1 */
    start_unit(m);
    b->norm1_w = add(m, WHOLE, ZT_INIT_ONES, 0, 1, C, 0, "blocks.%d.norm1.weight", l);
    if (gpt) b->norm1_b = add(m, WHOLE, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.norm1.bias", l);
    if (gpt) { /* local rows: [q slice; k slice; v slice], as attn_fwd reads them */
      b->qkv_w = add(m, ROWS_QKV, ZT_INIT_NORMAL, sd, 2, 3 * C, C, "blocks.%d.attn.qkv.weight", l);
      b->qkv_b = add(m, ROWS_QKV, ZT_INIT_ZEROS, 0, 1, 3 * C, 0, "blocks.%d.attn.qkv.bias", l);
    } else { /* q, k, v (local heads) adjacent: one GEMM computes all three */
      b->qkv_w = add(m, ROWS, ZT_INIT_NORMAL, sd, 2, C, C, "blocks.%d.attn.q.weight", l);
      add(m, ROWS_KV, ZT_INIT_NORMAL, sd, 2, kvr, C, "blocks.%d.attn.k.weight", l);
      add(m, ROWS_KV, ZT_INIT_NORMAL, sd, 2, kvr, C, "blocks.%d.attn.v.weight", l);
    }
    /* row-parallel biases are whole: added once, after the sum over tp */
    b->out_w = add(m, COLS, ZT_INIT_NORMAL, sd_res, 2, C, C, "blocks.%d.attn.out.weight", l);
    if (gpt) b->out_b = add(m, WHOLE, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.attn.out.bias", l);
    b->norm2_w = add(m, WHOLE, ZT_INIT_ONES, 0, 1, C, 0, "blocks.%d.norm2.weight", l);
    if (gpt) b->norm2_b = add(m, WHOLE, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.norm2.bias", l);
    if (gpt) {
      b->fc_w = add(m, ROWS, ZT_INIT_NORMAL, sd, 2, F, C, "blocks.%d.mlp.up.weight", l);
      b->fc_b = add(m, ROWS, ZT_INIT_ZEROS, 0, 1, F, 0, "blocks.%d.mlp.up.bias", l);
    } else { /* gate, up (local slices) adjacent: one GEMM computes both */
      b->fc_w = add(m, ROWS, ZT_INIT_NORMAL, sd, 2, F, C, "blocks.%d.mlp.gate.weight", l);
      add(m, ROWS, ZT_INIT_NORMAL, sd, 2, F, C, "blocks.%d.mlp.up.weight", l);
    }
    b->down_w = add(m, COLS, ZT_INIT_NORMAL, sd_res, 2, C, F, "blocks.%d.mlp.down.weight", l);
    if (gpt) b->down_b = add(m, WHOLE, ZT_INIT_ZEROS, 0, 1, C, 0, "blocks.%d.mlp.down.bias", l);
  }
  start_unit(m);
  m->final_w = add(m, WHOLE, ZT_INIT_ONES, 0, 1, C, 0, "final_norm.weight", 0);
  m->final_b = gpt ? add(m, WHOLE, ZT_INIT_ZEROS, 0, 1, C, 0, "final_norm.bias", 0) : -1;
  m->head = c->tied ? m->embed_tok
                    : add(m, ROWS, ZT_INIT_NORMAL, sd, 2, c->vocab, C, "head.weight", 0);
  return ZT_OK;
}

/* Initialisation is cut into chunks of a tensor's local elements, each
 * generated into a thread's cache-sized buffer and uploaded from there:
 * the threads share the work however many there are, and no host copy
 * of the largest tensor is needed. */
enum { INIT_CHUNK = 16384 };

typedef struct { int64_t local, global, n; } init_run;
typedef struct { init_run *r; int64_t n; } init_runs;

static void count_run(void *ctx, int64_t local, int64_t global, int64_t n) {
  (void)local, (void)global, (void)n;
  ((init_runs *)ctx)->n++;
}

static void keep_run(void *ctx, int64_t local, int64_t global, int64_t n) {
  init_runs *rs = ctx;
  rs->r[rs->n++] = (init_run){local, global, n};
}

/* Elements [lo, hi) of p's local piece into buf. Values depend only on
 * logical indices (the runs map local to logical ones), so any chunking,
 * thread count and TP cut give the same bits. Without a run table
 * (out of memory) each element is a run of its own: slower, same values. */
static void init_chunk(const zt_param *p, uint64_t key, const init_run *r, int64_t nr,
                       int64_t lo, int64_t hi, float *buf) {
  if (p->init != ZT_INIT_NORMAL) {
    float v = p->init == ZT_INIT_ONES ? 1.0f : 0.0f;
    for (int64_t j = lo; j < hi; j++) buf[j - lo] = v;
    return;
  }
  if (!r) {
    for (int64_t j = lo; j < hi; j++)
      zt_rng_normal_fill(key, (uint64_t)zt_shard_global_index(&p->t, j), 1, p->std, buf + (j - lo));
    return;
  }
  int64_t a = 0, b = nr; /* the last run starting at or before lo */
  while (b - a > 1) {
    int64_t mid = a + (b - a) / 2;
    if (r[mid].local <= lo) a = mid; else b = mid;
  }
  for (int64_t k = a, j = lo; j < hi; k++) {
    int64_t skip = j - r[k].local, n = r[k].n - skip;
    if (n > hi - j) n = hi - j;
    zt_rng_normal_fill(key, (uint64_t)(r[k].global + skip), n, p->std, buf + (j - lo));
    j += n;
  }
}

/* The part [*a, *b) of parameter p's local piece inside flat range [lo, hi). */
static int64_t clip_piece(const zt_param *p, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
  int64_t off = p->t.offset;
  *a = *b = 0;
  if (!p->here) return 0;
  *a = lo > off ? lo - off : 0;
  *b = hi < off + p->t.numel ? hi - off : p->t.numel;
  if (*b < *a) *b = *a;
  return *b - *a;
}

int zt_model_init_weights(const zt_model *m, uint64_t seed, float *dst, int64_t lo, int64_t hi,
                          zt_err *e) {
  int np = m->n_params;
  int64_t *first_chunk = malloc((size_t)(np + 1) * sizeof *first_chunk);
  int64_t *first_run = malloc((size_t)(np + 1) * sizeof *first_run);
  uint64_t *keys = malloc((size_t)(np > 0 ? np : 1) * sizeof *keys);
  if (!first_chunk || !first_run || !keys) {
    free(first_chunk), free(first_run), free(keys);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory initialising the weights");
  }
  init_runs all = {0};
  first_chunk[0] = first_run[0] = 0;
  for (int i = 0; i < np; i++) {
    const zt_param *p = &m->params[i];
    int64_t a, b, n = clip_piece(p, lo, hi, &a, &b);
    init_runs c = {0};
    if (n && p->init == ZT_INIT_NORMAL) zt_shard_runs(&p->t, &c, count_run);
    first_chunk[i + 1] = first_chunk[i] + (n + INIT_CHUNK - 1) / INIT_CHUNK;
    first_run[i + 1] = first_run[i] + c.n;
    keys[i] = zt_rng_key(seed, p->t.name);
  }
  all.r = malloc((size_t)(first_run[np] > 0 ? first_run[np] : 1) * sizeof *all.r);
  for (int i = 0; all.r && i < np; i++)
    if (first_run[i + 1] > first_run[i]) zt_shard_runs(&m->params[i].t, &all, keep_run);

  /* Threads fill host memory: dst itself where the backend's device memory
   * is host memory, else a host copy of the range that then goes over a
   * tensor at a time (worker threads make no backend calls: on a GPU they
   * would need its device current, and a copy per tensor beats a
   * synchronised copy per 16k elements). */
  int64_t chunks = first_chunk[np];
  int direct = m->be->host_visible;
  float *host = direct ? dst : malloc((size_t)(hi > lo ? hi - lo : 1) * sizeof *host);
  if (!host) {
    free(all.r), free(keys), free(first_run), free(first_chunk);
    return zt_err_set(e, ZT_ERUNTIME, "out of host memory initialising %lld weights",
                      (long long)(hi - lo));
  }
#pragma omp parallel
  {
    int i = 0;
    /* dynamic: a thread that another process slows down takes fewer */
#pragma omp for schedule(dynamic, 8)
    for (int64_t c = 0; c < chunks; c++) {
      while (first_chunk[i + 1] <= c) i++; /* chunks come in increasing order per thread */
      while (first_chunk[i] > c) i--;
      const zt_param *p = &m->params[i];
      int64_t pa, pb;
      clip_piece(p, lo, hi, &pa, &pb);
      int64_t a = pa + (c - first_chunk[i]) * INIT_CHUNK;
      int64_t b = a + INIT_CHUNK < pb ? a + INIT_CHUNK : pb;
      init_chunk(p, keys[i], all.r ? all.r + first_run[i] : NULL, first_run[i + 1] - first_run[i],
                 a, b, host + (p->t.offset + a - lo));
    }
  }
  if (!direct) {
    /* what no tensor covers (another stage's) stays as dst has it */
    for (int i = 0; i < np; i++) {
      int64_t pa, pb;
      if (clip_piece(&m->params[i], lo, hi, &pa, &pb) == 0) continue;
      const zt_param *p = &m->params[i];
      m->be->copy(m->stream, dst + (p->t.offset + pa - lo), host + (p->t.offset + pa - lo),
                  (size_t)(pb - pa) * sizeof *host);
    }
    m->be->stream_sync(m->stream); /* host is freed next */
    free(host);
  }
  free(all.r);
  free(keys);
  free(first_run);
  free(first_chunk);
  return ZT_OK;
}

int zt_model_find(const zt_model *m, const char *name) {
  for (int i = 0; i < m->n_params; i++)
    if (!strcmp(m->params[i].t.name, name)) return i;
  return -1;
}

double zt_model_cfg_flops_per_token(const zt_model_cfg *c) {
  /* PaLM appendix B: 6 per parameter that takes part in a matmul (everything
   * but embeddings and norms, head included) plus 12*L*C*T for attention
   * scores and values. Logical sizes: the same for any TP cut. */
  double hd = (double)(c->dim / c->heads); /* as zt_model_init sizes it */
  double qkv = (double)(c->heads + 2 * c->kv_heads) * hd;
  double fc = c->arch == ZT_ARCH_GPT ? c->ffn_dim : 2.0 * c->ffn_dim;
  double per_layer = (double)c->dim * (qkv + c->dim + fc + c->ffn_dim);
  double matmul = c->layers * per_layer;
  matmul += (double)c->vocab * c->dim;
  return 6 * matmul + 12.0 * c->layers * c->dim * c->seq;
}

double zt_model_flops_per_token(const zt_model *m) { return zt_model_cfg_flops_per_token(&m->cfg); }
