/* ckpt: writes checkpoints (zt_ckpt_save, the background save) and holds
 * what the loader (ckpt_load.c) shares with it: see ckpt.h, ckpt_impl.h. */
#include "src/ckpt/ckpt.h"
#include "src/ckpt/ckpt_impl.h"
#include "src/ckpt/h5util.h"
#include "parallel/watchdog.h"
#include "src/core/timer.h"
#include "src/core/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <libgen.h>
#include <math.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
/* Inline: the checksum hashes one 4-byte element per call. Through the
 * shared library each call is opaque and dispatches on the length; compiled
 * here, XXH3 is specialized for 4 bytes and the loop vectorized (same
 * values, about 9 times faster with -march=native on AVX-512). */
#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t zt_ckpt_checksum_count(const float *x, int64_t n, int64_t first, uint64_t *nonfinite) {
  uint64_t s = 0, bad = 0;
#pragma omp parallel for reduction(+ : s, bad)
  for (int64_t i = 0; i < n; i++) {
    s += XXH3_64bits_withSeed(&x[i], sizeof *x, (uint64_t)(first + i));
    bad += !isfinite(x[i]);
  }
  if (nonfinite) *nonfinite += bad;
  return s;
}

uint64_t zt_ckpt_checksum(const float *x, int64_t n, int64_t first) {
  return zt_ckpt_checksum_count(x, n, first, NULL);
}

/* ---- where each state lives on this rank ------------------------------------ */

static const zt_state_kind state_kind[3] = {ZT_STATE_MASTER, ZT_STATE_EXP_AVG,
                                             ZT_STATE_EXP_AVG_SQ};

/* Base pointer such that flat element i of state `which` (0 weights: the
 * fp32 masters, 1 exp_avg, 2 exp_avg_sq) is base[i - *lo], and the range
 * [lo, hi) present: in host memory. */
float *zt_ckpti_state_at(const zt_ckpt_state *s, int which, int64_t *lo, int64_t *hi) {
  zt_state_view v = zt_zero_state(s->z, state_kind[which]);
  *lo = v.lo;
  *hi = v.hi;
  return s->host[which] ? s->host[which] : v.data;
}

/* A state is host-addressable where the backend's device memory is host
 * memory, or where the policy placed it in host memory, all of it in one
 * buffer (an offload policy may spread it or put it in a file: data NULL). */
static int host_addressable(const zt_ckpt_state *s, const zt_state_view *v) {
  return v->data && (s->m->be->host_visible || v->mem != ZT_MEM_DEVICE);
}

int zt_ckpti_host_begin(zt_ckpt_state *ls, const zt_ckpt_state *s, zt_err *e) {
  const zt_backend *be = s->m->be;
  *ls = *s;
  int ok = 1;
  for (int k = 0; k < 3; k++) {
    zt_state_view v = zt_zero_state(s->z, state_kind[k]);
    ls->host[k] = NULL;
    if (host_addressable(s, &v)) continue;
    size_t bytes = (size_t)(v.hi - v.lo) * sizeof(float);
    if (!(ls->host[k] = malloc(bytes ? bytes : 1))) {
      ok = 0;
      break;
    }
    if (v.data) be->copy(s->m->stream, ls->host[k], v.data, bytes);
    else if (zt_zero_state_read(s->z, state_kind[k], v.lo, v.hi - v.lo, ls->host[k], e))
      return zt_ckpti_host_end(ls, 0), e->code;
  }
  be->stream_sync(s->m->stream); /* the host reads the copies next */
  if (ok) return ZT_OK;
  zt_ckpti_host_end(ls, 0);
  return zt_err_set(e, ZT_ERUNTIME, "out of host memory for the checkpoint's copy of the state");
}

void zt_ckpti_host_end(zt_ckpt_state *ls, int kinds) {
  const zt_backend *be = ls->m->be;
  for (int k = 0; k < 3; k++) {
    if (!ls->host[k]) continue;
    if (k < kinds) {
      zt_state_view v = zt_zero_state(ls->z, state_kind[k]);
      zt_err e;
      if (v.data) be->copy(ls->m->stream, v.data, ls->host[k], (size_t)(v.hi - v.lo) * sizeof(float));
      else zt_zero_state_write(ls->z, state_kind[k], v.lo, v.hi - v.lo, ls->host[k], &e);
    }
  }
  be->stream_sync(ls->m->stream); /* before the copies' memory goes */
  for (int k = 0; k < 3; k++) {
    free(ls->host[k]);
    ls->host[k] = NULL;
  }
}

/* ---- hyperslabs ------------------------------------------------------------ */

/* Adds the logical image of local rectangle rows [r0, r1) x cols [c0, c1)
 * of tensor t's piece to the selection, cutting it where the local piece is
 * discontiguous in the logical tensor (slice and part boundaries). */
static void select_rect(hid_t space, const zt_tensor_desc *t, int64_t r0, int64_t r1,
                        int64_t c0, int64_t c1) {
  int d = t->shard.dim < 0 || t->shard.count <= 1 ? -1 : t->shard.dim;
  int64_t ls[ZT_MAX_DIMS];
  zt_shard_local_shape(t, ls);
  int g = t->shard.groups > 0 ? t->shard.groups : 1;
  int64_t run = d < 0 ? INT64_MAX : ls[d] / g; /* local rows (or cols) that stay contiguous */
  int64_t lo = d == 1 ? c0 : r0, hi = d == 1 ? c1 : r1;
  for (int64_t x = lo; x < hi;) {
    int64_t y = d < 0 ? hi : (x / run + 1) * run;
    if (y > hi) y = hi;
    int64_t gx = zt_shard_global_coord(t, x);
    hsize_t start[2], count[2];
    if (t->ndim == 1) {
      start[0] = (hsize_t)gx;
      count[0] = (hsize_t)(y - x);
    } else if (d == 1) {
      start[0] = (hsize_t)r0, count[0] = (hsize_t)(r1 - r0);
      start[1] = (hsize_t)gx, count[1] = (hsize_t)(y - x);
    } else {
      start[0] = (hsize_t)gx, count[0] = (hsize_t)(y - x);
      start[1] = (hsize_t)c0, count[1] = (hsize_t)(c1 - c0);
    }
    H5Sselect_hyperslab(space, H5S_SELECT_OR, start, NULL, count, NULL);
    x = y;
  }
}

/* Selects the logical image of local elements [a, b) of t's piece (row-major
 * in the local shape). Tensors have 1 or 2 dimensions. The selection's
 * row-major order equals the local order, so a contiguous buffer of b - a
 * elements matches it. */
void zt_ckpti_select_local(hid_t space, const zt_tensor_desc *t, int64_t a, int64_t b) {
  H5Sselect_none(space);
  if (a >= b) return;
  if (t->ndim == 1) {
    select_rect(space, t, a, b, 0, 1);
    return;
  }
  int64_t ls[ZT_MAX_DIMS];
  zt_shard_local_shape(t, ls);
  int64_t C = ls[1], ra = a / C, rb = b / C;
  if (ra == rb) { /* inside one row */
    select_rect(space, t, ra, ra + 1, a % C, b % C);
    return;
  }
  if (a % C) {
    select_rect(space, t, ra, ra + 1, a % C, C);
    ra++;
  }
  if (rb > ra) select_rect(space, t, ra, rb, 0, C);
  if (b % C) select_rect(space, t, rb, rb + 1, 0, b % C);
}

/* Checksum of local elements [a, b) of t's piece that starts at data. */
typedef struct { const float *data; int64_t a, b; uint64_t sum, bad; } sum_ctx;

static void sum_run(void *ctx, int64_t local, int64_t global, int64_t n) {
  sum_ctx *c = ctx;
  int64_t s = local > c->a ? local : c->a, e = local + n < c->b ? local + n : c->b;
  if (e > s)
    c->sum += zt_ckpt_checksum_count(c->data + (s - c->a), e - s, global + (s - local), &c->bad);
}

/* The checksum of local elements [a, b) of t's piece; adds their count of
 * non-finite values to *bad. */
uint64_t zt_ckpti_piece_checksum(const zt_tensor_desc *t, const float *data, int64_t a, int64_t b,
                               uint64_t *bad) {
  sum_ctx c = {data, a, b, 0, 0};
  if (a < b) zt_shard_runs(t, &c, sum_run);
  *bad += c.bad;
  return c.sum;
}

/* The local elements [a, b) of t this rank counts once for the world: its
 * ZeRO range, if it is the designated holder of its TP piece. */
void zt_ckpti_counted_range(const zt_ckpt_state *s, const zt_tensor_desc *t, int64_t *a,
                          int64_t *b) {
  const zt_model *m = s->m;
  int64_t off = t->offset, lo, hi;
  zt_zero_shard(s->z, &lo, &hi);
  if (off < 0) { /* another pipeline stage holds it */
    *a = *b = 0;
    return;
  }
  *a = (lo > off ? lo : off) - off;
  *b = (hi < off + t->numel ? hi : off + t->numel) - off;
  if (*b < *a || !zt_shard_counts_here(t, m->tp_rank, m->tp_size)) *a = *b = 0;
}

/* ---- save ------------------------------------------------------------------- */

static char *topology_json(const zt_ckpt_state *s) {
  const zt_grid *g = s->grid;
  json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:b}", "world", g->world.size, "dp", g->dp,
                        "tp", g->tp, "pp", g->pp, "zero", zt_zero_stage(s->z), "sequence_parallel",
                        s->m->cfg.sequence_parallel);
  char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return txt;
}

static char *state_json(const zt_ckpt_state *s, int64_t step) {
  int64_t next = step * s->global_batch;
  const zt_scaler *sc = s->scaler;
  zt_ckpt_state_rec r = {
      .epoch = s->samples ? next / s->samples : 0, .next_sample = next,
      .samples_per_epoch = s->samples, .seed = s->seed, .loss_scale = sc ? sc->scale : 1.0,
      .skipped_steps = s->skipped ? *s->skipped : 0, .has_scaler = sc && sc->cfg.dynamic};
  if (r.has_scaler) {
    r.scaler_scale = sc->scale;
    r.scaler_iter = sc->iter;
    r.scaler_last_overflow = sc->last_overflow_iter;
    r.scaler_hysteresis = sc->hysteresis_left;
  }
  return zt_ckpt_format_state_json(&r);
}

/* Root attributes and groups (collective: every rank passes the same). */
static int write_record(hid_t f, const zt_ckpt_state *s, int64_t at) {
  char *topo = topology_json(s), *state = state_json(s, at);
  int bad = !topo || !state ||
            zt_ckpt_format_write_header(f, at, s->plan_json, topo, state) ||
            zt_ckpt_format_create_groups(f, 1);
  free(topo);
  free(state);
  return bad;
}

/* The script as a 1-D byte dataset: it may exceed an attribute's 64 KiB. */
static int write_script(hid_t f, const char *text, int rank0, hid_t dxpl) {
  hsize_t n = text ? strlen(text) : 0;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t ds = H5Dcreate2(f, ZT_CKPT_SCRIPT, H5T_NATIVE_UCHAR, space, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT);
  hsize_t one = n ? n : 1;
  hid_t mem = H5Screate_simple(1, &one, NULL);
  if (!rank0 || !n) {
    H5Sselect_none(space);
    H5Sselect_none(mem);
  }
  int bad = ds < 0 || H5Dwrite(ds, H5T_NATIVE_UCHAR, mem, space, dxpl, n ? text : "") < 0;
  if (ds >= 0) H5Dclose(ds);
  H5Sclose(mem);
  H5Sclose(space);
  return bad;
}

/* Whether every rank's piece of t lies in the file as a few long runs:
 * whole tensors and cuts along the first dimension (a ZeRO range of a
 * row-major piece is contiguous; gpt's q|k|v cut makes three runs). Those
 * are written straight to the file (save_direct). Cuts along a later
 * dimension interleave the TP ranks' pieces row by row in short runs:
 * those are written collectively, so that MPI-IO's collective buffering
 * merges them into large writes (on a parallel file system, ranks taking
 * turns inside one stripe contend for it). Every rank decides alike: it
 * depends on the layout only. */
static int long_runs(const zt_tensor_desc *t) {
  return t->shard.dim <= 0 || t->shard.count <= 1;
}

/* Tensors are stored contiguously, their space allocated when the dataset
 * is created and never filled: every byte is written once, by the rank
 * that counts it, at the address HDF5 gives the dataset. */
static hid_t tensor_dcpl(void) {
  hid_t p = H5Pcreate(H5P_DATASET_CREATE);
  if (p >= 0 && (H5Pset_layout(p, H5D_CONTIGUOUS) < 0 ||
                 H5Pset_alloc_time(p, H5D_ALLOC_TIME_EARLY) < 0 ||
                 H5Pset_fill_time(p, H5D_FILL_TIME_NEVER) < 0)) {
    H5Pclose(p);
    p = -1;
  }
  return p;
}

/* Creates the dataset of tensor t of state `which` (collective: every
 * rank, in the same order); *addr is where its data starts in the file. */
static hid_t create_tensor(hid_t f, int which, const zt_tensor_desc *t, hid_t dcpl,
                           haddr_t *addr) {
  hsize_t dims[ZT_MAX_DIMS];
  for (int d = 0; d < t->ndim; d++) dims[d] = (hsize_t)t->shape[d];
  char path[ZT_NAME_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", zt_ckpt_group_path[which], t->name);
  hid_t space = H5Screate_simple(t->ndim, dims, NULL);
  hid_t ds = space < 0 ? -1
                       : H5Dcreate2(f, path, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (space >= 0) H5Sclose(space);
  *addr = ds < 0 ? HADDR_UNDEF : H5Dget_offset(ds);
  return ds;
}

/* Writes this rank's part of tensor t of state `which` (from data, its
 * counted range) through HDF5, collectively: every rank makes the call, a
 * rank with nothing to write selects nothing. On failure e says which
 * tensor and why. */
static int write_collective(hid_t ds, const zt_ckpt_state *s, int which, const zt_tensor_desc *t,
                            const float *data, hid_t dxpl, zt_err *e) {
  int64_t a, b;
  zt_ckpti_counted_range(s, t, &a, &b);
  hid_t fspace = H5Dget_space(ds);
  if (fspace >= 0) zt_ckpti_select_local(fspace, t, a, b);
  hsize_t n = (hsize_t)(b > a ? b - a : 1);
  hid_t mspace = H5Screate_simple(1, &n, NULL);
  if (b <= a) H5Sselect_none(mspace);
  /* the reason is taken at once: the next HDF5 call clears the error stack */
  char why[256] = "";
  int fail = fspace < 0 || H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data) < 0;
  if (fail) zt_h5_error_reason(why, sizeof why);
  H5Sclose(mspace);
  if (fspace >= 0) H5Sclose(fspace);
  return fail ? zt_err_set(e, ZT_ERUNTIME, "%s/%s: %s", zt_ckpt_group_path[which], t->name, why) : ZT_OK;
}

/* Where the counted range of tensor i of state `which` is in live state. */
static const float *live_piece(const zt_ckpt_state *s, int which, int i) {
  const zt_tensor_desc *t = &s->m->params[i].t;
  int64_t a, b, lo, hi;
  zt_ckpti_counted_range(s, t, &a, &b);
  const float *base = zt_ckpti_state_at(s, which, &lo, &hi);
  return t->offset < 0 ? base : base + (t->offset + a - lo); /* absent: nothing is read */
}

/* About how large the file will be: every logical tensor three times, the
 * record, and HDF5's headers (measured ~450 bytes a tensor; twice that
 * here, and 64 KiB for the rest). */
static double file_bytes(const zt_ckpt_state *s) {
  double n = 65536.0 + (s->script_text ? strlen(s->script_text) : 0) +
             (s->plan_json ? strlen(s->plan_json) : 0);
  for (int i = 0; i < s->m->n_params; i++)
    n += 3.0 * (sizeof(float) * (double)zt_tensor_numel(&s->m->params[i].t) + 1024.0);
  return n;
}

/* The folder that will hold path, and its free space (-1: unknown). */
static long long free_bytes(const char *path, char *dir, size_t n) {
  char *copy = strdup(path);
  snprintf(dir, n, "%s", copy ? dirname(copy) : ".");
  free(copy);
  return zt_fs_free_bytes(dir);
}

/* Rank 0, before anything is written: room for the file? */
static int check_space(const char *path, double need, zt_err *e) {
  char dir[4096];
  long long avail = free_bytes(path, dir, sizeof dir);
  if (avail < 0 || avail >= need || getenv("ZT_TEST_NO_SPACE_CHECK")) return ZT_OK;
  return zt_err_set(e, ZT_ERUNTIME,
                    "checkpoint %s not written: it needs about %.2f MB and %s has %.2f MB free; "
                    "make room there or set checkpoint.dir (or --save) elsewhere; the previous "
                    "checkpoints are untouched", path, need / 1e6, dir, avail / 1e6);
}

/* Rank 0, after a failed write: the message that goes to the user. */
static void failed_message(const char *path, double need, zt_err *e) {
  char dir[4096], why[sizeof e->msg];
  snprintf(why, sizeof why, "%s", e->msg);
  long long avail = free_bytes(path, dir, sizeof dir);
  /* HDF5 1.10's MPI-IO driver does not pass the system's reason on: the
   * free space tells a full disk apart */
  if (avail >= 0 && (strstr(why, "No space") || strstr(why, "quota") || avail < need))
    zt_err_set(e, ZT_ERUNTIME, "checkpoint %s not written: %s: the file system is full (%s has "
               "%.2f MB free; this checkpoint needs about %.2f MB); the last good checkpoint is "
               "kept", path, why, dir, avail / 1e6, need / 1e6);
  else
    zt_err_set(e, ZT_ERUNTIME, "checkpoint %s not written: %s; the last good checkpoint is kept",
               path, why);
}

/* Test hook: ZT_TEST_FAIL_WRITE="RANK:STEP" fails one tensor's write on
 * world rank RANK in the save of step STEP, as a full disk or an I/O
 * error on that rank alone would. */
static int injected_failure(const zt_comm *c, int64_t step) {
  const char *v = getenv("ZT_TEST_FAIL_WRITE");
  int r;
  long long at;
  return v && sscanf(v, "%d:%lld", &r, &at) == 2 && at == step && c->world_ranks &&
         c->world_ranks[c->rank] == r;
}

/* ---- the data, straight to the file ------------------------------------------ */

void zt_ckpti_add_span(void *ctx, int64_t local, int64_t global, int64_t n) {
  span_list *l = ctx;
  int64_t s = local > l->a ? local : l->a, e = local + n < l->b ? local + n : l->b;
  if (e <= s || l->oom) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 256;
    span *v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = 1;
      return;
    }
    l->v = v, l->cap = cap;
  }
  l->v[l->n++] = (span){l->idx, s - l->a, global + (s - local), e - s};
}

/* Writes this rank's stream up to element `end` (checksums and non-finite
 * counts first, then the bytes). test_hook runs once, halfway through the
 * stream (at once when this rank has nothing to write). */
static int direct_write(direct *d, int64_t end, const float *const *data, const haddr_t *addr,
                        uint64_t *sums, uint64_t *bad, const zt_model *m, int *hooked,
                        int (*test_hook)(void *, int idx, zt_err *), void *hook_ctx, zt_err *e) {
  while (1) {
    if (!*hooked && 2 * d->done >= d->total) {
      *hooked = 1;
      int idx = d->k < d->runs.n ? d->runs.v[d->k].idx : 0;
      if (test_hook(hook_ctx, idx, e)) return e->code;
    }
    if (d->done >= end) return ZT_OK;
    const span *r = &d->runs.v[d->k];
    int64_t n = r->n - d->at;
    if (n > end - d->done) n = end - d->done;
    if (n > DIRECT_CHUNK) n = DIRECT_CHUNK;
    const float *x = data[r->idx] + r->at + d->at;
    int64_t first = r->global + d->at;
    sums[r->idx] += zt_ckpt_checksum_count(x, n, first, &bad[r->idx]);
    int err = zt_fs_writer_put(d->w, x, (size_t)n * sizeof *x,
                               (long long)addr[r->idx] + first * (long long)sizeof *x);
    if (!err && d->done + n >= end) err = zt_fs_writer_flush(d->w); /* the part is written */
    if (err)
      return zt_err_set(e, ZT_ERUNTIME, "%s/%s: file write failed: %s",
                        zt_ckpt_group_path[r->idx / m->n_params], m->params[r->idx % m->n_params].t.name,
                        strerror(err));
    d->done += n;
    if ((d->at += n) == r->n) d->k++, d->at = 0;
  }
}

/* Test hooks, halfway through this rank's part of a save. */
typedef struct {
  const zt_ckpt_state *s;
  const zt_comm *comm;
  int64_t step;
  const char *stop_at;
} hook_ctx;

static int save_hooks(void *ctx, int idx, zt_err *e) {
  hook_ctx *h = ctx;
  int np = h->s->m->n_params;
  /* die halfway through writing the file, as a crash would */
  const char *die = getenv("ZT_TEST_KILL_IN_SAVE");
  if (die && atoll(die) == h->step) raise(SIGKILL);
  zt_watchdog_test_stop(h->stop_at);
  if (injected_failure(h->comm, h->step))
    return zt_err_set(e, ZT_ERUNTIME, "%s/%s: test: injected write failure", zt_ckpt_group_path[idx / np],
                      h->s->m->params[idx % np].t.name);
  return ZT_OK;
}

/* Writes the file: every rank its counted pieces, which are `pieces`
 * (3 x n_params, from a snapshot) or the live state. HDF5 creates the file
 * and every dataset collectively; then each rank writes its pieces of
 * tensors stored in long runs straight to the file, at the datasets'
 * addresses, without waiting for the others (ZeRO gives ranks different
 * tensors: waiting for each tensor in turn serialised them); the few
 * tensors cut in short runs go through HDF5's collective writes. Saves
 * cannot deadlock: every rank makes every collective call, and the ranks
 * agree on whether all went well after each part of the data and each
 * collective tensor (one small all-reduce), so a failure on one rank stops
 * all of them at the same place; the HDF5 collectives and the parts run
 * as watched phases (a rank that stalls inside one is reported). A file
 * with a non-finite weight or moment is never published. Every MPI call
 * goes over `comm` under the comm lock: a background save has its own
 * communicator, so its collectives never meet the training's, and the
 * direct writes hold no lock. */
static int save_impl(const char *path, const zt_ckpt_state *s, int64_t step, zt_comm *comm,
                     const float *const *pieces, zt_err *e) {
  const zt_model *m = s->m;
  int np = m->n_params, nt = 3 * np, rank0 = comm->rank == 0, rc = ZT_OK;
  double need = file_bytes(s);
  if (rank0) rc = check_space(path, need, e);
  if ((rc = zt_comm_agree(comm, rc, e))) return rc;
  char tmp[4096], what[96], stop_at[64], why[256];
  int32_t pid = (int32_t)getpid();
  zt_comm_bcast(comm, &pid, sizeof pid, ZT_U8, 0); /* one temporary name for all */
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)pid);
  snprintf(stop_at, sizeof stop_at, "save:%lld", (long long)step);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  /* per tensor (which * np + i): checksum, non-finite count, address in
   * the file, open dataset, counted piece in memory */
  uint64_t *sums = calloc((size_t)2 * nt, sizeof *sums), *bad = sums ? sums + nt : NULL;
  haddr_t *addr = calloc((size_t)nt, sizeof *addr);
  hid_t *ds = malloc((size_t)nt * sizeof *ds);
  const float **data = malloc((size_t)nt * sizeof *data);
  int mem = sums && addr && ds && data;
  for (int idx = 0; mem && idx < nt; idx++) {
    ds[idx] = -1;
    data[idx] = pieces ? pieces[idx] : live_piece(s, idx / np, idx % np);
  }
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), dxpl = H5Pcreate(H5P_DATASET_XFER),
        dcpl = tensor_dcpl();
  H5Pset_fapl_mpio(fapl, comm->mpi, MPI_INFO_NULL);
  zt_h5_checked_metadata(fapl);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  /* HDF5 makes its own MPI calls: none of ours may run meanwhile; the lock
   * is dropped between its calls, so that a background save lets the
   * training's collectives through in between */
  double t0 = zt_timer_now();
  zt_comm_phase_begin(comm, "checkpoint: creating the file");
  zt_comm_lock();
  hid_t f = mem && dcpl >= 0 ? H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl) : -1;
  if (!mem || dcpl < 0) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  else if (f < 0)
    rc = zt_err_set(e, ZT_ERUNTIME, "cannot create %s: %s", tmp,
                    zt_h5_error_reason(why, sizeof why));
  else if (write_record(f, s, step) || write_script(f, s->script_text, rank0, dxpl))
    rc = zt_err_set(e, ZT_ERUNTIME, "writing the record: %s", zt_h5_error_reason(why, sizeof why));
  long long data_end = 0;
  for (int idx = 0; idx < nt && !rc; idx++) {
    const zt_tensor_desc *t = &m->params[idx % np].t;
    ds[idx] = create_tensor(f, idx / np, t, dcpl, &addr[idx]);
    if (ds[idx] < 0 || addr[idx] == HADDR_UNDEF)
      rc = zt_err_set(e, ZT_ERUNTIME, "creating %s/%s: %s", zt_ckpt_group_path[idx / np], t->name,
                      ds[idx] < 0 ? zt_h5_error_reason(why, sizeof why)
                                  : "HDF5 allocated no space for it");
    long long end = (long long)addr[idx] + (long long)sizeof(float) * zt_tensor_numel(t);
    if (end > data_end) data_end = end;
  }
  int err = rank0 && !rc ? zt_fs_reserve(tmp, data_end) : 0;
  if (err)
    rc = zt_err_set(e, ZT_ERUNTIME, "rank %d could not reserve %.2f MB for %s: %s",
                    comm->world_ranks[comm->rank], data_end / 1e6, tmp, strerror(err));
  zt_comm_unlock();
  zt_comm_phase_end(comm);
  zt_trace_slice("ckpt", "create", NULL, t0, zt_timer_now(), NULL, 0, NULL, 0);
  rc = zt_comm_agree(comm, rc, e);

  /* this rank's long runs, and the number of parts (the same everywhere) */
  direct d = {0};
  for (int idx = 0; idx < nt && !rc && !d.runs.oom; idx++) {
    const zt_tensor_desc *t = &m->params[idx % np].t;
    if (!long_runs(t)) continue;
    zt_ckpti_counted_range(s, t, &d.runs.a, &d.runs.b);
    d.runs.idx = idx;
    if (d.runs.a < d.runs.b) zt_shard_runs(t, &d.runs, zt_ckpti_add_span);
  }
  for (size_t k = 0; k < d.runs.n; k++) d.total += d.runs.v[k].n;
  if (!rc && d.runs.oom) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (!rc && d.total && (err = zt_fs_writer_open(&d.w, tmp, DIRECT_BUFFER_BYTES)))
    rc = zt_err_set(e, ZT_ERUNTIME, "rank %d cannot open %s: %s",
                    comm->world_ranks[comm->rank], tmp, strerror(err));
  rc = zt_comm_agree(comm, rc, e);
  uint64_t parts = (uint64_t)((d.total * (int64_t)sizeof(float) + DIRECT_PART_BYTES - 1) /
                              DIRECT_PART_BYTES);
  if (!rc) zt_comm_allreduce(comm, &parts, 1, ZT_U64, ZT_MAX);
  if (parts < 1) parts = 1;
  hook_ctx hook = {s, comm, step, stop_at};
  int hooked = 0;
  for (uint64_t part = 0; part < parts && !rc; part++) {
    snprintf(what, sizeof what, "checkpoint: writing data, part %llu of %llu",
             (unsigned long long)part + 1, (unsigned long long)parts);
    int64_t from = d.done, end = (int64_t)((double)d.total * (double)(part + 1) / (double)parts);
    if (part + 1 == parts) end = d.total;
    t0 = zt_timer_now();
    zt_comm_phase_begin(comm, what);
    rc = direct_write(&d, end, data, addr, sums, bad, m, &hooked, save_hooks, &hook, e);
    zt_comm_phase_end(comm);
    zt_trace_slice("ckpt", "write", NULL, t0, zt_timer_now(), "bytes",
                   (long long)(d.done - from) * (long long)sizeof(float), NULL, 0);
    if (rc) { /* the first failing rank's reason, with its rank */
      char r[sizeof e->msg];
      snprintf(r, sizeof r, "%s", e->msg);
      zt_err_set(e, rc, "rank %d could not write %s", comm->world_ranks[comm->rank], r);
    }
    rc = zt_comm_agree(comm, rc, e);
  }
  /* cuts in short runs: one collective write each */
  for (int idx = 0; idx < nt && !rc; idx++) {
    const zt_tensor_desc *t = &m->params[idx % np].t;
    if (long_runs(t)) continue;
    int64_t a, b;
    zt_ckpti_counted_range(s, t, &a, &b);
    snprintf(what, sizeof what, "checkpoint write of %s/%s", zt_ckpt_group_name[idx / np], t->name);
    t0 = zt_timer_now();
    zt_comm_phase_begin(comm, what);
    zt_comm_lock();
    rc = write_collective(ds[idx], s, idx / np, t, data[idx], dxpl, e);
    zt_comm_unlock();
    zt_comm_phase_end(comm);
    sums[idx] = zt_ckpti_piece_checksum(t, data[idx], a, b, &bad[idx]);
    zt_trace_slice("ckpt", "write collective", NULL, t0, zt_timer_now(), "bytes",
                   (long long)(b - a) * (long long)sizeof(float), NULL, 0);
    if (rc) {
      char r[sizeof e->msg];
      snprintf(r, sizeof r, "%s", e->msg);
      zt_err_set(e, rc, "rank %d could not write %s", comm->world_ranks[comm->rank], r);
    }
    rc = zt_comm_agree(comm, rc, e);
  }
  /* what this rank wrote is on the disk before rank 0 publishes the file
   * (on a parallel file system rank 0's fsync covers only its own node) */
  t0 = zt_timer_now();
  if (d.w && (err = zt_fs_writer_close(d.w, !rc)) && !rc)
    rc = zt_err_set(e, ZT_ERUNTIME, "rank %d could not write %s: %s",
                    comm->world_ranks[comm->rank], tmp, strerror(err));
  zt_trace_slice("ckpt", "sync", NULL, t0, zt_timer_now(), NULL, 0, NULL, 0);
  free(d.runs.v);
  rc = zt_comm_agree(comm, rc, e);
  if (!rc) zt_comm_allreduce(comm, sums, (size_t)2 * nt, ZT_U64, ZT_SUM);
  for (int idx = 0; idx < nt && !rc; idx++)
    if (bad[idx])
      rc = zt_err_set(e, ZT_ERUNTIME, "tensor %s/%s holds %llu non-finite values (NaN or "
                      "inf) at step %lld: a diverged state is never saved", zt_ckpt_group_path[idx / np],
                      m->params[idx % np].t.name, (unsigned long long)bad[idx], (long long)step);
  t0 = zt_timer_now();
  if (!rc) { /* every rank has the same sums: these metadata writes are collective */
    zt_comm_phase_begin(comm, "checkpoint: checksums and links");
    zt_comm_lock();
    for (int idx = 0; idx < nt && !rc; idx++)
      if (zt_h5_write_scalar_attr(ds[idx], ZT_CKPT_ATTR_CHECKSUM, H5T_STD_U64LE, H5T_NATIVE_UINT64,
                                  &sums[idx]))
        rc = zt_err_set(e, ZT_ERUNTIME, "writing checksums: %s",
                        zt_h5_error_reason(why, sizeof why));
    for (int i = 0; i < np && !rc; i++) /* fp32 master weights = the parameters */
      if (zt_ckpt_format_link_master(f, m->params[i].t.name))
        rc = zt_err_set(e, ZT_ERUNTIME, "linking master weights: %s",
                        zt_h5_error_reason(why, sizeof why));
    zt_comm_unlock();
    zt_comm_phase_end(comm);
    rc = zt_comm_agree(comm, rc, e);
  }
  zt_comm_phase_begin(comm, "checkpoint: closing the file");
  zt_comm_lock();
  for (int idx = 0; ds && idx < nt; idx++)
    if (ds[idx] >= 0) H5Dclose(ds[idx]);
  if (f >= 0 && H5Fclose(f) < 0 && !rc)
    rc = zt_err_set(e, ZT_ERUNTIME, "closing %s: %s", tmp, zt_h5_error_reason(why, sizeof why));
  H5Eclear2(H5E_DEFAULT);
  zt_comm_unlock();
  zt_comm_phase_end(comm);
  zt_trace_slice("ckpt", "close", NULL, t0, zt_timer_now(), NULL, 0, NULL, 0);
  if (dcpl >= 0) H5Pclose(dcpl);
  H5Pclose(fapl);
  H5Pclose(dxpl);
  free(sums);
  free(addr);
  free(ds);
  free(data);
  rc = zt_comm_agree(comm, rc, e);
  /* rank 0 publishes the file or removes it, and has the last word */
  t0 = zt_timer_now();
  if (rank0 && rc) {
    unlink(tmp);
    failed_message(path, need, e);
  } else if (rank0) {
    rc = zt_fs_publish(tmp, path, e);
    if (rc) unlink(tmp);
  }
  zt_trace_slice("ckpt", "publish", NULL, t0, zt_timer_now(), NULL, 0, NULL, 0);
  return zt_comm_agree(comm, rank0 ? rc : ZT_OK, e) ? e->code : ZT_OK;
}

int zt_ckpt_save(const char *path, const zt_ckpt_state *s, zt_err *e) {
  zt_ckpt_state ls;
  int rc = zt_comm_agree(&s->grid->world, zt_ckpti_host_begin(&ls, s, e), e);
  if (!rc) rc = save_impl(path, &ls, *s->step, &s->grid->world, NULL, e);
  zt_ckpti_host_end(&ls, 0);
  return rc;
}

/* ---- asynchronous save ------------------------------------------------------ */

static void *async_run(void *arg) {
  zt_ckpt_async *a = arg;
  /* every rank's thread must exist before any of them starts collectives */
  pthread_mutex_lock(&a->gate_lock);
  while (!a->go) pthread_cond_wait(&a->gate, &a->gate_lock);
  pthread_mutex_unlock(&a->gate_lock);
  if (a->go < 0) return NULL;
  zt_watchdog_thread_slot(1); /* its waits are watched apart from the training's */
  a->rc = save_impl(a->path, &a->s, a->step, &a->comm, (const float *const *)a->pieces, &a->err);
  if (!a->rc && a->done) a->done(a);
  return NULL;
}

int zt_ckpt_async_start(zt_ckpt_async *a, const char *path, const zt_ckpt_state *s,
                        void (*done)(zt_ckpt_async *), zt_err *e) {
  int rc = zt_ckpt_async_wait(a, e); /* one save at a time */
  if (rc) return rc;
  const zt_model *m = s->m;
  int np = m->n_params;
  int64_t total = 0, a0, b0;
  for (int which = 0; which < 3; which++)
    for (int i = 0; i < np; i++) {
      zt_ckpti_counted_range(s, &m->params[i].t, &a0, &b0);
      total += b0 - a0;
    }
  memset(a, 0, sizeof *a);
  a->s = *s;
  a->step = *s->step;
  a->skipped = s->skipped ? *s->skipped : 0;
  a->s.skipped = &a->skipped; /* as of the snapshot, not as training goes on */
  if (s->scaler) {
    a->scaler = *s->scaler;
    a->s.scaler = &a->scaler;
  }
  a->done = done;
  snprintf(a->path, sizeof a->path, "%s", path);
  a->snap = malloc((size_t)(total ? total : 1) * sizeof *a->snap);
  a->pieces = malloc((size_t)3 * np * sizeof *a->pieces);
  rc = !a->snap || !a->pieces
           ? zt_err_set(e, ZT_ERUNTIME, "out of host memory for an asynchronous checkpoint "
                        "(%.1f MB)", total * 4e-6)
           : ZT_OK;
  if ((rc = zt_comm_agree(&s->grid->world, rc, e))) {
    free(a->snap);
    free(a->pieces);
    return rc;
  }
  /* the step boundary's state, copied to host; training may go on */
  float *p = a->snap;
  for (int which = 0; which < 3; which++)
    for (int i = 0; i < np; i++) {
      zt_ckpti_counted_range(s, &m->params[i].t, &a0, &b0);
      const zt_tensor_desc *t = &m->params[i].t;
      if (zt_zero_state(s->z, state_kind[which]).data || t->offset < 0)
        m->be->copy(m->stream, p, live_piece(s, which, i), (size_t)(b0 - a0) * sizeof *p);
      else if (b0 > a0) /* spread or in a file: read where it lives */
        zt_zero_state_read(s->z, state_kind[which], t->offset + a0, b0 - a0, p, e);
      a->pieces[which * np + i] = p;
      p += b0 - a0;
    }
  m->be->stream_sync(m->stream); /* the snapshot is whole before the thread reads it */
  zt_comm_dup(&s->grid->world, "ckpt", &a->comm);
  pthread_mutex_init(&a->gate_lock, NULL);
  pthread_cond_init(&a->gate, NULL);
  /* from here on the training's collectives leave the lock to the writer;
   * every rank says so before any writer starts (the gate below) */
  zt_comm_thread_attach();
  int started = pthread_create(&a->thread, NULL, async_run, a) == 0;
  rc = zt_comm_agree(&s->grid->world,
                     started ? ZT_OK : zt_err_set(e, ZT_ERUNTIME, "cannot start the checkpoint "
                                                  "thread"), e);
  pthread_mutex_lock(&a->gate_lock);
  a->go = rc ? -1 : 1;
  pthread_cond_signal(&a->gate);
  pthread_mutex_unlock(&a->gate_lock);
  a->active = 1;
  if (!started) a->active = 0, a->rc = rc, a->err = *e;
  if (rc) {
    zt_err failed = *e;
    zt_ckpt_async_wait(a, e); /* joins a started thread; frees */
    *e = failed;
  }
  return rc;
}

int zt_ckpt_async_wait(zt_ckpt_async *a, zt_err *e) {
  if (!a->comm.world_ranks) return ZT_OK; /* none started */
  if (a->active) pthread_join(a->thread, NULL);
  zt_comm_thread_detach();
  pthread_cond_destroy(&a->gate);
  pthread_mutex_destroy(&a->gate_lock);
  zt_comm_free(&a->comm);
  free(a->snap);
  free(a->pieces);
  a->active = 0;
  if (a->rc) *e = a->err;
  return a->rc;
}
