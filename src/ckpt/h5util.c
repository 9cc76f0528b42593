/* h5util: see h5util.h. */
#define _GNU_SOURCE /* O_DIRECT, fallocate */
#include "src/ckpt/h5util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
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

/* at most 1 GiB a call: Linux moves at most 2 GiB - 4 KiB at once anyway */
#define IO_MAX ((size_t)1 << 30)

int zt_fs_pwrite(int fd, const void *buf, size_t n, long long off) {
  const char *p = buf;
  while (n) {
    ssize_t k = pwrite(fd, p, n < IO_MAX ? n : IO_MAX, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return errno;
    if (k == 0) return EIO;
    p += k, n -= (size_t)k, off += k;
  }
  return 0;
}

int zt_fs_pread(int fd, void *buf, size_t n, long long off) {
  char *p = buf;
  while (n) {
    ssize_t k = pread(fd, p, n < IO_MAX ? n : IO_MAX, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return errno;
    if (k == 0) return EIO;
    p += k, n -= (size_t)k, off += k;
  }
  return 0;
}

/* O_DIRECT wants the memory, the offset and the length aligned to the
 * device's logical block (512 or 4096 bytes): 4096 suits any of them. */
#define DIO_ALIGN ((long long)4096)

/* The caller fills one staging buffer while a thread of the writer
 * writes the other: an O_DIRECT write leaves the CPU idle while the device
 * works, and the copy (and whatever the caller computes between puts)
 * fills that time. */
struct zt_fs_writer {
  int fd, dfd; /* through the page cache; O_DIRECT (-1: not allowed here) */
  char *buf[2]; /* DIO_ALIGN-aligned, cap bytes each */
  size_t cap;
  /* the caller's buffer: bytes [base, base + fill) of the file */
  int cur;
  size_t fill;
  long long base;
  /* shared with the thread, under lock */
  pthread_t thread;
  int started, quit, next; /* next: the buffer the thread writes next */
  int busy[2];
  size_t jfill[2];
  long long jbase[2];
  int err; /* the first failure */
  pthread_mutex_t lock;
  pthread_cond_t cv;
};

/* Writes buffer i: its whole blocks directly, a partial last block through
 * the page cache. Only the thread calls it (dfd is the thread's). */
static int write_staged(zt_fs_writer *w, int i) {
  size_t fill = w->jfill[i], whole = w->dfd >= 0 ? fill / DIO_ALIGN * DIO_ALIGN : 0;
  long long base = w->jbase[i];
  int err = whole ? zt_fs_pwrite(w->dfd, w->buf[i], whole, base) : 0;
  if (err == EINVAL) { /* the file system takes O_DIRECT opens, not writes */
    close(w->dfd);
    w->dfd = -1;
    whole = 0, err = 0;
  }
  if (!err && fill > whole)
    err = zt_fs_pwrite(w->fd, w->buf[i] + whole, fill - whole, base + (long long)whole);
  return err;
}

static void *writer_thread(void *arg) {
  zt_fs_writer *w = arg;
  pthread_mutex_lock(&w->lock);
  while (1) {
    while (!w->busy[w->next] && !w->quit) pthread_cond_wait(&w->cv, &w->lock);
    if (!w->busy[w->next]) break; /* quit, nothing left */
    int i = w->next;
    pthread_mutex_unlock(&w->lock);
    int err = write_staged(w, i);
    pthread_mutex_lock(&w->lock);
    if (err && !w->err) w->err = err;
    w->busy[i] = 0;
    w->next ^= 1;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

int zt_fs_writer_open(zt_fs_writer **out, const char *path, size_t buffer) {
  zt_fs_writer *w = calloc(1, sizeof *w);
  *out = NULL;
  if (!w) return ENOMEM;
  w->cap = buffer < (size_t)DIO_ALIGN ? (size_t)DIO_ALIGN : buffer / DIO_ALIGN * DIO_ALIGN;
  w->dfd = -1;
  w->fd = open(path, O_WRONLY | O_CLOEXEC);
  int err = w->fd < 0 ? errno : 0;
  for (int i = 0; i < 2 && !err; i++) err = posix_memalign((void **)&w->buf[i], DIO_ALIGN, w->cap);
  if (!err) {
    w->dfd = open(path, O_WRONLY | O_CLOEXEC | O_DIRECT); /* may be refused (EINVAL) */
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cv, NULL);
    /* without a thread, the caller writes each buffer itself */
    w->started = !pthread_create(&w->thread, NULL, writer_thread, w);
  }
  if (err) {
    zt_fs_writer_close(w, 0);
    return err;
  }
  *out = w;
  return 0;
}

/* Hands the caller's buffer to the thread and takes the other one once
 * the thread is done with it; returns the first failure so far. */
static int hand_over(zt_fs_writer *w) {
  if (!w->started) {
    if (w->fill) {
      w->jfill[0] = w->fill, w->jbase[0] = w->base;
      int err = write_staged(w, 0);
      if (err && !w->err) w->err = err;
      w->fill = 0;
    }
    return w->err;
  }
  pthread_mutex_lock(&w->lock);
  if (w->fill) {
    w->busy[w->cur] = 1;
    w->jfill[w->cur] = w->fill;
    w->jbase[w->cur] = w->base;
    pthread_cond_broadcast(&w->cv);
    w->cur ^= 1;
    w->fill = 0;
  }
  while (w->busy[w->cur]) pthread_cond_wait(&w->cv, &w->lock);
  int err = w->err;
  pthread_mutex_unlock(&w->lock);
  return err;
}

int zt_fs_writer_put(zt_fs_writer *w, const void *src, size_t n, long long off) {
  const char *p = src;
  int err = 0;
  if (w->fill && off != w->base + (long long)w->fill) err = hand_over(w); /* not adjacent */
  while (n && !err) {
    if (!w->fill) {
      /* the bytes before the run's first whole block, which another
       * writer may share, go through the page cache */
      size_t head = (size_t)((DIO_ALIGN - off % DIO_ALIGN) % DIO_ALIGN);
      if (head || n < (size_t)DIO_ALIGN) {
        if (head > n || !head) head = n;
        err = zt_fs_pwrite(w->fd, p, head, off);
        p += head, n -= head, off += (long long)head;
        continue;
      }
      w->base = off;
    }
    size_t k = w->cap - w->fill < n ? w->cap - w->fill : n;
    memcpy(w->buf[w->cur] + w->fill, p, k);
    w->fill += k, p += k, n -= k, off += (long long)k;
    if (w->fill == w->cap) err = hand_over(w);
  }
  return err;
}

int zt_fs_writer_flush(zt_fs_writer *w) {
  int err = hand_over(w); /* hands over the caller's buffer, if any */
  if (!w->started) return err;
  pthread_mutex_lock(&w->lock);
  while (w->busy[0] || w->busy[1]) pthread_cond_wait(&w->cv, &w->lock);
  if (!err) err = w->err;
  pthread_mutex_unlock(&w->lock);
  return err;
}

int zt_fs_writer_close(zt_fs_writer *w, int sync) {
  if (!w) return 0;
  int err = w->buf[1] ? zt_fs_writer_flush(w) : 0;
  if (w->started) {
    pthread_mutex_lock(&w->lock);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
  }
  if (w->buf[1]) pthread_cond_destroy(&w->cv), pthread_mutex_destroy(&w->lock);
  if (!err && sync && fdatasync(w->fd)) err = errno;
  if (w->dfd >= 0) close(w->dfd);
  if (w->fd >= 0) close(w->fd);
  free(w->buf[0]);
  free(w->buf[1]);
  free(w);
  return err;
}

struct zt_fs_reader {
  int fd, dfd; /* through the page cache; O_DIRECT (-1: not allowed here) */
  char *buf;   /* DIO_ALIGN-aligned, cap bytes: file bytes [lo, lo + have) */
  size_t cap, have;
  long long lo;
};

int zt_fs_reader_open(zt_fs_reader **out, const char *path, size_t buffer) {
  zt_fs_reader *r = calloc(1, sizeof *r);
  *out = NULL;
  if (!r) return ENOMEM;
  r->cap = buffer < (size_t)DIO_ALIGN ? (size_t)DIO_ALIGN : buffer / DIO_ALIGN * DIO_ALIGN;
  r->dfd = -1;
  r->fd = open(path, O_RDONLY | O_CLOEXEC);
  int err = r->fd < 0 ? errno : posix_memalign((void **)&r->buf, DIO_ALIGN, r->cap);
  if (err) {
    zt_fs_reader_close(r);
    return err;
  }
  r->dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
  *out = r;
  return 0;
}

/* Reads up to n bytes at off, fewer only where the file ends: the count,
 * or -1 with errno. */
static ssize_t pread_upto(int fd, char *p, size_t n, long long off) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = pread(fd, p + got, n - got, (off_t)(off + (long long)got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    if (k == 0) break;
    got += (size_t)k;
  }
  return (ssize_t)got;
}

int zt_fs_reader_get(zt_fs_reader *r, void *dst, size_t n, long long off, int direct) {
  char *p = dst;
  if (!direct || r->dfd < 0) return zt_fs_pread(r->fd, dst, n, off);
  while (n) {
    if (off < r->lo || off >= r->lo + (long long)r->have) { /* not staged: read its blocks */
      long long lo = off / DIO_ALIGN * DIO_ALIGN;
      size_t want = (size_t)((off + (long long)n - lo + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN);
      ssize_t k = pread_upto(r->dfd, r->buf, want < r->cap ? want : r->cap, lo);
      if (k < 0 && errno == EINVAL) { /* the file system takes O_DIRECT opens, not reads */
        close(r->dfd);
        r->dfd = -1;
        return zt_fs_pread(r->fd, p, n, off);
      }
      if (k < 0) return errno;
      r->lo = lo, r->have = (size_t)k;
      if (off >= lo + k) return EIO; /* the file ends first */
    }
    size_t at = (size_t)(off - r->lo), k = r->have - at < n ? r->have - at : n;
    memcpy(p, r->buf + at, k);
    p += k, n -= k, off += (long long)k;
  }
  return 0;
}

void zt_fs_reader_close(zt_fs_reader *r) {
  if (!r) return;
  if (r->dfd >= 0) close(r->dfd);
  if (r->fd >= 0) close(r->fd);
  free(r->buf);
  free(r);
}

int zt_fs_reserve(const char *path, long long size) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = size > 0 && fallocate(fd, 0, 0, (off_t)size) ? errno : 0;
  close(fd);
  return err == EOPNOTSUPP || err == ENOSYS ? 0 : err;
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

int zt_h5_attr_str(hid_t obj, const char *name, const char *what, size_t max, char **out,
                   zt_err *e) {
  *out = NULL;
  htri_t ex = H5Aexists(obj, name);
  if (ex == 0) return ZT_OK;
  hid_t a = ex > 0 ? H5Aopen(obj, name, H5P_DEFAULT) : -1;
  hid_t type = a >= 0 ? H5Aget_type(a) : -1;
  hid_t space = a >= 0 ? H5Aget_space(a) : -1;
  hid_t mem = -1;
  int rc = ZT_OK;
  if (type < 0 || space < 0) {
    rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is unreadable", what, name);
  } else if (H5Tget_class(type) != H5T_STRING || H5Sget_simple_extent_npoints(space) != 1) {
    rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is not a string", what, name);
  } else if (H5Tis_variable_str(type) > 0) {
    char *p = NULL;
    mem = H5Tcopy(H5T_C_S1);
    if (mem < 0 || H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Tset_cset(mem, H5Tget_cset(type)) < 0 ||
        H5Aread(a, mem, &p) < 0 || !p)
      rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is unreadable", what, name);
    else if (strnlen(p, max + 1) > max)
      rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is longer than %zu bytes", what, name,
                      max);
    else if (!(*out = strdup(p)))
      rc = zt_err_set(e, ZT_ERUNTIME, "out of memory reading attribute %s", name);
    if (p) H5free_memory(p);
  } else {
    size_t sz = H5Tget_size(type);
    if (sz == 0 || sz > max) {
      rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s has %zu bytes (at most %zu)", what, name,
                      sz, max);
    } else if (!(*out = calloc(sz + 1, 1))) {
      rc = zt_err_set(e, ZT_ERUNTIME, "out of memory reading attribute %s", name);
    } else {
      /* one byte more than stored: room for the NUL a NULLPAD string lacks */
      mem = H5Tcopy(H5T_C_S1);
      if (mem < 0 || H5Tset_size(mem, sz + 1) < 0 || H5Tset_strpad(mem, H5T_STR_NULLTERM) < 0 ||
          H5Tset_cset(mem, H5Tget_cset(type)) < 0 || H5Aread(a, mem, *out) < 0)
        rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is unreadable", what, name);
      (*out)[sz] = 0;
    }
  }
  if (rc) {
    free(*out);
    *out = NULL;
  }
  if (mem >= 0) H5Tclose(mem);
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  if (a >= 0) H5Aclose(a);
  if (ex < 0) rc = zt_err_set(e, ZT_EINPUT, "%s: attribute %s is unreadable", what, name);
  return rc;
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

/* ---- version-1 object headers, checked before HDF5 decodes them ---------- */

typedef struct {
  int fd;
  long long size;     /* of the file */
  int so, sl;         /* sizes of offsets and lengths (superblock) */
  char *why;
  size_t n;
} hdr_check;

static uint64_t le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint64_t pad8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

static int bad_hdr(hdr_check *c, uint64_t at, const char *what) {
  snprintf(c->why, c->n, "the object header at byte %llu is damaged (%s)", (unsigned long long)at,
           what);
  return -1;
}

/* Elements of a dataspace message (version 1 or 2), or -1 when damaged. */
static int64_t space_points(const unsigned char *d, uint64_t len, int sl) {
  if (len < 4) return -1;
  int version = d[0], rank = d[1];
  uint64_t dims = version == 1 ? 8 : 4;
  if ((version != 1 && version != 2) || rank > 32 || dims + (uint64_t)rank * sl > len) return -1;
  if (version == 2 && d[3] == 2) return 0; /* null dataspace */
  int64_t points = 1;
  for (int i = 0; i < rank; i++) {
    uint64_t x = le(d + dims + (uint64_t)i * sl, sl);
    if (x && (uint64_t)points > (uint64_t)INT64_MAX / x) return -1;
    points *= (int64_t)x;
  }
  return points;
}

/* An attribute message: its name, datatype, dataspace and value within len. */
static int attr_ok(const unsigned char *d, uint64_t len, int sl) {
  if (len < 8) return 0;
  int version = d[0];
  uint64_t name = le(d + 2, 2), type = le(d + 4, 2), space = le(d + 6, 2), head = 8;
  if (version == 3) head = 9;
  else if (version != 1 && version != 2) return 1; /* HDF5 refuses an unknown version itself */
  if (version == 1) name = pad8(name), type = pad8(type), space = pad8(space);
  if (head + name + type + space > len || type < 8) return 0;
  /* a shared datatype or dataspace is a reference here, and a variable-
   * length value lives in a heap: their sizes are HDF5's to check */
  const unsigned char *t = d + head + name, *s = t + type;
  if ((version > 1 && (d[1] & 3)) || (t[0] & 0x0f) == 9) return 1;
  int64_t points = space_points(s, space, sl);
  uint64_t elem = le(t + 4, 4), value = len - (head + name + type + space);
  return points >= 0 && (elem == 0 || (uint64_t)points <= value / elem);
}

/* The messages of one chunk of a version-1 header; continuation chunks
 * are appended to the queue (at most ZT_HDR_CHUNKS in all). */
enum { ZT_HDR_CHUNKS = 64 };
static int check_chunk(hdr_check *c, uint64_t at, uint64_t len, uint64_t *queue, int *nq) {
  if (len > (1u << 20) || at > (uint64_t)c->size || len > (uint64_t)c->size - at)
    return bad_hdr(c, at, "a chunk past the end of the file");
  unsigned char *buf = malloc(len ? len : 1);
  if (!buf) return bad_hdr(c, at, "out of memory reading it");
  int rc = 0;
  if (zt_fs_pread(c->fd, buf, len, (long long)at)) rc = bad_hdr(c, at, "unreadable");
  for (uint64_t o = 0; !rc && o + 8 <= len;) {
    uint64_t type = le(buf + o, 2), size = le(buf + o + 2, 2);
    if (o + 8 + size > len) {
      rc = bad_hdr(c, at + o, "a message longer than its chunk");
      break;
    }
    const unsigned char *d = buf + o + 8;
    if (type == 0x000C && !attr_ok(d, size, c->sl))
      rc = bad_hdr(c, at + o, "an attribute message's lengths run past the message");
    if (type == 0x0010) { /* continuation: offset, length */
      if (size < (uint64_t)(c->so + c->sl) || *nq >= 2 * ZT_HDR_CHUNKS)
        rc = bad_hdr(c, at + o, "a damaged continuation message");
      else {
        queue[(*nq)++] = le(d, c->so);
        queue[(*nq)++] = le(d + c->so, c->sl);
      }
    }
    o += 8 + size;
  }
  free(buf);
  return rc;
}

int zt_h5_check_header(const char *path, uint64_t addr, char *why, size_t n) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0; /* HDF5 says why it cannot read it */
  unsigned char sb[64];
  long long size = lseek(fd, 0, SEEK_END);
  hdr_check c = {fd, size, 0, 0, why, n};
  int rc = 0;
  /* the superblock at 0 (versions 0-1 carry no checksums; 2-3 do, and
   * their object headers are version 2, which HDF5 verifies) */
  if (size < 64 || zt_fs_pread(fd, sb, sizeof sb, 0) || memcmp(sb, "\x89HDF\r\n\x1a\n", 8) ||
      sb[8] > 1) {
    close(fd);
    return 0;
  }
  c.so = sb[13];
  c.sl = sb[14];
  if ((c.so != 4 && c.so != 8) || (c.sl != 4 && c.sl != 8)) {
    close(fd);
    return 0;
  }
  if (addr == UINT64_MAX) { /* the root group's, from its symbol table entry */
    int at = (sb[8] == 0 ? 24 : 28) + 4 * c.so + c.so;
    unsigned char e[8];
    if (zt_fs_pread(fd, e, (size_t)c.so, at)) {
      close(fd);
      return 0;
    }
    addr = le(e, c.so);
  }
  unsigned char pre[16];
  if (zt_fs_pread(fd, pre, sizeof pre, (long long)addr) || pre[0] != 1) {
    close(fd); /* not a version-1 header: checksummed, or HDF5 refuses it */
    return 0;
  }
  uint64_t queue[2 * ZT_HDR_CHUNKS];
  int nq = 2;
  queue[0] = addr + 16;
  queue[1] = le(pre + 8, 4);
  for (int q = 0; !rc && q < nq; q += 2) rc = check_chunk(&c, queue[q], queue[q + 1], queue, &nq);
  close(fd);
  return rc;
}
