/* zero: see zero.h. */
#include "parallel/zero.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/offload.h"
#include "parallel/zero_impl.h"

/* One model state: flat elements [lo, hi) at p; `alias`: another state's
 * memory (PARAM is MASTER in fp32), not freed or counted twice. */
typedef struct state_buf {
  void *p;
  int64_t lo, hi;
  zt_dtype dt;
  zt_mem_kind mem;
  int alias;
} state_buf;

struct zt_zero {
  zt_zero_cfg cfg;
  const zt_backend *be;
  zt_stream *stream; /* where its copies and adds run: the model's */
  zt_comm *dp;
  zt_zero_units u;
  int64_t numel, S, lo, hi; /* Ψ, shard size, this rank's range */
  int *counts, *displs;     /* shard of each dp rank */
  state_buf st[ZT_STATE_KINDS];

  /* stage >= 2: gradient buckets */
  int n_buckets, *bucket_of;
  zt_bucket *buckets;
  int n_bufs;
  float **bufs, **recv;
  int *buf_busy;
  int64_t buf_elems, recv_elems;
  void **hbufs, **hrecv; /* 16-bit reduce: the buckets converted, sent and received */
  void *hfull;           /* 16-bit reduce at stage < 2: the gradients converted */
  int *bwd_uses_left; /* per unit, this micro-batch */

  /* stage 3: gathered units */
  int n_gbufs;
  void **gbufs;       /* of param_dtype */
  int *gbuf_unit;     /* unit in each gather buffer, -1 free */
  int *unit_gbuf;     /* gather buffer of each unit, -1 none */
  zt_req *unit_req;   /* gather in flight per unit */
  int *unit_gathering;
  int *unit_keep;     /* tied unit: stays until its last backward use */
  int *fwd_uses;      /* per unit, this micro-batch */
  int *unit_counts;   /* per unit: gather counts then displacements per dp rank */
  int64_t gbuf_elems;

  /* stage 3, params placed per unit: each unit's piece of PARAM where the
   * policy put it, packed in a device and a pinned buffer; the host ones
   * copied down into staging buffers on a copy stream ahead of use */
  void **unit_param;        /* per unit, its first element in [lo, hi); NULL none */
  void *param_dev, *param_host;
  zt_stream *cs;
  void *stage[PARAM_STAGE_BUFFERS];
  int stage_unit[PARAM_STAGE_BUFFERS], stage_evict;
  int stage_reading[PARAM_STAGE_BUFFERS]; /* params on nvme: the piece is being read
                                           * into the store's host buffer of that index */
  zt_event *stage_in[PARAM_STAGE_BUFFERS], *stage_out[PARAM_STAGE_BUFFERS];
  zt_event *params_ready; /* the model stream where the weights were last written */

  int64_t state_bytes, buffer_bytes; /* model states; gather + bucket buffers */

  /* the policy offloads masters or moments: they live in this store */
  zt_offload *off;
  float *owned_scratch; /* zt_zero_owned_weights of state held in a file */

  /* a failure inside a hook (a read of weights from the file), which has
   * no status of its own: reported by the next zt_zero_update */
  int failed;
  zt_err err;
};

/* Part of flat range [a, b) that dp rank r owns. */
static int64_t owned(const zt_zero *z, int r, int64_t a, int64_t b, int64_t *from) {
  return zt_zero_part(z->numel, z->dp->size, r, a, b, from);
}

static float *grads(const zt_zero *z) { return z->st[ZT_STATE_GRAD].p; }
static float *master(const zt_zero *z) { return z->st[ZT_STATE_MASTER].p; }
static int param_is_master(const zt_zero *z) { return z->st[ZT_STATE_PARAM].alias; }

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

static int plan_buckets(zt_zero *z) {
  int n = z->u.n;
  z->buckets = calloc((size_t)n, sizeof *z->buckets);
  z->bucket_of = malloc((size_t)n * sizeof *z->bucket_of);
  if (!z->buckets || !z->bucket_of) return -1;
  int nb = z->n_buckets = zt_zero_pack_buckets(&z->u, z->cfg.bucket_bytes, z->buckets, z->bucket_of);
  for (int i = 0; i < nb; i++) {
    zt_bucket *b = &z->buckets[i];
    b->buf = -1;
    b->counts = malloc((size_t)z->dp->size * sizeof *b->counts);
    if (!b->counts) return -1;
    for (int r = 0; r < z->dp->size; r++) b->counts[r] = (int)owned(z, r, b->lo, b->hi, NULL);
  }
  zt_zero_bucket_extent(z->buckets, nb, z->numel, z->dp->size, z->dp->rank, &z->buf_elems,
                &z->recv_elems);
  return 0;
}

/* State `k` as state_layout says, over [lo, hi), counted in state_bytes
 * (allocation rounded up to S elements for a shard: every rank alike). An
 * alias takes the memory of the state it is (allocated before it). */
static int alloc_state(zt_zero *z, zt_state_kind k) {
  int whole, alias;
  zt_dtype dt;
  zt_mem_kind mem;
  zt_zero_state_layout(&z->cfg, k, &whole, &dt, &mem, &alias);
  state_buf *b = &z->st[k];
  if (alias) {
    *b = z->st[ZT_STATE_PARAM];
    return 1;
  }
  int64_t n = whole ? z->numel : z->S;
  *b = (state_buf){.lo = whole ? 0 : z->lo, .hi = whole ? z->numel : z->hi, .dt = dt, .mem = mem};
  b->p = z->be->alloc(mem, (size_t)(n > 0 ? n : 1) * zt_dtype_size(dt));
  z->state_bytes += n * (int64_t)zt_dtype_size(dt);
  return b->p != NULL;
}

/* Stage 3 with params placed per unit: PARAM as two packed buffers, the
 * device's and the pinned host's (flat order within each); the state's
 * view has no one pointer then. */
static int alloc_placed_params(zt_zero *z) {
  const unsigned char *pl = z->cfg.offload.place[ZT_OFF_PARAMS];
  size_t x = zt_dtype_size(z->cfg.param_dtype);
  int64_t n[ZT_PLACES], stage, used[ZT_PLACES] = {0};
  zt_zero_param_split(&z->cfg, &z->u, z->numel, z->dp->size, z->dp->rank, n, &stage);
  int64_t nd = n[ZT_PLACE_DEVICE], nh = n[ZT_PLACE_CPU], nf = n[ZT_PLACE_NVME];
  z->unit_param = calloc((size_t)z->u.n, sizeof *z->unit_param);
  z->param_dev = z->be->alloc(ZT_MEM_DEVICE, (size_t)(nd ? nd : 1) * x);
  z->param_host = nh ? z->be->alloc(ZT_MEM_PINNED, (size_t)nh * x) : NULL;
  if (!z->unit_param || !z->param_dev || (nh && !z->param_host)) return 0;
  z->state_bytes += (nd + nh) * (int64_t)x;
  /* weights in the file (the offload store's) have no memory here */
  for (int u = 0; u < z->u.n; u++) {
    int64_t m = owned(z, z->dp->rank, z->u.start[u], z->u.start[u] + z->u.numel[u], NULL);
    int q = pl[u];
    if (m && q != ZT_PLACE_NVME)
      z->unit_param[u] = (char *)(q ? z->param_host : z->param_dev) + (size_t)used[q] * x;
    used[q] += m;
  }
  int one = (nd > 0) + (nh > 0) + (nf > 0) == 1 && !nf; /* all of it in one memory */
  z->st[ZT_STATE_PARAM] = (state_buf){.p = one ? (nd ? z->param_dev : z->param_host) : NULL,
                                      .lo = z->lo, .hi = z->hi, .dt = z->cfg.param_dtype,
                                      .mem = nh && !nd ? ZT_MEM_PINNED : ZT_MEM_DEVICE};
  if (!nh && !nf) return 1;
  /* the copy stream and staging of the host pieces; every event recorded
   * once so that a first wait on it passes */
  int ok = (z->cs = z->be->stream_new()) && (z->params_ready = z->be->event_new());
  for (int i = 0; ok && i < PARAM_STAGE_BUFFERS; i++) {
    z->stage_unit[i] = -1;
    z->stage_reading[i] = 0;
    ok = (z->stage[i] = z->be->alloc(ZT_MEM_DEVICE, (size_t)stage * x)) &&
         (z->stage_in[i] = z->be->event_new()) && (z->stage_out[i] = z->be->event_new());
    if (ok) z->be->event_record(z->stage_out[i], z->stream);
    z->buffer_bytes += stage * (int64_t)x;
  }
  if (ok) z->be->event_record(z->params_ready, z->stream);
  return ok;
}

/* The masters and moments in an offload store, over the range the
 * optimizer updates (the whole buffer at stage 0, the shard from 1); the
 * views point into it where a state lives in one memory. */
static int offload_states(zt_zero *z, int separate, zt_err *e) {
  const state_buf *p = &z->st[ZT_STATE_PARAM];
  zt_offload_layout lay = zt_zero_offload_layout(&z->cfg, &z->u, z->numel, z->dp->size, z->dp->rank);
  int64_t lo = lay.lo, hi = lay.hi;
  if (z->unit_param) lay.unit_param = z->unit_param;
  else lay.param = (char *)p->p + (size_t)(lo - p->lo) * zt_dtype_size(p->dt);
  lay.rank = z->dp->world_ranks ? z->dp->world_ranks[z->dp->rank] : z->dp->rank;
  z->off = zt_offload_new(&z->cfg.offload, &lay, z->be, z->stream, e);
  if (!z->off) return e->code;
  static const zt_state_kind kinds[ZT_OFF_STATES] = {ZT_STATE_MASTER, ZT_STATE_EXP_AVG,
                                                     ZT_STATE_EXP_AVG_SQ};
  for (int s = 0; s < ZT_OFF_STATES; s++) {
    state_buf *b = &z->st[kinds[s]];
    *b = (state_buf){.lo = lo, .hi = hi, .dt = ZT_F32, .mem = ZT_MEM_DEVICE, .alias = 1};
    b->p = zt_offload_state(z->off, s, &b->mem);
  }
  /* fp32 masters all on the device are PARAM, whole as the stage holds it */
  if (!separate) z->st[ZT_STATE_MASTER] = z->st[ZT_STATE_PARAM];
  int64_t bytes[ZT_PLACES];
  zt_offload_bytes(z->off, bytes);
  /* memory: device and pinned host, not the file */
  z->state_bytes += bytes[ZT_PLACE_DEVICE] + bytes[ZT_PLACE_CPU];
  return ZT_OK;
}

zt_zero *zt_zero_new(const zt_zero_cfg *cfg, const zt_backend *be, zt_stream *stream,
                     zt_comm *dp, int64_t numel, const zt_zero_units *units, zt_err *e) {
  zt_zero *z = calloc(1, sizeof *z);
  if (!z) {
    zt_err_set(e, ZT_ERUNTIME, "out of memory (ZeRO tables)");
    return NULL;
  }
  z->cfg = *cfg;
  z->be = be;
  z->stream = stream;
  z->dp = dp;
  z->u = *units;
  z->u.group = NULL;
  z->numel = numel;
  z->S = (numel + dp->size - 1) / dp->size;
  int *grp = units->group ? malloc((size_t)units->n * sizeof *grp) : NULL;
  z->counts = malloc((size_t)dp->size * sizeof *z->counts);
  z->displs = malloc((size_t)dp->size * sizeof *z->displs);
  if ((units->group && !grp) || !z->counts || !z->displs) {
    free(grp);
    zt_zero_free(z);
    zt_err_set(e, ZT_ERUNTIME, "out of memory (ZeRO tables)");
    return NULL;
  }
  if (grp) { /* read again at every prefetch: the engine keeps a copy */
    memcpy(grp, units->group, (size_t)units->n * sizeof *grp);
    z->u.group = grp;
  }
  for (int r = 0; r < dp->size; r++) {
    int64_t from;
    z->counts[r] = (int)owned(z, r, 0, numel, &from);
    z->displs[r] = (int)from;
  }
  z->lo = z->displs[dp->rank];
  z->hi = z->lo + z->counts[dp->rank];
  int stage = cfg->stage, half = cfg->param_dtype != ZT_F32;
  int offloaded = zt_zero_offloads(&cfg->offload);
  /* fp32 masters are the weights the passes compute with, unless the
   * policy moves some of them off the device: then PARAM is their copy */
  int64_t pn[ZT_PLACES], pstage;
  int placed = zt_zero_param_split(cfg, units, numel, dp->size, dp->rank, pn, &pstage);
  int separate = half || zt_offload_any(&cfg->offload, ZT_OFF_MASTER) || placed;
  int ok = 1;
  if (offloaded) {
    ok = (placed ? alloc_placed_params(z) : alloc_state(z, ZT_STATE_PARAM)) &&
         alloc_state(z, ZT_STATE_GRAD);
    if (ok && !(ok = offload_states(z, separate, e) == ZT_OK)) {
      zt_zero_free(z);
      return NULL;
    }
  } else {
    for (int k = 0; ok && k < ZT_STATE_KINDS; k++) ok = alloc_state(z, (zt_state_kind)k);
  }
  /* fp32 without offloaded masters: MASTER is PARAM's memory, which
   * MASTER's entry frees */
  z->st[ZT_STATE_PARAM].alias = !separate;
  size_t cx = zt_dtype_size(cfg->param_dtype);
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
    zt_err_set(e, ZT_ERUNTIME, "out of memory for ZeRO stage %d state", stage);
    return NULL;
  }
  return z;
}

void zt_zero_free(zt_zero *z) {
  if (!z) return;
  zt_offload_free(z->off);
  free(z->owned_scratch);
  if (z->cs) z->be->stream_sync(z->cs);
  for (int i = 0; i < PARAM_STAGE_BUFFERS; i++) {
    if (z->stage[i]) z->be->free(ZT_MEM_DEVICE, z->stage[i]);
    if (z->stage_in[i]) z->be->event_free(z->stage_in[i]);
    if (z->stage_out[i]) z->be->event_free(z->stage_out[i]);
  }
  if (z->params_ready) z->be->event_free(z->params_ready);
  if (z->cs) z->be->stream_free(z->cs);
  if (z->param_dev) z->be->free(ZT_MEM_DEVICE, z->param_dev);
  if (z->param_host) z->be->free(ZT_MEM_PINNED, z->param_host);
  free(z->unit_param);
  for (int k = 0; k < ZT_STATE_KINDS; k++) /* placed params: param_dev and param_host */
    if (z->st[k].p && !z->st[k].alias && !(k == ZT_STATE_PARAM && z->unit_param))
      z->be->free(z->st[k].mem, z->st[k].p);
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
  free(z);
}

int zt_zero_stage(const zt_zero *z) { return z->cfg.stage; }

const char *zt_zero_nvme_engine(const zt_zero *z) {
  return z->off ? zt_offload_nvme_engine(z->off) : NULL;
}

zt_state_view zt_zero_state(const zt_zero *z, zt_state_kind kind) {
  const state_buf *b = &z->st[kind];
  return (zt_state_view){.data = b->p, .lo = b->lo, .hi = b->hi, .dtype = b->dt, .mem = b->mem};
}

void zt_zero_shard(const zt_zero *z, int64_t *lo, int64_t *hi) {
  *lo = z->lo;
  *hi = z->hi;
}

void zt_zero_bytes(const zt_zero *z, int64_t *states, int64_t *buffers) {
  *states = z->state_bytes;
  *buffers = z->buffer_bytes;
}

/* PARAM at flat element i (its range must hold i). */
static void *param_at(const zt_zero *z, int64_t i) {
  const state_buf *b = &z->st[ZT_STATE_PARAM];
  return (char *)b->p + (size_t)(i - b->lo) * zt_dtype_size(b->dt);
}

/* PARAM at flat element i of unit u (its piece on this rank must hold i). */
static void *unit_param_at(const zt_zero *z, int u, int64_t i) {
  if (!z->unit_param) return param_at(z, i);
  int64_t a = z->u.start[u] > z->lo ? z->u.start[u] : z->lo;
  return (char *)z->unit_param[u] + (size_t)(i - a) * zt_dtype_size(z->cfg.param_dtype);
}

/* The weights changed (an update, a load): staged copies are stale, and
 * the next copies down wait for the model stream to get here. */
static void params_written(zt_zero *z) {
  if (!z->cs) return;
  for (int i = 0; i < PARAM_STAGE_BUFFERS; i++) z->stage_unit[i] = -1;
  z->be->event_record(z->params_ready, z->stream);
}

int zt_zero_sync_params(zt_zero *z, zt_err *e) {
  if (param_is_master(z)) return ZT_OK;
  const state_buf *w = &z->st[ZT_STATE_MASTER];
  if (z->off) {
    int rc = zt_offload_sync_params(z->off, e);
    if (rc) return rc;
    params_written(z);
  } else {
    z->be->convert(z->stream, z->cfg.param_dtype, param_at(z, w->lo), ZT_F32, w->p,
                   (size_t)(w->hi - w->lo));
  }
  if (w->hi - w->lo < z->st[ZT_STATE_PARAM].hi - z->st[ZT_STATE_PARAM].lo) {
    z->be->stream_sync(z->stream); /* MPI reads it */
    zt_comm_allgather(z->dp, z->st[ZT_STATE_PARAM].p, z->counts, z->displs, z->cfg.param_dtype);
  }
  return ZT_OK;
}

/* ---- stage >= 2: gradient buckets ------------------------------------- */

/* A reduced bucket: add this rank's part into the shard, free its buffer. */
static void finish_bucket(zt_zero *z, zt_bucket *b) {
  zt_comm_wait(&b->req);
  int64_t from, n = owned(z, z->dp->rank, b->lo, b->hi, &from);
  if (n && half_reduce(z))
    z->be->convert(z->stream, ZT_F32, z->recv[b->buf], z->cfg.reduce_dtype, z->hrecv[b->buf],
                   (size_t)n);
  if (n) z->be->add(z->stream, ZT_F32, grads(z) + (from - z->lo), z->recv[b->buf], (size_t)n);
  /* the step's last reduction of the bucket: its sum is final, and the
   * part the host updates starts down while backward goes on */
  if (++b->reduced == z->cfg.microbatches && n && z->off)
    zt_offload_grads_final(z->off, grads(z), from, from + n);
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

/* The unit a pass uses after `unit`: the nearest non-empty one of its
 * group, or -1. */
static int next_unit(const zt_zero *z, int unit, int backward) {
  int step = backward ? -1 : 1, next = unit + step;
  while (next >= 0 && next < z->u.n && !z->u.numel[next]) next += step;
  if (!backward && unit == z->u.final_unit) return -1;
  if (next < 0 || next >= z->u.n || group_of(z, next) != group_of(z, unit)) return -1;
  return next;
}

static int *gather_counts(const zt_zero *z, int unit) {
  return z->unit_counts + (size_t)unit * 2 * z->dp->size;
}

/* Where this rank's piece of the unit's weights lives when off the device
 * (ZT_PLACE_CPU, _NVME), else 0 (on the device, or no piece). */
static int off_device(const zt_zero *z, int unit) {
  if (unit < 0 || !z->unit_param || !gather_counts(z, unit)[z->dp->rank]) return 0;
  return z->cfg.offload.place[ZT_OFF_PARAMS][unit];
}

static void fail(zt_zero *z, const zt_err *e) {
  if (!z->failed) z->err = *e;
  z->failed = 1;
}

/* Starts copying the unit's host piece down to a staging buffer on the
 * copy stream (a buffer no gather has taken yet is reused when none is
 * free: its copy is only dropped). Returns the buffer, or -1. */
static int stage_params(zt_zero *z, int unit) {
  int where = off_device(z, unit);
  if (!where) return -1;
  for (int i = 0; i < PARAM_STAGE_BUFFERS; i++)
    if (z->stage_unit[i] == unit) return i;
  int k = -1;
  for (int i = 0; i < PARAM_STAGE_BUFFERS && k < 0; i++)
    if (z->stage_unit[i] < 0) k = i;
  if (k < 0) k = z->stage_evict = (z->stage_evict + 1) % PARAM_STAGE_BUFFERS;
  int *counts = gather_counts(z, unit), *displs = counts + z->dp->size, me = z->dp->rank;
  size_t x = zt_dtype_size(z->cfg.param_dtype);
  z->stage_unit[k] = unit;
  if (where == ZT_PLACE_NVME) {
    /* read from the file now; copied down when the gather takes it, once
     * the copy out of the same host buffer last time is done */
    zt_err e;
    z->be->event_sync(z->stage_in[k]);
    z->stage_reading[k] = 1;
    if (zt_offload_param_fetch(z->off, unit, k, &e)) {
      fail(z, &e);
      z->stage_reading[k] = 0;
    }
    return k;
  }
  /* after the weights were last written, and after the gather that last
   * read this buffer */
  z->be->event_wait(z->cs, z->params_ready);
  z->be->event_wait(z->cs, z->stage_out[k]);
  z->be->copy(z->cs, z->stage[k], unit_param_at(z, unit, z->u.start[unit] + displs[me]),
              (size_t)counts[me] * x);
  z->be->event_record(z->stage_in[k], z->cs);
  return k;
}

/* Starts the unit's all-gather into a free gather buffer (none free: it
 * is gathered when needed); with its weights on the host, its piece comes
 * from the staging buffer, and the copy of the piece of the unit the pass
 * uses after it (backward: the one before) starts. */
static void start_gather(zt_zero *z, int unit, int backward) {
  if (unit < 0 || unit >= z->u.n || z->unit_gbuf[unit] >= 0) return;
  int k = -1;
  for (int i = 0; i < z->n_gbufs && k < 0; i++)
    if (z->gbuf_unit[i] < 0) k = i;
  if (k < 0) return; /* no room to prefetch: gather when needed */
  z->gbuf_unit[k] = unit;
  z->unit_gbuf[unit] = k;
  int64_t a = z->u.start[unit];
  /* MPI reads the count arrays until the gather completes: they persist */
  int *counts = gather_counts(z, unit), *displs = counts + z->dp->size;
  int me = z->dp->rank;
  zt_dtype t = z->cfg.param_dtype;
  size_t x = zt_dtype_size(t);
  void *piece = (char *)z->gbufs[k] + (size_t)displs[me] * x;
  int j = stage_params(z, unit);
  if (j >= 0 && z->stage_reading[j]) { /* read from the file: down to the staging */
    zt_err e;
    const void *h = zt_offload_param_wait(z->off, j, &e);
    z->stage_reading[j] = 0;
    if (!h) fail(z, &e);
    z->be->event_wait(z->cs, z->stage_out[j]);
    if (h) z->be->copy(z->cs, z->stage[j], h, (size_t)counts[me] * x);
    z->be->event_record(z->stage_in[j], z->cs);
  }
  if (j >= 0) {
    z->be->event_wait(z->stream, z->stage_in[j]);
    z->be->copy(z->stream, piece, z->stage[j], (size_t)counts[me] * x);
    z->be->event_record(z->stage_out[j], z->stream);
    z->stage_unit[j] = -1;
  } else if (counts[me]) {
    z->be->copy(z->stream, piece, unit_param_at(z, unit, a + displs[me]), (size_t)counts[me] * x);
  }
  stage_params(z, next_unit(z, unit, backward));
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
    start_gather(z, unit, backward);
  }
  if (z->unit_gathering[unit]) {
    zt_comm_wait(&z->unit_req[unit]);
    z->unit_gathering[unit] = 0;
  }
  if (prefetch) start_gather(z, next_unit(z, unit, backward), backward);
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

void zt_zero_before(zt_zero *z, int unit, zt_zero_pass pass, void **w, float **g) {
  int64_t s = z->u.start[unit];
  int backward = pass != ZT_ZERO_FWD, need_g = pass == ZT_ZERO_BWD || pass == ZT_ZERO_BWD_WEIGHT;
  if (z->cfg.stage < 3) {
    *w = param_at(z, s);
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
  if (z->cfg.stage < 2) *g = grads(z) + s;
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
  const state_buf *g = &z->st[ZT_STATE_GRAD];
  for (int i = 0; i < z->n_buckets; i++) z->buckets[i].reduced = 0;
  if (z->off) zt_offload_grads_begin(z->off);
  z->be->memzero(z->stream, g->p, (size_t)(z->cfg.stage < 2 ? z->numel : z->S) * sizeof(float));
}

void zt_zero_grads_end(zt_zero *z, zt_zero_range *r) {
  float *g = grads(z);
  switch (z->cfg.stage) {
    case 0:
      if (half_reduce(z)) {
        zt_dtype t = z->cfg.reduce_dtype;
        z->be->convert(z->stream, t, z->hfull, ZT_F32, g, (size_t)z->numel);
        z->be->stream_sync(z->stream);
        zt_comm_allreduce(z->dp, z->hfull, (size_t)z->numel, t, ZT_SUM);
        z->be->convert(z->stream, ZT_F32, g, t, z->hfull, (size_t)z->numel);
      } else {
        zt_comm_allreduce(z->dp, g, (size_t)z->numel, ZT_F32, ZT_SUM);
      }
      break;
    case 1:
      /* in place: this rank's part lands at the start of the gradients */
      if (half_reduce(z)) {
        zt_dtype t = z->cfg.reduce_dtype;
        z->be->convert(z->stream, t, z->hfull, ZT_F32, g, (size_t)z->numel);
        z->be->stream_sync(z->stream);
        zt_comm_reduce_scatter(z->dp, z->hfull, z->hfull, z->counts, t, ZT_SUM);
        z->be->convert(z->stream, ZT_F32, g, t, z->hfull, (size_t)z->counts[z->dp->rank]);
      } else {
        zt_comm_reduce_scatter(z->dp, g, g, z->counts, ZT_F32, ZT_SUM);
      }
      break;
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
      /* and a read of weights from the file that no gather took is done
       * before the update writes them there */
      for (int i = 0; z->cs && i < PARAM_STAGE_BUFFERS; i++)
        if (z->stage_reading[i]) {
          zt_err e;
          if (!zt_offload_param_wait(z->off, i, &e)) fail(z, &e);
          z->stage_reading[i] = 0;
          z->stage_unit[i] = -1;
        }
  }
  int64_t lo = z->cfg.stage == 0 ? 0 : z->lo, hi = z->cfg.stage == 0 ? z->numel : z->hi;
  const state_buf *w = &z->st[ZT_STATE_MASTER];
  *r = (zt_zero_range){.lo = lo, .hi = hi, .w = master(z) + (lo - w->lo), .g = g,
                       .m = z->st[ZT_STATE_EXP_AVG].p, .v = z->st[ZT_STATE_EXP_AVG_SQ].p,
                       .w16 = param_is_master(z) || z->off ? NULL : param_at(z, lo),
                       .dt16 = z->cfg.param_dtype};
  if (z->off) r->w = r->m = r->v = NULL, r->w16 = NULL; /* reached through zt_zero_update */
}

int zt_zero_update(zt_zero *z, const zt_zero_range *r, int update, zt_update_fn fn, void *ctx,
                   zt_step_sums *sums, uint64_t *host_nonfinite, zt_err *e) {
  zt_update_exec x = {.be = z->be, .stream = z->stream, .sums = sums};
  if (z->failed) {
    *e = z->err;
    return e->code;
  }
  if (z->off) {
    int rc = zt_offload_step(z->off, r->g, update, fn, ctx, &x, host_nonfinite, e);
    if (!rc && update) params_written(z);
    return rc;
  }
  fn(ctx, &x, r);
  return ZT_OK;
}

/* Offloaded state kinds and the store's state of each. */
static int store_state(const zt_zero *z, zt_state_kind kind) {
  if (!z->off || (kind == ZT_STATE_MASTER && param_is_master(z))) return -1;
  return kind == ZT_STATE_MASTER ? ZT_OFF_W : kind == ZT_STATE_EXP_AVG ? ZT_OFF_M
         : kind == ZT_STATE_EXP_AVG_SQ ? ZT_OFF_V : -1;
}

static int state_transfer(zt_zero *z, zt_state_kind kind, int64_t a, int64_t n, float *h,
                          int to_host, zt_err *e) {
  int s = store_state(z, kind);
  if (s >= 0)
    return to_host ? zt_offload_read(z->off, s, a, n, h, e) : zt_offload_write(z->off, s, a, n, h, e);
  const state_buf *b = &z->st[kind];
  float *p = (float *)b->p + (a - b->lo);
  z->be->copy(z->stream, to_host ? (void *)h : (void *)p, to_host ? (void *)p : (void *)h,
              (size_t)n * sizeof(float));
  z->be->stream_sync(z->stream);
  return ZT_OK;
}

int zt_zero_state_read(zt_zero *z, zt_state_kind kind, int64_t a, int64_t n, float *dst,
                       zt_err *e) {
  return state_transfer(z, kind, a, n, dst, 1, e);
}

int zt_zero_state_write(zt_zero *z, zt_state_kind kind, int64_t a, int64_t n, const float *src,
                        zt_err *e) {
  return state_transfer(z, kind, a, n, (float *)src, 0, e);
}

void zt_zero_params_sync(zt_zero *z) {
  if (z->cfg.stage != 1 && z->cfg.stage != 2) return;
  z->be->stream_sync(z->stream); /* MPI reads what the update wrote */
  zt_comm_allgather(z->dp, z->st[ZT_STATE_PARAM].p, z->counts, z->displs, z->cfg.param_dtype);
}

void zt_zero_add_grad(zt_zero *z, int64_t a, int64_t n, const float *src) {
  if (n <= 0) return;
  if (z->cfg.stage < 2) {
    z->be->add(z->stream, ZT_F32, grads(z) + a, src, (size_t)n);
    return;
  }
  z->be->add(z->stream, ZT_F32, grads(z) + (a - z->lo), src, (size_t)n);
  zt_zero_grads_written(z, a, n);
}

void zt_zero_grads_written(zt_zero *z, int64_t a, int64_t n) {
  if (z->off) zt_offload_grads_stale(z->off, a, a + n);
}

const float *zt_zero_owned_weights(const zt_zero *z, int64_t a, int64_t b, int64_t *from,
                                   int64_t *n) {
  *n = owned(z, z->dp->rank, a, b, from);
  if (!*n) return NULL;
  if (master(z)) return master(z) + (*from - z->st[ZT_STATE_MASTER].lo);
  /* spread over several memories: a host copy */
  zt_zero *zz = (zt_zero *)z;
  zt_err e;
  free(zz->owned_scratch);
  zz->owned_scratch = malloc((size_t)*n * sizeof(float));
  if (!zz->owned_scratch || zt_zero_state_read(zz, ZT_STATE_MASTER, *from, *n, zz->owned_scratch, &e))
    return NULL;
  return zz->owned_scratch;
}
