/* zero_layout: how the ZeRO engine lays out its states and buckets, as
 * pure functions of the policy and the units (zero_impl.h): zt_zero_new
 * allocates by them and zt_zero_plan_bytes counts by them, so the memory
 * planner's figures are the allocations. */
#include <stdlib.h>
#include <string.h>

#include "parallel/offload.h"
#include "parallel/zero_impl.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int64_t zt_zero_part(int64_t numel, int dp, int r, int64_t a, int64_t b, int64_t *from) {
  int64_t S = (numel + dp - 1) / dp;
  int64_t lo = min64((int64_t)r * S, numel), hi = min64((int64_t)(r + 1) * S, numel);
  int64_t s = max64(a, lo), t = min64(b, hi);
  if (from) *from = s;
  return t > s ? t - s : 0;
}

/* Buckets in backward order: units numbered down from the last, packed up
 * to bucket_bytes (at least one unit each) within a group; the tied unit
 * alone, since its gradients are written both first (by the head) and
 * last. Empty units belong to no bucket. Fills b[] (room for u->n) and
 * bucket_of; returns how many. */
int zt_zero_pack_buckets(const zt_zero_units *u, int64_t bucket_bytes, zt_bucket *bk,
                        int *bucket_of) {
  int nb = 0;
  int64_t cap = bucket_bytes / (int64_t)sizeof(float);
  for (int i = u->n - 1; i >= 0; i--) {
    bucket_of[i] = -1;
    if (!u->numel[i]) continue;
    zt_bucket *b = nb ? &bk[nb - 1] : NULL;
    int alone = i == u->tied_unit || (b && b->first == u->tied_unit);
    int gi = u->group ? u->group[i] : 0, gb = b && u->group ? u->group[b->first] : 0;
    if (!b || alone || b->hi - u->start[i] > cap || gi != gb) {
      b = &bk[nb++];
      b->first = i;
      b->hi = u->start[i] + u->numel[i];
    }
    b->last = i;
    b->lo = u->start[i];
    bucket_of[i] = nb - 1;
  }
  return nb;
}

/* The bucket buffers' sizes, in elements: the largest bucket, and the
 * largest part of one that dp rank `rank` owns. */
void zt_zero_bucket_extent(const zt_bucket *bk, int nb, int64_t numel, int dp, int rank,
                          int64_t *buf, int64_t *recv) {
  *buf = *recv = 0;
  for (int i = 0; i < nb; i++) {
    int64_t own = zt_zero_part(numel, dp, rank, bk[i].lo, bk[i].hi, NULL);
    if (bk[i].hi - bk[i].lo > *buf) *buf = bk[i].hi - bk[i].lo;
    if (own > *recv) *recv = own;
  }
}

/* Whether the policy moves any state off the device. */
int zt_zero_offloads(const zt_offload_cfg *c) {
  for (int k = 0; k < ZT_OFF_KINDS; k++)
    if (zt_offload_any(c, (zt_offload_kind)k)) return 1;
  return 0;
}

/* The offload store's layout for dp rank r: the units over the range the
 * optimizer updates (the whole buffer at stage 0, the shard from 1). */
zt_offload_layout zt_zero_offload_layout(const zt_zero_cfg *c, const zt_zero_units *u,
                                        int64_t numel, int dp, int r) {
  int64_t lo = 0, n = numel;
  if (c->stage) n = zt_zero_part(numel, dp, r, 0, numel, &lo);
  /* from stage 2 the buckets' reductions make the gradients final during
   * backward, so the host's share can go down then (ZeRO-Offload) */
  return (zt_offload_layout){.n_units = u->n, .start = u->start, .numel = u->numel, .lo = lo,
                             .hi = lo + n, .param_dt = c->param_dtype,
                             .master_is_param = c->param_dtype == ZT_F32,
                             .grads_ahead = c->stage >= 2, .rank = r};
}

int zt_zero_param_split(const zt_zero_cfg *c, const zt_zero_units *u, int64_t numel, int dp,
                        int r, int64_t n[ZT_PLACES], int64_t *stage) {
  const unsigned char *pl = c->offload.place[ZT_OFF_PARAMS];
  for (int q = 0; q < ZT_PLACES; q++) n[q] = 0;
  *stage = 0;
  if (c->stage < 3 || !zt_offload_any(&c->offload, ZT_OFF_PARAMS)) return 0;
  for (int i = 0; i < u->n; i++) {
    int64_t m = zt_zero_part(numel, dp, r, u->start[i], u->start[i] + u->numel[i], NULL);
    n[pl[i]] += m;
    if (pl[i] != ZT_PLACE_DEVICE && m > *stage) *stage = m;
  }
  return 1;
}

/* How the stage holds state k without offload: whole or as the shard, in
 * what dtype, where; *alias: it is another state's memory (fp32 PARAM is
 * MASTER). An offload policy moves MASTER and the moments into an offload
 * store (offload_states, offload_layout). */
void zt_zero_state_layout(const zt_zero_cfg *c, zt_state_kind k, int *whole, zt_dtype *dt,
                         zt_mem_kind *mem, int *alias) {
  int st = c->stage, half = c->param_dtype != ZT_F32;
  *dt = ZT_F32, *mem = ZT_MEM_DEVICE, *alias = 0;
  switch (k) {
    case ZT_STATE_PARAM: *whole = st < 3, *dt = c->param_dtype; break;
    /* the masters live where the policy places them, unless the passes
     * compute with them (fp32): then they are PARAM, on the device */
    case ZT_STATE_MASTER: *whole = half ? st == 0 : st < 3, *alias = !half; break;
    case ZT_STATE_GRAD: *whole = st < 2; break;
    default: *whole = st == 0; /* the moments */
  }
}

int zt_zero_plan_bytes(const zt_zero_cfg *cfg, int dp, int dp_rank, int64_t numel,
                       const zt_zero_units *units, zt_zero_sizes *out) {
  memset(out, 0, sizeof *out);
  int64_t S = (numel + dp - 1) / dp;
  for (int k = 0; k < ZT_STATE_KINDS; k++) {
    int whole, alias;
    zt_dtype dt;
    zt_mem_kind mem;
    zt_zero_state_layout(cfg, (zt_state_kind)k, &whole, &dt, &mem, &alias);
    out->elems[k] = whole ? numel : S;
    out->state[k] = alias ? 0 : out->elems[k] * (int64_t)zt_dtype_size(dt);
    out->placed[k][mem == ZT_MEM_DEVICE ? ZT_PLACE_DEVICE : ZT_PLACE_CPU] = out->state[k];
  }
  int64_t pn[ZT_PLACES], pstage;
  if (zt_zero_param_split(cfg, units, numel, dp, dp_rank, pn, &pstage)) {
    size_t x = zt_dtype_size(cfg->param_dtype);
    out->placed[ZT_STATE_PARAM][ZT_PLACE_DEVICE] = pn[ZT_PLACE_DEVICE] * (int64_t)x;
    out->placed[ZT_STATE_PARAM][ZT_PLACE_CPU] = pn[ZT_PLACE_CPU] * (int64_t)x;
    out->state[ZT_STATE_PARAM] = (pn[ZT_PLACE_DEVICE] + pn[ZT_PLACE_CPU]) * (int64_t)x;
    out->param_stage = PARAM_STAGE_BUFFERS * pstage * (int64_t)x;
  }
  if (zt_zero_offloads(&cfg->offload)) { /* the masters and moments as the store lays them out */
    static const zt_state_kind kinds[ZT_OFF_STATES] = {ZT_STATE_MASTER, ZT_STATE_EXP_AVG,
                                                       ZT_STATE_EXP_AVG_SQ};
    zt_offload_layout lay = zt_zero_offload_layout(cfg, units, numel, dp, dp_rank);
    zt_offload_sizes o;
    if (zt_offload_plan_bytes(&cfg->offload, &lay, &o)) return -1;
    out->offload_staging = o.staging;
    out->placed[ZT_STATE_PARAM][ZT_PLACE_NVME] = o.param_file;
    out->placed[ZT_STATE_GRAD][ZT_PLACE_CPU] = o.grads_host;
    out->state[ZT_STATE_GRAD] += o.grads_host;
    for (int s = 0; s < ZT_OFF_STATES; s++) {
      zt_state_kind k = kinds[s];
      out->elems[k] = lay.hi - lay.lo;
      out->state[k] = o.state[s][ZT_PLACE_DEVICE] + o.state[s][ZT_PLACE_CPU];
      memcpy(out->placed[k], o.state[s], sizeof o.state[s]);
    }
  }
  int half_reduce = cfg->reduce_dtype != ZT_F32;
  if (cfg->stage >= 2) {
    zt_bucket *bk = calloc((size_t)units->n + 1, sizeof *bk);
    int *of = malloc(((size_t)units->n + 1) * sizeof *of);
    if (!bk || !of) {
      free(bk);
      free(of);
      return -1;
    }
    int nb = zt_zero_pack_buckets(units, cfg->bucket_bytes, bk, of);
    zt_zero_bucket_extent(bk, nb, numel, dp, dp_rank, &out->bucket_elems, &out->recv_elems);
    int big = -1;
    for (int i = 0; i < nb; i++)
      if (big < 0 || bk[i].hi - bk[i].lo > bk[big].hi - bk[big].lo) big = i;
    for (int i = 0; i < nb; i++)
      if (i != big && bk[i].hi - bk[i].lo > out->bucket_next) out->bucket_next = bk[i].hi - bk[i].lo;
    free(bk);
    free(of);
    out->buckets = GRAD_BUFFERS * (out->bucket_elems + out->recv_elems) *
                   (int64_t)(sizeof(float) + (half_reduce ? 2 : 0));
  } else if (half_reduce) {
    out->reduce16 = numel * 2;
  }
  if (cfg->stage >= 3) {
    for (int u = 0; u < units->n; u++)
      if (units->numel[u] > out->gather_elems) out->gather_elems = units->numel[u];
    out->gather = GATHER_BUFFERS * out->gather_elems * (int64_t)zt_dtype_size(cfg->param_dtype);
  }
  return 0;
}

