/* test_rng: the counter-based generator of src/core/rng.h. Philox-4x32-10
 * against Random123's published known-answer vectors (directly where our
 * counter packing can express the vector, otherwise through an independent
 * textbook implementation that is itself checked against all of them);
 * the normals against the same Box-Muller computed in long double with
 * libm; their distribution (moments, tail fractions, Kolmogorov-Smirnov
 * against the exact normal) and that of zt_rng_below, within 5 standard
 * errors; determinism: a value depends on (seed, stream name, index) only,
 * and distinct names give distinct streams; the batch fill equals single
 * draws bit for bit; and model initialisation gives the same bits for any
 * thread count and any cut of a tensor. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/core/rng.h"
#include "src/model/model.h"

/* Random123 tests/kat_vectors, "philox4x32 10": counter[4], key[2],
 * expected[4]. Only the first has counter words 2 and 3 zero, which is all
 * zt_rng_philox's 64-bit counter can express. */
static const uint32_t kat[3][10] = {
    {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
     0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
    {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
     0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
    {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
     0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
};

/* Philox4x32-10 as written in Salmon et al. (SC'11), full 128-bit counter:
 * ten rounds, the key bumped by the Weyl constants between rounds. Kept
 * deliberately different in shape from rng.c (mulhilo helper, explicit
 * round function) so that the two do not share a mistake. */
static uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}
static void ref_round(uint32_t c[4], const uint32_t k[2]) {
  uint32_t hi0, hi1;
  uint32_t lo0 = mulhilo(0xD2511F53u, c[0], &hi0);
  uint32_t lo1 = mulhilo(0xCD9E8D57u, c[2], &hi1);
  uint32_t out[4] = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  memcpy(c, out, sizeof out);
}
static void ref_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c[4], k[2] = {key[0], key[1]};
  memcpy(c, ctr, sizeof c);
  for (int r = 0; r < 10; r++) {
    if (r) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    ref_round(c, k);
  }
  memcpy(out, c, sizeof c);
}

static void test_philox_kat(void **state) {
  (void)state;
  uint32_t out[4];
  /* the all-zero vector straight through the library */
  zt_rng_philox(0, 0, out);
  for (int i = 0; i < 4; i++) assert_int_equal(out[i], kat[0][6 + i]);

  /* the reference reproduces every published vector ... */
  for (int v = 0; v < 3; v++) {
    ref_philox(kat[v], kat[v] + 4, out);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], kat[v][6 + i]);
  }

  /* ... so it can vouch for the library on counters and keys that no
   * published vector covers: ctr packed as words (low, high, 0, 0), key as
   * (low, high). The first cases pin the packing order down. */
  const uint64_t fixed[][2] = {
      {0, 1}, {0, (uint64_t)1 << 32}, {1, 0}, {(uint64_t)1 << 32, 0},
      {UINT64_MAX, UINT64_MAX}, {0xa4093822299f31d0u, 0x85a308d3243f6a88u}};
  uint64_t s = 0x243f6a8885a308d3u;
  for (int t = 0; t < 1006; t++) {
    uint64_t key, ctr;
    if (t < 6) {
      key = fixed[t][0];
      ctr = fixed[t][1];
    } else { /* splitmix64: arbitrary inputs independent of the code under test */
      uint64_t z = (s += 0x9E3779B97F4A7C15u);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
      key = z ^ (z >> 31);
      ctr = key * 0x2545F4914F6CDD1Du + (uint64_t)t;
    }
    uint32_t c4[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), 0, 0};
    uint32_t k2[2] = {(uint32_t)key, (uint32_t)(key >> 32)}, want[4];
    ref_philox(c4, k2, want);
    zt_rng_philox(key, ctr, out);
    assert_memory_equal(out, want, sizeof want);
  }
}

/* The normals are Box-Muller on the Philox words of counter i / 2: cos
 * for even i, sin for odd. Recomputed here with libm in long double (64-bit
 * mantissa) from the words of the reference Philox, the float result must
 * be that value rounded, or its neighbour when the exact value lies within
 * rounding noise of the midpoint between two floats: rng.c's own log, cos
 * and sin are good to about a double ulp. Counts both and bounds the
 * second. Also pins the values down: a change of the formula fails here. */
static void test_normal_reference(void **state) {
  (void)state;
  enum { n = 200000 };
  uint64_t key = zt_rng_key(1234, "test.reference");
  const long double pi = acosl(-1.0L);
  long exact = 0, near = 0;
  for (int i = 0; i < n; i++) {
    uint64_t ctr = (uint64_t)i >> 1;
    if (i >= n / 2) ctr += ((uint64_t)1 << 32) - n / 4; /* also counters past 2^32 */
    uint32_t c4[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), 0, 0};
    uint32_t k2[2] = {(uint32_t)key, (uint32_t)(key >> 32)}, w[4];
    ref_philox(c4, k2, w);
    uint64_t x1 = (uint64_t)w[0] << 21 | w[1] >> 11, x2 = (uint64_t)w[2] << 21 | w[3] >> 11;
    long double u1 = (x1 + 1.0L) / 9007199254740992.0L, u2 = (x2 + 0.5L) / 9007199254740992.0L;
    long double rad = sqrtl(-2.0L * logl(u1)), a = 2.0L * pi * u2;
    long double want = rad * (i & 1 ? sinl(a) : cosl(a));
    float got = zt_rng_normal(key, (uint64_t)(i >= n / 2 ? 2 * ctr + (i & 1) : (uint64_t)i));
    float r = (float)want;
    if (got == r) {
      exact++;
      continue;
    }
    /* not the rounded value: then the neighbour on the far side of a
     * midpoint that `want` is within 1e-15 (relative) of */
    float other = nextafterf(r, want > r ? INFINITY : -INFINITY);
    long double mid = ((long double)r + other) / 2;
    assert_true(got == other);
    assert_true(fabsl(want - mid) <= 1e-15L * fabsl(want));
    near++;
  }
  print_message("  %ld of %d exactly the rounded long double value, %ld the neighbour "
                "across a midpoint\n", exact, n, near);
  assert_true(near <= 2);
}

/* Exact normal CDF and tail probability. */
static double phi(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

/* 2e6 standard normals (through the fill, which the scalar draws match):
 * mean (se 1/sqrt(n)), variance (se sqrt(2/n)), skewness (se sqrt(6/n)),
 * excess kurtosis (se sqrt(24/n)), P(|x| > t) for t = 1..4 against the
 * exact normal (se sqrt(p(1-p)/n)), no correlation between neighbours,
 * whether of one Philox block (cos and sin halves) or of two (se
 * 1/sqrt(n/2) each): each within 5 standard errors. Kolmogorov-Smirnov
 * against the exact CDF: D sqrt(n) < 1.95 (p = 0.001). Then the range:
 * the 53-bit uniform bounds |x| by sqrt(2 ln 2^53) = 8.57. */
static void test_normal_distribution(void **state) {
  (void)state;
  enum { n = 2000000, bins = 4096 };
  float *x = malloc(n * sizeof *x);
  assert_non_null(x);
  uint64_t key = zt_rng_key(1234, "test.normal");
  zt_rng_normal_fill(key, 0, n, 1.0f, x);
  double m1 = 0, m2 = 0, m3 = 0, m4 = 0, lag_in = 0, lag_across = 0, lo = INFINITY, hi = -INFINITY;
  long tail[5] = {0};
  long *hist = calloc(bins, sizeof *hist);
  assert_non_null(hist);
  for (int i = 0; i < n; i++) m1 += x[i];
  m1 /= n;
  for (int i = 0; i < n; i++) {
    double v = x[i], d = v - m1;
    assert_true(isfinite(v));
    m2 += d * d, m3 += d * d * d, m4 += d * d * d * d;
    for (int t = 1; t <= 4; t++) tail[t] += fabs(v) > t;
    if (i + 1 < n) *(i & 1 ? &lag_across : &lag_in) += v * x[i + 1];
    lo = fmin(lo, v), hi = fmax(hi, v);
    /* CDF on a fine grid: bin k holds Phi(x) in [k/bins, (k+1)/bins) */
    int k = (int)(phi(v) * bins);
    hist[k < 0 ? 0 : k >= bins ? bins - 1 : k]++;
  }
  m2 /= n, m3 /= n, m4 /= n;
  double skew = m3 / pow(m2, 1.5), kurt = m4 / (m2 * m2) - 3;
  double ks = 0;
  long cum = 0;
  for (int k = 0; k < bins; k++) { /* sup |F_n - Phi|, at the bin edges */
    cum += hist[k];
    ks = fmax(ks, fabs((double)cum / n - (double)(k + 1) / bins));
  }
  print_message("  mean %.5f var %.5f skew %.4f kurt %.4f lag %.5f %.5f range [%.2f, %.2f] "
                "KS sqrt(n) D %.3f\n", m1, m2, skew, kurt, lag_in / (n / 2), lag_across / (n / 2),
                lo, hi, ks * sqrt(n));
  assert_true(fabs(m1) <= 5 / sqrt(n));
  assert_true(fabs(m2 - 1) <= 5 * sqrt(2.0 / n));
  assert_true(fabs(skew) <= 5 * sqrt(6.0 / n));
  assert_true(fabs(kurt) <= 5 * sqrt(24.0 / n));
  for (int t = 1; t <= 4; t++) {
    double p = 2 * phi(-t), f = (double)tail[t] / n;
    print_message("  P(|x| > %d) %.6f, exact %.6f\n", t, f, p);
    assert_true(fabs(f - p) <= 5 * sqrt(p * (1 - p) / n));
  }
  assert_true(fabs(lag_in / (n / 2)) <= 5 / sqrt(n / 2));
  assert_true(fabs(lag_across / (n / 2)) <= 5 / sqrt(n / 2));
  /* the bin width adds at most 1/bins to D */
  assert_true((ks - 1.0 / bins) * sqrt(n) < 1.95);
  /* P(max < 4.5) over 2e6 draws is ~e^-14 */
  assert_true(lo < -4.5 && hi > 4.5 && lo > -8.58 && hi < 8.58);
  free(hist);
  free(x);
}

/* Uniform integers: always in range, and for n = 10 the counts pass a
 * chi-square test (9 dof: mean 9, sd sqrt(18); 9 + 5 sd ~ 30). */
static void test_below(void **state) {
  (void)state;
  enum { draws = 100000, k = 10 };
  uint64_t key = zt_rng_key(7, "test.below");
  long count[k] = {0};
  for (int i = 0; i < draws; i++) {
    uint64_t v = zt_rng_below(key, (uint64_t)i, k);
    assert_true(v < k);
    count[v]++;
  }
  double chi2 = 0, e = (double)draws / k;
  for (int b = 0; b < k; b++) chi2 += (count[b] - e) * (count[b] - e) / e;
  print_message("  chi2 over %d bins: %.2f\n", k, chi2);
  assert_true(chi2 <= 9 + 5 * sqrt(18.0));

  /* the edges: n = 1 can only give 0; huge n stays below n and also reaches
   * its upper half (the high bits are used, not only the low 32) */
  uint64_t big[] = {1000003, (uint64_t)1 << 33, ((uint64_t)1 << 63) + 12345, UINT64_MAX};
  for (int i = 0; i < 1000; i++) assert_true(zt_rng_below(key, (uint64_t)i, 1) == 0);
  for (size_t b = 0; b < sizeof big / sizeof *big; b++) {
    int upper = 0;
    for (int i = 0; i < 1000; i++) {
      uint64_t v = zt_rng_below(key, (uint64_t)i, big[b]);
      assert_true(v < big[b]);
      upper += v >= big[b] / 2;
    }
    assert_true(upper > 400 && upper < 600); /* 5 sd of Binomial(1000, 1/2) ~ 79 */
  }
}

/* A value is a pure function of (seed, name, index): the same triple gives
 * the same bits however it is reached, and changing any part changes the
 * stream. This is what makes initialisation independent of the topology. */
static void test_determinism(void **state) {
  (void)state;
  uint64_t ka = zt_rng_key(42, "model.wte"), kb = zt_rng_key(42, "model.wpe");
  assert_true(ka == zt_rng_key(42, "model.wte"));
  assert_true(ka != kb);
  assert_true(ka != zt_rng_key(43, "model.wte"));
  assert_true(zt_rng_key(42, "") != zt_rng_key(43, ""));

  /* reading the stream backwards, or one element alone, gives the same
   * values as reading it forwards */
  enum { n = 1000 };
  float fwd[n];
  for (int i = 0; i < n; i++) fwd[i] = zt_rng_normal(ka, (uint64_t)i);
  for (int i = n - 1; i >= 0; i--) {
    float again = zt_rng_normal(zt_rng_key(42, "model.wte"), (uint64_t)i);
    assert_memory_equal(&again, &fwd[i], sizeof again);
  }
  assert_true(zt_rng_below(ka, 17, 1000003) == zt_rng_below(ka, 17, 1000003));

  /* another name, another seed, or a neighbouring index: no shared values */
  uint64_t kc = zt_rng_key(43, "model.wte");
  int same_name = 0, same_seed = 0, same_next = 0;
  for (int i = 0; i < n; i++) {
    same_name += zt_rng_normal(kb, (uint64_t)i) == fwd[i];
    same_seed += zt_rng_normal(kc, (uint64_t)i) == fwd[i];
    same_next += i + 1 < n && fwd[i + 1] == fwd[i];
  }
  assert_int_equal(same_name, 0);
  assert_int_equal(same_seed, 0);
  assert_int_equal(same_next, 0);

  /* indices beyond 2^32 are distinct counters, not wrapped ones */
  uint64_t far = (uint64_t)1 << 32;
  assert_true(zt_rng_normal(ka, far) != zt_rng_normal(ka, 0));
  assert_true(zt_rng_normal(ka, far + 5) != zt_rng_normal(ka, 5));
}

/* The fill is the single draws, bit for bit, scaled in float, for runs
 * that start and end on either half of a block, from empty to long, and
 * across the counter's 32-bit boundary (index 2^33). */
static void test_fill_matches_single(void **state) {
  (void)state;
  uint64_t key = zt_rng_key(5, "test.fill");
  float out[1200];
  const uint64_t firsts[] = {0, 1, 2, 7, 1000001, ((uint64_t)1 << 33) - 37, ((uint64_t)1 << 33) - 36};
  const int64_t lens[] = {0, 1, 2, 3, 4, 15, 16, 17, 31, 64, 1111};
  const float scales[] = {1.0f, 0.02f, -3.5f};
  for (size_t f = 0; f < sizeof firsts / sizeof *firsts; f++)
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++)
      for (size_t c = 0; c < sizeof scales / sizeof *scales; c++) {
        int64_t n = lens[l];
        out[n] = 12345.0f; /* a fill writes exactly n values */
        zt_rng_normal_fill(key, firsts[f], n, scales[c], out);
        for (int64_t i = 0; i < n; i++) {
          float want = scales[c] * zt_rng_normal(key, firsts[f] + (uint64_t)i);
          assert_memory_equal(&out[i], &want, sizeof want);
        }
        assert_true(out[n] == 12345.0f);
      }
}

/* A stand-in model: only what zt_model_init_weights reads (the parameter
 * table, the flat buffer, the backend), with tensors that are whole or
 * cut as TP cuts them: rows, rows in 3 groups (gpt's fused qkv), columns
 * (runs that start on odd logical indices), the middle dim of a 3-D
 * tensor, several tens of thousands of elements (many chunks), and
 * constant inits. */
static zt_tensor_desc desc(const char *name, int ndim, const int64_t *shape, int dim, int index,
                           int count, int groups, int64_t offset) {
  zt_tensor_desc t = {.dtype = ZT_F32, .ndim = ndim, .shard = {dim, index, count, groups},
                      .offset = offset};
  snprintf(t.name, sizeof t.name, "%s", name);
  memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
  int64_t ls[ZT_MAX_DIMS];
  zt_shard_local_shape(&t, ls);
  t.numel = 1;
  for (int i = 0; i < ndim; i++) t.numel *= ls[i];
  return t;
}

static void test_init_any_threads_any_cut(void **state) {
  (void)state;
  const int64_t s2[] = {301, 250}, s3[] = {12, 90, 37}, s1[] = {333}, big[] = {60000};
  struct { const char *name; int ndim; const int64_t *shape; int dim, count, groups;
           zt_init_kind init; } spec[] = {
      {"whole", 2, s2, -1, 1, 1, ZT_INIT_NORMAL},
      {"rows", 2, s3 + 1, 0, 2, 1, ZT_INIT_NORMAL},
      {"qkv", 2, (const int64_t[]){6 * 7, 33}, 0, 2, 3, ZT_INIT_NORMAL},
      {"cols", 2, s2, 1, 5, 1, ZT_INIT_NORMAL},
      {"mid", 3, s3, 1, 3, 1, ZT_INIT_NORMAL},
      {"big", 1, big, -1, 1, 1, ZT_INIT_NORMAL},
      {"ones", 1, s1, -1, 1, 1, ZT_INIT_ONES},
      {"zeros", 1, s1, -1, 1, 1, ZT_INIT_ZEROS},
  };
  enum { np = sizeof spec / sizeof *spec };
  const zt_backend *be = zt_backend_cpu();
  const int cuts = 5, threads[] = {1, 2, 3, 7};
  for (int index = 0; index < cuts; index++) { /* the piece of TP rank `index` */
    zt_param params[np];
    int64_t off = 0;
    for (int i = 0; i < np; i++) {
      int count = spec[i].count, idx = count > 1 ? index % count : 0;
      params[i] = (zt_param){desc(spec[i].name, spec[i].ndim, spec[i].shape, spec[i].dim, idx,
                                  count, spec[i].groups, off),
                             spec[i].init, 0.02f, 1};
      off += params[i].t.numel;
    }
    params[2].here = index != 3; /* a tensor another stage holds stays untouched */
    float *first = NULL;
    for (size_t th = 0; th < sizeof threads / sizeof *threads; th++) {
      zt_model m = {0};
      m.be = be;
      m.params = params;
      m.n_params = np;
      m.stream = be->stream_new();
      float *w = be->alloc(ZT_MEM_DEVICE, (size_t)off * sizeof(float));
      assert_non_null(w);
      omp_set_num_threads(threads[th]);
      zt_err e;
      assert_int_equal(zt_model_init_weights(&m, 77, w, 0, off, &e), ZT_OK);
      if (!first) {
        first = w;
        /* the values: each element that of its logical index */
        for (int i = 0; i < np; i++) {
          const zt_param *p = &params[i];
          uint64_t key = zt_rng_key(77, p->t.name);
          for (int64_t j = 0; j < p->t.numel; j++) {
            float want = !p->here                   ? 0.0f
                         : p->init == ZT_INIT_ONES  ? 1.0f
                         : p->init == ZT_INIT_ZEROS ? 0.0f
                         : p->std * zt_rng_normal(key, (uint64_t)zt_shard_global_index(&p->t, j));
            assert_memory_equal(&first[p->t.offset + j], &want, sizeof want);
          }
        }
      } else {
        assert_memory_equal(w, first, (size_t)off * sizeof(float));
        /* any flat range alone (a ZeRO shard): exactly its slice of the
         * whole, cut inside tensors and across them */
        const int64_t lo = off / 3 + th, hi = off - off / 5 - 7 * (int64_t)th;
        float *part = be->alloc(ZT_MEM_DEVICE, (size_t)(hi - lo) * sizeof(float));
        assert_non_null(part);
        assert_int_equal(zt_model_init_weights(&m, 77, part, lo, hi, &e), ZT_OK);
        assert_memory_equal(part, first + lo, (size_t)(hi - lo) * sizeof(float));
        be->free(ZT_MEM_DEVICE, part);
        be->free(ZT_MEM_DEVICE, w);
      }
      be->stream_free(m.stream);
    }
    be->free(ZT_MEM_DEVICE, first);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_kat),
      cmocka_unit_test(test_normal_reference),
      cmocka_unit_test(test_normal_distribution),
      cmocka_unit_test(test_below),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_fill_matches_single),
      cmocka_unit_test(test_init_any_threads_any_cut),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
