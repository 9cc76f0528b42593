/* nvme: see nvme.h. One request table serves both engines: a request is
 * cut into chunks that are handed out in the order the requests came,
 * to the io_uring submission queue or to the pool's threads, and counted
 * back in; a request is done when all its bytes are back or one chunk
 * failed and the rest have drained. Only how a chunk is started and how
 * its completion comes back differs between the engines. */
#define _GNU_SOURCE /* O_DIRECT, fallocate, statx */
#include "parallel/nvme.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* io_uring entries: chunks in the kernel at once. A test build makes it
 * small, so that chunks queue behind a full ring with little data. */
#ifndef ZT_NVME_RING
#define ZT_NVME_RING 128
#endif
enum {
  MAXREQ = 64,   /* requests in flight per file (nvme.h) */
  RING = ZT_NVME_RING,
  NTHREADS = 4,  /* the pool: enough to keep an SSD's queue busy with 8 MiB chunks */
  BUF_ALIGN = 65536 /* zt_nvme_buf_alloc's alignment, the largest zt_nvme_align */
};
/* Chunks of 8 MiB: far below the 2 GiB a single read(2) may move, large
 * enough that the per-chunk cost is nothing next to the transfer, and
 * small enough that one big request keeps every pool thread busy. */
#define CHUNK ((size_t)8 << 20)

typedef struct {
  int live;          /* a ticket holds it */
  int gen;           /* the ticket's upper part, so a stale ticket is refused */
  int write;
  int64_t off;
  size_t n;
  char *buf;
  size_t issued;     /* bytes handed to the engine */
  size_t done;       /* bytes transferred */
  int inflight;      /* chunks out */
  int err;           /* errno of the first failure; -1: a transfer of 0 bytes */
  int64_t err_off;   /* the failing chunk */
  size_t err_len;
  uint64_t seq;      /* issue order, for wait_all's "first error" */
} req;

/* A chunk in the kernel (io_uring's user_data points at it). */
typedef struct {
  int slot;
  int64_t off;
  size_t len;
  char *buf;
} chunk;

struct zt_nvme {
  int fd;
  char *path;
  int64_t size;
  size_t align;
  int direct;
  int uring;
  char name[256];

  pthread_mutex_t mu; /* the table; only the pool's threads contend for it */
  req r[MAXREQ];
  int queue[MAXREQ]; /* slots with bytes not yet handed out, oldest first */
  int qhead, qlen;
  int nlive;
  uint64_t seq;

  struct io_uring ring;
  chunk ch[RING];
  int chfree[RING];
  int nchfree;

  pthread_cond_t work, done;
  pthread_t th[NTHREADS];
  int nth;
  int stop;
};

/* ---- the request table, shared by both engines (f->mu held) ---- */

static int req_complete(const req *r) {
  return r->inflight == 0 && (r->issued == r->n || r->err);
}

/* Hands out the next chunk of the oldest request with bytes left; 0 when
 * there is none. A request that has failed gets no more chunks. */
static int take_chunk(zt_nvme *f, chunk *c) {
  while (f->qlen) {
    int s = f->queue[f->qhead];
    req *r = &f->r[s];
    int got = 0;
    if (!r->err && r->issued < r->n) {
      size_t len = r->n - r->issued < CHUNK ? r->n - r->issued : CHUNK;
      *c = (chunk){s, r->off + (int64_t)r->issued, len, r->buf + r->issued};
      r->issued += len;
      r->inflight++;
      got = 1;
    }
    if (r->err || r->issued == r->n) {
      f->qhead = (f->qhead + 1) % MAXREQ;
      f->qlen--;
    }
    if (got) return 1;
  }
  return 0;
}

/* Takes a failed request out of the queue before its slot is reused. */
static void queue_drop(zt_nvme *f, int s) {
  int k = 0;
  for (int i = 0; i < f->qlen; i++) {
    int q = f->queue[(f->qhead + i) % MAXREQ];
    if (q != s) f->queue[(f->qhead + k++) % MAXREQ] = q;
  }
  f->qlen = k;
}

/* A chunk (what was left of it) failed with errno err (-1: 0 bytes
 * moved). The failure nearest the request's start is the one reported,
 * so the report names the first bad byte whichever chunk came back first. */
static void chunk_failed(req *r, const chunk *c, int err) {
  if (!r->err || c->off < r->err_off) {
    r->err = err;
    r->err_off = c->off;
    r->err_len = c->len;
  }
}

static int req_result(zt_nvme *f, req *r, zt_err *e) {
  if (!r->err) return ZT_OK;
  char why[160];
  if (r->err > 0)
    snprintf(why, sizeof why, "%s", strerror(r->err));
  else
    snprintf(why, sizeof why, "0 bytes transferred (end of file or device)");
  return zt_err_set(e, ZT_ERUNTIME,
                    "nvme %s: %s of %zu bytes at offset %lld (request of %zu bytes at %lld) "
                    "failed: %s",
                    f->path, r->write ? "write" : "read", r->err_len, (long long)r->err_off,
                    r->n, (long long)r->off, why);
}

/* ---- io_uring engine (one producer thread: f->mu is uncontended) ---- */

static void uring_prep(zt_nvme *f, chunk *c) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&f->ring);
  /* at most RING chunks are out and each submitted at once, so the
   * submission queue always has room */
  if (f->r[c->slot].write)
    io_uring_prep_write(sqe, f->fd, c->buf, (unsigned)c->len, (uint64_t)c->off);
  else
    io_uring_prep_read(sqe, f->fd, c->buf, (unsigned)c->len, (uint64_t)c->off);
  io_uring_sqe_set_data(sqe, c);
}

static int uring_pump(zt_nvme *f) {
  int n = 0;
  chunk c;
  while (f->nchfree && take_chunk(f, &c)) {
    chunk *slot = &f->ch[f->chfree[--f->nchfree]];
    *slot = c;
    uring_prep(f, slot);
    n++;
  }
  return n ? io_uring_submit(&f->ring) : 0;
}

/* Counts in every completion there is, waiting for one if `block`. */
static int uring_reap(zt_nvme *f, int block) {
  struct io_uring_cqe *cqe;
  int ret = block ? io_uring_wait_cqe(&f->ring, &cqe) : io_uring_peek_cqe(&f->ring, &cqe);
  if (ret == -EINTR || ret == -EAGAIN) return 0;
  if (ret < 0) return ret;
  int resubmit = 0;
  while (io_uring_peek_cqe(&f->ring, &cqe) == 0) {
    chunk *c = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&f->ring, cqe);
    req *r = &f->r[c->slot];
    if (res == -EINTR || res == -EAGAIN) {
      uring_prep(f, c);
      resubmit = 1;
      continue;
    }
    if (res > 0 && (size_t)res < c->len) { /* short: the rest again */
      r->done += (size_t)res;
      c->off += res;
      c->buf += res;
      c->len -= (size_t)res;
      uring_prep(f, c);
      resubmit = 1;
      continue;
    }
    if (res <= 0)
      chunk_failed(r, c, res < 0 ? -res : -1);
    else
      r->done += c->len;
    r->inflight--;
    f->chfree[f->nchfree++] = (int)(c - f->ch);
  }
  if (resubmit) {
    ret = io_uring_submit(&f->ring);
    if (ret < 0) return ret;
  }
  return 0;
}

static int uring_wait(zt_nvme *f, req *r, zt_err *e) {
  while (!req_complete(r)) {
    int ret = uring_pump(f);
    if (ret >= 0) ret = uring_reap(f, !req_complete(r));
    if (ret < 0)
      return zt_err_set(e, ZT_ERUNTIME, "nvme %s: io_uring: %s", f->path, strerror(-ret));
  }
  return ZT_OK;
}

/* ---- thread pool engine ---- */

/* Moves chunk c, retrying short transfers; c is left at what failed. */
static int chunk_io(int fd, int write, chunk *c, size_t *moved) {
  while (c->len) {
    ssize_t k = write ? pwrite(fd, c->buf, c->len, c->off) : pread(fd, c->buf, c->len, c->off);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno;
    }
    if (k == 0) return -1;
    c->buf += k;
    c->off += k;
    c->len -= (size_t)k;
    *moved += (size_t)k;
  }
  return 0;
}

static void *worker(void *arg) {
  zt_nvme *f = arg;
  pthread_mutex_lock(&f->mu);
  for (;;) {
    chunk c;
    while (!f->stop && !take_chunk(f, &c)) pthread_cond_wait(&f->work, &f->mu);
    if (f->stop) break;
    int write = f->r[c.slot].write;
    pthread_mutex_unlock(&f->mu);
    size_t moved = 0;
    int err = chunk_io(f->fd, write, &c, &moved);
    pthread_mutex_lock(&f->mu);
    req *r = &f->r[c.slot];
    r->done += moved;
    if (err) chunk_failed(r, &c, err);
    r->inflight--;
    if (req_complete(r)) pthread_cond_broadcast(&f->done);
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

/* ---- open and close ---- */

static int input_errno(int err) {
  return err == ENOENT || err == ENOTDIR || err == EACCES || err == EPERM || err == EROFS ||
         err == EISDIR || err == ELOOP || err == ENAMETOOLONG;
}

/* The direct-I/O alignment the file system asks for (statx, Linux 6.1+),
 * at least 4096; 0 when it says it takes no direct I/O. */
static size_t dio_align(int fd) {
  size_t a = 4096;
#ifdef STATX_DIOALIGN
  struct statx st;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st) == 0 && (st.stx_mask & STATX_DIOALIGN)) {
    if (!st.stx_dio_offset_align) return 0;
    if (st.stx_dio_offset_align > a) a = st.stx_dio_offset_align;
    if (st.stx_dio_mem_align > a) a = st.stx_dio_mem_align;
  }
#else
  (void)fd;
#endif
  return a;
}

/* The engine asked for: ZT_NVME_ENGINE overrides the caller's choice. */
static int engine_from_env(zt_nvme_engine *want, const char **why, zt_err *e) {
  const char *v = getenv("ZT_NVME_ENGINE");
  if (!v || !*v) return ZT_OK;
  if (!strcmp(v, "auto"))
    *want = ZT_NVME_AUTO;
  else if (!strcmp(v, "uring") || !strcmp(v, "io_uring"))
    *want = ZT_NVME_URING;
  else if (!strcmp(v, "threads"))
    *want = ZT_NVME_THREADS;
  else
    return zt_err_set(e, ZT_EINPUT, "ZT_NVME_ENGINE=%s: expected auto, uring or threads", v);
  *why = "ZT_NVME_ENGINE=threads";
  return ZT_OK;
}

/* Closes and removes the file, frees f: the end of close, and of an open
 * that failed half-way (nothing is left on disk either way). */
static void file_free(zt_nvme *f) {
  if (f->fd >= 0) {
    close(f->fd);
    unlink(f->path);
  }
  free(f->path);
  free(f);
}

/* Opens the file, O_DIRECT when the file system takes it; the reason
 * when not goes to *buffered. */
static int open_file(zt_nvme *f, const char **buffered, zt_err *e) {
  if (unlink(f->path) != 0 && errno != ENOENT) {
    int err = errno;
    return zt_err_set(e, input_errno(err) ? ZT_EINPUT : ZT_ERUNTIME,
                      "nvme file %s: cannot replace what is there: %s", f->path, strerror(err));
  }
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  f->fd = open(f->path, flags | O_DIRECT, 0600);
  f->direct = f->fd >= 0;
  if (f->fd < 0 && errno == EINVAL) {
    f->fd = open(f->path, flags, 0600);
    *buffered = "the file system refuses O_DIRECT";
  }
  if (f->fd < 0) {
    int err = errno;
    return zt_err_set(e, input_errno(err) ? ZT_EINPUT : ZT_ERUNTIME,
                      "nvme file %s: cannot create it: %s (its directory must exist and be "
                      "writable)",
                      f->path, strerror(err));
  }
  f->align = 4096;
  if (f->direct) {
    size_t a = dio_align(f->fd);
    if (a == 0 || a > BUF_ALIGN) {
      /* no direct I/O after all, or blocks larger than our buffers' alignment */
      *buffered = a ? "the file system's direct-I/O blocks exceed 64 KiB"
                    : "the file system refuses O_DIRECT";
      int fl = fcntl(f->fd, F_GETFL);
      if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) < 0)
        return zt_err_set(e, ZT_ERUNTIME, "nvme file %s: fcntl: %s", f->path, strerror(errno));
      f->direct = 0;
    } else {
      f->align = a;
    }
  }
  return ZT_OK;
}

static int allocate(zt_nvme *f, zt_err *e) {
  if (f->size == 0) return ZT_OK;
  if (fallocate(f->fd, 0, 0, f->size) == 0) return ZT_OK;
  int err = errno;
  if (err == ENOSPC || err == EDQUOT) {
    struct statvfs vfs;
    long long avail = fstatvfs(f->fd, &vfs) == 0 ? (long long)vfs.f_bavail * (long long)vfs.f_frsize : -1;
    return zt_err_set(e, ZT_EINPUT,
                      "nvme file %s: %s: it needs %lld bytes, the file system has %lld free for "
                      "this user; a directory on a file system with room would work",
                      f->path, strerror(err), (long long)f->size, avail);
  }
  if (err == EOPNOTSUPP && ftruncate(f->fd, f->size) == 0) return ZT_OK; /* no fallocate there */
  return zt_err_set(e, ZT_ERUNTIME, "nvme file %s: fallocate %lld bytes: %s", f->path,
                    (long long)f->size, strerror(err));
}

/* A file system may take O_DIRECT at open and refuse the I/O itself:
 * one aligned read finds out, and the file goes buffered then. */
static int probe_direct(zt_nvme *f, const char **buffered) {
  if (!f->direct || f->size == 0) return ZT_OK;
  void *b = zt_nvme_buf_alloc(f->align);
  if (!b) return ZT_ERUNTIME;
  ssize_t k = pread(f->fd, b, f->align, 0);
  int err = errno;
  zt_nvme_buf_free(b);
  if (k >= 0 || err != EINVAL) return ZT_OK;
  int fl = fcntl(f->fd, F_GETFL);
  if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) < 0) return ZT_ERUNTIME;
  f->direct = 0;
  f->align = 4096;
  *buffered = "the file system refuses O_DIRECT reads";
  return ZT_OK;
}

zt_nvme *zt_nvme_open(const char *path, int64_t bytes, zt_nvme_engine want, zt_err *e) {
  const char *why = want == ZT_NVME_THREADS ? "asked for" : NULL;
  if (engine_from_env(&want, &why, e)) return NULL;
  if (bytes < 0) {
    zt_err_set(e, ZT_EINPUT, "nvme file %s: size %lld is negative", path, (long long)bytes);
    return NULL;
  }
  zt_nvme *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    zt_err_set(e, ZT_ERUNTIME, "nvme file %s: out of memory", path);
    return NULL;
  }
  f->fd = -1;
  const char *buffered = NULL;
  if (open_file(f, &buffered, e)) {
    file_free(f);
    return NULL;
  }
  f->size = (bytes + (int64_t)f->align - 1) / (int64_t)f->align * (int64_t)f->align;
  if (allocate(f, e)) {
    file_free(f);
    return NULL;
  }
  if (probe_direct(f, &buffered)) {
    zt_err_set(e, ZT_ERUNTIME, "nvme file %s: probing O_DIRECT: %s", path, strerror(errno));
    file_free(f);
    return NULL;
  }
  char mode[96];
  snprintf(mode, sizeof mode, buffered ? "buffered: %s" : "O_DIRECT", buffered);

  char refused[128] = "";
  if (want != ZT_NVME_THREADS) {
    int ret = io_uring_queue_init(RING, &f->ring, 0);
    if (ret == 0) {
      struct io_uring_probe *p = io_uring_get_probe_ring(&f->ring);
      int ok = p && io_uring_opcode_supported(p, IORING_OP_READ) &&
               io_uring_opcode_supported(p, IORING_OP_WRITE);
      io_uring_free_probe(p);
      if (ok)
        f->uring = 1;
      else {
        io_uring_queue_exit(&f->ring);
        snprintf(refused, sizeof refused, "io_uring lacks read/write (kernel before 5.6)");
      }
    } else {
      snprintf(refused, sizeof refused, "io_uring refused: %s", strerror(-ret));
    }
    if (!f->uring && want == ZT_NVME_URING) {
      zt_err_set(e, ZT_ERUNTIME,
                 "nvme file %s: %s (the thread-pool engine works without it: "
                 "ZT_NVME_ENGINE=threads)",
                 path, refused);
      file_free(f);
      return NULL;
    }
    why = refused;
  }

  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->work, NULL);
  pthread_cond_init(&f->done, NULL);
  if (f->uring) {
    for (int i = 0; i < RING; i++) f->chfree[i] = RING - 1 - i;
    f->nchfree = RING;
    snprintf(f->name, sizeof f->name, "io_uring (%s)", mode);
  } else {
    for (; f->nth < NTHREADS; f->nth++)
      if (pthread_create(&f->th[f->nth], NULL, worker, f)) break;
    if (!f->nth) {
      zt_err_set(e, ZT_ERUNTIME, "nvme file %s: cannot start I/O threads", path);
      file_free(f);
      return NULL;
    }
    snprintf(f->name, sizeof f->name, "threads (pread/pwrite, %s): %s", mode, why);
  }
  return f;
}

void zt_nvme_close(zt_nvme *f) {
  if (!f) return;
  zt_nvme_wait_all(f, NULL);
  if (f->uring) {
    io_uring_queue_exit(&f->ring);
  } else {
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_broadcast(&f->work);
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < f->nth; i++) pthread_join(f->th[i], NULL);
  }
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->work);
  pthread_cond_destroy(&f->done);
  file_free(f);
}

size_t zt_nvme_align(const zt_nvme *f) { return f->align; }
const char *zt_nvme_engine_name(const zt_nvme *f) { return f->name; }

void *zt_nvme_buf_alloc(size_t bytes) {
  size_t n = (bytes + 4095) / 4096 * 4096;
  void *p = NULL;
  if (posix_memalign(&p, BUF_ALIGN, n ? n : 4096)) return NULL;
  memset(p, 0, n);
  return p;
}
void zt_nvme_buf_free(void *p) { free(p); }

/* ---- requests ---- */

static int submit(zt_nvme *f, int write, int64_t off, void *buf, size_t n, zt_err *e) {
  const char *op = write ? "write" : "read";
  if (off < 0 || n == 0 || off % (int64_t)f->align || n % f->align || (uintptr_t)buf % f->align) {
    zt_err_set(e, ZT_ERUNTIME,
               "nvme %s: %s of %zu bytes at offset %lld into %p is not aligned to %zu bytes "
               "(offset, length and buffer must be multiples of zt_nvme_align, length > 0)",
               f->path, op, n, (long long)off, buf, f->align);
    return -1;
  }
  if ((int64_t)n > f->size - off) {
    zt_err_set(e, ZT_ERUNTIME, "nvme %s: %s of %zu bytes at offset %lld runs past the file's %lld bytes",
               f->path, op, n, (long long)off, (long long)f->size);
    return -1;
  }
  pthread_mutex_lock(&f->mu);
  if (f->nlive == MAXREQ) {
    pthread_mutex_unlock(&f->mu);
    zt_err_set(e, ZT_ERUNTIME, "nvme %s: %d requests already in flight; wait for one first",
               f->path, MAXREQ);
    return -1;
  }
  int s = 0;
  while (f->r[s].live) s++;
  req *r = &f->r[s];
  int gen = r->gen % (INT_MAX / MAXREQ - 1) + 1;
  *r = (req){.live = 1, .gen = gen, .write = write, .off = off, .n = n, .buf = buf,
             .seq = f->seq++};
  f->nlive++;
  f->queue[(f->qhead + f->qlen++) % MAXREQ] = s;
  int ret = 0;
  if (f->uring) {
    /* what completed frees room for this request's chunks */
    ret = uring_reap(f, 0);
    if (ret >= 0) ret = uring_pump(f);
  } else
    pthread_cond_broadcast(&f->work);
  pthread_mutex_unlock(&f->mu);
  if (ret < 0) {
    /* the request stays in the table; wait reports what becomes of it */
    zt_err_set(e, ZT_ERUNTIME, "nvme %s: io_uring submit: %s", f->path, strerror(-ret));
  }
  return gen * MAXREQ + s;
}

int zt_nvme_read(zt_nvme *f, int64_t off, void *buf, size_t n, zt_err *e) {
  return submit(f, 0, off, buf, n, e);
}
int zt_nvme_write(zt_nvme *f, int64_t off, const void *buf, size_t n, zt_err *e) {
  return submit(f, 1, off, (void *)buf, n, e);
}

/* Waits for slot s (f->mu held), frees it and gives its outcome. */
static int wait_slot(zt_nvme *f, int s, zt_err *e) {
  req *r = &f->r[s];
  int rc = ZT_OK;
  if (f->uring)
    rc = uring_wait(f, r, e);
  else
    while (!req_complete(r)) pthread_cond_wait(&f->done, &f->mu);
  if (rc == ZT_OK) rc = req_result(f, r, e);
  if (r->issued < r->n) queue_drop(f, s);
  r->live = 0;
  f->nlive--;
  return rc;
}

int zt_nvme_wait(zt_nvme *f, int ticket, zt_err *e) {
  int s = ticket >= 0 ? ticket % MAXREQ : 0;
  pthread_mutex_lock(&f->mu);
  if (ticket < 0 || !f->r[s].live || f->r[s].gen != ticket / MAXREQ) {
    pthread_mutex_unlock(&f->mu);
    return zt_err_set(e, ZT_ERUNTIME,
                      "nvme %s: ticket %d is not in flight (never issued, or already waited for)",
                      f->path, ticket);
  }
  int rc = wait_slot(f, s, e);
  pthread_mutex_unlock(&f->mu);
  return rc;
}

int zt_nvme_wait_all(zt_nvme *f, zt_err *e) {
  int rc = ZT_OK;
  zt_err scratch;
  pthread_mutex_lock(&f->mu);
  while (f->nlive) {
    int s = -1;
    for (int i = 0; i < MAXREQ; i++)
      if (f->r[i].live && (s < 0 || f->r[i].seq < f->r[s].seq)) s = i;
    int ri = wait_slot(f, s, rc ? &scratch : e);
    if (!rc) rc = ri;
  }
  pthread_mutex_unlock(&f->mu);
  return rc;
}
