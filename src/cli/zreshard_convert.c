/* zreshard_convert: `zreshard convert`, a copy of a checkpoint laid out for
 * another topology: the source's record is checked (zt_zreshard_open) and
 * its model against the target layout, every tensor is stored in chunks
 * that tile the target's TP shards (so a loader of one shard reads whole
 * chunks), checksums and finiteness are verified on the way in (a tensor
 * that fails stops the copy unless --force) and checksums recomputed for
 * what is written. */
#include <errno.h>
#include <hdf5.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/ckpt/ckpt.h"
#include "src/ckpt/h5util.h"
#include "src/cli/zreshard.h"
#include "src/core/half.h"

int64_t zt_zreshard_chunk_max_bytes = INT64_C(64) << 20;

static int64_t smallest_factor(int64_t n) {
  for (int64_t f = 2; f * f <= n; f++)
    if (n % f == 0) return f;
  return n;
}

/* Chunks of tensor p as the target cuts it: along a cut dimension, one
 * slice of one part (dim / (groups * count)), so every TP shard is whole
 * chunks; whole along the others. A chunk over max_bytes is made smaller
 * from the first dimension on: by a factor of the slice along the cut
 * dimension (chunks still tile each shard), by halves elsewhere. */
static void chunk_dims(const zt_tensor_desc *p, int esize, int64_t max_bytes, int64_t *c) {
  int cut = p->shard.dim >= 0 && p->shard.count > 1 ? p->shard.dim : -1;
  int64_t bytes = esize;
  for (int d = 0; d < p->ndim; d++) {
    c[d] = p->shape[d];
    if (d == cut) c[d] /= (int64_t)(p->shard.groups > 0 ? p->shard.groups : 1) * p->shard.count;
    bytes *= c[d];
  }
  for (int d = 0; d < p->ndim; d++)
    while (c[d] > 1 && bytes > max_bytes) {
      int64_t was = c[d];
      c[d] = d == cut ? c[d] / smallest_factor(c[d]) : (c[d] + 1) / 2;
      bytes = bytes / was * c[d];
    }
}



/* The script as a 1-D byte dataset /script, as ztrain writes it (an
 * attribute could not hold more than 64 KiB). */
static int write_script(hid_t f, const char *text) {
  hsize_t n = strlen(text);
  if (!n) return 0;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t ds = space < 0 ? -1
                       : H5Dcreate2(f, "script", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                    H5P_DEFAULT);
  int bad = ds < 0 || H5Dwrite(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, text) < 0;
  if (ds >= 0 && H5Dclose(ds) < 0) bad = 1;
  if (space >= 0) H5Sclose(space);
  return bad;
}

typedef struct {
  const args *a;
  const zt_ckpt_file *cf;
  hid_t f, ftype, mtype; /* output file; element type in it and in memory */
  int bf16;
  float *buf;     /* one chunk */
  uint16_t *half; /* one chunk in bf16 */
} converter;

/* Copies tensor src (logical shape of p) into group g of the output,
 * chunked as the target cuts p, verifying the source on the way and
 * storing the checksum of what was written. */
static int convert_tensor(converter *cv, const zt_ckpt_tensor *src, const zt_tensor_desc *p,
                          hid_t g, zt_err *e) {
  int nd = p->ndim, esize = cv->bf16 ? 2 : 4;
  int64_t c[ZT_MAX_DIMS], start[ZT_MAX_DIMS] = {0}, count[ZT_MAX_DIMS];
  hsize_t dims[ZT_MAX_DIMS], hc[ZT_MAX_DIMS], hs[ZT_MAX_DIMS], hn[ZT_MAX_DIMS];
  chunk_dims(p, esize, zt_zreshard_chunk_max_bytes, c);
  for (int d = 0; d < nd; d++) {
    dims[d] = (hsize_t)p->shape[d];
    hc[d] = (hsize_t)c[d];
  }
  hid_t space = H5Screate_simple(nd, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  /* every element is written: no fill values to write first */
  int bad = space < 0 || dcpl < 0 || H5Pset_chunk(dcpl, nd, hc) < 0 ||
            H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0;
  hid_t ds = bad ? -1 : H5Dcreate2(g, p->name, cv->ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  bad = bad || ds < 0;
  zt_ckpt_tally in = {0};
  uint64_t out_sum = 0;
  int rc = ZT_OK;
  while (!bad && !rc) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) {
      count[d] = p->shape[d] - start[d] < c[d] ? p->shape[d] - start[d] : c[d];
      hs[d] = (hsize_t)start[d];
      hn[d] = (hsize_t)count[d];
      n *= count[d];
    }
    rc = zt_ckpt_file_read(cv->cf, src, start, count, cv->buf, e);
    if (rc) break;
    zt_ckpt_tally_box(&in, src, start, count, cv->buf, n);
    if (cv->bf16) { /* the checksum is of the values stored: rounded */
      zt_bf16_from_f32_n(cv->half, cv->buf, (size_t)n);
      zt_bf16_to_f32_n(cv->buf, cv->half, (size_t)n);
      out_sum += zt_ckpt_file_box_checksum(src, start, count, cv->buf, NULL);
    }
    hid_t fs = H5Dget_space(ds), ms = H5Screate_simple(nd, hn, NULL);
    bad = fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, hs, NULL, hn, NULL) < 0 ||
          H5Dwrite(ds, cv->mtype, ms, fs, H5P_DEFAULT,
                   cv->bf16 ? (void *)cv->half : (void *)cv->buf) < 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    int d = nd - 1; /* next chunk, row-major */
    while (d >= 0 && (start[d] += c[d]) >= p->shape[d]) start[d--] = 0;
    if (d < 0) break;
  }
  if (!cv->bf16) out_sum = in.sum;
  if (!rc && !bad) rc = zt_zreshard_accept(cv->a, cv->cf, src, &in, e);
  if (!rc && !bad) bad = zt_h5_write_scalar_attr(ds, ZT_CKPT_ATTR_CHECKSUM, H5T_STD_U64LE, H5T_NATIVE_UINT64, &out_sum);
  if (ds >= 0 && H5Dclose(ds) < 0) bad = 1;
  if (dcpl >= 0) H5Pclose(dcpl);
  if (space >= 0) H5Sclose(space);
  if (!rc && bad)
    rc = zt_err_set(e, ZT_ERUNTIME, "writing tensor %s/%s failed", zt_ckpt_group_path[src->group],
                    p->name);
  return rc;
}

/* The target topology as JSON: the source's record with world, dp, tp,
 * pp and zero replaced (other keys, e.g. sequence_parallel, kept). */
static char *target_topology(const zt_ckpt_file *cf, const zt_ckpt_topology *t) {
  json_t *src = cf->topology ? json_loads(cf->topology, 0, NULL) : NULL;
  json_t *plan = cf->plan ? json_loads(cf->plan, 0, NULL) : NULL;
  json_t *sp = json_object_get(json_is_object(src) ? src : json_object_get(plan, "parallel"),
                               "sequence_parallel");
  json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:b}", "world", t->world, "dp", t->dp, "tp",
                        t->tp, "pp", t->pp, "zero", t->zero, "sequence_parallel",
                        json_is_true(sp));
  const char *key;
  json_t *v;
  if (json_is_object(src))
    json_object_foreach(src, key, v) if (!json_object_get(o, key)) json_object_set(o, key, v);
  char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  json_decref(src);
  json_decref(plan);
  return s;
}

/* What the target layout is, checked against the model: the model's own
 * rules (zt_model_layout runs zt_model_cfg_check and zt_model_tp_check)
 * and a block per pipeline stage at least. The source's names and shapes
 * were checked with its record. */
static int convert_target(const args *a, const zt_ckpt_record *rec, zt_model *m,
                          zt_ckpt_topology *t, zt_err *e) {
  const zt_ckpt_topology *src = &rec->topo;
  if (!rec->have_topo && (a->tp < 0 || a->pp < 0 || a->dp < 0 || a->zero < 0))
    return zt_err_set(e, ZT_EINPUT, "%s records no topology; give all of --tp, --pp, --dp and "
                      "--zero", a->ckpt);
  t->tp = a->tp >= 0 ? a->tp : src->tp;
  t->pp = a->pp >= 0 ? a->pp : src->pp;
  t->dp = a->dp >= 0 ? a->dp : src->dp;
  t->zero = a->zero >= 0 ? a->zero : src->zero;
  t->from_plan = 0;
  long long world = (long long)t->dp * t->tp * t->pp;
  if (world > (1 << 24))
    return zt_err_set(e, ZT_EINPUT, "dp %d x tp %d x pp %d = %lld ranks is more than any run",
                      t->dp, t->tp, t->pp, world);
  t->world = (int)world;
  int rc = zt_model_layout(m, &rec->cfg, t->tp, 0, e);
  if (rc) return rc; /* nothing allocated yet when the checks fail */
  if (t->pp > rec->cfg.layers)
    rc = zt_err_set(e, ZT_EINPUT, "pp = %d exceeds the model's %d layers: each pipeline stage "
                    "needs a block; use pp <= %d", t->pp, rec->cfg.layers, rec->cfg.layers);
  if (rc) zt_model_free(m);
  return rc;
}

int zt_zreshard_convert(const args *a, zt_err *e) {
  zt_ckpt_file cf;
  zt_ckpt_record rec;
  zt_model m;
  zt_ckpt_topology t = {0};
  int rc = zt_fs_check_writable("-o", a->out, e);
  if (!rc) rc = zt_zreshard_open(a->ckpt, &cf, &rec, e);
  if (rc) return rc;
  rc = convert_target(a, &rec, &m, &t, e);
  int have_m = !rc;
  int optim = cf.has_optim && !a->weights_only;
  if (!rc) rc = zt_zreshard_need_checksums(a, &cf, optim ? 3 : 1, e);
  char *topo = rc ? NULL : target_topology(&cf, &t);
  if (!rc && !topo) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  /* buffers for the largest chunk of any tensor */
  int64_t most = 1;
  for (int i = 0; have_m && i < m.n_params; i++) {
    int64_t c[ZT_MAX_DIMS], n = 1;
    chunk_dims(&m.params[i].t, a->bf16 ? 2 : 4, zt_zreshard_chunk_max_bytes, c);
    for (int d = 0; d < m.params[i].t.ndim; d++) n *= c[d];
    if (n > most) most = n;
  }
  converter cv = {.a = a, .cf = &cf, .f = -1, .ftype = -1, .mtype = -1, .bf16 = a->bf16};
  char *tmp = rc ? NULL : zt_zreshard_temp_name(a->out);
  if (!rc) {
    cv.buf = malloc((size_t)most * sizeof *cv.buf);
    cv.half = a->bf16 ? malloc((size_t)most * sizeof *cv.half) : NULL;
    cv.ftype = a->bf16 ? zt_ckpt_format_bf16_type() : H5Tcopy(H5T_IEEE_F32LE);
    cv.mtype = a->bf16 ? zt_ckpt_format_bf16_type() : H5Tcopy(H5T_NATIVE_FLOAT);
    if (!tmp || !cv.buf || (a->bf16 && !cv.half) || cv.ftype < 0 || cv.mtype < 0)
      rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  if (!rc) {
    /* HDF5 1.10's file format, as ztrain writes: its metadata carries
     * checksums, so a later reader refuses damaged metadata */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    zt_h5_checked_metadata(fapl);
    cv.f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (cv.f < 0) rc = zt_err_set(e, ZT_ERUNTIME, "cannot create %s", tmp);
  }
  if (!rc) {
    if (zt_ckpt_format_write_header(cv.f, cf.step, cf.plan, topo, cf.state) ||
        (cf.script && write_script(cv.f, cf.script)) || zt_ckpt_format_create_groups(cv.f, optim))
      rc = zt_err_set(e, ZT_ERUNTIME, "writing the header of %s failed", tmp);
  }
  int written = 0;
  for (int g = 0; g < (optim ? 3 : 1) && !rc; g++) {
    const char *gpath = zt_ckpt_group_path[g];
    hid_t grp = H5Gopen2(cv.f, gpath, H5P_DEFAULT);
    if (grp < 0) rc = zt_err_set(e, ZT_ERUNTIME, "writing %s failed", tmp);
    for (int i = 0; i < m.n_params && !rc; i++) {
      const zt_tensor_desc *p = &m.params[i].t;
      rc = convert_tensor(&cv, zt_ckpt_file_find(&cf, (zt_ckpt_group)g, p->name), p, grp, e);
      written += !rc;
    }
    if (grp >= 0) H5Gclose(grp);
  }
  /* fp32 master weights are the parameters: links, as ztrain writes them */
  for (int i = 0; optim && !rc && i < m.n_params; i++)
    if (zt_ckpt_format_link_master(cv.f, m.params[i].t.name))
      rc = zt_err_set(e, ZT_ERUNTIME, "writing %s failed (link %s/%s)", tmp,
                      zt_ckpt_group_path[ZT_CKPT_MASTER], m.params[i].t.name);
  if (cv.f >= 0 && H5Fclose(cv.f) < 0 && !rc)
    rc = zt_err_set(e, ZT_ERUNTIME, "writing %s failed (closing)", tmp);
  if (!rc) rc = zt_fs_publish(tmp, a->out, e);
  if (rc && cv.f >= 0) unlink(tmp);
  if (!rc)
    printf("wrote %s: format version 2, step %lld, %d tensors as %s in chunks for tp %d%s; "
           "topology world %d = dp %d x tp %d x pp %d, zero %d\n",
           a->out, (long long)cf.step, written, a->bf16 ? "bf16" : "f32", t.tp,
           optim ? " (+ /optim/master links)" : a->weights_only ? " (weights only)" : "",
           t.world, t.dp, t.tp, t.pp, t.zero);
  if (cv.ftype >= 0) H5Tclose(cv.ftype);
  if (cv.mtype >= 0) H5Tclose(cv.mtype);
  free(cv.buf);
  free(cv.half);
  free(tmp);
  free(topo);
  if (have_m) zt_model_free(&m);
  zt_zreshard_close(&cf, &rec);
  return rc;
}

