/* offload: see offload.h. */
#include "parallel/offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/nvme.h"
#include "src/core/timer.h"
#include "src/core/trace.h"

/* Host staging: chunks of CHUNK elements, NSLOT of them in turn, so that
 * two chunks are on their way down while one updates. */
#define CHUNK ((int64_t)1 << 18)
#define NSLOT 3
enum { SL_G = 0, SL_W, SL_M, SL_V, SL_W16, SL_BUFS };
/* nvme: every segment starts at a multiple of this in the file, and
 * requests are padded to it (the largest alignment O_DIRECT may ask). */
#define FILE_ALIGN ((int64_t)65536)

/* One unit's part of the range, each state where the policy put it (ptr:
 * its element a; off: its byte offset in the nvme file). */
typedef struct seg {
  int64_t a, b;
  int unit;
  unsigned char place[ZT_OFF_STATES];
  unsigned char param_place; /* of the unit's weights (PARAM) */
  char *ptr[ZT_OFF_STATES];
  int64_t off[ZT_OFF_STATES];
  int64_t off_p; /* params on nvme: the byte offset of the weights in the file */
  float *hg;      /* grads_ahead: the pinned copy of its gradients (element a) */
  int c0;         /* its first chunk */
} seg;

/* A piece of the host-updated part: [a, a + n) of segment s; `have`: how
 * many of its gradients are in the pinned copy this step (n: all, so the
 * step copies none down; negative: written again since). */
typedef struct chunk {
  int64_t a, n;
  int s;
  int64_t have;
} chunk;

struct zt_offload {
  const zt_backend *be, *cpu;
  zt_stream *stream; /* the model's */
  zt_stream *cs;     /* the copies of host-updated chunks */
  zt_stream *hs;     /* the CPU backend's, for the host's AdamW */
  zt_offload_layout lay;
  int nseg, nchunk;
  seg *segs;
  chunk *chunks;
  void *buf[ZT_OFF_STATES][ZT_PLACES]; /* each state's memory per placement */
  int64_t bytes[ZT_PLACES];
  float *slot[NSLOT][SL_BUFS]; /* pinned, aligned for nvme requests */
  void *slot_raw[NSLOT][SL_BUFS];
  zt_event *ev_in[NSLOT], *ev_out[NSLOT], *ev_ready, *ev_done;
  zt_event *ev_grad;   /* grads_ahead: the model stream where final gradients are written */
  float *hgrad;        /* grads_ahead: the pinned copy of the host-updated gradients */
  int64_t hgrad_elems;
  zt_step_sums *hsums; /* host */
  zt_nvme *file;     /* the nvme-placed states, NULL when none */
  int depth;         /* chunks loaded ahead: NSLOT - 1, or 1 when serial */
  int serial;        /* test hook ZT_TEST_OFFLOAD_SERIAL: every transfer waited
                      * for at once, so a trace shows what the overlap hides */
  int rd[NSLOT][ZT_OFF_STATES], wr[NSLOT][ZT_OFF_STATES]; /* requests per slot, -1: none */
  int wrp[NSLOT];    /* params on nvme: the slot's write of the new weights, -1: none */
  /* params on nvme: the unit's segment, and the host buffers the weights
   * are read into ahead of their use (pinned, aligned) */
  int *seg_of_unit;
  char *pslot[ZT_OFFLOAD_PARAM_SLOTS];
  void *pslot_raw[ZT_OFFLOAD_PARAM_SLOTS];
  int prd[ZT_OFFLOAD_PARAM_SLOTS]; /* the read into each, -1: none */
  int64_t pslot_bytes;
};

static const char *const place_names[ZT_PLACES] = {"device", "cpu", "nvme"};
static const char *const kind_names[ZT_OFF_KINDS] = {"params", "grads", "master", "moments"};

const char *zt_place_name(zt_place p) { return place_names[p]; }
const char *zt_offload_kind_name(zt_offload_kind k) { return kind_names[k]; }

int zt_offload_any(const zt_offload_cfg *cfg, zt_offload_kind k) {
  for (int u = 0; cfg->place[k] && u < cfg->n_units; u++)
    if (cfg->place[k][u] != ZT_PLACE_DEVICE) return 1;
  return 0;
}

int zt_offload_uses(const zt_offload_cfg *cfg, zt_place p) {
  for (int k = 0; k < ZT_OFF_KINDS; k++)
    for (int u = 0; cfg->place[k] && u < cfg->n_units; u++)
      if (cfg->place[k][u] == p) return 1;
  return 0;
}

static size_t xsize(const zt_offload *o) { return zt_dtype_size(o->lay.param_dt); }
static int half(const zt_offload *o) { return o->lay.param_dt != ZT_F32; }

static void *param_at(const zt_offload *o, int64_t i) {
  return (char *)o->lay.param + (size_t)(i - o->lay.lo) * xsize(o);
}

/* PARAM at flat element i of segment k: in the unit's own part where the
 * weights are placed per unit, else in the one buffer. */
static void *seg_param(const zt_offload *o, int k, int64_t i) {
  const seg *g = &o->segs[k];
  if (!o->lay.unit_param) return param_at(o, i);
  return (char *)o->lay.unit_param[g->unit] + (size_t)(i - g->a) * xsize(o);
}

/* State s of segment k at flat element i. */
static float *at(const zt_offload *o, int k, int s, int64_t i) {
  return (float *)o->segs[k].ptr[s] + (i - o->segs[k].a);
}

static int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

/* Weights in the file: the passes' copy comes from it ahead of each use. */
static int params_in_file(const seg *g) { return g->param_place == ZT_PLACE_NVME; }

/* State s of segment g is PARAM's memory: fp32 masters on the device,
 * whose weights are in memory (the masters of weights in the file are
 * memory of their own, the file their copy). */
static int is_param(const zt_offload *o, const seg *g, int s) {
  return s == ZT_OFF_W && o->lay.master_is_param && g->place[s] == ZT_PLACE_DEVICE &&
         !params_in_file(g);
}

/* Updated on the host: any of its states or its weights off the device
 * (a device kernel cannot write weights in host memory). */
static int host_updated(const seg *g) {
  return g->place[ZT_OFF_W] || g->place[ZT_OFF_M] || g->place[ZT_OFF_V] || g->param_place;
}

/* Units cut by [lo, hi): the segments, and the host-updated ones in chunks. */
static int plan_segments(zt_offload *o, const zt_offload_cfg *cfg) {
  const zt_offload_layout *l = &o->lay;
  o->segs = calloc((size_t)(l->n_units > 0 ? l->n_units : 1), sizeof *o->segs);
  if (!o->segs) return -1;
  int64_t nch = 0;
  for (int u = 0; u < l->n_units; u++) {
    int64_t a = l->start[u] > l->lo ? l->start[u] : l->lo;
    int64_t b = l->start[u] + l->numel[u] < l->hi ? l->start[u] + l->numel[u] : l->hi;
    if (b <= a) continue;
    seg *g = &o->segs[o->nseg++];
    g->a = a;
    g->b = b;
    g->unit = u;
    g->param_place = cfg->place[ZT_OFF_PARAMS] ? cfg->place[ZT_OFF_PARAMS][u] : 0;
    g->place[ZT_OFF_W] = cfg->place[ZT_OFF_MASTER] ? cfg->place[ZT_OFF_MASTER][u] : 0;
    g->place[ZT_OFF_M] = g->place[ZT_OFF_V] =
        cfg->place[ZT_OFF_MOMENTS] ? cfg->place[ZT_OFF_MOMENTS][u] : 0;
    if (host_updated(g)) nch += (b - a + CHUNK - 1) / CHUNK;
  }
  o->chunks = malloc((size_t)(nch ? nch : 1) * sizeof *o->chunks);
  if (!o->chunks) return -1;
  for (int k = 0; k < o->nseg; k++) {
    o->segs[k].c0 = o->nchunk;
    for (int64_t a = o->segs[k].a; host_updated(&o->segs[k]) && a < o->segs[k].b; a += CHUNK) {
      int64_t n = o->segs[k].b - a < CHUNK ? o->segs[k].b - a : CHUNK;
      o->chunks[o->nchunk++] = (chunk){.a = a, .n = n, .s = k};
    }
  }
  return 0;
}

/* Where each state's segments go, packed per placement in flat order:
 * b[s][p] bytes of state s at placement p (a state wholly in one memory is
 * one buffer over the range, as without offload; fp32 masters on the
 * device are PARAM and count none), and each nvme segment's offset in the
 * file, an aligned, padded extent of its own. */
static void lay_out(zt_offload *o, int64_t b[ZT_OFF_STATES][ZT_PLACES], int64_t *param_file) {
  int64_t file = 0;
  for (int s = 0; s < ZT_OFF_STATES; s++) {
    for (int p = 0; p < ZT_PLACES; p++) b[s][p] = 0;
    for (int k = 0; k < o->nseg; k++) {
      seg *g = &o->segs[k];
      int p = g->place[s];
      int64_t bytes = (g->b - g->a) * (int64_t)sizeof(float);
      if (p == ZT_PLACE_NVME) {
        g->off[s] = file;
        bytes = round_up(bytes, FILE_ALIGN);
        file += bytes;
      }
      if (!is_param(o, g, s)) b[s][p] += bytes;
    }
  }
  /* the weights placed on nvme, after the states: an extent per unit */
  int64_t before = file;
  for (int k = 0; k < o->nseg; k++) {
    seg *g = &o->segs[k];
    if (!params_in_file(g)) continue;
    g->off_p = file;
    file += round_up((g->b - g->a) * (int64_t)xsize(o), FILE_ALIGN);
  }
  *param_file = file - before;
}

/* The host buffers params in the file are read into: each as large as the
 * largest unit's extent (0: no params in the file). */
static int64_t param_slot_bytes(const zt_offload *o) {
  int64_t most = 0;
  for (int k = 0; k < o->nseg; k++)
    if (params_in_file(&o->segs[k]) && o->segs[k].b - o->segs[k].a > most)
      most = o->segs[k].b - o->segs[k].a;
  return most ? round_up(most * (int64_t)xsize(o), FILE_ALIGN) : 0;
}

/* Staging for the host update: NSLOT slots of SL_BUFS buffers, each as large
 * as the largest chunk (padded for nvme requests) and aligned by hand. */
static size_t slot_bytes(const zt_offload *o) {
  int64_t ch = 0;
  for (int i = 0; i < o->nchunk; i++)
    if (o->chunks[i].n > ch) ch = o->chunks[i].n;
  if (!ch && o->nseg) ch = 1; /* sync_params and transfers stage through slot 0 */
  return (size_t)round_up(ch * (int64_t)sizeof(float), FILE_ALIGN);
}

static int alloc_states(zt_offload *o) {
  static const zt_mem_kind kinds[ZT_PLACES] = {ZT_MEM_DEVICE, ZT_MEM_PINNED, ZT_MEM_HOST};
  int64_t n[ZT_OFF_STATES][ZT_PLACES], param_file;
  lay_out(o, n, &param_file);
  o->bytes[ZT_PLACE_NVME] += param_file;
  for (int s = 0; s < ZT_OFF_STATES; s++) {
    int alias = s == ZT_OFF_W && o->lay.master_is_param;
    o->bytes[ZT_PLACE_NVME] += n[s][ZT_PLACE_NVME];
    for (int p = ZT_PLACE_DEVICE; p <= ZT_PLACE_CPU; p++) {
      /* fp32 masters on the device are PARAM, but where weights are in the file */
      if (p == ZT_PLACE_DEVICE && alias && !n[s][p]) continue;
      if (!n[s][p] && p != ZT_PLACE_DEVICE) continue;
      /* the device buffer always exists: an empty range's view points there */
      if (!(o->buf[s][p] = o->be->alloc(kinds[p], (size_t)(n[s][p] ? n[s][p] : 4)))) return -1;
      o->bytes[p] += n[s][p];
    }
    int64_t used[ZT_PLACES] = {0};
    for (int k = 0; k < o->nseg; k++) {
      seg *g = &o->segs[k];
      int p = g->place[s];
      if (p == ZT_PLACE_NVME) continue;
      if (is_param(o, g, s)) {
        g->ptr[s] = seg_param(o, k, g->a);
        continue;
      }
      g->ptr[s] = (char *)o->buf[s][p] + (size_t)used[p] * sizeof(float);
      used[p] += g->b - g->a;
    }
  }
  return 0;
}

/* Elements of the pinned copy of the gradients: every host-updated
 * segment's, when the layout asks for it. */
static int64_t grads_host_elems(const zt_offload *o) {
  int64_t n = 0;
  for (int k = 0; o->lay.grads_ahead && k < o->nseg; k++)
    if (host_updated(&o->segs[k])) n += o->segs[k].b - o->segs[k].a;
  return n;
}

int zt_offload_plan_bytes(const zt_offload_cfg *cfg, const zt_offload_layout *lay,
                          zt_offload_sizes *out) {
  zt_offload o = {.lay = *lay};
  memset(out, 0, sizeof *out);
  int rc = plan_segments(&o, cfg);
  if (!rc) {
    lay_out(&o, out->state, &out->param_file);
    out->staging = (int64_t)NSLOT * SL_BUFS * (int64_t)(slot_bytes(&o) + FILE_ALIGN);
    int64_t ps = param_slot_bytes(&o);
    if (ps) out->staging += ZT_OFFLOAD_PARAM_SLOTS * (ps + FILE_ALIGN);
    out->grads_host = grads_host_elems(&o) * (int64_t)sizeof(float);
  }
  free(o.segs);
  free(o.chunks);
  return rc;
}

/* This rank's file under cfg->dir, named by job and rank: the same name at
 * the next start, which replaces a file a killed run left behind. */
static int open_file(zt_offload *o, const zt_offload_cfg *cfg, zt_err *e) {
  if (!o->bytes[ZT_PLACE_NVME]) return ZT_OK;
  char path[4096];
  snprintf(path, sizeof path, "%s/ztrain-%s-rank%d.offload", cfg->dir ? cfg->dir : ".",
           cfg->job ? cfg->job : "job", o->lay.rank);
  if (!(o->file = zt_nvme_open(path, o->bytes[ZT_PLACE_NVME], ZT_NVME_AUTO, e))) return e->code;
  if (FILE_ALIGN % (int64_t)zt_nvme_align(o->file))
    return zt_err_set(e, ZT_ERUNTIME, "offload: %s asks for %zu-byte alignment, more than %lld",
                      path, zt_nvme_align(o->file), (long long)FILE_ALIGN);
  return ZT_OK;
}

zt_offload *zt_offload_new(const zt_offload_cfg *cfg, const zt_offload_layout *lay,
                           const zt_backend *be, zt_stream *stream, zt_err *e) {
  zt_offload *o = calloc(1, sizeof *o);
  if (!o) {
    zt_err_set(e, ZT_ERUNTIME, "out of memory (offload tables)");
    return NULL;
  }
  o->be = be;
  o->cpu = zt_backend_cpu();
  o->stream = stream;
  o->lay = *lay;
  if (zt_offload_any(cfg, ZT_OFF_GRADS) ||
      (zt_offload_any(cfg, ZT_OFF_PARAMS) && !lay->unit_param)) {
    zt_offload_free(o);
    zt_err_set(e, ZT_EINPUT, "offload: %s cannot be offloaded here; master and moments can, and "
               "params at ZeRO stage 3", zt_offload_any(cfg, ZT_OFF_GRADS) ? "grads" : "params");
    return NULL;
  }
  for (int i = 0; i < NSLOT; i++) {
    for (int s = 0; s < ZT_OFF_STATES; s++) o->rd[i][s] = o->wr[i][s] = -1;
    o->wrp[i] = -1;
  }
  for (int i = 0; i < ZT_OFFLOAD_PARAM_SLOTS; i++) o->prd[i] = -1;
  const char *serial = getenv("ZT_TEST_OFFLOAD_SERIAL");
  o->serial = serial && *serial && strcmp(serial, "0");
  o->depth = o->serial ? 1 : NSLOT - 1;
  int ok = plan_segments(o, cfg) == 0 && alloc_states(o) == 0 &&
           (o->seg_of_unit = malloc((size_t)(lay->n_units > 0 ? lay->n_units : 1) * sizeof(int)));
  for (int u = 0; ok && u < lay->n_units; u++) o->seg_of_unit[u] = -1;
  for (int k = 0; ok && k < o->nseg; k++) o->seg_of_unit[o->segs[k].unit] = k;
  o->pslot_bytes = ok ? param_slot_bytes(o) : 0;
  o->hgrad_elems = ok ? grads_host_elems(o) : 0;
  if (ok && o->hgrad_elems) {
    ok = (o->hgrad = be->alloc(ZT_MEM_PINNED, (size_t)o->hgrad_elems * sizeof(float))) &&
         (o->ev_grad = be->event_new());
    o->bytes[ZT_PLACE_CPU] += o->hgrad_elems * (int64_t)sizeof(float);
    for (int k = 0, used = 0; ok && k < o->nseg; k++)
      if (host_updated(&o->segs[k])) {
        o->segs[k].hg = o->hgrad + used;
        used += (int)(o->segs[k].b - o->segs[k].a);
      }
  }
  for (int i = 0; ok && o->pslot_bytes && i < ZT_OFFLOAD_PARAM_SLOTS; i++) {
    char *raw = be->alloc(ZT_MEM_PINNED, (size_t)(o->pslot_bytes + FILE_ALIGN));
    o->pslot_raw[i] = raw;
    ok = raw != NULL;
    if (ok) o->pslot[i] = raw + (FILE_ALIGN - (uintptr_t)raw % FILE_ALIGN) % FILE_ALIGN;
  }
  if (ok && open_file(o, cfg, e)) {
    zt_offload_free(o);
    return NULL;
  }
  ok = ok && (o->cs = be->stream_new()) && (o->hs = o->cpu->stream_new()) &&
       (o->ev_ready = be->event_new()) && (o->ev_done = be->event_new()) &&
       (o->hsums = calloc(1, sizeof *o->hsums));
  size_t slot = slot_bytes(o);
  for (int i = 0; ok && i < NSLOT; i++) {
    ok = (o->ev_in[i] = be->event_new()) && (o->ev_out[i] = be->event_new());
    for (int b = 0; ok && b < SL_BUFS; b++) {
      char *raw = be->alloc(ZT_MEM_PINNED, slot + FILE_ALIGN);
      o->slot_raw[i][b] = raw;
      ok = raw != NULL;
      if (ok) o->slot[i][b] = (float *)(raw + (FILE_ALIGN - (uintptr_t)raw % FILE_ALIGN) % FILE_ALIGN);
    }
  }
  if (!ok) {
    zt_offload_free(o);
    zt_err_set(e, ZT_ERUNTIME, "out of memory for the offloaded optimizer states");
    return NULL;
  }
  return o;
}

void zt_offload_free(zt_offload *o) {
  if (!o) return;
  static const zt_mem_kind kinds[ZT_PLACES] = {ZT_MEM_DEVICE, ZT_MEM_PINNED, ZT_MEM_HOST};
  if (o->cs) o->be->stream_sync(o->cs);
  if (o->file) zt_nvme_close(o->file); /* waits, and removes the file */
  for (int s = 0; s < ZT_OFF_STATES; s++)
    for (int p = 0; p < ZT_PLACES; p++)
      if (o->buf[s][p]) o->be->free(kinds[p], o->buf[s][p]);
  for (int i = 0; i < NSLOT; i++) {
    for (int b = 0; b < SL_BUFS; b++)
      if (o->slot_raw[i][b]) o->be->free(ZT_MEM_PINNED, o->slot_raw[i][b]);
    if (o->ev_in[i]) o->be->event_free(o->ev_in[i]);
    if (o->ev_out[i]) o->be->event_free(o->ev_out[i]);
  }
  for (int i = 0; i < ZT_OFFLOAD_PARAM_SLOTS; i++)
    if (o->pslot_raw[i]) o->be->free(ZT_MEM_PINNED, o->pslot_raw[i]);
  free(o->seg_of_unit);
  if (o->hgrad) o->be->free(ZT_MEM_PINNED, o->hgrad);
  if (o->ev_grad) o->be->event_free(o->ev_grad);
  if (o->ev_ready) o->be->event_free(o->ev_ready);
  if (o->ev_done) o->be->event_free(o->ev_done);
  if (o->cs) o->be->stream_free(o->cs);
  if (o->hs) o->cpu->stream_free(o->hs);
  free(o->hsums);
  free(o->segs);
  free(o->chunks);
  free(o);
}

void zt_offload_bytes(const zt_offload *o, int64_t bytes[ZT_PLACES]) {
  for (int p = 0; p < ZT_PLACES; p++) bytes[p] = o->bytes[p];
}

void *zt_offload_state(const zt_offload *o, int s, zt_mem_kind *mem) {
  int p = o->nseg ? o->segs[0].place[s] : ZT_PLACE_DEVICE;
  for (int k = 1; k < o->nseg; k++)
    if (o->segs[k].place[s] != p) return NULL;
  if (p == ZT_PLACE_NVME) return NULL;
  *mem = p == ZT_PLACE_CPU ? ZT_MEM_PINNED : ZT_MEM_DEVICE;
  if (p == ZT_PLACE_DEVICE && s == ZT_OFF_W && o->lay.master_is_param)
    return o->lay.unit_param ? NULL : o->lay.param; /* PARAM, which may be spread */
  return o->buf[s][p];
}

/* Elements [x, y) of segment k's state s in the file to or from host
 * memory q: a chunk at a time, the aligned extent around it through one
 * bounce buffer (read, and for a write changed and written back), so that
 * moving a state never holds more than a chunk of it in host memory (the
 * file is there because the host may not hold it). */
static int file_transfer(zt_offload *o, int k, int s, int64_t x, int64_t y, float *q,
                         int to_host, zt_err *e) {
  const seg *g = &o->segs[k];
  char *b = zt_nvme_buf_alloc((size_t)(CHUNK * (int64_t)sizeof(float) + 2 * FILE_ALIGN));
  if (!b) return zt_err_set(e, ZT_ERUNTIME, "out of memory reading the offload file");
  int rc = ZT_OK;
  for (int64_t u = x; !rc && u < y; u += CHUNK) {
    int64_t v = y - u < CHUNK ? y : u + CHUNK;
    int64_t from = g->off[s] + (u - g->a) * (int64_t)sizeof(float);
    int64_t lo = from / FILE_ALIGN * FILE_ALIGN;
    int64_t hi = round_up(from + (v - u) * (int64_t)sizeof(float), FILE_ALIGN);
    int t = zt_nvme_read(o->file, lo, b, (size_t)(hi - lo), e);
    rc = t < 0 ? e->code : zt_nvme_wait(o->file, t, e);
    size_t bytes = (size_t)(v - u) * sizeof(float);
    if (!rc && to_host) memcpy(q + (u - x), b + (from - lo), bytes);
    if (!rc && !to_host) {
      memcpy(b + (from - lo), q + (u - x), bytes);
      t = zt_nvme_write(o->file, lo, b, (size_t)(hi - lo), e);
      rc = t < 0 ? e->code : zt_nvme_wait(o->file, t, e);
    }
  }
  zt_nvme_buf_free(b);
  return rc;
}

/* Waits for every copy and file request of the staging (the last step's
 * write-backs may still be reading the states and the slots). */
static int drain(zt_offload *o, zt_err *e) {
  o->be->stream_sync(o->cs);
  int rc = o->file ? zt_nvme_wait_all(o->file, e) : ZT_OK;
  for (int k = 0; k < NSLOT; k++) {
    for (int s = 0; s < ZT_OFF_STATES; s++) o->rd[k][s] = o->wr[k][s] = -1;
    o->wrp[k] = -1;
  }
  for (int k = 0; k < ZT_OFFLOAD_PARAM_SLOTS; k++) o->prd[k] = -1;
  return rc;
}

/* Copies [a, a + n) of state s between host memory h and where it lives. */
static int transfer(zt_offload *o, int s, int64_t a, int64_t n, float *h, int to_host, zt_err *e) {
  int rc = drain(o, e);
  for (int k = 0; !rc && k < o->nseg; k++) {
    const seg *g = &o->segs[k];
    int64_t x = g->a > a ? g->a : a, y = g->b < a + n ? g->b : a + n;
    if (y <= x) continue;
    float *q = h + (x - a);
    if (g->place[s] == ZT_PLACE_NVME) {
      rc = file_transfer(o, k, s, x, y, q, to_host, e);
      continue;
    }
    float *p = at(o, k, s, x);
    size_t bytes = (size_t)(y - x) * sizeof(float);
    if (g->place[s] == ZT_PLACE_DEVICE) o->be->copy(o->stream, to_host ? q : p, to_host ? p : q, bytes);
    else memcpy(to_host ? q : p, to_host ? p : q, bytes);
  }
  o->be->stream_sync(o->stream); /* h is the caller's once this returns */
  return rc;
}

int zt_offload_read(zt_offload *o, int s, int64_t a, int64_t n, float *dst, zt_err *e) {
  return transfer(o, s, a, n, dst, 1, e);
}

int zt_offload_write(zt_offload *o, int s, int64_t a, int64_t n, const float *src, zt_err *e) {
  return transfer(o, s, a, n, (float *)src, 0, e);
}

int zt_offload_sync_params(zt_offload *o, zt_err *e) {
  size_t x = xsize(o);
  for (int k = 0; k < o->nseg; k++) {
    const seg *g = &o->segs[k];
    if (g->place[ZT_OFF_W] == ZT_PLACE_DEVICE && (!half(o) || !g->param_place) &&
        !params_in_file(g)) {
      if (half(o))
        o->be->convert(o->stream, o->lay.param_dt, seg_param(o, k, g->a), ZT_F32,
                       g->ptr[ZT_OFF_W], (size_t)(g->b - g->a));
      continue; /* fp32: PARAM is the masters */
    }
    /* through the staging: rounded on the host as the host update rounds */
    for (int64_t a = g->a; a < g->b; a += CHUNK) {
      int64_t n = g->b - a < CHUNK ? g->b - a : CHUNK;
      float *w = o->slot[0][SL_W];
      int rc = zt_offload_read(o, ZT_OFF_W, a, n, w, e);
      if (rc) return rc;
      void *src = w;
      if (half(o)) {
        o->cpu->convert(o->hs, o->lay.param_dt, o->slot[0][SL_W16], ZT_F32, w, (size_t)n);
        src = o->slot[0][SL_W16];
      }
      if (params_in_file(g)) { /* the slot's buffers are aligned for the file */
        int t = zt_nvme_write(o->file, g->off_p + (a - g->a) * (int64_t)x, src,
                              (size_t)round_up(n * (int64_t)x, FILE_ALIGN), e);
        if (t < 0 || zt_nvme_wait(o->file, t, e)) return e->code;
        continue;
      }
      o->be->copy(o->stream, seg_param(o, k, a), src, (size_t)n * x);
      o->be->stream_sync(o->stream); /* the staging is reused next */
    }
  }
  return ZT_OK;
}

/* ---- the step -------------------------------------------------------------- */

/* Bytes of chunk c's state s in the file: from its offset, padded. */
static int64_t file_off(const zt_offload *o, const chunk *c, int s) {
  const seg *g = &o->segs[c->s];
  return g->off[s] + (c->a - g->a) * (int64_t)sizeof(float);
}
static size_t file_len(const chunk *c) {
  return (size_t)round_up(c->n * (int64_t)sizeof(float), FILE_ALIGN);
}

/* Chunk i's gradients, and its states held on the device, down into its
 * slot; its states in the file read into it. */
static int load(zt_offload *o, float *g, int i, zt_err *e) {
  const chunk *c = &o->chunks[i];
  const seg *sg = &o->segs[c->s];
  int k = i % NSLOT;
  float **sl = o->slot[k];
  size_t bytes = (size_t)c->n * sizeof(float);
  if (o->file) {
    /* the slot's writes to the file (which read it) and its copies up
     * (before the file's reads overwrite it) must be done */
    for (int s = 0; s < ZT_OFF_STATES; s++) {
      if (o->wr[k][s] >= 0 && zt_nvme_wait(o->file, o->wr[k][s], e)) return e->code;
      o->wr[k][s] = -1;
    }
    if (o->wrp[k] >= 0 && zt_nvme_wait(o->file, o->wrp[k], e)) return e->code;
    o->wrp[k] = -1;
    o->be->event_sync(o->ev_out[k]);
  }
  if (c->have != c->n) o->be->copy(o->cs, sl[SL_G], g + (c->a - o->lay.lo), bytes);
  for (int s = 0; s < ZT_OFF_STATES; s++) {
    if (sg->place[s] == ZT_PLACE_DEVICE) o->be->copy(o->cs, sl[SL_W + s], at(o, c->s, s, c->a), bytes);
    if (sg->place[s] == ZT_PLACE_NVME &&
        (o->rd[k][s] = zt_nvme_read(o->file, file_off(o, c, s), sl[SL_W + s], file_len(c), e)) < 0)
      return e->code;
  }
  o->be->event_record(o->ev_in[k], o->cs);
  return ZT_OK;
}

/* Waits for chunk i's slot to be filled. */
static int arrived(zt_offload *o, int i, zt_err *e) {
  int k = i % NSLOT;
  o->be->event_sync(o->ev_in[k]);
  for (int s = 0; s < ZT_OFF_STATES; s++) {
    if (o->rd[k][s] >= 0 && zt_nvme_wait(o->file, o->rd[k][s], e)) return e->code;
    o->rd[k][s] = -1;
  }
  return ZT_OK;
}

/* Where chunk i's state s is on the host: in place, or its slot. */
static float *host_state(zt_offload *o, int i, int s) {
  const chunk *c = &o->chunks[i];
  if (o->segs[c->s].place[s] == ZT_PLACE_CPU) return at(o, c->s, s, c->a);
  return o->slot[i % NSLOT][SL_W + s];
}

/* Chunk i's updated states back where they live, its weights into PARAM. */
static int store(zt_offload *o, int i, zt_err *e) {
  const chunk *c = &o->chunks[i];
  const seg *sg = &o->segs[c->s];
  int k = i % NSLOT;
  float **sl = o->slot[k];
  size_t bytes = (size_t)c->n * sizeof(float);
  for (int s = 0; s < ZT_OFF_STATES; s++) {
    if (sg->place[s] == ZT_PLACE_DEVICE && !is_param(o, sg, s))
      o->be->copy(o->cs, at(o, c->s, s, c->a), sl[SL_W + s], bytes);
    if (sg->place[s] == ZT_PLACE_NVME &&
        (o->wr[k][s] = zt_nvme_write(o->file, file_off(o, c, s), sl[SL_W + s], file_len(c), e)) < 0)
      return e->code;
  }
  if (params_in_file(sg)) {
    /* the new weights to the file from an aligned buffer: the rounded copy,
     * or in fp32 the masters, copied there where they live in place */
    void *src = sl[SL_W16];
    if (!half(o)) memcpy(src, host_state(o, i, ZT_OFF_W), bytes);
    int64_t off = sg->off_p + (c->a - sg->a) * (int64_t)xsize(o);
    size_t len = (size_t)round_up(c->n * (int64_t)xsize(o), FILE_ALIGN);
    if ((o->wrp[k] = zt_nvme_write(o->file, off, src, len, e)) < 0) return e->code;
  } else {
    void *param = seg_param(o, c->s, c->a);
    if (half(o)) o->be->copy(o->cs, param, sl[SL_W16], (size_t)c->n * xsize(o));
    else o->be->copy(o->cs, param, host_state(o, i, ZT_OFF_W), bytes);
  }
  o->be->event_record(o->ev_out[k], o->cs);
  if (o->serial) {
    o->be->event_sync(o->ev_out[k]);
    for (int s = 0; s < ZT_OFF_STATES; s++)
      if (o->wr[k][s] >= 0 && zt_nvme_wait(o->file, o->wr[k][s], e)) return e->code;
      else o->wr[k][s] = -1;
    if (o->wrp[k] >= 0 && zt_nvme_wait(o->file, o->wrp[k], e)) return e->code;
    o->wrp[k] = -1;
  }
  return ZT_OK;
}

int zt_offload_step(zt_offload *o, float *g, int update, zt_update_fn fn, void *ctx,
                    const zt_update_exec *dev, uint64_t *host_nonfinite, zt_err *e) {
  size_t x = xsize(o);
  /* the gradients are final where the model stream is now: the copies
   * down need not wait for the device's own pieces, queued next */
  if (o->nchunk) o->be->event_record(o->ev_ready, o->stream);
  /* the device's pieces first: on a GPU they run while the host works */
  for (int k = 0; k < o->nseg; k++) {
    const seg *sg = &o->segs[k];
    if (host_updated(sg)) continue;
    zt_update_range r = {.lo = sg->a, .hi = sg->b, .w = at(o, k, ZT_OFF_W, sg->a),
                         .g = g + (sg->a - o->lay.lo), .m = at(o, k, ZT_OFF_M, sg->a),
                         .v = at(o, k, ZT_OFF_V, sg->a),
                         .w16 = half(o) ? seg_param(o, k, sg->a) : NULL, .dt16 = o->lay.param_dt};
    fn(ctx, dev, &r);
  }
  if (!o->nchunk) return ZT_OK;
  /* traced: the host's part of the step, and in it each chunk's update;
   * the rest of it is transfer time the pipeline left exposed */
  int tracing = zt_trace_on();
  double t0 = tracing ? zt_timer_now() : 0;
  int64_t elements = 0;
  o->be->event_wait(o->cs, o->ev_ready);
  memset(o->hsums, 0, sizeof *o->hsums);
  zt_update_exec hx = {.be = o->cpu, .stream = o->hs, .sums = o->hsums};
  int rc = ZT_OK;
  for (int i = 0; !rc && i < o->depth && i < o->nchunk; i++) rc = load(o, g, i, e);
  for (int i = 0; !rc && i < o->nchunk; i++) {
    const chunk *c = &o->chunks[i];
    if ((rc = arrived(o, i, e))) break;
    double t1 = tracing ? zt_timer_now() : 0;
    float **sl = o->slot[i % NSLOT];
    const seg *sg = &o->segs[c->s];
    float *hg = c->have == c->n ? sg->hg + (c->a - sg->a) : sl[SL_G];
    zt_update_range r = {.lo = c->a, .hi = c->a + c->n, .w = host_state(o, i, ZT_OFF_W),
                         .g = hg, .m = host_state(o, i, ZT_OFF_M),
                         .v = host_state(o, i, ZT_OFF_V), .w16 = half(o) ? sl[SL_W16] : NULL,
                         .dt16 = o->lay.param_dt};
    fn(ctx, &hx, &r);
    if (tracing)
      zt_trace_slice("offload", "host update", NULL, t1, zt_timer_now(), "elements",
                     (long long)c->n, NULL, 0);
    elements += c->n;
    if (update && (rc = store(o, i, e))) break;
    /* the slot of chunk i - 1, whose write-back is queued before this */
    if (i + o->depth < o->nchunk && (rc = load(o, g, i + o->depth, e))) break;
  }
  if (rc) { /* nothing may still be reading or writing the slots */
    zt_err ignored;
    drain(o, &ignored);
    return rc;
  }
  o->be->event_record(o->ev_done, o->cs);
  o->be->event_wait(o->stream, o->ev_done);
  *host_nonfinite += o->hsums->nonfinite;
  if (tracing)
    zt_trace_slice("offload", "host pieces", NULL, t0, zt_timer_now(), "elements",
                   (long long)elements, "bytes per element moved",
                   (long long)(update ? 4 + 4 + (long long)x : 4));
  return ZT_OK;
}

const char *zt_offload_nvme_engine(const zt_offload *o) {
  return o->file ? zt_nvme_engine_name(o->file) : NULL;
}

/* ---- params on nvme -------------------------------------------------------- */

int zt_offload_param_fetch(zt_offload *o, int unit, int slot, zt_err *e) {
  int k = unit >= 0 && unit < o->lay.n_units ? o->seg_of_unit[unit] : -1;
  if (k < 0 || !params_in_file(&o->segs[k]) || slot < 0 || slot >= ZT_OFFLOAD_PARAM_SLOTS)
    return zt_err_set(e, ZT_ERUNTIME, "offload: unit %d has no weights in the file", unit);
  const seg *g = &o->segs[k];
  /* the slot's last read is done with, and every new weight is in the file */
  if (o->prd[slot] >= 0 && zt_nvme_wait(o->file, o->prd[slot], e)) return e->code;
  o->prd[slot] = -1;
  for (int i = 0; i < NSLOT; i++) {
    if (o->wrp[i] >= 0 && zt_nvme_wait(o->file, o->wrp[i], e)) return e->code;
    o->wrp[i] = -1;
  }
  size_t len = (size_t)round_up((g->b - g->a) * (int64_t)xsize(o), FILE_ALIGN);
  o->prd[slot] = zt_nvme_read(o->file, g->off_p, o->pslot[slot], len, e);
  return o->prd[slot] < 0 ? e->code : ZT_OK;
}

const void *zt_offload_param_wait(zt_offload *o, int slot, zt_err *e) {
  if (o->prd[slot] >= 0 && zt_nvme_wait(o->file, o->prd[slot], e)) {
    o->prd[slot] = -1;
    return NULL;
  }
  o->prd[slot] = -1;
  return o->pslot[slot];
}

/* ---- gradients down during backward ---------------------------------------- */

void zt_offload_grads_begin(zt_offload *o) {
  for (int i = 0; i < o->nchunk; i++) o->chunks[i].have = 0;
}

/* Runs body for each host-updated chunk c_ (of segment g_) that meets
 * [a, b), with [cx, cy) the part they share. */
#define FOR_CHUNKS(o, a, b, body)                                                       \
  for (int k_ = 0; k_ < (o)->nseg; k_++) {                                              \
    const seg *g_ = &(o)->segs[k_];                                                     \
    int64_t x_ = g_->a > (a) ? g_->a : (a), y_ = g_->b < (b) ? g_->b : (b);             \
    if (!host_updated(g_) || y_ <= x_) continue;                                        \
    for (int i_ = g_->c0 + (int)((x_ - g_->a) / CHUNK); i_ < (o)->nchunk &&             \
         (o)->chunks[i_].s == k_ && (o)->chunks[i_].a < y_; i_++) {                     \
      chunk *c_ = &(o)->chunks[i_];                                                     \
      int64_t cx = c_->a > x_ ? c_->a : x_, cy = c_->a + c_->n < y_ ? c_->a + c_->n : y_; \
      body                                                                              \
    }                                                                                   \
  }

void zt_offload_grads_final(zt_offload *o, const float *g, int64_t a, int64_t b) {
  if (!o->hgrad) return;
  int waited = 0;
  int64_t elements = 0;
  double t0 = zt_trace_on() ? zt_timer_now() : 0;
  FOR_CHUNKS(o, a, b, {
    if (!waited) { /* after the model stream has written them */
      o->be->event_record(o->ev_grad, o->stream);
      o->be->event_wait(o->cs, o->ev_grad);
      waited = 1;
    }
    o->be->copy(o->cs, g_->hg + (cx - g_->a), g + (cx - o->lay.lo), (size_t)(cy - cx) * sizeof(float));
    if (c_->have >= 0) c_->have += cy - cx;
    elements += cy - cx;
  })
  /* issued during backward: the trace shows where (on a GPU the copy
   * itself runs later on the copy stream) */
  if (elements && t0)
    zt_trace_slice("offload", "grads down", NULL, t0, zt_timer_now(), "elements",
                   (long long)elements, NULL, 0);
}

void zt_offload_grads_stale(zt_offload *o, int64_t a, int64_t b) {
  FOR_CHUNKS(o, a, b, { (void)cx; (void)cy; c_->have = -1; })
}
