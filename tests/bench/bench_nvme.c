/* bench_nvme: one timed pass of the NVMe engine (parallel/nvme.h) over a
 * fresh file, for tests/bench/bench_nvme.py, which sets it against dd and
 * fio on the same file system.
 *
 *   bench_nvme PATH MIB BLOCK_KIB DEPTH uring|threads
 *
 * Opens PATH (MIB MiB, fallocated: not timed, as fio's layout is not),
 * writes it sequentially in BLOCK_KIB blocks of random bytes with DEPTH
 * requests in flight (the oldest waited for when full), then reads it
 * back the same way; checks the bytes read are those written (a pass that
 * moved wrong bytes is no measurement); prints
 *
 *   write_s W read_s R engine NAME
 *
 * and removes the file. A benchmark, not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/nvme.h"
#include "src/core/timer.h"

static int fail(const char *what, const zt_err *e) {
  fprintf(stderr, "bench_nvme: %s: %s\n", what, e->msg);
  return 1;
}

/* One sequential pass; 0 or 1 with the error printed. */
static int pass(zt_nvme *f, int write, char **bufs, size_t bs, int depth, int64_t blocks) {
  zt_err e = {0};
  int tickets[64];
  for (int64_t i = 0; i < blocks + depth; i++) {
    int k = (int)(i % depth);
    if (i >= depth && zt_nvme_wait(f, tickets[k], &e)) return fail("wait", &e);
    if (i >= blocks) continue;
    /* each block's bytes are buffer k's, salted with its number, so the
     * read pass can tell a block at the wrong place */
    if (write) memcpy(bufs[k], &i, sizeof i);
    tickets[k] = write ? zt_nvme_write(f, i * (int64_t)bs, bufs[k], bs, &e)
                       : zt_nvme_read(f, i * (int64_t)bs, bufs[k], bs, &e);
    if (tickets[k] < 0) return fail(write ? "write" : "read", &e);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: bench_nvme PATH MIB BLOCK_KIB DEPTH uring|threads\n");
    return 2;
  }
  const char *path = argv[1];
  int64_t mib = atoll(argv[2]);
  size_t bs = (size_t)atoll(argv[3]) << 10;
  int depth = atoi(argv[4]);
  zt_nvme_engine want = !strcmp(argv[5], "threads") ? ZT_NVME_THREADS : ZT_NVME_URING;
  int64_t bytes = mib << 20;
  if (mib <= 0 || bs == 0 || bytes % (int64_t)bs || depth < 1 || depth > 64) {
    fprintf(stderr, "bench_nvme: MIB > 0 a multiple of the block, 1 <= DEPTH <= 64\n");
    return 2;
  }
  zt_err e = {0};
  zt_nvme *f = zt_nvme_open(path, bytes, want, &e);
  if (!f) return fail("open", &e);
  int64_t blocks = bytes / (int64_t)bs;
  char *bufs[64], *ref[64];
  for (int k = 0; k < depth; k++) {
    bufs[k] = zt_nvme_buf_alloc(bs);
    ref[k] = malloc(bs);
    for (size_t j = 0; j < bs; j++) bufs[k][j] = (char)(rand() >> 7);
    memcpy(ref[k], bufs[k], bs);
  }
  double t0 = zt_timer_now();
  int rc = pass(f, 1, bufs, bs, depth, blocks);
  double t1 = zt_timer_now();
  for (int k = 0; k < depth; k++) memset(bufs[k], 0, bs);
  rc = rc || pass(f, 0, bufs, bs, depth, blocks);
  double t2 = zt_timer_now();
  /* the last `depth` blocks are in the buffers: salt and bytes */
  for (int64_t i = blocks > depth ? blocks - depth : 0; !rc && i < blocks; i++) {
    int k = (int)(i % depth);
    int64_t salt;
    memcpy(&salt, bufs[k], sizeof salt);
    if (salt != i || memcmp(bufs[k] + sizeof salt, ref[k] + sizeof salt, bs - sizeof salt)) {
      fprintf(stderr, "bench_nvme: block %lld read back wrong\n", (long long)i);
      rc = 1;
    }
  }
  if (!rc) printf("write_s %.6f read_s %.6f engine %s\n", t1 - t0, t2 - t1, zt_nvme_engine_name(f));
  zt_nvme_close(f);
  for (int k = 0; k < depth; k++) {
    zt_nvme_buf_free(bufs[k]);
    free(ref[k]);
  }
  return rc;
}
