/* zero: see zero.h. */
#include "parallel/zero.h"

#include <stdlib.h>
#include <string.h>

#define GRAD_BUFFERS 3   /* stage >= 2: two buckets in flight + the tied unit's */
#define GATHER_BUFFERS 3 /* stage 3: current, prefetched next, tied unit */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int64_t zt_zero_part(int64_t numel, int dp, int r, int64_t a, int64_t b, int64_t *from) {
  int64_t S = (numel + dp - 1) / dp;
  int64_t lo = min64((int64_t)r * S, numel), hi = min64((int64_t)(r + 1) * S, numel);
  int64_t s = max64(a, lo), t = min64(b, hi);
  if (from) *from = s;
  return t > s ? t - s : 0;
}

/* Part of flat range [a, b) that dp rank r owns. */
static int64_t owned(const zt_zero *z, int r, int64_t a, int64_t b, int64_t *from) {
  return zt_zero_part(z->numel, z->dp->size, r, a, b, from);
}

static int group_of(const zt_zero *z, int u) { return z->u.group ? z->u.group[u] : 0; }

/* Whether gradients are summed over dp in 16 bits (cfg.reduce_dtype) */
static int half_reduce(const zt_zero *z) { return z->cfg.reduce_dtype != ZT_F32; }

static void *alloc_h(zt_zero *z, int64_t n, int64_t *account) {
  void *p = z->be->alloc(ZT_MEM_DEVICE, (size_t)(n > 0 ? n : 1) * 2);
  if (p) *account += n * 2;
  return p;
}

static float *alloc_f(zt_zero *z, int64_t n, int64_t *account) {
  float *p = z->be->alloc(ZT_MEM_DEVICE, (size_t)(n > 0 ? n : 1) * sizeof(float));
  if (p) *account += n * (int64_t)sizeof(float);
  return p;
}

/* Buckets in backward order: units numbered down from the last, packed up
 * to bucket_bytes (at least one unit each) within a group; the tied unit
 * alone, since its gradients are written both first (by the head) and
 * last. Empty units belong to no bucket. */
static int plan_buckets(zt_zero *z) {
  int n = z->u.n, nb = 0;
  z->buckets = calloc((size_t)n, sizeof *z->buckets);
  z->bucket_of = malloc((size_t)n * sizeof *z->bucket_of);
  if (!z->buckets || !z->bucket_of) return -1;
  int64_t cap = z->cfg.bucket_bytes / (int64_t)sizeof(float);
  for (int u = n - 1; u >= 0; u--) {
    z->bucket_of[u] = -1;
    if (!z->u.numel[u]) continue;
    zt_bucket *b = nb ? &z->buckets[nb - 1] : NULL;
    int alone = u == z->u.tied_unit || (b && b->first == z->u.tied_unit);
    if (!b || alone || b->hi - z->u.start[u] > cap || group_of(z, u) != group_of(z, b->first)) {
      b = &z->buckets[nb++];
      b->first = u;
      b->hi = z->u.start[u] + z->u.numel[u];
    }
    b->last = u;
    b->lo = z->u.start[u];
    z->bucket_of[u] = nb - 1;
  }
  z->n_buckets = nb;
  for (int i = 0; i < nb; i++) {
    zt_bucket *b = &z->buckets[i];
    b->buf = -1;
    b->counts = malloc((size_t)z->dp->size * sizeof *b->counts);
    if (!b->counts) return -1;
    for (int r = 0; r < z->dp->size; r++) b->counts[r] = (int)owned(z, r, b->lo, b->hi, NULL);
    if (b->hi - b->lo > z->buf_elems) z->buf_elems = b->hi - b->lo;
    if (b->counts[z->dp->rank] > z->recv_elems) z->recv_elems = b->counts[z->dp->rank];
  }
  return 0;
}

int zt_zero_init(zt_zero *z, const zt_zero_cfg *cfg, const zt_backend *be,
                 zt_stream *stream, zt_comm *dp, int64_t numel, const zt_zero_units *units,
                 float *w_full, float *g_full, zt_err *e) {
  memset(z, 0, sizeof *z);
  z->cfg = *cfg;
  z->be = be;
  z->stream = stream;
  z->w_compute = w_full;
  z->dt = ZT_F32;
  z->dp = dp;
  z->u = *units;
  if (units->group) { /* read again at every prefetch: the engine keeps a copy */
    int *grp = malloc((size_t)units->n * sizeof *grp);
    if (!grp) return zt_err_set(e, ZT_ERUNTIME, "out of memory (ZeRO tables)");
    memcpy(grp, units->group, (size_t)units->n * sizeof *grp);
    z->u.group = grp;
  }
  z->numel = numel;
  z->S = (numel + dp->size - 1) / dp->size;
  z->counts = malloc((size_t)dp->size * sizeof *z->counts);
  z->displs = malloc((size_t)dp->size * sizeof *z->displs);
  if (!z->counts || !z->displs) return zt_err_set(e, ZT_ERUNTIME, "out of memory (ZeRO tables)");
  for (int r = 0; r < dp->size; r++) {
    int64_t from;
    z->counts[r] = (int)owned(z, r, 0, numel, &from);
    z->displs[r] = (int)from;
  }
  z->lo = z->displs[dp->rank];
  z->hi = z->lo + z->counts[dp->rank];
  z->w_full = w_full;
  z->g_full = g_full;
  int stage = cfg->stage;
  int64_t opt_n = stage == 0 ? numel : z->hi - z->lo;
  int ok = 1;
  z->state_bytes = (stage < 3 ? numel : 0) * 4 + (stage < 2 ? numel : 0) * 4;
  ok = ok && (z->m = alloc_f(z, opt_n, &z->state_bytes)) && (z->v = alloc_f(z, opt_n, &z->state_bytes));
  if (stage >= 2) ok = ok && (z->g_shard = alloc_f(z, z->S, &z->state_bytes));
  if (stage >= 3) ok = ok && (z->w_shard = alloc_f(z, z->S, &z->state_bytes));
  size_t cx = zt_dtype_size(cfg->compute_dtype);
  if (stage >= 3 && cfg->compute_dtype != ZT_F32) {
    ok = ok && (z->wc_shard = z->be->alloc(ZT_MEM_DEVICE, (size_t)(z->S ? z->S : 1) * cx));
    z->state_bytes += z->S * (int64_t)cx;
  }
  if (ok && stage >= 2) {
    int n = units->n;
    z->bwd_uses_left = calloc((size_t)n, sizeof(int));
    ok = z->bwd_uses_left && plan_buckets(z) == 0;
    z->n_bufs = GRAD_BUFFERS;
    z->bufs = calloc(GRAD_BUFFERS, sizeof *z->bufs);
    z->recv = calloc(GRAD_BUFFERS, sizeof *z->recv);
    z->buf_busy = calloc(GRAD_BUFFERS, sizeof *z->buf_busy);
    ok = ok && z->bufs && z->recv && z->buf_busy;
    for (int i = 0; ok && i < GRAD_BUFFERS; i++)
      ok = (z->bufs[i] = alloc_f(z, z->buf_elems, &z->buffer_bytes)) &&
           (z->recv[i] = alloc_f(z, z->recv_elems, &z->buffer_bytes));
    if (ok && half_reduce(z)) {
      z->hbufs = calloc(GRAD_BUFFERS, sizeof *z->hbufs);
      z->hrecv = calloc(GRAD_BUFFERS, sizeof *z->hrecv);
      ok = z->hbufs && z->hrecv;
      for (int i = 0; ok && i < GRAD_BUFFERS; i++)
        ok = (z->hbufs[i] = alloc_h(z, z->buf_elems, &z->buffer_bytes)) &&
             (z->hrecv[i] = alloc_h(z, z->recv_elems, &z->buffer_bytes));
    }
  }
  if (ok && stage < 2 && half_reduce(z))
    ok = (z->hfull = alloc_h(z, numel, &z->buffer_bytes)) != NULL;
  if (ok && stage >= 3) {
    int n = units->n;
    for (int u = 0; u < n; u++)
      if (units->numel[u] > z->gbuf_elems) z->gbuf_elems = units->numel[u];
    z->n_gbufs = GATHER_BUFFERS;
    z->gbufs = calloc(GATHER_BUFFERS, sizeof *z->gbufs);
    z->gbuf_unit = malloc(GATHER_BUFFERS * sizeof(int));
    z->unit_gbuf = malloc((size_t)n * sizeof(int));
    z->unit_req = calloc((size_t)n, sizeof *z->unit_req);
    z->unit_gathering = calloc((size_t)n, sizeof(int));
    z->unit_keep = calloc((size_t)n, sizeof(int));
    z->fwd_uses = calloc((size_t)n, sizeof(int));
    z->unit_counts = malloc((size_t)n * 2 * dp->size * sizeof(int));
    ok = z->gbufs && z->gbuf_unit && z->unit_gbuf && z->unit_req && z->unit_gathering &&
         z->unit_keep && z->fwd_uses && z->unit_counts;
    for (int u = 0; ok && u < n; u++) {
      int *counts = z->unit_counts + (size_t)u * 2 * dp->size, *displs = counts + dp->size;
      int64_t a = units->start[u], b = a + units->numel[u];
      for (int r = 0; r < dp->size; r++) {
        int64_t from;
        counts[r] = (int)owned(z, r, a, b, &from);
        displs[r] = (int)(counts[r] ? from - a : 0);
      }
    }
    for (int i = 0; ok && i < GATHER_BUFFERS; i++) {
      ok = (z->gbufs[i] = z->be->alloc(ZT_MEM_DEVICE, (size_t)(z->gbuf_elems ? z->gbuf_elems : 1) * cx)) != NULL;
      z->buffer_bytes += z->gbuf_elems * (int64_t)cx;
      if (ok) z->gbuf_unit[i] = -1;
    }
    for (int u = 0; ok && u < n; u++) z->unit_gbuf[u] = -1;
  }
  if (!ok) {
    zt_zero_free(z);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for ZeRO stage %d state", stage);
  }
  return ZT_OK;
}

void zt_zero_free(zt_zero *z) {
  if (!z->be) return;
  z->be->free(ZT_MEM_DEVICE, z->m);
  z->be->free(ZT_MEM_DEVICE, z->v);
  z->be->free(ZT_MEM_DEVICE, z->g_shard);
  z->be->free(ZT_MEM_DEVICE, z->w_shard);
  z->be->free(ZT_MEM_DEVICE, z->wc_shard);
  for (int i = 0; z->bufs && i < z->n_bufs; i++) {
    z->be->free(ZT_MEM_DEVICE, z->bufs[i]);
    z->be->free(ZT_MEM_DEVICE, z->recv[i]);
  }
  for (int i = 0; z->gbufs && i < z->n_gbufs; i++) z->be->free(ZT_MEM_DEVICE, z->gbufs[i]);
  for (int i = 0; z->hbufs && i < z->n_bufs; i++) z->be->free(ZT_MEM_DEVICE, z->hbufs[i]);
  for (int i = 0; z->hrecv && i < z->n_bufs; i++) z->be->free(ZT_MEM_DEVICE, z->hrecv[i]);
  free(z->hbufs);
  free(z->hrecv);
  if (z->hfull) z->be->free(ZT_MEM_DEVICE, z->hfull);
  for (int i = 0; z->buckets && i < z->n_buckets; i++) free(z->buckets[i].counts);
  free(z->buckets);
  free(z->bucket_of);
  free(z->bufs);
  free(z->recv);
  free(z->buf_busy);
  free(z->bwd_uses_left);
  free(z->gbufs);
  free(z->gbuf_unit);
  free(z->unit_gbuf);
  free(z->unit_req);
  free(z->unit_gathering);
  free(z->unit_keep);
  free(z->fwd_uses);
  free(z->unit_counts);
  free(z->counts);
  free(z->displs);
  free((void *)z->u.group);
  memset(z, 0, sizeof *z);
}

void zt_zero_shard_weights(zt_zero *z) {
  z->be->copy(z->stream, z->w_shard, z->w_full + z->lo, (size_t)(z->hi - z->lo) * sizeof(float));
  z->w_full = NULL;
  zt_zero_sync_compute(z);
}

void zt_zero_sync_compute(zt_zero *z) {
  if (z->wc_shard)
    z->be->convert(z->stream, z->cfg.compute_dtype, z->wc_shard, ZT_F32, z->w_shard,
                   (size_t)(z->hi - z->lo));
}

void *zt_zero_update_copy(zt_zero *z) { return z->wc_shard; }

/* ---- stage >= 2: gradient buckets ------------------------------------- */

/* A reduced bucket: add this rank's part into the shard, free its buffer. */
static void finish_bucket(zt_zero *z, zt_bucket *b) {
  zt_comm_wait(&b->req);
  int64_t from, n = owned(z, z->dp->rank, b->lo, b->hi, &from);
  if (n && half_reduce(z))
    z->be->convert(z->stream, ZT_F32, z->recv[b->buf], z->cfg.reduce_dtype, z->hrecv[b->buf],
                   (size_t)n);
  if (n) z->be->add(z->stream, ZT_F32, z->g_shard + (from - z->lo), z->recv[b->buf], (size_t)n);
  z->buf_busy[b->buf] = 0;
  b->buf = -1;
  b->in_flight = 0;
}

/* Lets MPI move in-flight reductions on; finishes the ones that are done. */
static void progress(zt_zero *z) {
  for (int i = 0; i < z->n_buckets; i++) {
    zt_bucket *b = &z->buckets[i];
    if (b->in_flight && zt_comm_test(&b->req)) finish_bucket(z, b);
  }
}

static int acquire_buffer(zt_zero *z) {
  for (;;) {
    for (int i = 0; i < z->n_bufs; i++)
      if (!z->buf_busy[i]) {
        z->buf_busy[i] = 1;
        return i;
      }
    /* all busy: wait for the oldest reduction (lowest seq) */
    zt_bucket *oldest = NULL;
    for (int i = 0; i < z->n_buckets; i++)
      if (z->buckets[i].in_flight && (!oldest || z->buckets[i].req.seq < oldest->req.seq))
        oldest = &z->buckets[i];
    finish_bucket(z, oldest);
  }
}

static float *open_grads(zt_zero *z, int unit) {
  zt_bucket *b = &z->buckets[z->bucket_of[unit]];
  if (!b->open) {
    /* last micro-batch's reduction of this bucket must be done with its
     * buffer before backward writes here again */
    if (b->in_flight) finish_bucket(z, b);
    b->open = 1;
    b->buf = acquire_buffer(z);
    z->be->memzero(z->stream, z->bufs[b->buf], (size_t)(b->hi - b->lo) * sizeof(float));
    b->pending = 0;
    for (int u = b->last; u <= b->first; u++) b->pending += z->u.numel[u] > 0;
  }
  return z->bufs[b->buf] + (z->u.start[unit] - b->lo);
}

static void close_grads(zt_zero *z, int unit) {
  if (--z->bwd_uses_left[unit] > 0) return; /* the tied unit: used again later */
  zt_bucket *b = &z->buckets[z->bucket_of[unit]];
  if (--b->pending > 0) return;
  b->open = 0;
  if (half_reduce(z)) {
    zt_dtype t = z->cfg.reduce_dtype;
    z->be->convert(z->stream, t, z->hbufs[b->buf], ZT_F32, z->bufs[b->buf], (size_t)(b->hi - b->lo));
    z->be->stream_sync(z->stream); /* MPI reads it */
    zt_comm_ireduce_scatter(z->dp, z->hbufs[b->buf], z->hrecv[b->buf], b->counts, t, ZT_SUM,
                            &b->req);
  } else {
    zt_comm_ireduce_scatter(z->dp, z->bufs[b->buf], z->recv[b->buf], b->counts, ZT_F32, ZT_SUM,
                            &b->req);
  }
  b->in_flight = 1;
  if (!z->cfg.overlap) finish_bucket(z, b);
}

/* ---- stage 3: gathered units ------------------------------------------ */

static void start_gather(zt_zero *z, int unit) {
  if (unit < 0 || unit >= z->u.n || z->unit_gbuf[unit] >= 0) return;
  int k = -1;
  for (int i = 0; i < z->n_gbufs && k < 0; i++)
    if (z->gbuf_unit[i] < 0) k = i;
  if (k < 0) return; /* no room to prefetch: gather when needed */
  z->gbuf_unit[k] = unit;
  z->unit_gbuf[unit] = k;
  int64_t a = z->u.start[unit];
  /* MPI reads the count arrays until the gather completes: they persist */
  int *counts = z->unit_counts + (size_t)unit * 2 * z->dp->size, *displs = counts + z->dp->size;
  int me = z->dp->rank;
  zt_dtype t = z->cfg.compute_dtype;
  size_t x = zt_dtype_size(t);
  const char *src = z->wc_shard ? z->wc_shard : (const void *)z->w_shard;
  if (counts[me])
    z->be->copy(z->stream, (char *)z->gbufs[k] + (size_t)displs[me] * x,
                src + (size_t)(a + displs[me] - z->lo) * x, (size_t)counts[me] * x);
  z->be->stream_sync(z->stream); /* MPI reads the buffer */
  zt_comm_iallgather(z->dp, z->gbufs[k], counts, displs, t, &z->unit_req[unit]);
  z->unit_gathering[unit] = 1;
}

static void release_unit(zt_zero *z, int unit) {
  int k = z->unit_gbuf[unit];
  if (k < 0) return;
  if (z->unit_gathering[unit]) zt_comm_wait(&z->unit_req[unit]);
  z->unit_gathering[unit] = 0;
  z->gbuf_unit[k] = -1;
  z->unit_gbuf[unit] = -1;
}

/* Gathers the unit if needed; with `prefetch`, starts gathering the unit
 * the pass uses next. */
static void *use_weights(zt_zero *z, int unit, int backward, int prefetch) {
  if (z->unit_gbuf[unit] < 0) {
    /* the buffers may all hold prefetches: make room */
    int free_one = 0;
    for (int i = 0; i < z->n_gbufs; i++) free_one |= z->gbuf_unit[i] < 0;
    for (int i = 0; !free_one && i < z->n_gbufs; i++)
      if (!z->unit_keep[z->gbuf_unit[i]]) {
        release_unit(z, z->gbuf_unit[i]);
        free_one = 1;
      }
    start_gather(z, unit);
  }
  if (z->unit_gathering[unit]) {
    zt_comm_wait(&z->unit_req[unit]);
    z->unit_gathering[unit] = 0;
  }
  /* the next unit of this pass: the nearest non-empty one in its group */
  int step = backward ? -1 : 1, next = unit + step;
  while (next >= 0 && next < z->u.n && !z->u.numel[next]) next += step;
  if (!backward && unit == z->u.final_unit) next = -1;
  if (prefetch && next >= 0 && next < z->u.n && group_of(z, next) == group_of(z, unit))
    start_gather(z, next);
  return z->gbufs[z->unit_gbuf[unit]];
}

/* ---- hooks ------------------------------------------------------------- */

void zt_zero_microbatch_begin(zt_zero *z) {
  for (int u = 0; z->bwd_uses_left && u < z->u.n; u++)
    z->bwd_uses_left[u] = u == z->u.tied_unit ? 2 : 1;
  for (int u = 0; z->fwd_uses && u < z->u.n; u++) {
    z->fwd_uses[u] = 0;
    if (z->unit_keep[u]) {
      z->unit_keep[u] = 0;
      release_unit(z, u);
    }
  }
}

void zt_zero_set_compute(zt_zero *z, void *w, zt_dtype dt) {
  z->w_compute = w;
  z->dt = dt;
}

void zt_zero_before(zt_zero *z, int unit, zt_zero_pass pass, void **w, float **g) {
  int64_t s = z->u.start[unit];
  int backward = pass != ZT_ZERO_FWD, need_g = pass == ZT_ZERO_BWD || pass == ZT_ZERO_BWD_WEIGHT;
  if (z->cfg.stage < 3) {
    *w = (char *)z->w_compute + (size_t)s * zt_dtype_size(z->dt);
  } else if (pass == ZT_ZERO_BWD_WEIGHT) {
    *w = NULL; /* W needs no weights: nothing to gather */
  } else {
    /* the tied unit used by the head: kept through backward, and not a
     * step of the pass that would call for a prefetch */
    int head_use = unit == z->u.tied_unit && (backward ? z->bwd_uses_left[unit] == 2
                                                        : ++z->fwd_uses[unit] == 2);
    if (head_use && !backward) z->unit_keep[unit] = 1;
    *w = use_weights(z, unit, backward, !head_use);
  }
  if (z->cfg.stage < 2) *g = z->g_full + s;
  else *g = need_g ? open_grads(z, unit) : NULL;
  if (z->cfg.stage >= 2) progress(z);
}

void zt_zero_after(zt_zero *z, int unit, zt_zero_pass pass) {
  int backward = pass != ZT_ZERO_FWD;
  if (z->cfg.stage >= 2 && (pass == ZT_ZERO_BWD || pass == ZT_ZERO_BWD_WEIGHT))
    close_grads(z, unit);
  if (z->cfg.stage >= 3 && pass != ZT_ZERO_BWD_WEIGHT) {
    int last_bwd = backward && (z->bwd_uses_left[unit] == 0);
    if (!z->unit_keep[unit] || last_bwd) {
      z->unit_keep[unit] = 0;
      release_unit(z, unit);
    }
  }
  if (z->cfg.stage >= 2) progress(z);
}

/* ---- step -------------------------------------------------------------- */

void zt_zero_grads_begin(zt_zero *z) {
  if (z->cfg.stage < 2) z->be->memzero(z->stream, z->g_full, (size_t)z->numel * sizeof(float));
  else z->be->memzero(z->stream, z->g_shard, (size_t)z->S * sizeof(float));
}

void zt_zero_grads_end(zt_zero *z, float **w, float **g) {
  switch (z->cfg.stage) {
    case 0:
      if (half_reduce(z)) {
        zt_dtype t = z->cfg.reduce_dtype;
        z->be->convert(z->stream, t, z->hfull, ZT_F32, z->g_full, (size_t)z->numel);
        z->be->stream_sync(z->stream);
        zt_comm_allreduce(z->dp, z->hfull, (size_t)z->numel, t, ZT_SUM);
        z->be->convert(z->stream, ZT_F32, z->g_full, t, z->hfull, (size_t)z->numel);
      } else {
        zt_comm_allreduce(z->dp, z->g_full, (size_t)z->numel, ZT_F32, ZT_SUM);
      }
      *w = z->w_full;
      *g = z->g_full;
      return;
    case 1:
      /* in place: this rank's part lands at the start of g_full */
      if (half_reduce(z)) {
        zt_dtype t = z->cfg.reduce_dtype;
        z->be->convert(z->stream, t, z->hfull, ZT_F32, z->g_full, (size_t)z->numel);
        z->be->stream_sync(z->stream);
        zt_comm_reduce_scatter(z->dp, z->hfull, z->hfull, z->counts, t, ZT_SUM);
        z->be->convert(z->stream, ZT_F32, z->g_full, t, z->hfull, (size_t)z->counts[z->dp->rank]);
      } else {
        zt_comm_reduce_scatter(z->dp, z->g_full, z->g_full, z->counts, ZT_F32, ZT_SUM);
      }
      *w = z->w_full + z->lo;
      *g = z->g_full;
      return;
    default:
      for (int i = 0; i < z->n_buckets; i++)
        if (z->buckets[i].in_flight) finish_bucket(z, &z->buckets[i]);
      /* a gathered unit would be stale after the update: a prefetch that
       * no pass used (a split backward's B never uses the embedding's
       * weights) must not survive into the next step */
      for (int i = 0; z->gbufs && i < z->n_gbufs; i++)
        if (z->gbuf_unit[i] >= 0) {
          z->unit_keep[z->gbuf_unit[i]] = 0;
          release_unit(z, z->gbuf_unit[i]);
        }
      *w = z->cfg.stage == 2 ? z->w_full + z->lo : z->w_shard;
      *g = z->g_shard;
  }
}

void zt_zero_params_sync(zt_zero *z) {
  if (z->cfg.stage != 1 && z->cfg.stage != 2) return;
  zt_comm_allgather(z->dp, z->w_full, z->counts, z->displs, ZT_F32);
}

void zt_zero_add_grad(zt_zero *z, int64_t a, int64_t n, const float *src) {
  if (n <= 0) return;
  if (z->cfg.stage < 2) z->be->add(z->stream, ZT_F32, z->g_full + a, src, (size_t)n);
  else z->be->add(z->stream, ZT_F32, z->g_shard + (a - z->lo), src, (size_t)n);
}

const float *zt_zero_owned_weights(const zt_zero *z, int64_t a, int64_t b, int64_t *from,
                                   int64_t *n) {
  *n = owned(z, z->dp->rank, a, b, from);
  if (!*n) return NULL;
  return z->cfg.stage < 3 ? z->w_full + *from : z->w_shard + (*from - z->lo);
}
