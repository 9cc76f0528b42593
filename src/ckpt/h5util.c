/* h5util: see h5util.h. */
#include "src/ckpt/h5util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

int zt_h5_write_str_attr(hid_t obj, const char *name, const char *value) {
  hid_t type = H5Tcopy(H5T_C_S1);
  hid_t space = H5Screate(H5S_SCALAR);
  int bad = type < 0 || space < 0 || H5Tset_size(type, strlen(value) ? strlen(value) : 1) < 0;
  hid_t a = bad ? -1 : H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  bad = a < 0 || H5Awrite(a, type, value) < 0;
  if (a >= 0 && H5Aclose(a) < 0) bad = 1;
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  return bad;
}

int zt_h5_write_scalar_attr(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                            const void *value) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = space < 0 ? -1 : H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  int bad = a < 0 || H5Awrite(a, mem_type, value) < 0;
  if (a >= 0 && H5Aclose(a) < 0) bad = 1;
  if (space >= 0) H5Sclose(space);
  return bad;
}

int zt_h5_plain_number(hid_t type) {
  if (H5Tget_class(type) == H5T_INTEGER) {
    size_t size = H5Tget_size(type), prec = H5Tget_precision(type);
    int off = H5Tget_offset(type);
    return size >= 1 && size <= 8 && prec >= 1 && off >= 0 && prec + (size_t)off <= 8 * size;
  }
  return H5Tequal(type, H5T_IEEE_F32LE) > 0 || H5Tequal(type, H5T_IEEE_F32BE) > 0 ||
         H5Tequal(type, H5T_IEEE_F64LE) > 0 || H5Tequal(type, H5T_IEEE_F64BE) > 0;
}

int zt_h5_read_scalar_attr(hid_t obj, const char *name, hid_t mem_type, void *value) {
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t space = a < 0 ? -1 : H5Aget_space(a);
  hid_t type = a < 0 ? -1 : H5Aget_type(a);
  int ok = space >= 0 && type >= 0 && H5Sget_simple_extent_type(space) == H5S_SCALAR &&
           zt_h5_plain_number(type) && H5Aread(a, mem_type, value) >= 0;
  if (type >= 0) H5Tclose(type);
  if (space >= 0) H5Sclose(space);
  if (a >= 0) H5Aclose(a);
  return ok ? 0 : -1;
}

int zt_fs_sync(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

int zt_fs_publish(const char *tmp, const char *path, zt_err *e) {
  errno = 0;
  if (zt_fs_sync(tmp) || rename(tmp, path))
    return zt_err_set(e, ZT_ERUNTIME, "writing %s failed: %s", path,
                      errno ? strerror(errno) : "cannot sync");
  char *dir = strdup(path);
  if (dir) zt_fs_sync(dirname(dir));
  free(dir);
  return ZT_OK;
}

int zt_fs_check_writable(const char *what, const char *path, zt_err *e) {
  char *copy = strdup(path);
  if (!copy) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  const char *dir = dirname(copy);
  int rc = access(dir, W_OK) ? zt_err_set(e, ZT_EINPUT, "%s %s: cannot write to folder %s: %s",
                                           what, path, dir, strerror(errno))
                             : ZT_OK;
  free(copy);
  return rc;
}

void zt_h5_checked_metadata(hid_t fapl) {
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
}

int zt_h5_read_str_attr(hid_t obj, const char *name, size_t max, char **out) {
  *out = NULL;
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t type = a < 0 ? -1 : H5Aget_type(a);
  hid_t space = a < 0 ? -1 : H5Aget_space(a);
  size_t sz = type < 0 ? 0 : H5Tget_size(type);
  int ok = type >= 0 && space >= 0 && H5Tget_class(type) == H5T_STRING &&
           H5Tis_variable_str(type) == 0 && H5Sget_simple_extent_npoints(space) == 1 &&
           sz > 0 && sz <= max && (*out = calloc(sz + 1, 1));
  if (ok) {
    hid_t mem = H5Tcopy(H5T_C_S1);
    ok = mem >= 0 && H5Tset_size(mem, sz + 1) >= 0 && H5Aread(a, mem, *out) >= 0;
    if (mem >= 0) H5Tclose(mem);
  }
  if (!ok) {
    free(*out);
    *out = NULL;
  }
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  if (a >= 0) H5Aclose(a);
  return ok ? 0 : -1;
}

typedef struct {
  char *buf;
  size_t n;
  int have_os; /* an operating-system or MPI reason is in buf */
} reason_ctx;

static herr_t collect(unsigned n, const H5E_error2_t *err, void *arg) {
  reason_ctx *r = arg;
  const char *d = err->desc ? err->desc : "";
  /* MPI-IO and POSIX drivers quote the system's words: prefer them */
  int os = strstr(d, "errno") || strstr(d, "MPI error string") || strstr(d, "No space") ||
           strstr(d, "Input/output") || strstr(d, "Disk quota");
  if ((n == 0 && !r->buf[0]) || (os && !r->have_os)) {
    snprintf(r->buf, r->n, "%s", d);
    r->have_os |= os;
  }
  return 0;
}

const char *zt_h5_error_reason(char *buf, size_t n) {
  reason_ctx r = {buf, n, 0};
  buf[0] = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect, &r);
  H5Eclear2(H5E_DEFAULT);
  for (char *p = buf; *p; p++)
    if (*p < 0x20 || *p > 0x7e) *p = '?';
  if (!buf[0]) snprintf(buf, n, "HDF5 error");
  return buf;
}

long long zt_fs_free_bytes(const char *path) {
  struct statvfs v;
  if (statvfs(path, &v)) return -1;
  return (long long)v.f_bavail * (long long)v.f_frsize;
}
