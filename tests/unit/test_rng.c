/* test_rng: the counter-based generator of src/core/rng.h. Philox-4x32-10
 * against Random123's published known-answer vectors (directly where our
 * counter packing can express the vector, otherwise through an independent
 * textbook implementation that is itself checked against all of them);
 * statistics of zt_rng_normal and zt_rng_below with tolerances of 5 standard
 * errors; and determinism: a value depends on (seed, stream name, index)
 * only, and distinct names give distinct streams. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "src/core/rng.h"

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

/* 1e5 standard normals: mean (se 1/sqrt(n)), variance (se sqrt(2/n)),
 * P(|x| < 1) = 0.6827 (se sqrt(p(1-p)/n)), and no correlation between
 * neighbouring indices (se 1/sqrt(n)): each within 5 standard errors. */
static void test_normal_moments(void **state) {
  (void)state;
  enum { n = 100000 };
  uint64_t key = zt_rng_key(1234, "test.normal");
  double sum = 0, sq = 0, inside = 0, lag = 0, prev = zt_rng_normal(key, 0);
  double lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; i++) {
    double x = zt_rng_normal(key, (uint64_t)i);
    assert_true(isfinite(x));
    sum += x;
    sq += x * x;
    inside += fabs(x) < 1;
    if (i) lag += x * prev;
    prev = x;
    lo = fmin(lo, x);
    hi = fmax(hi, x);
  }
  double mean = sum / n, var = sq / n - mean * mean, p1 = 0.682689492137;
  print_message("  mean %.4f var %.4f P(|x|<1) %.4f lag-1 corr %.4f range [%.2f, %.2f]\n",
                mean, var, inside / n, lag / (n - 1), lo, hi);
  assert_true(fabs(mean) <= 5 / sqrt(n));
  assert_true(fabs(var - 1) <= 5 * sqrt(2.0 / n));
  assert_true(fabs(inside / n - p1) <= 5 * sqrt(p1 * (1 - p1) / n));
  assert_true(fabs(lag / (n - 1)) <= 5 / sqrt(n));
  /* tails exist (P(max < 3.5) over 1e5 draws is ~e^-23) but stay sane */
  assert_true(lo < -3.5 && hi > 3.5 && lo > -7 && hi < 7);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_kat),
      cmocka_unit_test(test_normal_moments),
      cmocka_unit_test(test_below),
      cmocka_unit_test(test_determinism),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
