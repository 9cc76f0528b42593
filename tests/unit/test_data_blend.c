/* test_data_blend: the data sources beyond one file (src/data/megatron.c,
 * blend.c, the lists of data.c). A Megatron-LM indexed dataset written by
 * tests/ref/megatron_idx.py (Megatron's format, from its description)
 * reads as its sequences back to back, under each of the names a script
 * may give it, and packs samples across document boundaries; each defect
 * of an index (magic, version, dtype, a pointer past the .bin, truncation,
 * document indices) is refused with ZT_EINPUT and a message naming it; a
 * list of files serves exactly the order of the one concatenated file; a
 * blend follows Megatron's rule (its first choices for one set of weights),
 * tracks its weights within one sample at every prefix, is the same
 * from any starting point (a resume) and for the same seed, and a blend of
 * one part is that part. Usage: test_data_blend PATH/megatron_idx.py */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/data/data.h"

static char dir[64];
static const char *writer; /* tests/ref/megatron_idx.py */

static int rm_entry(const char *p, const struct stat *s, int flag, struct FTW *f) {
  (void)s, (void)flag, (void)f;
  return remove(p);
}
static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/zt_test_blend_XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  return nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static const char *path_of(const char *name) {
  static char buf[4][160];
  static int slot;
  char *p = buf[slot++ % 4];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

/* Runs the writer: PREFIX CODE DOCS... [--corrupt KIND | --scatter]. */
static void megatron(const char *name, int code, const char *docs, const char *corrupt) {
  char cmd[4096];
  int scatter = corrupt && !strcmp(corrupt, "scatter");
  snprintf(cmd, sizeof cmd, "python3 %s %s %d %s %s %s", writer, path_of(name), code, docs,
           scatter ? "--scatter" : corrupt ? "--corrupt" : "", scatter || !corrupt ? "" : corrupt);
  if (system(cmd)) fail_msg("%s failed", cmd);
}

/* Documents "d0/d1/..;..": 5 documents of 1-3 sequences, 61 tokens, token
 * k of the stream = (k * 37 + 11) % 200 so a misplaced read shows. */
static const int doc_seqs[][3] = {{7, 0, 0}, {5, 9, 0}, {13, 0, 0}, {4, 4, 8}, {11, 0, 0}};
static int64_t stream_token(int64_t k) { return (k * 37 + 11) % 200; }
static void doc_args(char *out, size_t size) {
  int64_t k = 0;
  size_t n = 0;
  for (int d = 0; d < 5; d++) {
    n += (size_t)snprintf(out + n, size - n, " \"");
    for (int s = 0; s < 3 && doc_seqs[d][s]; s++) {
      if (s) n += (size_t)snprintf(out + n, size - n, "/");
      for (int j = 0; j < doc_seqs[d][s]; j++)
        n += (size_t)snprintf(out + n, size - n, "%s%lld", j ? "," : "",
                              (long long)stream_token(k++));
    }
    n += (size_t)snprintf(out + n, size - n, "\"");
  }
}
#define STREAM 61

static void open_ok(zt_tokens *t, const char *path, int seq, int vocab) {
  zt_err e = {0};
  if (zt_tokens_open(t, path, 2, seq, vocab, &e)) fail_msg("open %s: %s", path, e.msg);
}

/* The stream, under each name, in u16 and i32, and with the sequences
 * stored out of order in .bin; samples of T = 8 cross sequence and
 * document boundaries (the first document has 7 tokens). */
static void test_megatron_read(void **state) {
  (void)state;
  char docs[2048];
  doc_args(docs, sizeof docs);
  for (int code = 0; code <= 8; code += 4) {
    megatron("m", code ? code : 8, docs, code ? NULL : "scatter");
    const char *names[] = {path_of("m"), path_of("m.bin"), path_of("m.idx")};
    for (int n = 0; n < 3; n++) {
      zt_tokens t;
      open_ok(&t, names[n], 8, 256);
      assert_true(t.megatron);
      assert_int_equal(t.count, STREAM);
      assert_int_equal(t.samples, (STREAM - 1) / 8);
      /* back to back in the file: one run; scattered: one per sequence */
      assert_int_equal(t.npieces, code ? 1 : 8);
      for (int64_t k = 0; k < STREAM; k++) assert_int_equal(zt_tokens_at(&t, k), stream_token(k));
      zt_loader ld;
      zt_err e = {0};
      assert_int_equal(zt_loader_init(&ld, &t, 0, 1, &e), ZT_OK);
      int32_t in[7 * 8], tg[7 * 8];
      zt_loader_fill(&ld, 0, 7, 0, 7, in, tg);
      for (int s = 0; s < 7; s++)
        for (int j = 0; j < 8; j++) {
          assert_int_equal(in[s * 8 + j], stream_token(s * 8 + j));
          assert_int_equal(tg[s * 8 + j], stream_token(s * 8 + j + 1));
        }
      zt_loader_free(&ld);
      zt_tokens_close(&t);
    }
  }
}

static void expect_refused(const char *path, int seq, int vocab, const char *want) {
  zt_tokens t;
  zt_err e = {0};
  int rc = zt_tokens_open(&t, path, 2, seq, vocab, &e);
  zt_tokens_close(&t);
  if (rc != ZT_EINPUT || !strstr(e.msg, want))
    fail_msg("%s: rc %d, message '%s'; expected ZT_EINPUT with '%s'", path, rc, e.msg, want);
}

static void test_megatron_bad(void **state) {
  (void)state;
  const char *docs = "\"1,2,3/4,5\" \"6,7,8,9\" \"10,11\"";
  struct { const char *kind, *want; } cases[] = {
      {"magic", "not a Megatron-LM index: it does not start with the magic bytes"},
      {"version", "index version 2; ztrain reads Megatron-LM's version 1"},
      {"dtype", "dtype code 7 is not an integer token type"},
      {"pointer", "sequence 3 (byte offset 20, 2 tokens of 2 bytes) lies outside"},
      {"truncated", "index truncated: 4 sequences and 4 document indices need 80 bytes"},
      {"docs", "the document indices must run from 0 to the sequence count 4"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    megatron("bad", 8, docs, cases[i].kind);
    expect_refused(path_of("bad"), 2, 256, cases[i].want);
  }
  megatron("bad", 8, docs, "pointer");
  expect_refused(path_of("bad.idx"), 2, 256, "lies outside");
  megatron("bad", 4, "\"1,2,-3,4\"", NULL); /* a negative i32 token */
  expect_refused(path_of("bad"), 2, 256, "token value beyond");
  megatron("bad", 8, docs, NULL);
  expect_refused(path_of("bad"), 2, 8, "token 8 at index 7 (byte offset 14) is out of range");
  expect_refused(path_of("bad"), 11, 256, "holds 11 tokens; seq 11 needs at least 12");
  remove(path_of("bad.bin"));
  expect_refused(path_of("bad.idx"), 2, 256, "bad.bin: No such file or directory");
}

/* Raw u16 tokens [from, from+n) of stream_token into `name`. */
static void flat(const char *name, int64_t from, int64_t n) {
  FILE *f = fopen(path_of(name), "wb");
  assert_non_null(f);
  for (int64_t k = from; k < from + n; k++) {
    uint8_t b[2] = {(uint8_t)stream_token(k), 0};
    fwrite(b, 1, 2, f);
  }
  fclose(f);
}

/* The same samples at every position of two loaders, over `epochs`. */
static void same_order(zt_loader *a, zt_loader *b, int T, int64_t positions) {
  int32_t ia[64], ta[64], ib[64], tb[64];
  for (int64_t p = 0; p < positions; p++) {
    zt_loader_fill(a, p, 1, 0, 1, ia, ta);
    zt_loader_fill(b, p, 1, 0, 1, ib, tb);
    assert_memory_equal(ia, ib, (size_t)T * sizeof *ia);
    assert_memory_equal(ta, tb, (size_t)T * sizeof *ta);
  }
}

/* A list (a flat file, a Megatron dataset, a short flat file that holds no
 * sample alone) serves the order of the one file that concatenates them. */
static void test_list_equals_concatenation(void **state) {
  (void)state;
  char docs[2048];
  doc_args(docs, sizeof docs); /* stream tokens 0..60 */
  megatron("l1", 8, docs, NULL);
  /* l0: tokens that come before; l2: after (a file of 3 tokens) */
  FILE *f = fopen(path_of("all.bin"), "wb");
  fclose(f);
  flat("l0.bin", 0, 40); /* the list: l0 (40), m (61 = tokens 0..60 again), l2 (3) */
  flat("l2.bin", 5, 3);
  f = fopen(path_of("all.bin"), "wb");
  for (int part = 0; part < 3; part++) {
    int64_t from = part == 2 ? 5 : 0, n = part == 0 ? 40 : part == 1 ? STREAM : 3;
    for (int64_t k = from; k < from + n; k++) {
      uint8_t b[2] = {(uint8_t)stream_token(k), 0};
      fwrite(b, 1, 2, f);
    }
  }
  fclose(f);
  char *list[] = {(char *)path_of("l0.bin"), (char *)path_of("l1"), (char *)path_of("l2.bin")};
  char *copies[3];
  for (int i = 0; i < 3; i++) copies[i] = strdup(list[i]);
  zt_tokens lt, one;
  zt_err e = {0};
  const int T = 6;
  if (zt_tokens_open_list(&lt, copies, 3, 2, T, 256, &e)) fail_msg("list: %s", e.msg);
  open_ok(&one, path_of("all.bin"), T, 256);
  assert_int_equal(lt.count, 104);
  assert_int_equal(lt.samples, one.samples);
  for (int shuffle = 0; shuffle < 2; shuffle++) {
    zt_loader a, b;
    assert_int_equal(zt_loader_init(&a, &lt, shuffle, 42, &e), ZT_OK);
    assert_int_equal(zt_loader_init(&b, &one, shuffle, 42, &e), ZT_OK);
    same_order(&a, &b, T, 3 * one.samples); /* three epochs */
    zt_loader_free(&a);
    zt_loader_free(&b);
  }
  /* a list whose files hold fewer tokens than one sample, all together */
  char *shorts[] = {copies[2], copies[2]};
  assert_int_equal(zt_tokens_open_list(&lt.files[0], shorts, 2, 2, 8, 256, &e), ZT_EINPUT);
  assert_non_null(strstr(e.msg, "the 2 data files"));
  assert_non_null(strstr(e.msg, "hold 6 tokens; seq 8 needs at least 9"));
  zt_tokens_close(&lt);
  zt_tokens_close(&one);
  for (int i = 0; i < 3; i++) free(copies[i]);
}

static zt_data_spec spec_of(int n, const double *w, char **paths) {
  zt_data_spec s = {.blend = 1, .n = n, .parts = calloc((size_t)n, sizeof(zt_data_part))};
  for (int i = 0; i < n; i++)
    s.parts[i] = (zt_data_part){.weight = w[i], .n = 1, .paths = &paths[i]};
  return s;
}

/* Every prefix of N positions holds each part within one sample of its
 * share; a fresh loader asked for position p first (a resume) and one with
 * the same seed agree; the parts' own orders are permutations per epoch. */
static void test_blend(void **state) {
  (void)state;
  flat("b0.bin", 0, 200);
  flat("b1.bin", 1000, 120);
  flat("b2.bin", 2000, 90);
  char *paths[] = {(char *)path_of("b0.bin"), (char *)path_of("b1.bin"), (char *)path_of("b2.bin")};
  char *copies[3];
  for (int i = 0; i < 3; i++) copies[i] = strdup(paths[i]);
  const double w[] = {5, 3, 2}; /* normalised: 0.5, 0.3, 0.2 */
  zt_data_spec s = spec_of(3, w, copies);
  zt_data d;
  zt_err e = {0};
  const int T = 4, N = 2000;
  if (zt_data_open(&d, &s, 2, T, 256, &e)) fail_msg("blend: %s", e.msg);
  assert_int_equal(d.samples, 49 + 29 + 22);
  assert_true(fabs(d.weights[0] - 0.5) < 1e-15 && fabs(d.weights[2] - 0.2) < 1e-15);
  zt_loader a, b;
  assert_int_equal(zt_loader_init_data(&a, &d, 1, 9, &e), ZT_OK);
  int64_t count[3] = {0}, at;
  int64_t *seen = calloc(3 * N, sizeof *seen);
  for (int64_t p = 0; p < N; p++) {
    int c = zt_blend_locate(&a, p, &at);
    assert_int_equal(at, count[c]); /* each part read in its own order, in turn */
    count[c]++;
    seen[p] = c;
    for (int k = 0; k < 3; k++)
      if (fabs((double)count[k] - d.weights[k] * (double)(p + 1)) > 1.0)
        fail_msg("after %lld positions part %d has %lld samples, weight %.2f",
                 (long long)p + 1, k, (long long)count[k], d.weights[k]);
  }
  /* the first 30 choices of Megatron's build_blending_indices (helpers.cpp)
   * for these weights, from a Python transcription of it */
  const char *megatron_order = "012010201001201020100120102010";
  for (int p = 0; p < 30; p++)
    if (seen[p] != megatron_order[p] - '0')
      fail_msg("position %d goes to part %lld; Megatron's rule gives %c", p, (long long)seen[p],
               megatron_order[p]);
  /* resume: from batch 150 (position 1200) on, a new loader reads what a
   * loader that went through positions 0..1999 and back reads, token for token */
  assert_int_equal(zt_loader_init_data(&b, &d, 1, 9, &e), ZT_OK);
  int32_t ia[4 * 4], ta[4 * 4], ib[4 * 4], tb[4 * 4]; /* 4 samples of T = 4 */
  for (int64_t k = 150; k < 160; k++) {
    zt_loader_fill(&b, k, 8, 2, 4, ib, tb); /* a DP rank's slice: positions 8k+2 .. 8k+5 */
    zt_loader_fill(&a, k, 8, 2, 4, ia, ta); /* a went to N and comes back: a rescan */
    assert_memory_equal(ia, ib, sizeof ia);
    assert_memory_equal(ta, tb, sizeof ta);
  }
  /* the part's samples: every part-0 sample of a 49-sample epoch once */
  int hit[49] = {0};
  zt_loader_free(&b);
  assert_int_equal(zt_loader_init_data(&b, &d, 1, 9, &e), ZT_OK);
  for (int64_t p = 0, n = 0; n < 49; p++)
    if (seen[p] == 0) {
      int64_t idx = zt_loader_sample_at(&b, p);
      assert_true(idx >= 0 && idx < 49);
      hit[idx]++;
      n++;
    }
  for (int i = 0; i < 49; i++) assert_int_equal(hit[i], 1);
  zt_loader_free(&a);
  zt_loader_free(&b);
  zt_data_close(&d);
  free(s.parts);
  /* one part, any weight: the plain loader over that file */
  const double one[] = {0.25};
  s = spec_of(1, one, copies);
  assert_int_equal(zt_data_open(&d, &s, 2, T, 256, &e), ZT_OK);
  zt_tokens t;
  open_ok(&t, copies[0], T, 256);
  assert_int_equal(zt_loader_init_data(&a, &d, 1, 9, &e), ZT_OK);
  assert_int_equal(zt_loader_init(&b, &t, 1, 9, &e), ZT_OK);
  same_order(&a, &b, T, 120);
  zt_loader_free(&a);
  zt_loader_free(&b);
  zt_tokens_close(&t);
  zt_data_close(&d);
  free(s.parts);
  /* weights that sum to nothing */
  const double zero[] = {0, 0};
  s = spec_of(2, zero, copies);
  assert_int_equal(zt_data_open(&d, &s, 2, T, 256, &e), ZT_EINPUT);
  assert_non_null(strstr(e.msg, "the blend weights sum to 0"));
  free(s.parts);
  free(seen);
  for (int i = 0; i < 3; i++) free(copies[i]);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_data_blend PATH/megatron_idx.py\n");
    return 2;
  }
  writer = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_megatron_read),
      cmocka_unit_test(test_megatron_bad),
      cmocka_unit_test(test_list_equals_concatenation),
      cmocka_unit_test(test_blend),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
