/* ckpt: see ckpt.h. */
#include "src/ckpt/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int write_str_attr(hid_t obj, const char *name, const char *value) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, strlen(value) ? strlen(value) : 1);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Awrite(a, type, value);
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  H5Tclose(type);
  return rc < 0;
}

static int write_i64_attr(hid_t obj, const char *name, long long value) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_LLONG, &value);
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  return rc < 0;
}

/* Writes every tensor of device buffer `buf` (model layout) under group. */
static int write_tensors(hid_t file, const char *group, const zt_model *m,
                         const float *buf, float *host) {
  hid_t g = H5Gcreate2(file, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) return 1;
  int bad = 0;
  for (int i = 0; i < m->n_params && !bad; i++) {
    const zt_tensor_desc *t = &m->params[i].t;
    hsize_t dims[ZT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) dims[d] = (hsize_t)t->shape[d];
    hid_t space = H5Screate_simple(t->ndim, dims, NULL);
    hid_t ds = H5Dcreate2(g, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT,
                          H5P_DEFAULT, H5P_DEFAULT);
    m->be->download(host, buf + t->offset, (size_t)t->numel * sizeof *host);
    bad = ds < 0 || H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host) < 0;
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(space);
  }
  H5Gclose(g);
  return bad;
}

static int64_t max_numel(const zt_model *m) {
  int64_t n = 1;
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i].t.numel > n) n = m->params[i].t.numel;
  return n;
}

/* fsync a file or directory by path; a checkpoint is durable before the
 * rename makes it visible. */
static int sync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

static int save_rank0(const char *path, const zt_model *m, const zt_optim *o,
                      const char *plan_json, zt_err *e) {
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid());
  float *host = malloc((size_t)max_numel(m) * sizeof *host);
  hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  int bad = f < 0 || !host;
  if (!bad) {
    bad = write_str_attr(f, "format", ZT_CKPT_FORMAT) ||
          write_i64_attr(f, "format_version", ZT_CKPT_VERSION) ||
          write_i64_attr(f, "step", o ? o->t : 0) ||
          write_str_attr(f, "plan", plan_json ? plan_json : "{}") ||
          write_tensors(f, "/model", m, m->w, host);
    if (!bad && o) {
      hid_t g = H5Gcreate2(f, "/optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      bad = g < 0 || write_tensors(f, "/optim/exp_avg", m, o->m, host) ||
            write_tensors(f, "/optim/exp_avg_sq", m, o->v, host);
      if (g >= 0) H5Gclose(g);
    }
  }
  if (f >= 0 && H5Fclose(f) < 0) bad = 1;
  free(host);
  if (!bad && sync_path(tmp)) bad = 1;
  if (!bad && rename(tmp, path)) bad = 1;
  if (bad) {
    int rc = zt_err_set(e, ZT_ERUNTIME, "writing checkpoint %s failed (%s)", path,
                        errno ? strerror(errno) : "HDF5 error");
    unlink(tmp);
    free(tmp);
    return rc;
  }
  char *dir = strdup(path);
  sync_path(dirname(dir));
  free(dir);
  free(tmp);
  return ZT_OK;
}

int zt_ckpt_save(const char *path, const zt_model *m, const zt_optim *o,
                 const char *plan_json, zt_comm *world, zt_err *e) {
  int rc = ZT_OK;
  if (world->rank == 0) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    errno = 0;
    rc = save_rank0(path, m, o, plan_json, e);
  }
  zt_comm_bcast(world, &rc, sizeof rc, 0);
  zt_comm_bcast(world, e->msg, sizeof e->msg, 0);
  return rc;
}

static void shape_str(char *buf, size_t n, int ndim, const hsize_t *d) {
  int k = snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k < (int)n; i++)
    k += snprintf(buf + k, n - (size_t)k, i ? ", %llu" : "%llu", (unsigned long long)d[i]);
  if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
}

/* Reads every tensor of group into device buffer `buf` (model layout). */
static int read_tensors(hid_t file, const char *path, const char *group,
                        zt_model *m, float *buf, float *host, zt_err *e) {
  hid_t g = H5Gopen2(file, group, H5P_DEFAULT);
  if (g < 0)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: no group %s", path, group);
  H5G_info_t info;
  int rc = ZT_OK;
  if (H5Gget_info(g, &info) >= 0 && info.nlinks != (hsize_t)m->n_params)
    rc = zt_err_set(e, ZT_EINPUT,
                    "checkpoint %s holds %llu tensors in %s, the model has %d: "
                    "it is from another model", path,
                    (unsigned long long)info.nlinks, group, m->n_params);
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
    hsize_t dims[ZT_MAX_DIMS + 1] = {0}, want[ZT_MAX_DIMS];
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
      shape_str(have_s, sizeof have_s, nd > ZT_MAX_DIMS ? 0 : nd, dims);
      shape_str(want_s, sizeof want_s, t->ndim, want);
      rc = zt_err_set(e, ZT_EINPUT,
                      "checkpoint %s: tensor %s has shape %s%s, the model "
                      "expects %s", path, t->name, have_s,
                      nd > ZT_MAX_DIMS ? " (too many dimensions)" : "", want_s);
    } else if (H5Tget_class(type) != H5T_FLOAT) {
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s is not floating point",
                      path, t->name);
    } else if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host) < 0) {
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: reading %s failed (file damaged?)",
                      path, t->name);
    } else {
      m->be->upload(buf + t->offset, host, (size_t)t->numel * sizeof *host);
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    if (ds >= 0) H5Dclose(ds);
  }
  H5Gclose(g);
  return rc;
}

static int read_header(hid_t f, const char *path, long long *step, zt_err *e) {
  char fmt[64] = "";
  long long version = -1;
  if (H5Aexists(f, "format") > 0) {
    hid_t a = H5Aopen(f, "format", H5P_DEFAULT);
    hid_t type = H5Aget_type(a);
    size_t sz = H5Tget_size(type);
    if (H5Tget_class(type) == H5T_STRING && !H5Tis_variable_str(type) && sz < sizeof fmt) {
      hid_t mem = H5Tcopy(H5T_C_S1);
      H5Tset_size(mem, sizeof fmt);
      H5Aread(a, mem, fmt);
      H5Tclose(mem);
    }
    H5Tclose(type);
    H5Aclose(a);
  }
  if (strcmp(fmt, ZT_CKPT_FORMAT))
    return zt_err_set(e, ZT_EINPUT, "%s is not a ztrain checkpoint (no format attribute \"%s\")",
                      path, ZT_CKPT_FORMAT);
  const char *names[] = {"format_version", "step"};
  long long *vals[] = {&version, step};
  for (int i = 0; i < 2; i++) {
    hid_t a = H5Aexists(f, names[i]) > 0 ? H5Aopen(f, names[i], H5P_DEFAULT) : -1;
    if (a < 0 || H5Aread(a, H5T_NATIVE_LLONG, vals[i]) < 0) {
      if (a >= 0) H5Aclose(a);
      return zt_err_set(e, ZT_EINPUT, "checkpoint %s: attribute %s missing or unreadable",
                        path, names[i]);
    }
    H5Aclose(a);
  }
  if (version != ZT_CKPT_VERSION)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s has format version %lld; this ztrain reads %d",
                      path, version, ZT_CKPT_VERSION);
  if (*step < 0)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: negative step %lld", path, *step);
  return ZT_OK;
}

int zt_ckpt_load(const char *path, zt_model *m, zt_optim *o, zt_err *e) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if (access(path, R_OK))
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: %s", path, strerror(errno));
  if (H5Fis_hdf5(path) <= 0)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s is not an HDF5 file (damaged or truncated?)", path);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s cannot be opened (damaged or truncated?)", path);
  long long step = 0;
  float *host = malloc((size_t)max_numel(m) * sizeof *host);
  int rc = host ? read_header(f, path, &step, e)
                : zt_err_set(e, ZT_ERUNTIME, "out of host memory loading %s", path);
  if (!rc) rc = read_tensors(f, path, "/model", m, m->w, host, e);
  if (!rc && o && H5Lexists(f, "/optim", H5P_DEFAULT) > 0) {
    rc = read_tensors(f, path, "/optim/exp_avg", m, o->m, host, e);
    if (!rc) rc = read_tensors(f, path, "/optim/exp_avg_sq", m, o->v, host, e);
    if (!rc) o->t = step;
  }
  free(host);
  H5Fclose(f);
  return rc;
}
