/* test_nvme: the NVMe tier's I/O engine (parallel/nvme.h) on the file
 * system that holds $TMPDIR (default /tmp), one engine per run:
 *
 *   test_nvme threads | uring | fallback | full
 *
 * threads, uring: random data written and read back at many offsets and
 * sizes (chunk boundaries crossed), with up to 64 requests in flight and
 * waited for out of order, against an image kept in memory; the 65th
 * request, a misaligned one, one past the end and a stale ticket refused
 * with their numbers; a file cut short behind the engine's back fails
 * the read across the cut naming the first bad byte, in wait and in
 * wait_all, and the file goes on working; a missing or unwritable
 * directory is ZT_EINPUT naming the path; a stale file is replaced, the
 * new one reads zeros and is gone after close; the engine's name. uring exits 77 (skipped) where
 * io_uring is refused, saying so.
 * fallback: a child whose io_uring_setup is refused by a seccomp filter
 * (as Docker's default profile does) gets the thread pool, with the
 * reason in the engine's name, and still round-trips; asking for uring
 * there fails with the reason.
 * full: a 1 MiB tmpfs mounted in a private mount namespace; a file larger
 * than it fails at open with ZT_EINPUT and the numbers. 77 where no mount
 * namespace can be had. */
#define _GNU_SOURCE /* unshare, mount, seccomp */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "parallel/nvme.h"

static zt_nvme_engine engine;
static char dir[256];
static char path[300];

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static void fill_random(void *p, size_t n) {
  uint64_t *q = p;
  for (size_t i = 0; i < n / 8; i++) q[i] = rnd();
}

static zt_nvme *open_ok(int64_t bytes) {
  zt_err e = {0};
  zt_nvme *f = zt_nvme_open(path, bytes, engine, &e);
  if (!f) fail_msg("open: %s", e.msg);
  return f;
}

/* Cuts [0, size) into extents of random aligned lengths (1 block to
 * 20 MiB, so 8 MiB chunks are crossed) and shuffles them. */
static int extents(size_t size, size_t align, size_t *off, size_t *len, int max) {
  int n = 0;
  for (size_t at = 0; at < size && n < max; n++) {
    size_t blocks = rnd() % 16 ? 1 + rnd() % 64 : 1 + rnd() % (20u << 20) / align;
    off[n] = at;
    len[n] = blocks * align < size - at ? blocks * align : size - at;
    at += len[n];
  }
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rnd() % (uint64_t)(i + 1));
    size_t t = off[i];
    off[i] = off[j], off[j] = t;
    t = len[i], len[i] = len[j], len[j] = t;
  }
  return n;
}

/* Issues every extent with at most `depth` in flight, waiting for a
 * random one of them when full; the rest with wait_all. */
static void transfer(zt_nvme *f, int write, char *mem, const size_t *off, const size_t *len, int n,
                     int depth) {
  zt_err e = {0};
  int tickets[64], live = 0;
  for (int i = 0; i < n; i++) {
    if (live == depth) {
      int k = (int)(rnd() % (uint64_t)live);
      assert_int_equal(zt_nvme_wait(f, tickets[k], &e), ZT_OK);
      tickets[k] = tickets[--live];
    }
    int t = write ? zt_nvme_write(f, (int64_t)off[i], mem + off[i], len[i], &e)
                  : zt_nvme_read(f, (int64_t)off[i], mem + off[i], len[i], &e);
    if (t < 0) fail_msg("%s", e.msg);
    tickets[live++] = t;
  }
  if (zt_nvme_wait_all(f, &e)) fail_msg("%s", e.msg);
}

static void test_round_trip(void **state) {
  (void)state;
  const size_t size = 48u << 20;
  zt_nvme *f = open_ok((int64_t)size);
  size_t a = zt_nvme_align(f);
  assert_true(a >= 4096 && a % 4096 == 0);
  char *image = zt_nvme_buf_alloc(size), *back = zt_nvme_buf_alloc(size);
  assert_non_null(image);
  assert_non_null(back);
  enum { MAXEXT = 4096 };
  size_t *off = malloc(MAXEXT * sizeof *off), *len = malloc(MAXEXT * sizeof *len);
  static const int depth[] = {64, 1, 7};
  for (int round = 0; round < 3; round++) {
    /* the whole file, then random parts of it over the last image */
    int n = extents(size, a, off, len, MAXEXT);
    if (round) n /= 3;
    char *fresh = zt_nvme_buf_alloc(size);
    fill_random(fresh, size);
    for (int i = 0; i < n; i++) memcpy(image + off[i], fresh + off[i], len[i]);
    transfer(f, 1, fresh, off, len, n, depth[round]);
    zt_nvme_buf_free(fresh);
    memset(back, 0, size);
    n = extents(size, a, off, len, MAXEXT);
    transfer(f, 0, back, off, len, n, depth[(round + 1) % 3]);
    assert_memory_equal(back, image, size);
  }
  free(off);
  free(len);
  zt_nvme_buf_free(image);
  zt_nvme_buf_free(back);
  zt_nvme_close(f);
}

static void test_in_flight(void **state) {
  (void)state;
  zt_nvme *f = open_ok(65 * 4096);
  size_t a = zt_nvme_align(f);
  char *buf = zt_nvme_buf_alloc(65 * a);
  for (size_t i = 0; i < 65 * a; i++) buf[i] = (char)(i / a + 1);
  zt_err e = {0};
  int t[64];
  for (int i = 0; i < 64; i++) {
    t[i] = zt_nvme_write(f, (int64_t)(i * a), buf + i * a, a, &e);
    assert_true(t[i] >= 0);
  }
  assert_int_equal(zt_nvme_write(f, 64 * (int64_t)a, buf + 64 * a, a, &e), -1);
  assert_non_null(strstr(e.msg, "64 requests already in flight"));
  for (int i = 63; i >= 0; i--) assert_int_equal(zt_nvme_wait(f, t[i], &e), ZT_OK);
  /* a ticket waited for is not in flight any more, nor is a made-up one */
  assert_int_equal(zt_nvme_wait(f, t[5], &e), ZT_ERUNTIME);
  assert_non_null(strstr(e.msg, "is not in flight"));
  assert_int_equal(zt_nvme_wait(f, -3, &e), ZT_ERUNTIME);
  /* reads of the same blocks, waited for all at once */
  char *back = zt_nvme_buf_alloc(64 * a);
  for (int i = 0; i < 64; i++) assert_true(zt_nvme_read(f, (int64_t)(i * a), back + i * a, a, &e) >= 0);
  assert_int_equal(zt_nvme_wait_all(f, &e), ZT_OK);
  assert_memory_equal(back, buf, 64 * a);
  /* nothing is left in flight, so wait_all has nothing to do */
  assert_int_equal(zt_nvme_wait_all(f, &e), ZT_OK);
  zt_nvme_buf_free(back);
  zt_nvme_buf_free(buf);
  zt_nvme_close(f);
}

static void test_refused(void **state) {
  (void)state;
  zt_nvme *f = open_ok(1 << 20);
  size_t a = zt_nvme_align(f);
  char *buf = zt_nvme_buf_alloc(2 * a);
  zt_err e = {0};
  char want[64];
  snprintf(want, sizeof want, "not aligned to %zu bytes", a);
  assert_int_equal(zt_nvme_write(f, 100, buf, a, &e), -1);
  assert_non_null(strstr(e.msg, "at offset 100"));
  assert_non_null(strstr(e.msg, want));
  assert_int_equal(zt_nvme_read(f, 0, buf, 1000, &e), -1);
  assert_non_null(strstr(e.msg, "read of 1000 bytes"));
  assert_int_equal(zt_nvme_read(f, 0, buf + 512, a, &e), -1);
  assert_non_null(strstr(e.msg, want));
  assert_int_equal(zt_nvme_read(f, 0, buf, 0, &e), -1);
  assert_int_equal(zt_nvme_read(f, (1 << 20) - (int64_t)a, buf, 2 * a, &e), -1);
  assert_non_null(strstr(e.msg, "runs past the file's 1048576 bytes"));
  zt_nvme_buf_free(buf);
  zt_nvme_close(f);
}

static void test_io_error(void **state) {
  (void)state;
  const size_t size = 32u << 20;
  zt_nvme *f = open_ok((int64_t)size);
  char *buf = zt_nvme_buf_alloc(size);
  /* the file cut short behind the engine's back: a read past the cut
   * moves 0 bytes; the 8 MiB chunk across it comes back short, its rest
   * fails, and so do the chunks after it */
  assert_int_equal(truncate(path, 12 << 20), 0);
  zt_err e = {0};
  int t = zt_nvme_read(f, 0, buf, size, &e);
  assert_true(t >= 0);
  assert_int_equal(zt_nvme_wait(f, t, &e), ZT_ERUNTIME);
  char want[512];
  snprintf(want, sizeof want,
           "nvme %s: read of 4194304 bytes at offset 12582912 (request of 33554432 bytes at 0) "
           "failed: 0 bytes transferred (end of file or device)",
           path);
  assert_string_equal(e.msg, want);
  /* wait_all reports the failure among good requests; the file goes on */
  int good = zt_nvme_read(f, 0, buf, 1 << 20, &e);
  int bad = zt_nvme_read(f, 16 << 20, buf + (16 << 20), 1 << 20, &e);
  assert_true(good >= 0 && bad >= 0);
  assert_int_equal(zt_nvme_wait_all(f, &e), ZT_ERUNTIME);
  assert_non_null(strstr(e.msg, "read of 1048576 bytes at offset 16777216"));
  assert_int_equal(zt_nvme_wait(f, bad, &e), ZT_ERUNTIME); /* waited for already */
  assert_non_null(strstr(e.msg, "is not in flight"));
  fill_random(buf, 1 << 20);
  t = zt_nvme_write(f, 20 << 20, buf, 1 << 20, &e);
  assert_int_equal(zt_nvme_wait(f, t, &e), ZT_OK);
  t = zt_nvme_read(f, 20 << 20, buf + (1 << 20), 1 << 20, &e);
  assert_int_equal(zt_nvme_wait(f, t, &e), ZT_OK);
  assert_memory_equal(buf, buf + (1 << 20), 1 << 20);
  zt_nvme_buf_free(buf);
  zt_nvme_close(f);
}

static void expect_input_error(const char *p, const char *words) {
  zt_err e = {0};
  assert_null(zt_nvme_open(p, 1 << 20, engine, &e));
  assert_int_equal(e.code, ZT_EINPUT);
  if (!strstr(e.msg, p) || !strstr(e.msg, words)) fail_msg("%s: %s", p, e.msg);
}

static void test_bad_dir(void **state) {
  (void)state;
  char p[400];
  snprintf(p, sizeof p, "%s/no-such-dir/x.bin", dir);
  expect_input_error(p, "No such file or directory");
  snprintf(p, sizeof p, "%s/x.bin", path); /* under a regular file */
  int fd = open(path, O_CREAT | O_WRONLY, 0600);
  assert_true(fd >= 0);
  close(fd);
  expect_input_error(p, "Not a directory");
  unlink(path);
  if (geteuid() == 0) { /* root writes anywhere a mode allows; /sys refuses creation */
    expect_input_error("/sys/ztrain-nvme-test.bin", "Permission denied");
  } else {
    snprintf(p, sizeof p, "%s/ro", dir);
    assert_int_equal(mkdir(p, 0500), 0);
    strcat(p, "/x.bin");
    expect_input_error(p, "Permission denied");
    *strrchr(p, '/') = 0;
    rmdir(p);
  }
}

static void test_stale_replaced_and_removed(void **state) {
  (void)state;
  /* a read-only file of the wrong size full of junk, as a crash leaves it */
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0400);
  assert_true(fd >= 0);
  char junk[65536];
  memset(junk, 0x5a, sizeof junk);
  for (int i = 0; i < 16; i++) assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  close(fd);
  zt_nvme *f = open_ok(10000); /* rounded up to the alignment */
  size_t a = zt_nvme_align(f), size = (10000 + a - 1) / a * a;
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, (off_t)size);
  char *buf = zt_nvme_buf_alloc(size), *zero = zt_nvme_buf_alloc(size);
  memset(buf, 0x77, size);
  zt_err e = {0};
  int t = zt_nvme_read(f, 0, buf, size, &e);
  assert_true(t >= 0);
  assert_int_equal(zt_nvme_wait(f, t, &e), ZT_OK);
  assert_memory_equal(buf, zero, size);
  zt_nvme_close(f);
  assert_int_equal(stat(path, &st), -1);
  assert_int_equal(errno, ENOENT);
  zt_nvme_buf_free(buf);
  zt_nvme_buf_free(zero);
}

static void test_engine_name(void **state) {
  (void)state;
  zt_nvme *f = open_ok(1 << 20);
  const char *want = engine == ZT_NVME_URING ? "io_uring (O_DIRECT)"
                                             : "threads (pread/pwrite, O_DIRECT): asked for";
  assert_string_equal(zt_nvme_engine_name(f), want);
  zt_nvme_close(f);
  /* the environment overrides the caller */
  setenv("ZT_NVME_ENGINE", "threads", 1);
  zt_err e = {0};
  f = zt_nvme_open(path, 1 << 20, ZT_NVME_URING, &e);
  assert_non_null(f);
  assert_string_equal(zt_nvme_engine_name(f),
                      "threads (pread/pwrite, O_DIRECT): ZT_NVME_ENGINE=threads");
  zt_nvme_close(f);
  setenv("ZT_NVME_ENGINE", "fast", 1);
  assert_null(zt_nvme_open(path, 1 << 20, engine, &e));
  assert_int_equal(e.code, ZT_EINPUT);
  assert_string_equal(e.msg, "ZT_NVME_ENGINE=fast: expected auto, uring or threads");
  unsetenv("ZT_NVME_ENGINE");
}

/* ---- fallback: io_uring_setup refused by seccomp ---- */

static int refuse_io_uring(void) {
  struct sock_filter prog[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog fp = {sizeof prog / sizeof prog[0], prog};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fp);
}

static void test_fallback(void **state) {
  (void)state;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (refuse_io_uring()) _exit(3);
    zt_err e = {0};
    if (zt_nvme_open(path, 1 << 20, ZT_NVME_URING, &e) || e.code != ZT_ERUNTIME ||
        !strstr(e.msg, "io_uring refused: Operation not permitted")) {
      fprintf(stderr, "uring under seccomp: %s\n", e.msg);
      _exit(4);
    }
    zt_nvme *f = zt_nvme_open(path, 1 << 20, ZT_NVME_AUTO, &e);
    if (!f || strcmp(zt_nvme_engine_name(f),
                     "threads (pread/pwrite, O_DIRECT): io_uring refused: Operation not permitted")) {
      fprintf(stderr, "auto under seccomp: %s\n", f ? zt_nvme_engine_name(f) : e.msg);
      _exit(5);
    }
    char *w = zt_nvme_buf_alloc(1 << 20), *r = zt_nvme_buf_alloc(1 << 20);
    fill_random(w, 1 << 20);
    int t = zt_nvme_write(f, 0, w, 1 << 20, &e);
    if (t < 0 || zt_nvme_wait(f, t, &e)) _exit(6);
    t = zt_nvme_read(f, 0, r, 1 << 20, &e);
    if (t < 0 || zt_nvme_wait(f, t, &e) || memcmp(w, r, 1 << 20)) _exit(7);
    zt_nvme_close(f);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- full: a file system without room ---- */

static int full_fs(void) {
  if (unshare(CLONE_NEWNS) != 0) {
    printf("no mount namespace here (%s): the full file system is not tested (skipped)\n",
           strerror(errno));
    fflush(stdout);
    return 77;
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
      mount("tmpfs", dir, "tmpfs", 0, "size=1m")) {
    printf("cannot mount a 1 MiB tmpfs (%s): the full file system is not tested (skipped)\n",
           strerror(errno));
    fflush(stdout);
    return 77;
  }
  zt_err e = {0};
  zt_nvme *f = zt_nvme_open(path, 64 << 20, ZT_NVME_AUTO, &e);
  int ok = !f && e.code == ZT_EINPUT && strstr(e.msg, "No space left on device") &&
           strstr(e.msg, "it needs 67108864 bytes") && strstr(e.msg, path);
  printf("%s\n", f ? "opened a 64 MiB file on a 1 MiB tmpfs" : e.msg);
  struct stat st;
  if (stat(path, &st) == 0) {
    printf("the failed file was left behind\n");
    ok = 0;
  }
  umount(dir);
  fflush(stdout); /* the child leaves by _exit */
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "threads";
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/test_nvme.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/rank0.bin", dir);
  int rc;
  if (!strcmp(mode, "full")) {
    pid_t pid = fork(); /* the namespace and the mount die with the child */
    if (pid == 0) _exit(full_fs());
    int st;
    waitpid(pid, &st, 0);
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  } else if (!strcmp(mode, "fallback")) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fallback)};
    rc = cmocka_run_group_tests(tests, NULL, NULL);
  } else {
    engine = !strcmp(mode, "uring") ? ZT_NVME_URING : ZT_NVME_THREADS;
    struct io_uring ring;
    int ret = engine == ZT_NVME_URING ? io_uring_queue_init(8, &ring, 0) : 1;
    if (ret < 0) {
      printf("io_uring refused here (%s): the io_uring engine is not tested (skipped)\n",
             strerror(-ret));
      rmdir(dir);
      return 77;
    }
    if (ret == 0) io_uring_queue_exit(&ring);
    printf("engine: %s\n", mode);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip), cmocka_unit_test(test_in_flight),
        cmocka_unit_test(test_refused), cmocka_unit_test(test_io_error),
        cmocka_unit_test(test_bad_dir),
        cmocka_unit_test(test_stale_replaced_and_removed), cmocka_unit_test(test_engine_name),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
  }
  unlink(path);
  rmdir(dir);
  return rc;
}
