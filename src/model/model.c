/* model: memory of a model instance — the flat parameter and gradient
 * buffers of the units this rank holds, one arena for the activation
 * slots of its chunks and the scratch of a pass — and the passes of a
 * chunk (layers.c does the layers), with the unit hooks around each use of
 * a unit's weights or gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/layers.h"

/* Carves consecutive pieces out of one allocation: one pass with base NULL
 * measures, the second assigns. */
typedef struct { char *base; size_t used; } carver;

static void *carve(carver *cv, size_t bytes) {
  void *p = cv->base ? cv->base + cv->used : NULL;
  cv->used += (bytes + 63) / 64 * 64;
  return p;
}

/* Whether block l recomputes its activations in backward. */
static int recomputed(const zt_model *m, int l) {
  return m->cfg.recompute && m->cfg.recompute[l];
}

/* A block's saved activations: norm inputs and statistics Ns rows (this
 * rank's share with sequence parallelism), norm outputs, the inputs of
 * column-parallel layers, all N rows. */
static void carve_acts(zt_model *m, carver *cv, zt_block_acts *a) {
  const zt_model_cfg *c = &m->cfg;
  size_t N = (size_t)m->B * c->seq, Ns = (size_t)m->Ns, C = c->dim, f = sizeof(float);
  size_t x = zt_dtype_size(m->dt);
  a->ln1 = carve(cv, N * C * x);
  a->ln1_mean = carve(cv, Ns * f);
  a->ln1_rstd = carve(cv, Ns * f);
  a->qkv = carve(cv, N * m->qkv_rows * x);
  a->att = carve(cv, N * m->att_dim * x);
  a->lse = carve(cv, (size_t)m->B * m->heads * c->seq * f);
  a->mid = carve(cv, Ns * C * x);
  a->ln2 = carve(cv, N * C * x);
  a->ln2_mean = carve(cv, Ns * f);
  a->ln2_rstd = carve(cv, Ns * f);
  a->fc = carve(cv, N * m->fc_rows * x);
  a->act = carve(cv, N * m->hidden * x);
}

/* One slot: the residual stream (each block's input, Ns rows) and the
 * saved activations of the blocks that do not recompute theirs; those
 * that do share one set (m->racts), filled again in backward. The
 * forward of a recomputed block writes there too, overwritten by the next
 * one: only its input, res[i], is kept. */
static void carve_slot(zt_model *m, carver *cv, const zt_chunk *k, zt_slot *s) {
  const zt_model_cfg *c = &m->cfg;
  size_t N = (size_t)m->B * c->seq, Ns = (size_t)m->Ns, C = c->dim, f = sizeof(float);
  size_t x = zt_dtype_size(m->dt);
  int nb = k->last - k->first + 1;
  for (int i = 0; i <= nb; i++) s->res[i] = carve(cv, Ns * C * x);
  for (int i = 0; i < nb; i++) {
    zt_block_acts *a = &s->acts[i];
    if (!recomputed(m, k->first + i)) {
      carve_acts(m, cv, a);
    } else {
      *a = m->racts;
      /* a split schedule's W runs after other blocks have been recomputed:
       * the inputs of its weight gradients stay here until then */
      if (m->split) {
        a->ln1 = carve(cv, N * C * x);
        a->att = carve(cv, N * m->att_dim * x);
        a->ln2 = carve(cv, N * C * x);
        a->act = carve(cv, N * m->hidden * x);
      }
    }
    if (!m->split) continue;
    zt_block_saved *sv = &s->saved[i];
    sv->dy_down = carve(cv, N * C * x);
    sv->dfc = carve(cv, N * m->fc_rows * x);
    sv->dy_out = carve(cv, N * C * x);
    sv->dqkv = carve(cv, N * m->qkv_rows * x);
    sv->dnorm = carve(cv, 4 * C * f);
  }
  if (k->head) {
    s->lnf = carve(cv, N * C * x);
    s->lnf_mean = carve(cv, Ns * f);
    s->lnf_rstd = carve(cv, Ns * f);
    s->logits = carve(cv, N * m->vocab_local * x);
    s->losses = carve(cv, N * f);
    if (m->split) s->dnorm_final = carve(cv, 2 * C * f);
  }
  if (k->embed && m->split) s->dy_embed = carve(cv, N * C * x);
  s->tokens = carve(cv, N * sizeof(int32_t));
  s->targets = carve(cv, N * sizeof(int32_t));
}

/* The slots, then the scratch one pass at a time uses. */
static void carve_all(zt_model *m, carver *cv) {
  const zt_model_cfg *c = &m->cfg;
  size_t N = (size_t)m->B * c->seq, Ns = (size_t)m->Ns, C = c->dim, f = sizeof(float);
  size_t x = zt_dtype_size(m->dt);
  int any = 0;
  zt_model_bytes *z = &m->bytes;
  z->kept_blocks = z->recomputed_blocks = 0;
  for (int k = 0; k < m->n_chunks; k++)
    for (int l = m->chunks[k].first; l <= m->chunks[k].last; l++) {
      any |= recomputed(m, l);
      *(recomputed(m, l) ? &z->recomputed_blocks : &z->kept_blocks) += m->chunks[k].n_slots;
    }
  size_t at = cv->used;
  if (any) carve_acts(m, cv, &m->racts); /* before the slots, which point at it */
  z->acts_recompute = cv->used - at;
  at = cv->used;
  for (int k = 0; k < m->n_chunks; k++)
    for (int s = 0; s < m->chunks[k].n_slots; s++)
      carve_slot(m, cv, &m->chunks[k], &m->chunks[k].slots[s]);
  z->acts_slots = cv->used - at;
  at = cv->used;
  m->xent_stats = carve(cv, 3 * N * f);
  m->dres = carve(cv, Ns * C * x);
  m->dln = carve(cv, N * C * x);
  m->datt = carve(cv, N * m->att_dim * x);
  m->dqkv = carve(cv, N * m->qkv_rows * x);
  m->dfc = carve(cv, N * m->fc_rows * x);
  m->dact = carve(cv, N * m->hidden * x);
  m->dkv_w = carve(cv, m->kv_rep > 1 ? (size_t)(m->qkv_rows - m->att_dim) * C * f : 0);
  m->dnorm = carve(cv, m->sp ? 4 * C * f : 0);
  m->rope_cs = carve(cv, (size_t)c->seq * m->hd * f);
  z->scratch = cv->used - at;
  z->arena = cv->used;
  /* one block's part of a slot, kept and recomputed (measured on a carver
   * of its own: the same carve calls) */
  carver one = {0};
  zt_block_acts a;
  carve_acts(m, &one, &a);
  z->block_kept = one.used;
  z->block_input = (Ns * C * x + 63) / 64 * 64;
}

void zt_model_rope_rows(const zt_model *m, int t0, int n, float *cs) {
  int half = m->hd / 2;
  for (int t = 0; t < n; t++)
    for (int i = 0; i < half; i++) {
      double freq = pow((double)m->cfg.rope_theta, -2.0 * i / m->hd);
      cs[t * half + i] = (float)cos((t0 + t) * freq);
      cs[(size_t)n * half + t * half + i] = (float)sin((t0 + t) * freq);
    }
}

/* the tables of every position, for the passes */
static void upload_rope(zt_model *m) {
  int T = m->cfg.seq;
  float *cs = malloc((size_t)T * m->hd * sizeof *cs);
  zt_model_rope_rows(m, 0, T, cs);
  m->be->copy(m->stream, m->rope_cs, cs, (size_t)T * m->hd * sizeof *cs);
  m->be->stream_sync(m->stream); /* before cs is freed */
  free(cs);
}

/* Keeps in the flat buffer only the units of this rank's chunks: offsets
 * renumbered over them, the others' parameters marked absent (offset -1)
 * and their units empty. The table itself keeps every tensor. */
static void select_units(zt_model *m) {
  int L = m->cfg.layers;
  char *keep = calloc((size_t)m->n_units, 1);
  if (!keep) return;
  keep[0] = m->chunks[0].embed;
  keep[L + 1] = m->chunks[m->n_chunks - 1].head;
  for (int k = 0; k < m->n_chunks; k++)
    for (int l = m->chunks[k].first; l <= m->chunks[k].last; l++) keep[l + 1] = 1;
  int64_t off = 0;
  for (int u = 0, i = 0; u < m->n_units; u++) {
    m->unit_start[u] = off;
    m->unit_numel[u] = 0;
    for (; i < m->n_params && m->param_unit[i] == u; i++) {
      zt_param *p = &m->params[i];
      p->here = keep[u];
      p->t.offset = keep[u] ? off : -1;
      if (keep[u]) off += p->t.numel, m->unit_numel[u] += p->t.numel;
    }
  }
  m->numel = off;
  free(keep);
}

/* Chunks and their slot tables (host), from the stage description. */
static int make_chunks(zt_model *m, const zt_stage_cfg *st) {
  int whole[3] = {0, m->cfg.layers - 1, 1};
  zt_stage_cfg all = {.n_chunks = 1, .first = &whole[0], .last = &whole[1],
                      .slots = &whole[2], .embed = 1, .head = 1};
  if (!st) st = &all;
  m->n_chunks = st->n_chunks;
  m->split = st->split;
  m->chunks = calloc((size_t)st->n_chunks, sizeof *m->chunks);
  if (!m->chunks) return -1;
  for (int c = 0; c < st->n_chunks; c++) {
    zt_chunk *k = &m->chunks[c];
    k->first = st->first[c];
    k->last = st->last[c];
    k->embed = c == 0 && st->embed;
    k->head = c == st->n_chunks - 1 && st->head;
    k->n_slots = st->slots[c] > 0 ? st->slots[c] : 1;
    k->slots = calloc((size_t)k->n_slots, sizeof *k->slots);
    if (!k->slots) return -1;
    int nb = k->last - k->first + 1;
    for (int s = 0; s < k->n_slots; s++) {
      zt_slot *sl = &k->slots[s];
      sl->res = calloc((size_t)nb + 1, sizeof *sl->res);
      sl->acts = calloc((size_t)nb, sizeof *sl->acts);
      sl->saved = calloc((size_t)nb, sizeof *sl->saved);
      if (!sl->res || !sl->acts || !sl->saved) return -1;
    }
  }
  return 0;
}

int zt_model_plan(zt_model *m, const zt_model_cfg *cfg, const zt_backend *be, int micro_batch,
                  int tp_size, int tp_rank, const zt_stage_cfg *stage, zt_err *e) {
  int rc = zt_model_layout(m, cfg, tp_size, tp_rank, e);
  if (!rc) rc = zt_model_sp_check(cfg, micro_batch, m->tp_size, e);
  if (rc) return rc;
  m->be = be;
  m->dt = cfg->precision;
  int N = micro_batch * cfg->seq;
  m->sp = cfg->sequence_parallel && m->tp_size > 1;
  m->Ns = m->sp ? N / m->tp_size : N;
  m->n0 = m->sp ? m->tp_rank * m->Ns : 0;
  m->B = micro_batch;
  if (make_chunks(m, stage)) {
    zt_model_free(m);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory (model tables)");
  }
  select_units(m);
  zt_model_bytes *z = &m->bytes;
  /* a tied head on a stage without the embedding computes with a copy:
   * fp32 weights and gradients, and in 16 bits the copy computed with */
  z->tied_copy = cfg->tied && m->chunks[m->n_chunks - 1].head && !m->chunks[0].embed;
  int64_t tn = z->tied_copy ? m->params[m->embed_tok].t.numel : 0;
  z->tied_numel = tn;
  z->tied = (size_t)tn * (2 * sizeof(float) + (m->dt == ZT_F32 ? 0 : zt_dtype_size(m->dt)));
  z->host = (size_t)N * sizeof(float) + (m->sp ? 2 * (size_t)m->tp_size * sizeof(int) : 0);
  carver cv = {0};
  carve_all(m, &cv);
  m->act_bytes = z->arena;
  return ZT_OK;
}

int zt_model_init(zt_model *m, const zt_model_cfg *cfg, const zt_backend *be,
                  int micro_batch, zt_comm *tp, const zt_stage_cfg *stage, zt_err *e) {
  int rc = zt_model_plan(m, cfg, be, micro_batch, tp ? tp->size : 1, tp ? tp->rank : 0, stage, e);
  if (rc) return rc;
  m->tp = tp;
  if (m->kv_rep > 1) { /* ranks tp_rank / kv_rep share kv head tp_rank / kv_rep */
    m->kv = malloc(sizeof *m->kv);
    zt_comm scratch; /* the split is collective: join it even without memory */
    zt_comm_split(tp, "tp.kv", m->tp_rank / m->kv_rep, m->tp_rank, m->kv ? m->kv : &scratch);
    if (!m->kv) zt_comm_free(&scratch);
  }
  /* what zt_model_plan counted, allocated */
  const zt_model_bytes *z = &m->bytes;
  m->host_losses = malloc((size_t)micro_batch * cfg->seq * sizeof(float));
  if (m->sp) { /* every rank's rows of an [N, C] tensor, for the collectives */
    m->sp_counts = malloc((size_t)m->tp_size * sizeof *m->sp_counts);
    m->sp_displs = malloc((size_t)m->tp_size * sizeof *m->sp_displs);
    for (int r = 0; m->sp_counts && m->sp_displs && r < m->tp_size; r++) {
      m->sp_counts[r] = m->Ns * cfg->dim;
      m->sp_displs[r] = r * m->Ns * cfg->dim;
    }
  }
  m->arena = be->alloc(ZT_MEM_DEVICE, z->arena);
  m->stream = be->stream_new();
  size_t tied_bytes = (size_t)z->tied_numel * sizeof(float);
  if (z->tied_copy) {
    m->tied_w = be->alloc(ZT_MEM_DEVICE, tied_bytes);
    m->tied_g = be->alloc(ZT_MEM_DEVICE, tied_bytes);
    m->tied_wc = m->dt == ZT_F32 ? m->tied_w
                                 : be->alloc(ZT_MEM_DEVICE, (size_t)z->tied_numel *
                                                                zt_dtype_size(m->dt));
  }
  if (!m->host_losses || !m->arena || !m->stream ||
      (z->tied_copy && (!m->tied_w || !m->tied_g || !m->tied_wc)) || (m->kv_rep > 1 && !m->kv) ||
      (m->sp && (!m->sp_counts || !m->sp_displs))) {
    double gib = ((double)z->tied + z->arena) / (1 << 30);
    size_t arena = z->arena;
    zt_model_free(m);
    return zt_err_set(e, ZT_EINPUT,
                      "out of memory: the model needs %.2f GiB on backend %s "
                      "(activations for micro_batch %d: %.2f GiB); try a smaller micro_batch",
                      gib, be->name, micro_batch, (double)arena / (1 << 30));
  }
  carver cv = {.base = (char *)m->arena};
  carve_all(m, &cv);
  if (cfg->arch == ZT_ARCH_LLAMA) upload_rope(m);
  return ZT_OK;
}

void zt_model_free(zt_model *m) {
  if (m->be) {
    m->be->free(ZT_MEM_DEVICE, m->arena);
    m->be->free(ZT_MEM_DEVICE, m->tied_w);
    m->be->free(ZT_MEM_DEVICE, m->tied_g);
    if (m->tied_wc != m->tied_w) m->be->free(ZT_MEM_DEVICE, m->tied_wc);
    if (m->stream) m->be->stream_free(m->stream);
  }
  for (int c = 0; m->chunks && c < m->n_chunks; c++) {
    for (int s = 0; m->chunks[c].slots && s < m->chunks[c].n_slots; s++) {
      free(m->chunks[c].slots[s].res);
      free(m->chunks[c].slots[s].acts);
      free(m->chunks[c].slots[s].saved);
    }
    free(m->chunks[c].slots);
  }
  free(m->chunks);
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
  free(m->host_losses);
  memset(m, 0, sizeof *m);
}

static void before(zt_model *m, int unit, zt_phase ph) {
  if (m->hooks.before) m->hooks.before(m->hooks.ctx, m, unit, ph);
}

static void after(zt_model *m, int unit, zt_phase ph) {
  if (m->hooks.after) m->hooks.after(m->hooks.ctx, m, unit, ph);
}

/* The head's phases use the final unit and, for a head tied to the
 * embedding on the same rank, unit 0 as well (the tied copy is no unit). */
static void head_hooks(zt_model *m, zt_phase ph, int start) {
  int fin = m->cfg.layers + 1, hu = m->tied_w ? fin : m->param_unit[m->head];
  (start ? before : after)(m, fin, ph);
  if (hu != fin) (start ? before : after)(m, hu, ph);
}

void *zt_model_input(zt_model *m, int c, int s) { return m->chunks[c].slots[s].res[0]; }

void zt_model_bind(zt_model *m, void *w, float *g) {
  size_t x = zt_dtype_size(m->dt);
  for (int u = 0; u < m->n_units; u++) {
    m->unit_w[u] = (char *)w + (size_t)m->unit_start[u] * x;
    m->unit_g[u] = g + m->unit_start[u];
  }
}

void zt_model_sync_tied(zt_model *m) {
  if (m->dt == ZT_F32 || !m->tied_w) return;
  m->be->convert(m->stream, m->dt, m->tied_wc, ZT_F32, m->tied_w,
                 (size_t)m->params[m->embed_tok].t.numel);
}

int64_t zt_model_state_bytes(const zt_model *m) { return (int64_t)m->bytes.tied; }

/* The backend scratch of a linear layer's three GEMMs (src/model/layers.c,
 * N = B * seq rows): forward y = x W^T [N, out, in], weight gradient
 * dW += dy^T x [out, in, N] into fp32, input gradient dx = dy W [N, in, out]. */
static size_t linear_scratch(const zt_model *m, int out, int in) {
  const zt_backend *be = m->be;
  int N = m->B * m->cfg.seq;
  size_t s[3] = {be->gemm_scratch(m->dt, m->dt, N, out, in),
                 be->gemm_scratch(m->dt, ZT_F32, out, in, N),
                 be->gemm_scratch(m->dt, m->dt, N, in, out)};
  size_t most = s[0] > s[1] ? s[0] : s[1];
  return most > s[2] ? most : s[2];
}

/* The shapes are the blocks' linear layers (with kv_rep > 1 the qkv weight
 * gradient is two GEMMs, q and kv) and the head's, where this rank runs
 * them: the calls of layers.c, which a change there must keep in step. */
int64_t zt_model_gemm_scratch(const zt_model *m) {
  int C = m->cfg.dim, N = m->B * m->cfg.seq, blocks = 0, head = 0;
  for (int i = 0; i < m->n_chunks; i++) {
    blocks |= m->chunks[i].first <= m->chunks[i].last;
    head |= m->chunks[i].head;
  }
  size_t most = 0, s[7] = {0};
  if (blocks) {
    s[0] = linear_scratch(m, m->qkv_rows, C);
    s[1] = linear_scratch(m, C, m->att_dim);
    s[2] = linear_scratch(m, m->fc_rows, C);
    s[3] = linear_scratch(m, C, m->hidden);
    if (m->kv_rep > 1) {
      s[4] = m->be->gemm_scratch(m->dt, ZT_F32, m->att_dim, C, N);
      s[5] = m->be->gemm_scratch(m->dt, ZT_F32, m->qkv_rows - m->att_dim, C, N);
    }
  }
  if (head) s[6] = linear_scratch(m, m->vocab_local, C);
  for (int i = 0; i < 7; i++) most = s[i] > most ? s[i] : most;
  return (int64_t)most;
}

const void *zt_model_output(const zt_model *m, int c, int s) {
  const zt_chunk *k = &m->chunks[c];
  return k->slots[s].res[k->last - k->first + 1];
}

double zt_model_fwd(zt_model *m, int c, int s, const int32_t *tokens,
                    const int32_t *targets, float dscale) {
  zt_chunk *k = &m->chunks[c];
  zt_slot *sl = &k->slots[s];
  size_t N = (size_t)m->B * m->cfg.seq;
  int nb = k->last - k->first + 1;
  if (k->embed) {
    m->be->copy(m->stream, sl->tokens, tokens, N * sizeof *tokens);
    m->be->stream_sync(m->stream); /* the caller fills tokens again */
    before(m, 0, ZT_PHASE_FWD);
    zt_layers_embed_fwd(m, sl);
    after(m, 0, ZT_PHASE_FWD);
  }
  for (int i = 0; i < nb; i++) {
    int l = k->first + i;
    before(m, l + 1, ZT_PHASE_FWD);
    zt_layers_block_fwd(m, sl, i, l, 0);
    after(m, l + 1, ZT_PHASE_FWD);
  }
  if (!k->head) return 0;
  m->be->copy(m->stream, sl->targets, targets, N * sizeof *targets);
  m->be->stream_sync(m->stream);
  head_hooks(m, ZT_PHASE_FWD, 1);
  double sum = zt_layers_head_fwd(m, sl, nb, dscale);
  head_hooks(m, ZT_PHASE_FWD, 0);
  return sum;
}

void zt_model_bwd(zt_model *m, int c, int s, int input_only) {
  zt_chunk *k = &m->chunks[c];
  zt_slot *sl = &k->slots[s];
  int nb = k->last - k->first + 1;
  zt_phase ph = input_only ? ZT_PHASE_BWD_INPUT : ZT_PHASE_BWD;
  if (k->head) {
    head_hooks(m, ph, 1);
    zt_layers_head_bwd(m, sl, nb, input_only);
    head_hooks(m, ph, 0);
  }
  for (int i = nb - 1; i >= 0; i--) {
    int l = k->first + i;
    before(m, l + 1, ph);
    if (recomputed(m, l)) zt_layers_block_fwd(m, sl, i, l, 1);
    zt_layers_block_bwd(m, sl, i, l, input_only);
    after(m, l + 1, ph);
  }
  if (!k->embed) return;
  const void *dy = zt_layers_rows_all(m, m->dres);
  if (input_only) { /* the embedding has only a weight gradient: all of it is W's */
    m->be->copy(m->stream, sl->dy_embed, dy,
                (size_t)m->B * m->cfg.seq * m->cfg.dim * zt_dtype_size(m->dt));
    return;
  }
  before(m, 0, ph);
  zt_layers_embed_wgrad(m, sl, dy);
  after(m, 0, ph);
}

void zt_model_wgrad(zt_model *m, int c, int s) {
  zt_chunk *k = &m->chunks[c];
  zt_slot *sl = &k->slots[s];
  int nb = k->last - k->first + 1;
  if (k->head) {
    head_hooks(m, ZT_PHASE_BWD_WEIGHT, 1);
    zt_layers_head_wgrad(m, sl);
    head_hooks(m, ZT_PHASE_BWD_WEIGHT, 0);
  }
  for (int i = nb - 1; i >= 0; i--) {
    int l = k->first + i;
    before(m, l + 1, ZT_PHASE_BWD_WEIGHT);
    zt_layers_block_wgrad(m, sl, i, l);
    after(m, l + 1, ZT_PHASE_BWD_WEIGHT);
  }
  if (k->embed) {
    before(m, 0, ZT_PHASE_BWD_WEIGHT);
    zt_layers_embed_wgrad(m, sl, sl->dy_embed);
    after(m, 0, ZT_PHASE_BWD_WEIGHT);
  }
}

double zt_model_step(zt_model *m, const int32_t *tokens, const int32_t *targets,
                     int backward, float dscale) {
  double sum = zt_model_fwd(m, 0, 0, tokens, targets, backward ? dscale : 0);
  if (backward) zt_model_bwd(m, 0, 0, 0);
  return sum;
}

uint64_t zt_model_tp_bytes(const zt_model *m) {
  return (m->tp ? zt_comm_total_bytes(m->tp) : 0) + (m->kv ? zt_comm_total_bytes(m->kv) : 0);
}
