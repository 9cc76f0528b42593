/* ckpt_load: reads a checkpoint into this rank's state (zt_ckpt_load in
 * ckpt.h): the record and the layout checked first, then every tensor's
 * piece, straight from the file where it is stored contiguously, through
 * HDF5 otherwise, each verified against its checksum. */
#include "src/ckpt/ckpt.h"
#include "src/ckpt/ckpt_impl.h"
#include "src/ckpt/h5util.h"
#include "src/core/timer.h"
#include "src/core/trace.h"

#include <errno.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void shape_str(char *buf, size_t n, int ndim, const hsize_t *d) {
  int k = snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k < (int)n; i++)
    k += snprintf(buf + k, n - (size_t)k, i ? ", %llu" : "%llu", (unsigned long long)d[i]);
  if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
}

static int read_header(hid_t f, const char *path, long long *step, long long *version,
                       zt_err *e) {
  /* zt_h5_attr_str is the tools' reader too: ztrain and zreshard accept
   * the same files (a variable-length string from h5py as well) */
  char *fmt = NULL;
  if (H5Aexists(f, ZT_CKPT_ATTR_FORMAT) < 0) /* damage, not another kind of file */
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: its root attributes are unreadable "
                      "(damaged?)", path);
  int rc = zt_h5_attr_str(f, ZT_CKPT_ATTR_FORMAT, path, ZT_CKPT_MAX_TEXT, &fmt, e);
  if (rc) return rc;
  int is_ckpt = fmt && !strcmp(fmt, ZT_CKPT_FORMAT);
  free(fmt);
  if (!is_ckpt)
    return zt_err_set(e, ZT_EINPUT, "%s is not a ztrain checkpoint (no format attribute \"%s\")",
                      path, ZT_CKPT_FORMAT);
  if (zt_h5_read_scalar_attr(f, ZT_CKPT_ATTR_VERSION, H5T_NATIVE_LLONG, version) ||
      zt_h5_read_scalar_attr(f, ZT_CKPT_ATTR_STEP, H5T_NATIVE_LLONG, step))
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

/* The local elements [a, b) of t's piece that this rank holds of state
 * `which` (its ZeRO range, or all of it where the state is whole here),
 * and where element a lives. */
static float *held_range(const zt_ckpt_state *s, int which, const zt_tensor_desc *t, int64_t *a,
                         int64_t *b) {
  int64_t lo, hi, off = t->offset;
  float *base = zt_ckpti_state_at(s, which, &lo, &hi);
  *a = (lo > off ? lo : off) - off, *b = (hi < off + t->numel ? hi : off + t->numel) - off;
  if (*b < *a || off < 0) *a = *b = 0, off = lo; /* off < 0: another pipeline stage holds it */
  return base + (off + *a - lo);
}

/* Reads what this rank holds of tensor t of state `which` through HDF5,
 * collectively; returns the checksum of the part it counts. */
static int read_tensor(hid_t f, const zt_ckpt_state *s, int which, const zt_tensor_desc *t,
                       hid_t dxpl, uint64_t *got, uint64_t *nonfinite) {
  char path[ZT_NAME_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", zt_ckpt_group_path[which], t->name);
  hid_t ds = H5Dopen2(f, path, H5P_DEFAULT);
  if (ds < 0) return 1;
  int64_t a, b;
  float *data = held_range(s, which, t, &a, &b);
  hid_t fspace = H5Dget_space(ds);
  zt_ckpti_select_local(fspace, t, a, b);
  hsize_t n = (hsize_t)(b > a ? b - a : 1);
  hid_t mspace = H5Screate_simple(1, &n, NULL);
  if (b <= a) H5Sselect_none(mspace);
  int bad = H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, data) < 0;
  int64_t ca, cb;
  zt_ckpti_counted_range(s, t, &ca, &cb); /* within [a, b): what this rank vouches for */
  *got = bad || cb <= ca ? 0 : zt_ckpti_piece_checksum(t, data + (ca - a), ca, cb, nonfinite);
  H5Sclose(mspace);
  H5Sclose(fspace);
  H5Dclose(ds);
  return bad;
}

/* Where tensor t's data can be read straight from the file: stored
 * contiguously inside the file (no external storage, no filters), as
 * little-endian float32, all of it allocated; HADDR_UNDEF when HDF5 must
 * read it (a chunked file from zreshard convert, say). Depends on the
 * file only, so every rank decides alike. */
static haddr_t direct_address(hid_t ds, const zt_tensor_desc *t, long long file_size) {
  haddr_t at = HADDR_UNDEF;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  hid_t dcpl = H5Dget_create_plist(ds), type = H5Dget_type(ds);
  hsize_t bytes = (hsize_t)zt_tensor_numel(t) * sizeof(float);
  if (dcpl >= 0 && type >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS &&
      H5Pget_external_count(dcpl) == 0 && H5Pget_nfilters(dcpl) == 0 &&
      H5Tequal(type, H5T_IEEE_F32LE) > 0 && H5Dget_storage_size(ds) == bytes) {
    haddr_t a = H5Dget_offset(ds);
    if (a != HADDR_UNDEF && file_size >= 0 && a <= (haddr_t)file_size &&
        bytes <= (haddr_t)file_size - a)
      at = a;
  }
  if (type >= 0) H5Tclose(type);
  if (dcpl >= 0) H5Pclose(dcpl);
#else
  (void)ds, (void)t, (void)file_size;
#endif
  return at;
}

/* Reads this rank's stream of runs up to element `end` with r; a run
 * this rank counts is read past the page cache (no other rank reads it),
 * one it holds as a copy through it (its owner's dp peers on this node
 * read it too). Then the checksum and non-finite count of what it counts. */
static int direct_read(direct *d, int64_t end, zt_fs_reader *r, float *const *dst,
                       const haddr_t *addr, const int64_t *counted, uint64_t *got,
                       uint64_t *nonfinite, const zt_model *m, const char *path, zt_err *e) {
  while (d->done < end) {
    const span *sp = &d->runs.v[d->k];
    int64_t n = sp->n - d->at;
    if (n > end - d->done) n = end - d->done;
    if (n > DIRECT_CHUNK) n = DIRECT_CHUNK;
    /* [x, x + n) of the held range, counted where inside [ca, cb) of it */
    int64_t x = sp->at + d->at, first = sp->global + d->at;
    int64_t ca = counted[2 * sp->idx], cb = counted[2 * sp->idx + 1];
    int64_t s0 = x > ca ? x : ca, s1 = x + n < cb ? x + n : cb;
    if (s0 < s1 && (s0 > x || s1 < x + n)) n = s0 > x ? s0 - x : s1 - x; /* one kind at a time */
    int mine = x >= ca && x < cb;
    float *p = dst[sp->idx] + x;
    int err = zt_fs_reader_get(r, p, (size_t)n * sizeof *p,
                               (long long)addr[sp->idx] + first * (long long)sizeof *p, mine);
    if (err)
      return zt_err_set(e, ZT_EINPUT, "checkpoint %s: reading tensor %s/%s failed: %s (file "
                        "damaged or truncated?)", path, zt_ckpt_group_path[sp->idx / m->n_params],
                        m->params[sp->idx % m->n_params].t.name, strerror(err));
    if (mine) got[sp->idx] += zt_ckpt_checksum_count(p, n, first, &nonfinite[sp->idx]);
    d->done += n;
    if ((d->at += n) == sp->n) d->k++, d->at = 0;
  }
  return ZT_OK;
}

/* The state record's skipped steps and loss scaler (format.h); a file
 * without a record (older ones) has neither. */
static int read_state(hid_t f, long long step, zt_ckpt_state_rec *r, const char **bad) {
  char *txt = NULL;
  memset(r, 0, sizeof *r);
  zt_err ignored = {0};
  *bad = ZT_CKPT_ATTR_STATE;
  if (zt_h5_attr_str(f, ZT_CKPT_ATTR_STATE, "", ZT_CKPT_MAX_TEXT, &txt, &ignored)) return -1;
  if (!txt) return 0;
  int rc = zt_ckpt_format_parse_state(txt, step, r, bad);
  free(txt);
  return rc;
}

static int load_impl(const char *path, const zt_ckpt_state *s, int *kinds, zt_err *e);

/* The load reads into host copies of the states where the host cannot
 * address them, and copies what it read back. */
int zt_ckpt_load(const char *path, const zt_ckpt_state *s, zt_err *e) {
  zt_ckpt_state ls;
  int kinds = 0, rc = zt_comm_agree(&s->grid->world, zt_ckpti_host_begin(&ls, s, e), e);
  if (!rc) rc = load_impl(path, &ls, &kinds, e);
  zt_ckpti_host_end(&ls, rc ? 0 : kinds);
  return rc;
}

static int load_impl(const char *path, const zt_ckpt_state *s, int *kinds, zt_err *e) {
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
  char why[160];
  rc = f < 0 ? zt_err_set(e, ZT_EINPUT, "checkpoint %s cannot be opened (damaged or "
                          "truncated?)", path)
       : zt_h5_check_header(path, UINT64_MAX, why, sizeof why)
           ? zt_err_set(e, ZT_EINPUT, "checkpoint %s: its root group: %s", path, why)
           : read_header(f, path, &step, &version, e);
  /* the data position is step * global_batch: a step past that is damage */
  if (!rc && s->global_batch > 0 && step > INT64_MAX / s->global_batch)
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: step %lld is out of range (damaged?)", path,
                    step);
  zt_ckpt_state_rec rec;
  const char *bad_key = "";
  if (!rc && read_state(f, step, &rec, &bad_key))
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: its state record is damaged (%s)", path,
                    bad_key);
  /* an error is not absence: it would drop the optimizer state and step */
  htri_t has_optim = rc ? 0 : H5Lexists(f, "/optim", H5P_DEFAULT);
  if (has_optim < 0)
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: its root group is unreadable (damaged?)", path);
  int optim = has_optim > 0;
  /* every rank reads the same header: the verdicts agree without talking */
  for (int w2 = 0; w2 < (optim ? 3 : 1) && !rc; w2++) rc = check_group(f, path, zt_ckpt_group_path[w2], m, e);
  zt_comm_unlock();
  zt_comm_phase_end(w);
  rc = zt_comm_agree(w, rc, e);
  /* per tensor (which * np + i) of the states in the file: [got | want |
   * non-finite], its address for direct reads, the part of its held range
   * this rank counts, where that range lives */
  int nt = (optim ? 3 : 1) * np;
  uint64_t *got = calloc((size_t)9 * np, sizeof *got), *want = got ? got + 3 * np : NULL,
           *nonfinite = got ? got + 6 * np : NULL;
  haddr_t *addr = malloc((size_t)nt * sizeof *addr);
  int64_t *counted = malloc((size_t)2 * nt * sizeof *counted);
  float **dst = malloc((size_t)nt * sizeof *dst);
  if (!rc && (!got || !addr || !counted || !dst)) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  rc = zt_comm_agree(w, rc, e);
  char what[96];
  struct stat st;
  long long file_size = stat(path, &st) ? -1 : (long long)st.st_size;
  zt_comm_phase_begin(w, "checkpoint: reading the tensors' headers");
  zt_comm_lock();
  for (int idx = 0; idx < nt && !rc; idx++) {
    const zt_tensor_desc *t = &m->params[idx % np].t;
    char name[ZT_NAME_MAX + 32];
    snprintf(name, sizeof name, "%s/%s", zt_ckpt_group_path[idx / np], t->name);
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0) {
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: reading tensor %s failed (file damaged or "
                      "truncated?)", path, name);
      break;
    }
    H5O_info_t oi;
    if (H5Oget_info2(ds, &oi, H5O_INFO_BASIC) >= 0 &&
        zt_h5_check_header(path, (uint64_t)oi.addr, why, sizeof why)) {
      H5Dclose(ds);
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s: %s", path, name, why);
      break;
    }
    if (zt_h5_read_scalar_attr(ds, ZT_CKPT_ATTR_CHECKSUM, H5T_NATIVE_UINT64, &want[idx])) want[idx] = 0;
    addr[idx] = direct_address(ds, t, file_size);
    H5Dclose(ds);
  }
  zt_comm_unlock();
  zt_comm_phase_end(w);
  rc = zt_comm_agree(w, rc, e);
  /* the tensors stored contiguously: every rank reads its runs of them
   * straight from the file, in parts (the same number on every rank),
   * agreeing after each */
  direct d = {0};
  for (int idx = 0; idx < nt && !rc && !d.runs.oom; idx++) {
    const zt_tensor_desc *t = &m->params[idx % np].t;
    dst[idx] = held_range(s, idx / np, t, &d.runs.a, &d.runs.b);
    int64_t ca, cb;
    zt_ckpti_counted_range(s, t, &ca, &cb);
    counted[2 * idx] = ca - d.runs.a, counted[2 * idx + 1] = cb - d.runs.a;
    d.runs.idx = idx;
    if (addr[idx] != HADDR_UNDEF && d.runs.a < d.runs.b) zt_shard_runs(t, &d.runs, zt_ckpti_add_span);
  }
  for (size_t k = 0; k < d.runs.n; k++) d.total += d.runs.v[k].n;
  zt_fs_reader *reader = NULL;
  int err = 0;
  if (!rc && d.runs.oom) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (!rc && d.total && (err = zt_fs_reader_open(&reader, path, DIRECT_BUFFER_BYTES)))
    rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: %s", path, strerror(err));
  rc = zt_comm_agree(w, rc, e);
  uint64_t parts = (uint64_t)((d.total * (int64_t)sizeof(float) + DIRECT_PART_BYTES - 1) /
                              DIRECT_PART_BYTES);
  if (!rc) zt_comm_allreduce(w, &parts, 1, ZT_U64, ZT_MAX);
  for (uint64_t part = 0; part < parts && !rc; part++) {
    snprintf(what, sizeof what, "checkpoint: reading data, part %llu of %llu",
             (unsigned long long)part + 1, (unsigned long long)parts);
    int64_t end = part + 1 == parts ? d.total
                                    : (int64_t)((double)d.total * (double)(part + 1) / (double)parts);
    double t0 = zt_timer_now();
    zt_comm_phase_begin(w, what);
    rc = direct_read(&d, end, reader, dst, addr, counted, got, nonfinite, m, path, e);
    zt_comm_phase_end(w);
    zt_trace_slice("ckpt", "read", NULL, t0, zt_timer_now(), NULL, 0, NULL, 0);
    rc = zt_comm_agree(w, rc, e);
  }
  zt_fs_reader_close(reader);
  free(d.runs.v);
  /* the others through HDF5, one collective read each */
  for (int idx = 0; idx < nt && !rc; idx++) {
    if (addr[idx] != HADDR_UNDEF) continue;
    const zt_tensor_desc *t = &m->params[idx % np].t;
    snprintf(what, sizeof what, "checkpoint read of %s/%s", zt_ckpt_group_path[idx / np] + 1, t->name);
    zt_comm_phase_begin(w, what);
    zt_comm_lock();
    if (read_tensor(f, s, idx / np, t, dxpl, &got[idx], &nonfinite[idx]))
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: reading tensor %s/%s failed (file "
                      "damaged or truncated?)", path, zt_ckpt_group_path[idx / np], t->name);
    zt_comm_unlock();
    zt_comm_phase_end(w);
    rc = zt_comm_agree(w, rc, e);
  }
  free(addr);
  free(counted);
  free(dst);
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
                        "damaged?)", path, zt_ckpt_group_path[which], m->params[i].t.name);
  for (int which = 0; which < (optim ? 3 : 1) && !rc; which++)
    for (int i = 0; i < np && !rc; i++)
      if (nonfinite[which * np + i])
        rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s/%s holds %llu non-finite values "
                        "(NaN or inf): written by a run that diverged; use an earlier checkpoint",
                        path, zt_ckpt_group_path[which], m->params[i].t.name,
                        (unsigned long long)nonfinite[which * np + i]);
  free(got);
  *kinds = optim ? 3 : 1;
  if (!rc && optim) {
    *s->step = step;
    if (s->skipped) *s->skipped = rec.skipped_steps;
    /* a dynamic scaler goes on where it was; a static one is the script's */
    if (rec.has_scaler && s->scaler && s->scaler->cfg.dynamic) {
      s->scaler->scale = rec.scaler_scale;
      s->scaler->iter = rec.scaler_iter;
      s->scaler->last_overflow_iter = rec.scaler_last_overflow;
      s->scaler->hysteresis_left = rec.scaler_hysteresis;
    }
  }
  return rc;
}
