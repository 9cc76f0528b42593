/* test_data: token files and the sample order (src/data/data.h). Files
 * written by zt_tokens_write (header, u16 and u32) and by hand (headerless
 * u16 / u32) read back with the right count, width and sample count; the
 * loader serves sample i as tokens[i*T .. i*T+T] with targets shifted by
 * one, batch k at positions k*G.. wrapping at the end; with shuffle every
 * epoch is a seeded permutation; and each malformed input is refused with
 * ZT_EINPUT and a message that says what is wrong and where. */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw, truncate */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/data/data.h"

static char dir[64];

static int make_dir(void **state) {
  (void)state;
  strcpy(dir, "/tmp/zt_test_data_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}
static int rm_entry(const char *p, const struct stat *s, int flag, struct FTW *f) {
  (void)s, (void)flag, (void)f;
  return remove(p);
}
static int remove_dir(void **state) {
  (void)state;
  return nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Path of `name` inside the temp dir (a static buffer per slot: tests hold
 * at most a few at once). */
static const char *path_of(const char *name) {
  static char buf[4][128];
  static int slot;
  char *p = buf[slot++ % 4];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

/* A token sequence whose values are distinct in the low bits, so a shifted
 * or mis-indexed read shows. */
static uint32_t tok_value(int64_t i, uint32_t vocab) { return (uint32_t)((i * 7919 + 13) % vocab); }

static const char *write_tokens(const char *name, int64_t count, int width, uint32_t vocab) {
  uint32_t *t = malloc((size_t)count * sizeof *t);
  assert_non_null(t);
  for (int64_t i = 0; i < count; i++) t[i] = tok_value(i, vocab);
  zt_err e = {0};
  const char *p = path_of(name);
  int rc = zt_tokens_write(p, t, count, width, vocab, &e);
  free(t);
  if (rc) fail_msg("zt_tokens_write: %s", e.msg);
  return p;
}

/* Headerless little-endian tokens, as nanoGPT writes them; `extra` adds
 * stray trailing bytes. */
static const char *write_raw(const char *name, int64_t count, int width, uint32_t vocab, int extra) {
  const char *p = path_of(name);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  for (int64_t i = 0; i < count; i++) {
    uint32_t v = tok_value(i, vocab);
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    assert_int_equal(fwrite(b, 1, (size_t)width, f), width);
  }
  for (int i = 0; i < extra; i++) fputc(0, f);
  assert_int_equal(fclose(f), 0);
  return p;
}

static void open_ok(zt_tokens *t, const char *p, int width, int seq, int vocab) {
  zt_err e = {0};
  if (zt_tokens_open(t, p, width, seq, vocab, &e)) fail_msg("open %s: %s", p, e.msg);
}

/* Every row of a fill against the token file read directly. */
static void check_rows(const int32_t *in, const int32_t *tg, const int64_t *idx, int n,
                       int T, uint32_t vocab) {
  for (int s = 0; s < n; s++)
    for (int j = 0; j < T; j++) {
      assert_int_equal(in[s * T + j], tok_value(idx[s] * T + j, vocab));
      assert_int_equal(tg[s * T + j], tok_value(idx[s] * T + j + 1, vocab));
    }
}

static void test_write_and_open(void **state) {
  (void)state;
  /* 43 tokens, T = 4: (43 - 1) / 4 = 10 samples, the last 2 tokens unused
   * as inputs; 41 tokens is exactly 10 samples too */
  const struct { const char *name; int64_t count; int width; uint32_t vocab; int64_t samples; } c[] = {
      {"a16.bin", 43, 2, 50257, 10}, {"a32.bin", 43, 4, 128256, 10}, {"b16.bin", 41, 2, 300, 10},
      {"c16.bin", 5, 2, 300, 1}};
  for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
    const char *p = write_tokens(c[k].name, c[k].count, c[k].width, c[k].vocab);
    /* the header decides the width: the headerless default is ignored */
    zt_tokens t;
    open_ok(&t, p, c[k].width == 2 ? 4 : 2, 4, (int)c[k].vocab);
    assert_int_equal(t.count, c[k].count);
    assert_int_equal(t.width, c[k].width);
    assert_int_equal(t.samples, c[k].samples);
    assert_int_equal(t.seq, 4);
    zt_tokens_close(&t);
  }
  /* the write is atomic (temp name + rename): no temp file is left behind */
  DIR *d = opendir(dir);
  assert_non_null(d);
  for (struct dirent *de; (de = readdir(d));)
    if (strstr(de->d_name, ".tmp")) fail_msg("leftover %s", de->d_name);
  closedir(d);
  FILE *f = fopen(path_of("a32.bin"), "rb");
  char magic[8];
  assert_int_equal(fread(magic, 1, 8, f), 8);
  fclose(f);
  assert_memory_equal(magic, ZT_TOKENS_MAGIC, 8);
}

static void test_raw_files(void **state) {
  (void)state;
  const int T = 5;
  for (int width = 2; width <= 4; width += 2) {
    /* u32 tokens above 65535 prove all four bytes are read */
    uint32_t vocab = width == 2 ? 65535 : 200000;
    const char *p = write_raw(width == 2 ? "raw16.bin" : "raw32.bin", 33, width, vocab, 0);
    zt_tokens t;
    open_ok(&t, p, width, T, (int)vocab);
    assert_int_equal(t.count, 33);
    assert_int_equal(t.width, width);
    assert_int_equal(t.samples, 6);
    zt_loader ld;
    zt_err e = {0};
    assert_int_equal(zt_loader_init(&ld, &t, 0, 1, &e), ZT_OK);
    int32_t in[6 * 5], tg[6 * 5];
    int64_t idx[6] = {0, 1, 2, 3, 4, 5};
    zt_loader_fill(&ld, 0, 6, 0, 6, in, tg);
    check_rows(in, tg, idx, 6, T, vocab);
    zt_loader_free(&ld);
    zt_tokens_close(&t);
  }
}

/* shuffle = 0: global batch k holds positions k*G .. k*G+G-1, position p is
 * sample p % samples; ranks / micro-batches read slices [first, first+n). */
static void test_fill_in_order(void **state) {
  (void)state;
  enum { T = 4, G = 3, V = 1000 };
  const char *p = write_tokens("order.bin", 10 * T + 1, 2, V); /* 10 samples */
  zt_tokens t;
  open_ok(&t, p, 2, T, V);
  zt_loader ld;
  zt_err e = {0};
  assert_int_equal(zt_loader_init(&ld, &t, 0, 123, &e), ZT_OK);
  int32_t in[G * T], tg[G * T];
  for (int64_t k = 0; k < 8; k++) { /* 8 batches of 3 cross the end twice */
    int64_t idx[G];
    for (int s = 0; s < G; s++) {
      idx[s] = (k * G + s) % 10;
      assert_int_equal(zt_loader_sample_at(&ld, k * G + s), idx[s]);
    }
    zt_loader_fill(&ld, k, G, 0, G, in, tg);
    check_rows(in, tg, idx, G, T, V);
  }
  /* batch 3 is positions 9, 10, 11: sample 9, then wrap to 0 and 1 */
  zt_loader_fill(&ld, 3, G, 0, G, in, tg);
  assert_int_equal(in[0], tok_value(9 * T, V));
  assert_int_equal(in[T], tok_value(0, V));
  /* a slice is the same rows as the whole batch, wherever it is cut */
  int32_t sin_[2 * T], stg[2 * T];
  zt_loader_fill(&ld, 3, G, 1, 2, sin_, stg);
  assert_memory_equal(sin_, in + T, sizeof sin_);
  assert_memory_equal(stg, tg + T, sizeof stg);
  zt_loader_free(&ld);
  zt_tokens_close(&t);
}

/* Reads epoch `ep` of the order: n positions starting at ep * n. */
static void epoch_order(zt_loader *ld, int64_t ep, int64_t n, int64_t *out) {
  for (int64_t i = 0; i < n; i++) out[i] = zt_loader_sample_at(ld, ep * n + i);
}

static void test_shuffle(void **state) {
  (void)state;
  enum { T = 2, S = 50, E = 4, V = 500 };
  const char *p = write_tokens("shuf.bin", S * T + 1, 2, V);
  zt_tokens t;
  open_ok(&t, p, 2, T, V);
  assert_int_equal(t.samples, S);
  zt_loader a, b, c;
  zt_err e = {0};
  assert_int_equal(zt_loader_init(&a, &t, 1, 7, &e), ZT_OK);
  assert_int_equal(zt_loader_init(&b, &t, 1, 7, &e), ZT_OK);
  assert_int_equal(zt_loader_init(&c, &t, 1, 8, &e), ZT_OK);

  int64_t ord[E][S], tmp[S];
  for (int ep = 0; ep < E; ep++) {
    epoch_order(&a, ep, S, ord[ep]);
    /* each epoch visits every sample exactly once */
    int seen[S] = {0};
    for (int i = 0; i < S; i++) {
      assert_true(ord[ep][i] >= 0 && ord[ep][i] < S);
      seen[ord[ep][i]]++;
    }
    for (int i = 0; i < S; i++) assert_int_equal(seen[i], 1);
    /* ... in a new order each time (two equal orders of 50: p = 1/50!) */
    for (int q = 0; q < ep; q++) assert_memory_not_equal(ord[ep], ord[q], sizeof tmp);
    int fixed = 0; /* and not the identity */
    for (int i = 0; i < S; i++) fixed += ord[ep][i] == i;
    assert_true(fixed < S);
  }
  /* the same seed gives the same orders, even visited out of sequence (as a
   * resumed run does); another seed gives another order */
  for (int ep = E - 1; ep >= 0; ep--) {
    epoch_order(&b, ep, S, tmp);
    assert_memory_equal(tmp, ord[ep], sizeof tmp);
  }
  epoch_order(&c, 0, S, tmp);
  assert_memory_not_equal(tmp, ord[0], sizeof tmp);

  /* a batch straddling the epoch boundary takes the tail of one order and
   * the head of the next; its rows are those samples' tokens */
  enum { G = 7 };
  int64_t k = S / G, idx[G]; /* positions 49 .. 55 */
  for (int s = 0; s < G; s++) {
    int64_t pos = k * G + s;
    idx[s] = ord[pos / S][pos % S];
  }
  int32_t in[G * T], tg[G * T];
  zt_loader_fill(&a, k, G, 0, G, in, tg);
  check_rows(in, tg, idx, G, T, V);

  zt_loader_free(&a);
  zt_loader_free(&b);
  zt_loader_free(&c);
  zt_tokens_close(&t);
}

/* Opens p expecting ZT_EINPUT with every one of the given message pieces. */
static void expect_refused(const char *p, int width, int seq, int vocab, const char *const *want) {
  zt_tokens t;
  zt_err e = {0};
  int rc = zt_tokens_open(&t, p, width, seq, vocab, &e);
  zt_tokens_close(&t); /* the mapping is the caller's to release either way */
  print_message("  %s\n", e.msg);
  assert_int_equal(rc, ZT_EINPUT);
  assert_int_equal(e.code, ZT_EINPUT);
  for (; *want; want++)
    if (!strstr(e.msg, *want)) fail_msg("message lacks \"%s\": %s", *want, e.msg);
}
#define REFUSED(p, w, seq, V, ...) \
  expect_refused(p, w, seq, V, (const char *const[]){__VA_ARGS__, NULL})

/* Overwrites 4 bytes (little-endian u32) at `off` of file p. */
static void patch32(const char *p, long off, uint32_t v) {
  FILE *f = fopen(p, "r+b");
  assert_non_null(f);
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  assert_int_equal(fwrite(b, 1, 4, f), 4);
  fclose(f);
}

static void test_errors(void **state) {
  (void)state;
  const char *p;
  REFUSED(path_of("nope.bin"), 2, 4, 100, "nope.bin", "No such file");

  /* out of vocab: the message names file, token, index and byte offset
   * (header 32 + 13 * 2 = 58; headerless u32: 13 * 4 = 52) */
  uint32_t tok[20];
  for (int i = 0; i < 20; i++) tok[i] = (uint32_t)i % 7;
  tok[13] = 100;
  zt_err e = {0};
  assert_int_equal(zt_tokens_write(p = path_of("vocab.bin"), tok, 20, 2, 50, &e), ZT_OK);
  REFUSED(p, 2, 4, 50, "vocab.bin", "token 100", "index 13", "offset 58", "vocab 50");
  p = write_raw("vocab32.bin", 20, 4, 1000, 0);
  REFUSED(p, 4, 4, 50, "vocab32.bin", "index 1 ", "offset 4)", "vocab 50");
  /* the boundary: token == vocab - 1 is fine, token == vocab is not */
  tok[13] = 49;
  assert_int_equal(zt_tokens_write(p = path_of("edge.bin"), tok, 20, 2, 50, &e), ZT_OK);
  zt_tokens t;
  open_ok(&t, p, 2, 4, 50);
  zt_tokens_close(&t);

  /* too short for one sample: seq + 1 tokens are needed */
  p = write_tokens("short.bin", 4, 2, 100);
  REFUSED(p, 2, 4, 100, "short.bin", "holds 4 tokens", "seq 4", "at least 5");
  p = write_raw("short_raw.bin", 8, 2, 100, 0);
  REFUSED(p, 2, 8, 100, "short_raw.bin", "holds 8 tokens");

  /* header promises more tokens than follow */
  p = write_tokens("trunc.bin", 40, 2, 100);
  assert_int_equal(truncate(p, 32 + 30 * 2), 0);
  REFUSED(p, 2, 4, 100, "trunc.bin", "40 tokens", "truncated");
  p = write_tokens("hdr.bin", 40, 2, 100);
  assert_int_equal(truncate(p, 20), 0);
  REFUSED(p, 2, 4, 100, "hdr.bin", "header truncated");

  /* headerless u16 with an odd byte count; u16 data read as u32 (the usual
   * wrong data.dtype) is caught whenever the length is not a multiple of 4 */
  p = write_raw("odd.bin", 20, 2, 100, 1);
  REFUSED(p, 2, 4, 100, "odd.bin", "41 bytes", "2-byte");
  p = write_raw("odd32.bin", 21, 2, 100, 0);
  REFUSED(p, 4, 4, 100, "odd32.bin", "42 bytes", "4-byte", "dtype");
}

/* The header fields the reader must check, one at a time. */
static void test_bad_header(void **state) {
  (void)state;
  const char *p = write_tokens("ver.bin", 40, 2, 100);
  patch32(p, 8, 2);
  REFUSED(p, 2, 4, 100, "ver.bin", "version 2");
  p = write_tokens("width.bin", 40, 2, 100);
  patch32(p, 12, 3);
  REFUSED(p, 2, 4, 100, "width.bin", "width 3");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_write_and_open), cmocka_unit_test(test_raw_files),
      cmocka_unit_test(test_fill_in_order),  cmocka_unit_test(test_shuffle),
      cmocka_unit_test(test_errors),         cmocka_unit_test(test_bad_header),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
