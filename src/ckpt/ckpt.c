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

/* fsync a file or directory by path; a checkpoint is durable before the
 * rename makes it visible. */
static int sync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

static void shape_str(char *buf, size_t n, int ndim, const hsize_t *d) {
  int k = snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k < (int)n; i++)
    k += snprintf(buf + k, n - (size_t)k, i ? ", %llu" : "%llu", (unsigned long long)d[i]);
  if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
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

static const char *const groups[3] = {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"};

/* Largest tensor, logical (whole) or local (this rank's piece). */
static int64_t max_numel(const zt_model *m, int logical) {
  int64_t n = 1;
  for (int i = 0; i < m->n_params; i++) {
    const zt_tensor_desc *t = &m->params[i].t;
    int64_t k = logical ? zt_tensor_numel(t) : t->numel;
    if (k > n) n = k;
  }
  return n;
}

typedef struct {
  float *local;
  float *logical;
  int to_logical;
} copy_ctx;

static void copy_run(void *ctx, int64_t local, int64_t global, int64_t n) {
  copy_ctx *c = ctx;
  if (c->to_logical)
    memcpy(c->logical + global, c->local + local, (size_t)n * sizeof(float));
  else
    memcpy(c->local + local, c->logical + global, (size_t)n * sizeof(float));
}

/* Every rank agrees on rank 0's status and message. */
static int share_status(zt_grid *g, int rc, zt_err *e) {
  zt_comm_bcast(&g->world, &rc, sizeof rc, 0);
  if (rc) zt_comm_bcast(&g->world, e->msg, sizeof e->msg, 0);
  e->code = rc;
  return rc;
}

static int create_file(const char *tmp, const zt_ckpt_state *s, const char *plan_json,
                       hid_t *f) {
  *f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (*f < 0) return 1;
  int bad = write_str_attr(*f, "format", ZT_CKPT_FORMAT) ||
            write_i64_attr(*f, "format_version", ZT_CKPT_VERSION) ||
            write_i64_attr(*f, "step", *s->step) ||
            write_str_attr(*f, "plan", plan_json ? plan_json : "{}");
  const char *gs[] = {"/model", "/optim", "/optim/exp_avg", "/optim/exp_avg_sq"};
  for (int i = 0; i < 4 && !bad; i++) {
    hid_t g = H5Gcreate2(*f, gs[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bad = g < 0;
    if (g >= 0) H5Gclose(g);
  }
  return bad;
}

static int write_tensor(hid_t f, const char *group, const zt_tensor_desc *t,
                        const float *data) {
  hsize_t dims[ZT_MAX_DIMS];
  for (int d = 0; d < t->ndim; d++) dims[d] = (hsize_t)t->shape[d];
  char path[ZT_NAME_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", group, t->name);
  hid_t space = H5Screate_simple(t->ndim, dims, NULL);
  hid_t ds = H5Dcreate2(f, path, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  int bad = ds < 0 || H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0;
  if (ds >= 0) H5Dclose(ds);
  H5Sclose(space);
  return bad;
}

int zt_ckpt_save(const char *path, const zt_ckpt_state *s, const char *plan_json,
                 zt_err *e) {
  const zt_model *m = s->m;
  zt_grid *g = s->grid;
  int rank0 = g->world.rank == 0, bad = 0;
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid());
  hid_t f = -1;
  if (rank0) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    errno = 0;
    bad = create_file(tmp, s, plan_json, &f);
  }
  zt_comm_bcast(&g->world, &bad, sizeof bad, 0);
  /* Host staging of this rank's whole TP-local state (one kind at a time);
   * the parallel format of the next version writes hyperslabs instead. */
  int64_t maxl = max_numel(m, 1);
  float *full = malloc((size_t)m->numel * sizeof *full);
  float *pieces = malloc((size_t)(g->tp * max_numel(m, 0)) * sizeof *pieces);
  float *logical = rank0 ? malloc((size_t)maxl * sizeof *logical) : NULL;
  if (!full || !pieces || (rank0 && !logical)) bad = 1;
  for (int which = 0; which < 3 && !bad; which++) {
    zt_zero_gather_state(s->z, which, full);
    if (g->dp_rank != 0) continue;
    for (int i = 0; i < m->n_params; i++) {
      const zt_tensor_desc *t = &m->params[i].t;
      zt_comm_gather_f32(&g->tp_comm, full + t->offset, pieces, (size_t)t->numel, 0);
      if (!rank0) continue;
      zt_tensor_desc piece = *t;
      for (int r = 0; r < g->tp; r++) {
        /* a whole tensor or a replicated kv head: take one copy */
        if (!zt_shard_counts_here(t, r, g->tp)) continue;
        piece.shard.index = zt_shard_index_at(t, r, g->tp);
        copy_ctx c = {pieces + (int64_t)r * t->numel, logical, 1};
        zt_shard_runs(&piece, &c, copy_run);
      }
      bad = bad || write_tensor(f, groups[which], t, logical);
    }
  }
  if (rank0) {
    if (f >= 0 && H5Fclose(f) < 0) bad = 1;
    if (!bad && sync_path(tmp)) bad = 1;
    if (!bad && rename(tmp, path)) bad = 1;
    if (bad) {
      zt_err_set(e, ZT_ERUNTIME, "writing checkpoint %s failed (%s)", path,
                 errno ? strerror(errno) : "HDF5 error");
      unlink(tmp);
    } else {
      char *dir = strdup(path);
      sync_path(dirname(dir));
      free(dir);
    }
  }
  free(tmp);
  free(full);
  free(pieces);
  free(logical);
  return share_status(g, rank0 && bad ? ZT_ERUNTIME : 0, e);
}

/* Rank 0: every tensor of `group` exists with the model's logical shape. */
static int check_group(hid_t f, const char *path, const char *group, const zt_model *m,
                       zt_err *e) {
  hid_t g = H5Gopen2(f, group, H5P_DEFAULT);
  if (g < 0) return zt_err_set(e, ZT_EINPUT, "checkpoint %s: no group %s", path, group);
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
      shape_str(have_s, sizeof have_s, nd > ZT_MAX_DIMS ? 0 : nd, dims);
      shape_str(want_s, sizeof want_s, t->ndim, want);
      rc = zt_err_set(e, ZT_EINPUT,
                      "checkpoint %s: tensor %s has shape %s%s, the model expects %s",
                      path, t->name, have_s, nd > ZT_MAX_DIMS ? " (too many dimensions)" : "",
                      want_s);
    } else if (H5Tget_class(type) != H5T_FLOAT) {
      rc = zt_err_set(e, ZT_EINPUT, "checkpoint %s: tensor %s is not floating point", path,
                      t->name);
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    if (ds >= 0) H5Dclose(ds);
  }
  H5Gclose(g);
  return rc;
}

/* Rank 0: opens and checks the whole file before anyone changes state. */
static int open_checked(const char *path, const zt_model *m, hid_t *f, long long *step,
                        int *has_optim, zt_err *e) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if (access(path, R_OK))
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: %s", path, strerror(errno));
  if (H5Fis_hdf5(path) <= 0)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s is not an HDF5 file (damaged or truncated?)", path);
  *f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (*f < 0)
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s cannot be opened (damaged or truncated?)", path);
  int rc = read_header(*f, path, step, e);
  *has_optim = !rc && H5Lexists(*f, "/optim", H5P_DEFAULT) > 0;
  for (int w = 0; w < (*has_optim ? 3 : 1) && !rc; w++) rc = check_group(*f, path, groups[w], m, e);
  return rc;
}

int zt_ckpt_load(const char *path, const zt_ckpt_state *s, zt_err *e) {
  zt_model *m = s->m;
  zt_grid *g = s->grid;
  int rank0 = g->world.rank == 0;
  hid_t f = -1;
  long long info[2] = {0, 0}; /* step, has_optim */
  int has_optim = 0, rc = ZT_OK;
  if (rank0) {
    rc = open_checked(path, m, &f, &info[0], &has_optim, e);
    info[1] = has_optim;
  }
  if (share_status(g, rc, e)) {
    if (f >= 0) H5Fclose(f);
    return e->code;
  }
  zt_comm_bcast(&g->world, info, sizeof info, 0);
  int64_t maxl = max_numel(m, 1);
  float *full = malloc((size_t)m->numel * sizeof *full);
  float *logical = malloc((size_t)maxl * sizeof *logical);
  int bad = !full || !logical;
  for (int which = 0; which < (info[1] ? 3 : 1) && !bad; which++) {
    for (int i = 0; i < m->n_params; i++) {
      const zt_tensor_desc *t = &m->params[i].t;
      int64_t n = zt_tensor_numel(t);
      if (rank0) {
        char p[ZT_NAME_MAX + 32];
        snprintf(p, sizeof p, "%s/%s", groups[which], t->name);
        hid_t ds = H5Dopen2(f, p, H5P_DEFAULT);
        bad = bad || ds < 0 ||
              H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, logical) < 0;
        if (ds >= 0) H5Dclose(ds);
      }
      zt_comm_bcast(&g->world, logical, (size_t)n * sizeof *logical, 0);
      copy_ctx c = {full + t->offset, logical, 0};
      zt_shard_runs(t, &c, copy_run);
    }
    zt_zero_scatter_state(s->z, which, full);
  }
  if (rank0) H5Fclose(f);
  free(full);
  free(logical);
  if (share_status(g, rank0 && bad ? zt_err_set(e, ZT_EINPUT, "checkpoint %s: reading "
                                                "tensor data failed (file damaged?)", path)
                                   : 0, e))
    return e->code;
  if (info[1]) *s->step = info[0];
  return ZT_OK;
}
