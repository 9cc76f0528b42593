/* nvme: one file of a rank's offloaded state (ZeRO-Infinity's NVMe tier),
 * read and written asynchronously in aligned blocks: io_uring with
 * O_DIRECT where the kernel and the file system allow it, else a small
 * thread pool doing pread/pwrite (O_DIRECT kept when the file system takes
 * it). The engine is chosen when the file is opened and named, with the
 * reason for a fallback, by zt_nvme_engine_name, so a banner can say what
 * runs. Nothing here knows what the bytes are: the offload layer
 * (parallel/offload) decides names, offsets and overlap. */
#ifndef ZT_NVME_H
#define ZT_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/err.h"

typedef struct zt_nvme zt_nvme;

/* The environment variable ZT_NVME_ENGINE=auto|uring|threads overrides
 * the caller's choice (tests, and users whose io_uring misbehaves); any
 * other value fails zt_nvme_open with ZT_EINPUT. */
typedef enum {
  ZT_NVME_AUTO = 0, /* io_uring, else threads */
  ZT_NVME_URING,    /* io_uring or fail */
  ZT_NVME_THREADS   /* the pread/pwrite pool even where io_uring works */
} zt_nvme_engine;

/* Creates `path` (replacing a file left there by an earlier run), sized
 * `bytes` rounded up to the alignment and allocated on disk (fallocate, so
 * a full file system fails here and not mid-step). NULL with *e set
 * (ZT_EINPUT for a directory that is missing or not writable, with the
 * path and errno's words, and for a file system without room, with the
 * bytes needed and free; ZT_ERUNTIME otherwise). */
zt_nvme *zt_nvme_open(const char *path, int64_t bytes, zt_nvme_engine want, zt_err *e);
/* Waits for what is in flight, closes and removes the file. */
void zt_nvme_close(zt_nvme *f);

/* Offsets, lengths and buffer addresses of requests must be multiples of
 * this (the file system's logical block size for O_DIRECT, at least 4096). */
size_t zt_nvme_align(const zt_nvme *f);
/* "io_uring (O_DIRECT)", "threads (pread/pwrite, O_DIRECT): io_uring
 * refused: Operation not permitted", ... */
const char *zt_nvme_engine_name(const zt_nvme *f);

/* Host memory aligned for requests (zeroed); free with zt_nvme_buf_free. */
void *zt_nvme_buf_alloc(size_t bytes);
void zt_nvme_buf_free(void *p);

/* Start a request of n bytes at offset off; buf belongs to the engine
 * until the request is waited for. Returns a ticket >= 0, or -1 with *e
 * set. At most 64 requests in flight per file. io_uring holds up to
 * 1 GiB of them in the kernel at once (128 chunks of 8 MiB); what is
 * beyond starts as those complete, during any later call on f. */
int zt_nvme_read(zt_nvme *f, int64_t off, void *buf, size_t n, zt_err *e);
int zt_nvme_write(zt_nvme *f, int64_t off, const void *buf, size_t n, zt_err *e);
/* Waits for request `ticket`; ZT_OK, or an error (an I/O error, a short
 * transfer) with the offset, length and errno's words. */
int zt_nvme_wait(zt_nvme *f, int ticket, zt_err *e);
/* Waits for every request in flight; the first error. */
int zt_nvme_wait_all(zt_nvme *f, zt_err *e);

#endif
