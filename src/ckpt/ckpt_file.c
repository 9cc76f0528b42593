/* ckpt_file: see ckpt_file.h. Every HDF5 call's return is checked; any
 * failure while opening is the file's fault (ZT_EINPUT), since the file is
 * only read. */
#include "src/ckpt/ckpt_file.h"
#include "src/ckpt/h5util.h"

#include "src/ckpt/ckpt.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "src/core/half.h"

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "zt_ckpt_file keeps a hid_t in an int64_t");


int64_t zt_ckpt_file_block_elems = INT64_C(1) << 24;


/* ---- errors ---------------------------------------------------------- */

static herr_t innermost(unsigned n, const H5E_error2_t *err, void *ctx) {
  if (n == 0 && err->desc) snprintf(ctx, 200, "%s", err->desc);
  return 0;
}

/* HDF5's own words for the innermost error (e.g. "truncated file: eof =
 * ..."), made printable: it may quote bytes from the file. */
static const char *h5_reason(char buf[200]) {
  buf[0] = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, buf);
  H5Eclear2(H5E_DEFAULT);
  for (char *p = buf; *p; p++)
    if (*p < 0x20 || *p > 0x7e) *p = '?';
  if (!buf[0]) snprintf(buf, 200, "HDF5 error");
  return buf;
}

static void close_all(hid_t ds, hid_t type, hid_t space, hid_t plist) {
  if (plist >= 0) H5Pclose(plist);
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  if (ds >= 0) H5Dclose(ds);
}

/* ---- checksums and bf16 ---------------------------------------------- */

uint64_t zt_ckpt_file_box_checksum(const zt_ckpt_tensor *t, const int64_t *start,
                                   const int64_t *count, const float *x, uint64_t *nonfinite) {
  int nd = t->ndim, last = nd - 1;
  int64_t stride[ZT_MAX_DIMS], idx[ZT_MAX_DIMS] = {0};
  stride[last] = 1;
  for (int d = last - 1; d >= 0; d--) stride[d] = stride[d + 1] * t->shape[d + 1];
  uint64_t sum = 0;
  int64_t off = 0;
  for (;;) { /* one run along the last dimension per outer index */
    int64_t g = 0;
    for (int d = 0; d < nd; d++) g += (start[d] + (d < last ? idx[d] : 0)) * stride[d];
    sum += zt_ckpt_checksum_count(x + off, count[last], g, nonfinite);
    off += count[last];
    int d = last - 1;
    while (d >= 0 && ++idx[d] == count[d]) idx[d--] = 0;
    if (d < 0) return sum;
  }
}

/* Which of our element types an HDF5 type is, or -1. Only the exact bit
 * layouts are accepted: any other float would need a conversion that the
 * checksums do not describe. */
static int classify(hid_t type) {
  if (H5Tget_class(type) != H5T_FLOAT) return -1;
  size_t spos, epos, esize, mpos, msize;
  if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return -1;
  size_t size = H5Tget_size(type), ebias = H5Tget_ebias(type);
  int off = H5Tget_offset(type), prec = (int)H5Tget_precision(type);
  H5T_order_t order = H5Tget_order(type);
  if (order != H5T_ORDER_LE && order != H5T_ORDER_BE) return -1;
  if (size == 4 && spos == 31 && epos == 23 && esize == 8 && mpos == 0 && msize == 23 &&
      ebias == 127 && off == 0 && prec == 32)
    return ZT_CKPT_F32;
  if (size == 2 && spos == 15 && epos == 7 && esize == 8 && mpos == 0 && msize == 7 &&
      ebias == 127 && off == 0 && prec == 16)
    return ZT_CKPT_BF16;
  return -1;
}

/* ---- attributes ------------------------------------------------------ */

/* 1 if `name` is a hard link in loc, 0 if absent, -1 if it is a soft or
 * external link (never followed: it could lead out of the file). */
static int hard_link(hid_t loc, const char *name) {
  htri_t ex = H5Lexists(loc, name, H5P_DEFAULT);
  if (ex <= 0) return ex < 0 ? -1 : 0;
  H5L_info_t li;
  if (H5Lget_info(loc, name, &li, H5P_DEFAULT) < 0) return -1;
  return li.type == H5L_TYPE_HARD ? 1 : -1;
}

/* A scalar integer attribute: 64-bit signed, or unsigned when `u` (read
 * without conversion, so a stored value is never clamped). */
static int read_int_attr(hid_t obj, const char *name, const char *what, int u, void *v,
                         int *present, zt_err *e) {
  *present = 0;
  htri_t ex = H5Aexists(obj, name);
  if (ex == 0) return ZT_OK;
  hid_t a = ex > 0 ? H5Aopen(obj, name, H5P_DEFAULT) : -1;
  hid_t type = a >= 0 ? H5Aget_type(a) : -1;
  hid_t space = a >= 0 ? H5Aget_space(a) : -1;
  int rc = ZT_OK;
  if (type < 0 || space < 0)
    rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is unreadable", what, name);
  else if (H5Tget_class(type) != H5T_INTEGER || !zt_h5_plain_number(type) ||
           H5Sget_simple_extent_npoints(space) != 1 || H5Tget_size(type) > 8 ||
           (u && (H5Tget_size(type) != 8 || H5Tget_sign(type) != H5T_SGN_NONE)))
    rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is not a %s integer", what, name,
                    u ? "scalar unsigned 64-bit" : "scalar");
  else if (H5Aread(a, u ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, v) < 0)
    rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is unreadable", what, name);
  else
    *present = 1;
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  if (a >= 0) H5Aclose(a);
  return rc;
}

int zt_ckpt_file_attr_str(const zt_ckpt_file *cf, const char *name, char **out, zt_err *e) {
  return zt_h5_attr_str(cf->h5, name, cf->path, ZT_CKPT_MAX_TEXT, out, e);
}

int zt_ckpt_file_attr_i64(const zt_ckpt_file *cf, const char *name, int64_t *v, int *present,
                          zt_err *e) {
  return read_int_attr(cf->h5, name, cf->path, 0, v, present, e);
}

/* The Lua script: a root string attribute, or a 1-D byte dataset /script
 * (which has no attribute's 64 KiB limit). */
static int read_script(zt_ckpt_file *cf, zt_err *e) {
  int rc = zt_h5_attr_str(cf->h5, "script", cf->path, ZT_CKPT_MAX_TEXT, &cf->script, e);
  if (rc || cf->script) return rc;
  int hl = hard_link(cf->h5, "script");
  if (hl == 0) return ZT_OK;
  hid_t ds = hl > 0 ? H5Dopen2(cf->h5, "script", H5P_DEFAULT) : -1;
  hid_t type = ds >= 0 ? H5Dget_type(ds) : -1;
  hid_t space = ds >= 0 ? H5Dget_space(ds) : -1;
  hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
  if (type < 0 || space < 0 || H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 1 ||
      !zt_h5_plain_number(type) ||
      H5Sget_simple_extent_ndims(space) != 1 || n < 0 || n > ZT_CKPT_MAX_TEXT) {
    rc = zt_err_set(e, ZT_EINPUT, "%s: /script is not a byte array of at most %d bytes",
                    cf->path, ZT_CKPT_MAX_TEXT);
  } else if (!(cf->script = calloc((size_t)n + 1, 1))) {
    rc = zt_err_set(e, ZT_ERUNTIME, "out of memory reading /script");
  } else if (n > 0 && H5Dread(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, cf->script) < 0) {
    char why[200];
    rc = zt_err_set(e, ZT_EINPUT, "%s: /script is unreadable (%s)", cf->path, h5_reason(why));
  }
  close_all(ds, type, space, -1);
  return rc;
}

/* ---- listing tensors -------------------------------------------------- */

/* Names ztrain gives tensors: printable ASCII, no space, quote or
 * backslash, so they print and go into JSON as they are. */
static int valid_name(const char *s) {
  size_t n = strnlen(s, ZT_NAME_MAX);
  if (n == 0 || n >= ZT_NAME_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] <= 0x20 || s[i] > 0x7e || s[i] == '"' || s[i] == '\\') return 0;
  return 1;
}

typedef struct {
  zt_ckpt_tensor *t;
  int n, cap;
  const char *why; /* set when the iteration stopped on a bad entry */
  int idx;         /* which entry */
} name_list;

static herr_t collect(hid_t g, const char *name, const H5L_info_t *info, void *ctx) {
  (void)g;
  name_list *l = ctx;
  l->idx = l->n;
  if (!valid_name(name)) l->why = "an entry whose name is not a tensor name";
  else if (info->type != H5L_TYPE_HARD) l->why = "a soft or external link (never followed)";
  else if (l->n >= ZT_CKPT_MAX_TENSORS) l->why = "more entries than any model has";
  if (l->why) return 1;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    zt_ckpt_tensor *t = realloc(l->t, (size_t)cap * sizeof *t);
    if (!t) {
      l->why = "too many entries for memory";
      return 1;
    }
    l->t = t;
    l->cap = cap;
  }
  memset(&l->t[l->n], 0, sizeof l->t[l->n]);
  memcpy(l->t[l->n].name, name, strlen(name) + 1);
  l->n++;
  return 0;
}

void zt_ckpt_shape_str(char *buf, size_t n, int ndim, const int64_t *d) {
  int k = snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k > 0 && (size_t)k < n; i++)
    k += snprintf(buf + k, n - (size_t)k, i ? ", %lld" : "%lld", (long long)d[i]);
  if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "]");
}

/* Whether a and b name the same object (a hard link to it). */
static int same_object(hid_t la, const char *a, hid_t lb, const char *b) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t ia, ib;
  int cmp = 1;
  if (H5Oget_info_by_name3(la, a, &ia, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
      H5Oget_info_by_name3(lb, b, &ib, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
    return 0;
  return ia.fileno == ib.fileno && H5Otoken_cmp(la, &ia.token, &ib.token, &cmp) >= 0 && cmp == 0;
#else
  H5O_info_t ia, ib;
  if (H5Oget_info_by_name2(la, a, &ia, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
      H5Oget_info_by_name2(lb, b, &ib, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
    return 0;
  return ia.fileno == ib.fileno && ia.addr == ib.addr;
#endif
}

/* Opens dataset `name` of group g and fills t from what it claims, each
 * claim checked before the next one relies on it. */
static int describe(hid_t g, const char *gpath, const char *file, zt_ckpt_tensor *t,
                    zt_err *e) {
  hid_t ds = H5Dopen2(g, t->name, H5P_DEFAULT);
  if (ds < 0)
    return zt_err_set(e, ZT_EINPUT, "%s: %s/%s is not a dataset", file, gpath, t->name);
  H5O_info_t oi;
  char why[160];
  if (H5Oget_info2(ds, &oi, H5O_INFO_BASIC) >= 0 &&
      zt_h5_check_header(file, (uint64_t)oi.addr, why, sizeof why)) {
    H5Dclose(ds);
    return zt_err_set(e, ZT_EINPUT, "%s: tensor %s/%s: %s", file, gpath, t->name, why);
  }
  hid_t type = H5Dget_type(ds), space = H5Dget_space(ds), dcpl = H5Dget_create_plist(ds);
  int rc = ZT_OK, nd = -1, esize = 0, dtype = -1;
  hsize_t dims[ZT_MAX_DIMS], cdims[ZT_MAX_DIMS];
  H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
#define BAD(...) (rc = zt_err_set(e, ZT_EINPUT, __VA_ARGS__))
  if (type < 0 || space < 0 || dcpl < 0) {
    BAD("%s: tensor %s/%s is unreadable", file, gpath, t->name);
  } else if ((dtype = classify(type)) < 0) {
    BAD("%s: tensor %s/%s has an element type that is neither float32 nor bf16", file, gpath,
        t->name);
  } else if ((nd = H5Sget_simple_extent_type(space) == H5S_SIMPLE
                       ? H5Sget_simple_extent_ndims(space)
                       : 0) < 1 || nd > ZT_MAX_DIMS) { /* 0: a scalar or empty */
    BAD("%s: tensor %s/%s has %d dimensions; tensors have 1 to %d", file, gpath, t->name, nd,
        ZT_MAX_DIMS);
  } else if (H5Sget_simple_extent_dims(space, dims, NULL) != nd) {
    BAD("%s: tensor %s/%s: unreadable shape", file, gpath, t->name);
  } else if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT) {
    BAD("%s: tensor %s/%s is a virtual dataset (data held in other files); refused", file,
        gpath, t->name);
  } else if (H5Pget_external_count(dcpl) != 0) {
    BAD("%s: tensor %s/%s keeps its data in external files; refused", file, gpath, t->name);
  } else if (H5Pget_nfilters(dcpl) != 0) {
    BAD("%s: tensor %s/%s is stored through filters (compression), which checkpoints never "
        "use; refused", file, gpath, t->name);
  }
  if (!rc) {
    t->dtype = (zt_ckpt_dtype)dtype;
    t->ndim = nd;
    t->numel = 1;
    esize = t->dtype == ZT_CKPT_F32 ? 4 : 2;
    for (int d = 0; d < nd && !rc; d++) {
      if (dims[d] < 1 || dims[d] > (hsize_t)(ZT_CKPT_MAX_NUMEL / t->numel))
        BAD("%s: tensor %s/%s: dimension %d of size %llu is out of range (1 to %lld elements "
            "in all)", file, gpath, t->name, d, (unsigned long long)dims[d],
            (long long)ZT_CKPT_MAX_NUMEL);
      else
        t->numel *= (int64_t)(t->shape[d] = (int64_t)dims[d]);
    }
  }
  if (!rc && layout == H5D_CHUNKED) {
    if (H5Pget_chunk(dcpl, ZT_MAX_DIMS, cdims) != nd) {
      BAD("%s: tensor %s/%s: chunk rank differs from its rank", file, gpath, t->name);
    } else {
      t->chunked = 1;
      for (int d = 0; d < nd; d++) t->chunk[d] = (int64_t)cdims[d];
    }
  }
  if (!rc) {
    /* a dataset whose storage is smaller than its shape was never fully
     * written (or claims a shape the file does not back) */
    hsize_t have = H5Dget_storage_size(ds), need = (hsize_t)t->numel * (hsize_t)esize;
    char s[96];
    zt_ckpt_shape_str(s, sizeof s, nd, t->shape);
    if (have < need)
      BAD("%s: tensor %s/%s has %llu bytes stored, its shape %s needs %llu (damaged or never "
          "written)", file, gpath, t->name, (unsigned long long)have, s,
          (unsigned long long)need);
  }
  int present = 0;
  if (!rc) {
    char what[4400]; /* messages name the file, as every other refusal does */
    snprintf(what, sizeof what, "%s: tensor %s/%s", file, gpath, t->name);
    rc = read_int_attr(ds, "checksum", what, 1, &t->checksum, &present, e);
    t->has_checksum = present;
  }
#undef BAD
  close_all(ds, type, space, dcpl);
  return rc;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const zt_ckpt_tensor *)a)->name, ((const zt_ckpt_tensor *)b)->name);
}

/* Lists and describes the tensors of one group (opened by the caller). */
static int list_group(zt_ckpt_file *cf, hid_t g, zt_ckpt_group which, zt_err *e) {
  const char *gpath = zt_ckpt_group_path[which];
  name_list l = {0};
  hsize_t at = 0;
  /* native order: in a group of many links HDF5 1.10.8 otherwise builds a
   * table of them to sort, and on damaged link storage its error path
   * frees pointers that table never set (a crash under AddressSanitizer on
   * one of fuzz_load's files); the names are sorted here instead */
  herr_t it = H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, &at, collect, &l);
  if (l.n > 1) qsort(l.t, (size_t)l.n, sizeof *l.t, by_name);
  int rc = ZT_OK;
  if (l.why)
    rc = zt_err_set(e, ZT_EINPUT, "%s: %s holds %s (entry %d); refused", cf->path, gpath,
                    l.why, l.idx + 1);
  else if (it < 0) {
    char why[200];
    rc = zt_err_set(e, ZT_EINPUT, "%s: cannot list %s (%s)", cf->path, gpath, h5_reason(why));
  }
  cf->tensors[which] = l.t;
  cf->n[which] = l.n;
  for (int i = 0; i < l.n && !rc; i++) {
    zt_ckpt_tensor *t = &l.t[i];
    t->group = which;
    if (which == ZT_CKPT_MASTER) {
      /* fp32 training: master weights are the parameters, hard-linked */
      char p[ZT_NAME_MAX + 16];
      snprintf(p, sizeof p, "/model/%s", t->name);
      t->link = hard_link(cf->h5, p) > 0 && same_object(g, t->name, cf->h5, p);
    }
    rc = describe(g, gpath, cf->path, t, e);
  }
  return rc;
}

/* Opens `name` in loc as a group if it is a hard link to one: *g >= 0;
 * absent: *g = -1 and ZT_OK. */
static int open_group(const zt_ckpt_file *cf, hid_t loc, const char *name, const char *gpath,
                      hid_t *g, zt_err *e) {
  *g = -1;
  int hl = hard_link(loc, name);
  if (hl == 0) return ZT_OK;
  if (hl < 0)
    return zt_err_set(e, ZT_EINPUT, "%s: %s is a soft or external link (never followed)",
                      cf->path, gpath);
  *g = H5Gopen2(loc, name, H5P_DEFAULT);
  if (*g < 0) return zt_err_set(e, ZT_EINPUT, "%s: %s is not a group", cf->path, gpath);
  return ZT_OK;
}

static int list_tensors(zt_ckpt_file *cf, zt_err *e) {
  hid_t model, optim = -1, sub;
  int rc = open_group(cf, cf->h5, "model", "/model", &model, e);
  if (!rc && model < 0)
    rc = zt_err_set(e, ZT_EINPUT, "%s: no /model group: not a complete checkpoint", cf->path);
  cf->present[ZT_CKPT_MODEL] = model >= 0;
  if (!rc) rc = list_group(cf, model, ZT_CKPT_MODEL, e);
  if (model >= 0) H5Gclose(model);
  if (!rc) rc = open_group(cf, cf->h5, "optim", "/optim", &optim, e);
  cf->has_optim = optim >= 0;
  const char *subs[] = {"exp_avg", "exp_avg_sq", "master"};
  for (int i = 0; i < 3 && optim >= 0 && !rc; i++) {
    zt_ckpt_group which = (zt_ckpt_group)(ZT_CKPT_EXP_AVG + i);
    rc = open_group(cf, optim, subs[i], zt_ckpt_group_path[which], &sub, e);
    cf->present[which] = sub >= 0;
    if (!rc && sub < 0 && which != ZT_CKPT_MASTER) /* master is new in version 2 */
      rc = zt_err_set(e, ZT_EINPUT, "%s: /optim has no %s group: incomplete optimizer state",
                      cf->path, zt_ckpt_group_path[which]);
    if (!rc && sub >= 0) rc = list_group(cf, sub, which, e);
    if (sub >= 0) H5Gclose(sub);
  }
  if (optim >= 0) H5Gclose(optim);
  return rc;
}

/* ---- open / close ------------------------------------------------------ */

static int read_header(zt_ckpt_file *cf, zt_err *e) {
  char *fmt = NULL;
  int rc = zt_h5_attr_str(cf->h5, ZT_CKPT_ATTR_FORMAT, cf->path, ZT_CKPT_MAX_TEXT, &fmt, e);
  int is_ckpt = fmt && !strcmp(fmt, ZT_CKPT_FORMAT);
  free(fmt);
  if (rc) return rc;
  if (!is_ckpt)
    return zt_err_set(e, ZT_EINPUT,
                      "%s is an HDF5 file but not a ztrain checkpoint (no format attribute "
                      "\"%s\")", cf->path, ZT_CKPT_FORMAT);
  int present = 0;
  rc = read_int_attr(cf->h5, "format_version", cf->path, 0, &cf->version, &present, e);
  if (!rc && !present)
    rc = zt_err_set(e, ZT_EINPUT, "%s: attribute format_version is missing", cf->path);
  if (!rc && (cf->version < 1 || cf->version > 2))
    rc = zt_err_set(e, ZT_EINPUT, "%s has checkpoint format version %lld; this tool reads "
                    "versions 1 and 2", cf->path, (long long)cf->version);
  if (!rc) rc = read_int_attr(cf->h5, "step", cf->path, 0, &cf->step, &present, e);
  if (!rc && !present) rc = zt_err_set(e, ZT_EINPUT, "%s: attribute step is missing", cf->path);
  if (!rc && cf->step < 0)
    rc = zt_err_set(e, ZT_EINPUT, "%s: negative step %lld", cf->path, (long long)cf->step);
  return rc;
}

int zt_ckpt_file_open(zt_ckpt_file *cf, const char *path, zt_err *e) {
  memset(cf, 0, sizeof *cf);
  cf->h5 = -1;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  /* a file names filters by number, and HDF5 would look for a plugin it
   * lacks in the plugin folders: never load code because a file asks */
  H5PLset_loading_state(0);
  struct stat st;
  if (stat(path, &st)) return zt_err_set(e, ZT_EINPUT, "checkpoint %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return zt_err_set(e, ZT_EINPUT, "checkpoint %s is not a file", path);
  if (access(path, R_OK))
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s: %s", path, strerror(errno));
  if (H5Fis_hdf5(path) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return zt_err_set(e, ZT_EINPUT,
                      "%s is not an HDF5 file (%lld bytes; damaged at the start, or another "
                      "kind of file)", path, (long long)st.st_size);
  }
  if (!(cf->path = strdup(path))) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  /* closing the file closes whatever an error path left open in it */
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    return zt_err_set(e, ZT_ERUNTIME, "HDF5: cannot make a file access list");
  }
  cf->h5 = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  if (cf->h5 < 0) {
    char why[200];
    return zt_err_set(e, ZT_EINPUT, "checkpoint %s cannot be opened: %s (truncated or damaged)",
                      path, h5_reason(why));
  }
  char why[160];
  int rc = zt_h5_check_header(path, UINT64_MAX, why, sizeof why)
               ? zt_err_set(e, ZT_EINPUT, "checkpoint %s: its root group: %s", path, why)
               : ZT_OK;
  if (!rc) rc = read_header(cf, e);
  if (!rc) rc = zt_h5_attr_str(cf->h5, "plan", path, ZT_CKPT_MAX_TEXT, &cf->plan, e);
  if (!rc) rc = zt_h5_attr_str(cf->h5, "topology", path, ZT_CKPT_MAX_TEXT, &cf->topology, e);
  if (!rc) rc = zt_h5_attr_str(cf->h5, "state", path, ZT_CKPT_MAX_TEXT, &cf->state, e);
  if (!rc) rc = read_script(cf, e);
  if (!rc) rc = list_tensors(cf, e);
  return rc;
}

void zt_ckpt_file_close(zt_ckpt_file *cf) {
  if (cf->h5 >= 0) H5Fclose(cf->h5);
  free(cf->path);
  free(cf->plan);
  free(cf->script);
  free(cf->topology);
  free(cf->state);
  for (int g = 0; g < ZT_CKPT_NGROUPS; g++) free(cf->tensors[g]);
  memset(cf, 0, sizeof *cf);
  cf->h5 = -1;
}

const zt_ckpt_tensor *zt_ckpt_file_find(const zt_ckpt_file *cf, zt_ckpt_group g,
                                        const char *name) {
  for (int i = 0; i < cf->n[g]; i++)
    if (!strcmp(cf->tensors[g][i].name, name)) return &cf->tensors[g][i];
  return NULL;
}

/* ---- reading data ------------------------------------------------------ */

int zt_ckpt_file_read(const zt_ckpt_file *cf, const zt_ckpt_tensor *t, const int64_t *start,
                      const int64_t *count, float *out, zt_err *e) {
  const char *gpath = zt_ckpt_group_path[t->group];
  hsize_t st[ZT_MAX_DIMS], ct[ZT_MAX_DIMS];
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) {
    int64_t s = start ? start[d] : 0, c = count ? count[d] : t->shape[d];
    if (s < 0 || c < 1 || s > t->shape[d] - c)
      return zt_err_set(e, ZT_ERUNTIME, "reading %s/%s: box outside the tensor", gpath, t->name);
    st[d] = (hsize_t)s;
    ct[d] = (hsize_t)c;
    n *= c;
  }
  char p[ZT_NAME_MAX + 24];
  snprintf(p, sizeof p, "%s/%s", gpath, t->name);
  hid_t ds = H5Dopen2(cf->h5, p, H5P_DEFAULT);
  hid_t fs = ds >= 0 ? H5Dget_space(ds) : -1;
  hid_t ms = H5Screate_simple(t->ndim, ct, NULL);
  hid_t mt = t->dtype == ZT_CKPT_F32 ? H5Tcopy(H5T_NATIVE_FLOAT) : zt_ckpt_format_bf16_type();
  int bad = ds < 0 || fs < 0 || ms < 0 || mt < 0 ||
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, st, NULL, ct, NULL) < 0;
  /* bf16 is read into the upper half of out and widened in place from the
   * front: element i's four bytes end before any bf16 not yet widened */
  void *dst = t->dtype == ZT_CKPT_F32 ? (void *)out : (void *)((char *)out + 2 * n);
  bad = bad || H5Dread(ds, mt, ms, fs, H5P_DEFAULT, dst) < 0;
  close_all(ds, mt, fs, -1);
  if (ms >= 0) H5Sclose(ms);
  if (bad) {
    char why[200];
    return zt_err_set(e, ZT_EINPUT, "%s: reading tensor %s/%s failed: %s (damaged file)",
                      cf->path, gpath, t->name, h5_reason(why));
  }
  if (t->dtype == ZT_CKPT_BF16) {
    const char *src = dst;
    for (int64_t i = 0; i < n; i++) {
      uint16_t b;
      memcpy(&b, src + 2 * i, sizeof b);
      out[i] = zt_bf16_to_f32(b);
    }
  }
  return ZT_OK;
}

int zt_ckpt_file_each_block(const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                            zt_ckpt_block_fn fn, void *ctx, zt_err *e) {
  /* blocks: whole trailing dimensions after d, the first dimension whose
   * trailing product fits a block, and `rows` indices of d; taken in
   * row-major order they are consecutive runs of the flat tensor */
  int nd = t->ndim, d = 0;
  const int64_t block = zt_ckpt_file_block_elems > 0 ? zt_ckpt_file_block_elems : 1;
  int64_t inner = t->numel / t->shape[0];
  while (inner > block && d < nd - 1) inner /= t->shape[++d];
  int64_t rows = block / inner > 0 ? block / inner : 1;
  if (rows > t->shape[d]) rows = t->shape[d];
  float *buf = malloc((size_t)(rows * inner) * sizeof *buf);
  if (!buf) return zt_err_set(e, ZT_ERUNTIME, "out of memory reading %s", t->name);
  int64_t start[ZT_MAX_DIMS] = {0}, count[ZT_MAX_DIMS];
  for (int k = 0; k < nd; k++) count[k] = k < d ? 1 : t->shape[k];
  int rc = ZT_OK;
  for (;;) {
    count[d] = t->shape[d] - start[d] < rows ? t->shape[d] - start[d] : rows;
    rc = zt_ckpt_file_read(cf, t, start, count, buf, e);
    if (!rc) rc = fn(ctx, t, start, count, buf, count[d] * inner);
    if (rc) break;
    start[d] += count[d];
    int k = d; /* carry into the dimensions before d */
    while (k >= 0 && start[k] >= t->shape[k]) {
      start[k] = 0;
      if (--k >= 0) start[k]++;
    }
    if (k < 0) break;
  }
  free(buf);
  return rc;
}

void zt_ckpt_tally_box(zt_ckpt_tally *ty, const zt_ckpt_tensor *t, const int64_t *start,
                       const int64_t *count, const float *x, int64_t n) {
  (void)n; /* the box says how many */
  uint64_t bad = 0;
  ty->sum += zt_ckpt_file_box_checksum(t, start, count, x, &bad);
  ty->nonfinite += (int64_t)bad;
}

static int add_tally(void *ctx, const zt_ckpt_tensor *t, const int64_t *start,
                     const int64_t *count, const float *x, int64_t n) {
  zt_ckpt_tally_box(ctx, t, start, count, x, n);
  return 0;
}

int zt_ckpt_file_tensor_tally(const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                              zt_ckpt_tally *ty, zt_err *e) {
  *ty = (zt_ckpt_tally){0};
  return zt_ckpt_file_each_block(cf, t, add_tally, ty, e);
}
