/* ckpt: see ckpt.h. */
#include "src/ckpt/ckpt.h"
#include "src/ckpt/h5util.h"
#include "parallel/watchdog.h"

#include <errno.h>
#include <hdf5.h>
#include <libgen.h>
#include <math.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* Inline: the checksum hashes one 4-byte element per call. Through the
 * shared library each call is opaque and dispatches on the length; compiled
 * here, XXH3 is specialized for 4 bytes and the loop vectorized (same
 * values, about 9 times faster with -march=native on AVX-512). */
#define XXH_INLINE_ALL
#include <xxhash.h>

static const char *const groups[3] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

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





static void shape_str(char *buf, size_t n, int ndim, const hsize_t *d) {
  int k = snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k < (int)n; i++)
    k += snprintf(buf + k, n - (size_t)k, i ? ", %llu" : "%llu", (unsigned long long)d[i]);
  if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
}

/* ---- where each state lives on this rank ------------------------------------ */

/* Base pointer such that flat element i of state `which` (0 weights, 1
 * exp_avg, 2 exp_avg_sq) is base[i - *lo], and the range [lo, hi) present. */
static float *state_at(const zt_zero *z, int which, int64_t *lo, int64_t *hi) {
  int full = which == 0 ? z->cfg.stage < 3 : z->cfg.stage == 0;
  *lo = full ? 0 : z->lo;
  *hi = full ? z->numel : z->hi;
  return which == 0 ? (z->cfg.stage < 3 ? z->w_full : z->w_shard) : which == 1 ? z->m : z->v;
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
static void select_local(hid_t space, const zt_tensor_desc *t, int64_t a, int64_t b) {
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
static uint64_t piece_checksum(const zt_tensor_desc *t, const float *data, int64_t a, int64_t b,
                               uint64_t *bad) {
  sum_ctx c = {data, a, b, 0, 0};
  if (a < b) zt_shard_runs(t, &c, sum_run);
  *bad += c.bad;
  return c.sum;
}

/* The local elements [a, b) of t this rank counts once for the world: its
 * ZeRO range, if it is the designated holder of its TP piece. */
static void counted_range(const zt_ckpt_state *s, const zt_tensor_desc *t, int64_t *a,
                          int64_t *b) {
  const zt_model *m = s->m;
  int64_t off = t->offset, lo = s->z->lo, hi = s->z->hi;
  if (off < 0) { /* another pipeline stage holds it */
    *a = *b = 0;
    return;
  }
  *a = (lo > off ? lo : off) - off;
  *b = (hi < off + t->numel ? hi : off + t->numel) - off;
  if (*b < *a || !zt_shard_counts_here(t, m->tp_rank, m->tp_size)) *a = *b = 0;
}

/* ---- save ------------------------------------------------------------------- */

static char *record_json(const zt_ckpt_state *s, int64_t step, int topology) {
  const zt_grid *g = s->grid;
  json_t *o;
  if (topology) {
    o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:b}", "world", g->world.size, "dp", g->dp, "tp",
                  g->tp, "pp", g->pp, "zero", s->z->cfg.stage, "sequence_parallel",
                  s->m->cfg.sequence_parallel);
  } else {
    int64_t next = step * s->global_batch;
    o = json_pack("{s:{s:I, s:I, s:I}, s:{s:I}, s:f, s:I}", "data", "epoch",
                  (json_int_t)(s->samples ? next / s->samples : 0), "next_sample",
                  (json_int_t)next, "samples_per_epoch", (json_int_t)s->samples, "rng", "seed",
                  (json_int_t)s->seed, "loss_scale", 1.0, "skipped_steps",
                  (json_int_t)(s->skipped ? *s->skipped : 0));
  }
  char *txt = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return txt;
}

/* Root attributes and groups (collective: every rank passes the same). */
static int write_record(hid_t f, const zt_ckpt_state *s, int64_t at) {
  long long version = ZT_CKPT_VERSION, step = at;
  char *topo = record_json(s, at, 1), *state = record_json(s, at, 0);
  int bad = zt_h5_write_str_attr(f, "format", ZT_CKPT_FORMAT) ||
            zt_h5_write_scalar_attr(f, "format_version", H5T_STD_I64LE, H5T_NATIVE_LLONG, &version) ||
            zt_h5_write_scalar_attr(f, "step", H5T_STD_I64LE, H5T_NATIVE_LLONG, &step) ||
            zt_h5_write_str_attr(f, "plan", s->plan_json ? s->plan_json : "{}") ||
            zt_h5_write_str_attr(f, "topology", topo) || zt_h5_write_str_attr(f, "state", state);
  free(topo);
  free(state);
  const char *gs[] = {"/model", "/optim", "/optim/exp_avg", "/optim/exp_avg_sq", "/optim/master"};
  for (int i = 0; i < 5 && !bad; i++) {
    hid_t g = H5Gcreate2(f, gs[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bad = g < 0;
    if (g >= 0) H5Gclose(g);
  }
  return bad;
}

/* The script as a 1-D byte dataset: it may exceed an attribute's 64 KiB. */
static int write_script(hid_t f, const char *text, int rank0, hid_t dxpl) {
  hsize_t n = text ? strlen(text) : 0;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t ds = H5Dcreate2(f, "/script", H5T_NATIVE_UCHAR, space, H5P_DEFAULT, H5P_DEFAULT,
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
 * row-major piece is contiguous). Those are written straight to the file:
 * MPI-IO's collective buffering would only copy them through aggregator
 * ranks first. Cuts along a later dimension interleave the TP ranks' pieces
 * row by row in short runs, which collective buffering merges into large
 * writes. Every rank decides alike: it depends on the layout only. */
static int long_runs(const zt_tensor_desc *t) {
  return t->shard.dim <= 0 || t->shard.count <= 1;
}

static const char *const short_names[3] = {"model", "exp_avg", "exp_avg_sq"};

/* Writes this rank's part of tensor t of state `which`, its checksum to
 * *sum and its count of non-finite values to *bad. Every rank makes the
 * same HDF5 calls (a rank with nothing to write selects nothing): they are
 * collective. On failure e says which tensor and why. */
static int write_tensor(hid_t f, const zt_ckpt_state *s, int which, const zt_tensor_desc *t,
                        const float *data, hid_t dxpl, uint64_t *sum, uint64_t *bad, zt_err *e) {
  hsize_t dims[ZT_MAX_DIMS];
  for (int d = 0; d < t->ndim; d++) dims[d] = (hsize_t)t->shape[d];
  char path[ZT_NAME_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", groups[which], t->name);
  hid_t fspace = H5Screate_simple(t->ndim, dims, NULL);
  hid_t ds = H5Dcreate2(f, path, H5T_IEEE_F32LE, fspace, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  int64_t a, b;
  counted_range(s, t, &a, &b);
  select_local(fspace, t, a, b);
  hsize_t n = (hsize_t)(b > a ? b - a : 1);
  hid_t mspace = H5Screate_simple(1, &n, NULL);
  if (b <= a) H5Sselect_none(mspace);
  /* host memory: the CUDA backend will stage through a pinned copy */
  H5Pset_dxpl_mpio_collective_opt(dxpl, long_runs(t) ? H5FD_MPIO_INDIVIDUAL_IO
                                                     : H5FD_MPIO_COLLECTIVE_IO);
  /* the reason is taken at once: the next HDF5 call clears the error stack */
  char why[256] = "";
  int fail = ds < 0 || H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data) < 0;
  if (fail) zt_h5_error_reason(why, sizeof why);
  *sum = piece_checksum(t, data, a, b, bad);
  if (ds >= 0 && H5Dclose(ds) < 0 && !fail) fail = 1, zt_h5_error_reason(why, sizeof why);
  H5Sclose(mspace);
  H5Sclose(fspace);
  return fail ? zt_err_set(e, ZT_ERUNTIME, "%s: %s", path, why) : ZT_OK;
}

static int set_checksum(hid_t f, int which, const zt_tensor_desc *t, uint64_t sum) {
  char path[ZT_NAME_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", groups[which], t->name);
  hid_t ds = H5Dopen2(f, path, H5P_DEFAULT);
  int bad = ds < 0 || zt_h5_write_scalar_attr(ds, "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sum);
  if (ds >= 0) H5Dclose(ds);
  return bad;
}

/* Where the counted range of tensor i of state `which` is in live state. */
static const float *live_piece(const zt_ckpt_state *s, int which, int i) {
  const zt_tensor_desc *t = &s->m->params[i].t;
  int64_t a, b, lo, hi;
  counted_range(s, t, &a, &b);
  const float *base = state_at(s->z, which, &lo, &hi);
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

/* Writes the file: every rank its counted pieces, which are `pieces`
 * (3 x n_params, from a snapshot) or the live state. Saves cannot
 * deadlock: every rank makes every collective call, and after each
 * tensor the ranks agree on whether all went well (one small all-reduce),
 * so a failure on one rank stops all of them at the same place; each
 * HDF5 collective runs as a watched phase (a rank that stalls inside one
 * is reported). A file with a non-finite weight or moment is never
 * published. Every MPI call goes over `comm` under the comm lock: a
 * background save has its own communicator, so its collectives never
 * meet the training's. */
static int save_impl(const char *path, const zt_ckpt_state *s, int64_t step, zt_comm *comm,
                     const float *const *pieces, zt_err *e) {
  const zt_model *m = s->m;
  int np = m->n_params, rank0 = comm->rank == 0, rc = ZT_OK;
  double need = file_bytes(s);
  if (rank0) rc = check_space(path, need, e);
  if ((rc = zt_comm_agree(comm, rc, e))) return rc;
  char tmp[4096], what[96], stop_at[64];
  int32_t pid = (int32_t)getpid();
  zt_comm_bcast(comm, &pid, sizeof pid, 0); /* one temporary name for all */
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)pid);
  snprintf(stop_at, sizeof stop_at, "save:%lld", (long long)step);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  uint64_t *sums = calloc((size_t)6 * np, sizeof *sums), *bad = sums ? sums + 3 * np : NULL;
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_fapl_mpio(fapl, comm->mpi, MPI_INFO_NULL);
  zt_h5_checked_metadata(fapl);
  /* collective calls (every rank takes part in each tensor); write_tensor
   * picks collective or independent I/O underneath */
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  /* HDF5 makes its own MPI calls: none of ours may run meanwhile; the lock
   * is dropped between tensors, so that a background save lets the
   * training's collectives through in between */
  zt_comm_phase_begin(comm, "checkpoint: creating the file");
  zt_comm_lock();
  hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  char why[256];
  if (!sums) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  else if (f < 0)
    rc = zt_err_set(e, ZT_ERUNTIME, "cannot create %s: %s", tmp,
                    zt_h5_error_reason(why, sizeof why));
  else if (write_record(f, s, step) || write_script(f, s->script_text, rank0, dxpl))
    rc = zt_err_set(e, ZT_ERUNTIME, "writing the record: %s", zt_h5_error_reason(why, sizeof why));
  zt_comm_unlock();
  zt_comm_phase_end(comm);
  rc = zt_comm_agree(comm, rc, e);
  /* test hook: die halfway through writing the file, as a crash would */
  const char *die = getenv("ZT_TEST_KILL_IN_SAVE");
  for (int which = 0; which < 3 && !rc; which++)
    for (int i = 0; i < np && !rc; i++) {
      const zt_tensor_desc *t = &m->params[i].t;
      if (which == 1 && i == np / 2) {
        if (die && atoll(die) == step) raise(SIGKILL);
        zt_watchdog_test_stop(stop_at);
      }
      const float *data = pieces ? pieces[which * np + i] : live_piece(s, which, i);
      snprintf(what, sizeof what, "checkpoint write of %s/%s", short_names[which], t->name);
      zt_comm_phase_begin(comm, what);
      zt_comm_lock();
      rc = write_tensor(f, s, which, t, data, dxpl, &sums[which * np + i], &bad[which * np + i], e);
      zt_comm_unlock();
      zt_comm_phase_end(comm);
      if (which == 1 && i == np / 2 && injected_failure(comm, step))
        rc = zt_err_set(e, ZT_ERUNTIME, "%s/%s: test: injected write failure", groups[which],
                        t->name);
      if (rc) { /* the first failing rank's reason, with its rank */
        char r[sizeof e->msg];
        snprintf(r, sizeof r, "%s", e->msg);
        zt_err_set(e, rc, "rank %d could not write %s", comm->world_ranks[comm->rank], r);
      }
      rc = zt_comm_agree(comm, rc, e);
    }
  if (!rc) zt_comm_allreduce(comm, sums, (size_t)6 * np, ZT_U64, ZT_SUM);
  for (int which = 0; which < 3 && !rc; which++)
    for (int i = 0; i < np && !rc; i++)
      if (bad[which * np + i])
        rc = zt_err_set(e, ZT_ERUNTIME, "tensor %s/%s holds %llu non-finite values (NaN or "
                        "inf) at step %lld: a diverged state is never saved", groups[which],
                        m->params[i].t.name, (unsigned long long)bad[which * np + i],
                        (long long)step);
  if (!rc) { /* every rank has the same sums: these metadata writes are collective */
    zt_comm_phase_begin(comm, "checkpoint: checksums and links");
    zt_comm_lock();
    for (int which = 0; which < 3 && !rc; which++)
      for (int i = 0; i < np && !rc; i++)
        if (set_checksum(f, which, &m->params[i].t, sums[which * np + i]))
          rc = zt_err_set(e, ZT_ERUNTIME, "writing checksums: %s",
                          zt_h5_error_reason(why, sizeof why));
    for (int i = 0; i < np && !rc; i++) { /* fp32 master weights = the parameters */
      char src[ZT_NAME_MAX + 16], dst[ZT_NAME_MAX + 32];
      snprintf(src, sizeof src, "/model/%s", m->params[i].t.name);
      snprintf(dst, sizeof dst, "/optim/master/%s", m->params[i].t.name);
      if (H5Lcreate_hard(f, src, f, dst, H5P_DEFAULT, H5P_DEFAULT) < 0)
        rc = zt_err_set(e, ZT_ERUNTIME, "linking master weights: %s",
                        zt_h5_error_reason(why, sizeof why));
    }
    zt_comm_unlock();
    zt_comm_phase_end(comm);
    rc = zt_comm_agree(comm, rc, e);
  }
  zt_comm_phase_begin(comm, "checkpoint: closing the file");
  zt_comm_lock();
  if (f >= 0 && H5Fclose(f) < 0 && !rc)
    rc = zt_err_set(e, ZT_ERUNTIME, "closing %s: %s", tmp, zt_h5_error_reason(why, sizeof why));
  H5Eclear2(H5E_DEFAULT);
  zt_comm_unlock();
  zt_comm_phase_end(comm);
  H5Pclose(fapl);
  H5Pclose(dxpl);
  free(sums);
  rc = zt_comm_agree(comm, rc, e);
  /* rank 0 publishes the file or removes it, and has the last word */
  if (rank0 && rc) {
    unlink(tmp);
    failed_message(path, need, e);
  } else if (rank0) {
    rc = zt_fs_publish(tmp, path, e);
    if (rc) unlink(tmp);
  }
  return zt_comm_agree(comm, rank0 ? rc : ZT_OK, e) ? e->code : ZT_OK;
}

int zt_ckpt_save(const char *path, const zt_ckpt_state *s, zt_err *e) {
  return save_impl(path, s, *s->step, &s->grid->world, NULL, e);
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
      counted_range(s, &m->params[i].t, &a0, &b0);
      total += b0 - a0;
    }
  memset(a, 0, sizeof *a);
  a->s = *s;
  a->step = *s->step;
  a->skipped = s->skipped ? *s->skipped : 0;
  a->s.skipped = &a->skipped; /* as of the snapshot, not as training goes on */
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
      counted_range(s, &m->params[i].t, &a0, &b0);
      m->be->download(p, live_piece(s, which, i), (size_t)(b0 - a0) * sizeof *p);
      a->pieces[which * np + i] = p;
      p += b0 - a0;
    }
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

/* ---- load ------------------------------------------------------------------- */

static int read_header(hid_t f, const char *path, long long *step, long long *version,
                       zt_err *e) {
  char fmt[64] = "";
  htri_t has = H5Aexists(f, "format");
  if (has < 0) /* damage, not another kind of file */
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: its root attributes are unreadable "
                      "(damaged?)", path);
  if (has > 0) {
    hid_t a = H5Aopen(f, "format", H5P_DEFAULT);
    hid_t type = a < 0 ? -1 : H5Aget_type(a);
    hid_t space = a < 0 ? -1 : H5Aget_space(a);
    /* one element only: H5Aread writes every element of the attribute's
     * dataspace, and fmt holds one */
    if (type >= 0 && space >= 0 && H5Sget_simple_extent_npoints(space) == 1 &&
        H5Tget_class(type) == H5T_STRING && !H5Tis_variable_str(type) &&
        H5Tget_size(type) < sizeof fmt) {
      hid_t mem = H5Tcopy(H5T_C_S1);
      H5Tset_size(mem, sizeof fmt);
      H5Aread(a, mem, fmt);
      H5Tclose(mem);
    }
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (a >= 0) H5Aclose(a);
  }
  if (strcmp(fmt, ZT_CKPT_FORMAT))
    return zt_err_set(e, ZT_EINPUT, "%s is not a ztrain checkpoint (no format attribute \"%s\")",
                      path, ZT_CKPT_FORMAT);
  if (zt_h5_read_scalar_attr(f, "format_version", H5T_NATIVE_LLONG, version) ||
      zt_h5_read_scalar_attr(f, "step", H5T_NATIVE_LLONG, step))
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: attribute format_version or step missing or "
                      "unreadable", path);
  if (*version < 1 || *version > ZT_CKPT_VERSION)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s has format version %lld; this ztrain reads "
                      "versions 1 to %d", path, *version, ZT_CKPT_VERSION);
  if (*step < 0) return zt_err_set(e, ZT_EINPUT, "checkpoint %s: negative step %lld", path, *step);
  return ZT_OK;
}

/* Every tensor of `group` exists with the model's logical shape. */
static int check_group(hid_t f, const char *path, const char *group, const zt_model *m,
                       zt_err *e) {
  hid_t g = H5Gopen2(f, group, H5P_DEFAULT);
  if (g < 0) return zt_err_set(e, ZT_EINPUT, "checkpoint %s: no group %s", path, group);
  H5G_info_t info;
  int rc = ZT_OK;
  if (H5Gget_info(g, &info) >= 0 && info.nlinks != (hsize_t)m->n_params)
    rc = zt_err_set(e, ZT_EINPUT,
                    "checkpoint %s holds %llu tensors in %s, the model has %d: it is from "
                    "another model", path, (unsigned long long)info.nlinks, group, m->n_params);
  for (int i = 0; i < m->n_params && !rc; i++) {
    const zt_tensor_desc *t = &m->params[i].t;
    if (H5Lexists(g, t->name, H5P_DEFAULT) <= 0) {
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s/%s is missing (from another model?)",
                      path, group, t->name);
      break;
    }
    hid_t ds = H5Dopen2(g, t->name, H5P_DEFAULT);
    hid_t space = ds < 0 ? -1 : H5Dget_space(ds);
    hid_t type = ds < 0 ? -1 : H5Dget_type(ds);
    hsize_t dims[ZT_MAX_DIMS] = {0}, want[ZT_MAX_DIMS];
    int nd = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    if (nd >= 0 && nd <= ZT_MAX_DIMS) H5Sget_simple_extent_dims(space, dims, NULL);
    int same = nd == t->ndim;
    for (int d = 0; d < t->ndim; d++) {
      want[d] = (hsize_t)t->shape[d];
      same = same && dims[d] == want[d];
    }
    if (ds < 0 || space < 0 || type < 0) {
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: cannot read %s/%s", path, group, t->name);
    } else if (!same) {
      char have_s[96], want_s[96];
      shape_str(have_s, sizeof have_s, nd > ZT_MAX_DIMS || nd < 0 ? 0 : nd, dims);
      shape_str(want_s, sizeof want_s, t->ndim, want);
      rc = zt_err_set(e, ZT_EINPUT,
                      "checkpoint %s: tensor %s has shape %s%s, the model expects %s", path,
                      t->name, have_s, nd > ZT_MAX_DIMS ? " (too many dimensions)" : "", want_s);
    } else if (H5Tequal(type, H5T_IEEE_F32LE) <= 0 && H5Tequal(type, H5T_IEEE_F32BE) <= 0) {
      /* exactly IEEE float32: HDF5 converts another layout by the bit
       * fields the file states, unchecked, and damaged ones read past
       * each element */
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s is not float32", path, t->name);
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    if (ds >= 0) H5Dclose(ds);
  }
  H5Gclose(g);
  return rc;
}

/* Reads what this rank holds of tensor t of state `which`; returns the
 * checksum of the part it counts, and the stored checksum in *want. */
static int read_tensor(hid_t f, const zt_ckpt_state *s, int which, const zt_tensor_desc *t,
                       hid_t dxpl, uint64_t *got, uint64_t *want, uint64_t *nonfinite) {
  char path[ZT_NAME_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", groups[which], t->name);
  hid_t ds = H5Dopen2(f, path, H5P_DEFAULT);
  if (ds < 0) return 1;
  int64_t lo, hi, off = t->offset;
  float *base = state_at(s->z, which, &lo, &hi);
  int64_t a = (lo > off ? lo : off) - off, b = (hi < off + t->numel ? hi : off + t->numel) - off;
  if (b < a || off < 0) a = b = 0, off = lo; /* off < 0: another pipeline stage holds it */
  hid_t fspace = H5Dget_space(ds);
  select_local(fspace, t, a, b);
  hsize_t n = (hsize_t)(b > a ? b - a : 1);
  hid_t mspace = H5Screate_simple(1, &n, NULL);
  if (b <= a) H5Sselect_none(mspace);
  float *data = base + (off + a - lo);
  int bad = H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data) < 0;
  int64_t ca, cb;
  counted_range(s, t, &ca, &cb); /* within [a, b): what this rank vouches for */
  *got = bad || cb <= ca ? 0 : piece_checksum(t, data + (ca - a), ca, cb, nonfinite);
  *want = 0;
  if (zt_h5_read_scalar_attr(ds, "checksum", H5T_NATIVE_UINT64, want)) *want = 0;
  H5Sclose(mspace);
  H5Sclose(fspace);
  H5Dclose(ds);
  return bad;
}

/* The steps skipped for non-finite values, from the state record (0 when
 * the file predates them); -1 when the record is damaged. */
static int64_t read_skipped(hid_t f, long long step) {
  char *txt = NULL;
  if (zt_h5_read_str_attr(f, "state", 1 << 20, &txt)) return 0;
  json_t *o = json_loads(txt, 0, NULL), *v = o ? json_object_get(o, "skipped_steps") : NULL;
  int64_t n = !o ? -1 : !v ? 0 : json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
  if (n > step) n = -1;
  json_decref(o);
  free(txt);
  return n;
}

int zt_ckpt_load(const char *path, const zt_ckpt_state *s, zt_err *e) {
  zt_model *m = s->m;
  zt_grid *g = s->grid;
  zt_comm *w = &g->world;
  int np = m->n_params, rc = ZT_OK;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  /* every rank looks (a file one node cannot see must not split them) */
  if (access(path, R_OK))
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: %s", path, strerror(errno));
  else if (H5Fis_hdf5(path) <= 0)
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s is not an HDF5 file (damaged or truncated?)",
                    path);
  if ((rc = zt_comm_agree(w, rc, e))) return rc;
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_fapl_mpio(fapl, w->mpi, MPI_INFO_NULL);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  zt_comm_phase_begin(w, "checkpoint: opening the file");
  zt_comm_lock();
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  long long step = 0, version = 0;
  int64_t skipped = 0;
  rc = f < 0 ? zt_err_set(e, ZT_EINPUT, "checkpoint %s cannot be opened (damaged or "
                          "truncated?)", path)
             : read_header(f, path, &step, &version, e);
  /* the data position is step * global_batch: a step past that is damage */
  if (!rc && s->global_batch > 0 && step > INT64_MAX / s->global_batch)
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: step %lld is out of range (damaged?)", path,
                    step);
  if (!rc && (skipped = read_skipped(f, step)) < 0)
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: its state record is damaged (skipped_steps)",
                    path);
  /* an error is not absence: it would drop the optimizer state and step */
  htri_t has_optim = rc ? 0 : H5Lexists(f, "/optim", H5P_DEFAULT);
  if (has_optim < 0)
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: its root group is unreadable (damaged?)", path);
  int optim = has_optim > 0;
  /* every rank reads the same header: the verdicts agree without talking */
  for (int w2 = 0; w2 < (optim ? 3 : 1) && !rc; w2++) rc = check_group(f, path, groups[w2], m, e);
  zt_comm_unlock();
  zt_comm_phase_end(w);
  rc = zt_comm_agree(w, rc, e);
  /* [got | want | non-finite] per tensor of each state */
  uint64_t *got = calloc((size_t)9 * np, sizeof *got), *want = got ? got + 3 * np : NULL,
           *nonfinite = got ? got + 6 * np : NULL;
  if (!rc && !got) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  rc = zt_comm_agree(w, rc, e);
  char what[96];
  for (int which = 0; which < (optim ? 3 : 1) && !rc; which++)
    for (int i = 0; i < np && !rc; i++) {
      snprintf(what, sizeof what, "checkpoint read of %s/%s", groups[which] + 1,
               m->params[i].t.name);
      zt_comm_phase_begin(w, what);
      zt_comm_lock();
      if (read_tensor(f, s, which, &m->params[i].t, dxpl, &got[which * np + i],
                      &want[which * np + i], &nonfinite[which * np + i]))
        rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: reading tensor %s/%s failed (file "
                        "damaged or truncated?)", path, groups[which], m->params[i].t.name);
      zt_comm_unlock();
      zt_comm_phase_end(w);
      rc = zt_comm_agree(w, rc, e);
    }
  zt_comm_phase_begin(w, "checkpoint: closing the file");
  zt_comm_lock();
  if (f >= 0) H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
  zt_comm_unlock();
  zt_comm_phase_end(w);
  H5Pclose(dxpl);
  if (!rc) {
    /* checksums add up over the ranks; the non-finite counts too */
    zt_comm_allreduce(w, got, (size_t)3 * np, ZT_U64, ZT_SUM);
    zt_comm_allreduce(w, nonfinite, (size_t)3 * np, ZT_U64, ZT_SUM);
  }
  for (int which = 0; which < (optim ? 3 : 1) && version >= 2 && !rc; which++)
    for (int i = 0; i < np && !rc; i++)
      if (got[which * np + i] != want[which * np + i])
        rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s/%s fails its checksum (file "
                        "damaged?)", path, groups[which], m->params[i].t.name);
  for (int which = 0; which < (optim ? 3 : 1) && !rc; which++)
    for (int i = 0; i < np && !rc; i++)
      if (nonfinite[which * np + i])
        rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s/%s holds %llu non-finite values "
                        "(NaN or inf): written by a run that diverged; use an earlier checkpoint",
                        path, groups[which], m->params[i].t.name,
                        (unsigned long long)nonfinite[which * np + i]);
  free(got);
  if (!rc && optim) {
    *s->step = step;
    if (s->skipped) *s->skipped = skipped;
  }
  return rc;
}
