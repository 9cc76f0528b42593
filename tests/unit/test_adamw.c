/* test_adamw: the CPU backend's AdamW kernels (zt_cpu_*_adamw_p16, the
 * optimised loop of ops_impl.h) against the plain scalar statement of
 * AdamW they replaced, which is torch.optim.AdamW's single-tensor order of
 * operations: p, m, v, the 16-bit copy of p and the count of non-finite
 * weights must be the same bits and number, every build (float; bf16 and
 * fp16 copies; the float copy; double), over three chained steps on random
 * values with NaN, infinities, huge, zero and subnormal entries among them,
 * a clipping coefficient, on an uneven split over 3 threads and lengths
 * that leave the vector loops' tails. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <tgmath.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "src/core/half.h"
#include "src/core/rng.h"
#include "tests/unit/pool.h"

/* The loop as it was written before it was optimised, one element at a
 * time, in float and in double (tgmath's sqrt is sqrtf on float). */
#define REF_ADAMW(NAME, T)                                                            \
  static size_t NAME(T *p, const T *g, T *m, T *v, size_t n, const zt_adamw_args *a) { \
    T decay = a->decay, b1 = a->b1, c1 = a->c1, b2 = a->b2, c2 = a->c2;                \
    T eps = a->eps, step = a->step, bc2s = a->bc2_sqrt, gs = a->gscale;               \
    size_t bad = 0;                                                                    \
    for (size_t i = 0; i < n; i++) {                                                   \
      T gi = g[i] * gs;                                                                \
      p[i] *= decay;                                                                   \
      m[i] = b1 * m[i] + c1 * gi;                                                      \
      v[i] = b2 * v[i] + c2 * gi * gi;                                                 \
      p[i] -= step * m[i] / (sqrt(v[i]) / bc2s + eps);                                 \
      bad += !isfinite(p[i]);                                                          \
    }                                                                                  \
    return bad;                                                                        \
  }
REF_ADAMW(ref_adamw, float)
REF_ADAMW(ref_adamw_f64, double)

static float *frand(size_t n, const char *stream, float sd) {
  float *x = keep(malloc(n * sizeof(float)));
  zt_rng_normal_fill(zt_rng_key(13, stream), 0, (int64_t)n, sd, x);
  return x;
}
static void *dup(const void *x, size_t bytes) { return memcpy(keep(malloc(bytes)), x, bytes); }

/* Special values at a few fixed places: each makes some weight non-finite
 * or takes an edge of sqrt and the division. */
static void poison(float *p, float *g, float *m, float *v, size_t n) {
  g[3] = NAN, g[n / 2] = INFINITY, g[n - 1] = -INFINITY; /* NaN and inf weights */
  p[7] = INFINITY, p[n / 3] = -NAN;
  g[11] = 0, m[11] = -0.0f, v[11] = 0;                    /* 0 / eps */
  v[13] = FLT_MAX, g[13] = 3e19f;                         /* v overflows: m / inf = 0 */
  v[17] = 1e-40f, g[17] = 1e-30f, m[17] = 1e-41f;         /* subnormals */
  p[19] = 1e30f;                                          /* huge but finite */
}

/* Random p, m, g, v >= 0 (squares), and the special values. */
static void inputs(size_t n, float **p, float **g, float **m, float **v) {
  *p = frand(n, "p", 0.02f), *m = frand(n, "m", 1e-3f), *v = frand(n, "v", 1e-3f);
  *g = frand(n, "g1", 1e-2f);
  for (size_t i = 0; i < n; i++) (*v)[i] *= (*v)[i];
  poison(*p, *g, *m, *v, n);
}

static void expect_bits(const char *what, const void *got, const void *ref, size_t bytes) {
  size_t diff = 0;
  for (size_t i = 0; i < bytes; i++) diff += ((const char *)got)[i] != ((const char *)ref)[i];
  print_message("  %-28s %zu bytes, %zu differ\n", what, bytes, diff);
  assert_int_equal(diff, 0);
}

typedef size_t (*adamw16_fn)(float *, const float *, float *, float *, size_t,
                             const zt_adamw_args *, uint16_t *);

static zt_adamw_args step_args(int t) {
  return (zt_adamw_args){.decay = 1 - 6e-4f * 0.1f, .b1 = 0.9f, .c1 = 0.1f, .b2 = 0.95f,
                         .c2 = 0.05f, .eps = 1e-8f,
                         .step = (float)(6e-4 / (1 - pow(0.9, t))),
                         .bc2_sqrt = (float)sqrt(1 - pow(0.95, t)),
                         .gscale = t == 2 ? 0.37f : 1};
}

/* One build (fn16 with its rounding, or the float build with a float copy
 * or none) over three steps, on n elements. */
static void check(const char *name, size_t n, adamw16_fn fn16, uint16_t (*rnd16)(float),
                  int fcopy) {
  float *p, *g, *m, *v;
  inputs(n, &p, &g, &m, &v);
  float *rp = dup(p, n * 4), *rm = dup(m, n * 4), *rv = dup(v, n * 4);
  uint16_t *h = keep(calloc(n, 2)), *rh = keep(calloc(n, 2));
  float *f = keep(calloc(n, 4)), *rf = keep(calloc(n, 4));
  size_t bad = 0, rbad = 0;
  for (int t = 1; t <= 3; t++) {
    zt_adamw_args a = step_args(t);
    if (t > 1) {
      char s[8];
      snprintf(s, sizeof s, "g%d", t);
      g = frand(n, s, 1e-2f);
      g[5 * t] = NAN; /* new non-finite weights each step */
    }
    bad += fn16 ? fn16(p, g, m, v, n, &a, h)
                : fcopy ? zt_cpu_f32_adamw_p16(p, g, m, v, n, &a, f)
                        : zt_cpu_f32_adamw(p, g, m, v, n, &a);
    rbad += ref_adamw(rp, g, rm, rv, n, &a);
    for (size_t i = 0; i < n; i++) {
      if (fn16) rh[i] = rnd16(rp[i]);
      if (fcopy) rf[i] = rp[i];
    }
  }
  print_message("%s, n = %zu: %zu non-finite (reference %zu)\n", name, n, bad, rbad);
  assert_true(rbad >= 3); /* the poison did reach the count */
  assert_int_equal(bad, rbad);
  expect_bits("p", p, rp, n * 4);
  expect_bits("m", m, rm, n * 4);
  expect_bits("v", v, rv, n * 4);
  if (fn16) expect_bits("16-bit copy of p", h, rh, n * 2);
  if (fcopy) expect_bits("float copy of p", f, rf, n * 4);
}

/* Lengths: within one vector, one piece with a tail, and 8 pieces of
 * ZT_CHUNK (1024) split 3, 3, 2 over the 3 threads, the last with a tail. */
static const size_t lengths[] = {20, 45, 7 * 1024 + 37};

static void test_f32(void **state) {
  (void)state;
  for (int k = 0; k < 3; k++) {
    check("float", lengths[k], NULL, NULL, 0);
    check("float, float copy", lengths[k], NULL, NULL, 1);
  }
}

static void test_bf16(void **state) {
  (void)state;
  for (int k = 0; k < 3; k++)
    check("bf16 copy", lengths[k], zt_cpu_bf16_adamw_p16, zt_bf16_from_f32, 0);
}

static void test_f16(void **state) {
  (void)state;
  for (int k = 0; k < 3; k++)
    check("fp16 copy", lengths[k], zt_cpu_f16_adamw_p16, zt_f16_from_f32, 0);
}

static void test_f64(void **state) {
  (void)state;
  size_t n = lengths[2];
  float *pf, *gf, *mf, *vf;
  inputs(n, &pf, &gf, &mf, &vf);
  double *p = keep(malloc(n * 8)), *m = keep(malloc(n * 8)), *v = keep(malloc(n * 8));
  double *g = keep(malloc(n * 8));
  for (size_t i = 0; i < n; i++) p[i] = pf[i], m[i] = mf[i], v[i] = vf[i], g[i] = gf[i];
  double *rp = dup(p, n * 8), *rm = dup(m, n * 8), *rv = dup(v, n * 8);
  size_t bad = 0, rbad = 0;
  for (int t = 1; t <= 3; t++) {
    zt_adamw_args a = step_args(t);
    bad += zt_cpu_f64_adamw(p, g, m, v, n, &a);
    rbad += ref_adamw_f64(rp, g, rm, rv, n, &a);
  }
  print_message("double, n = %zu: %zu non-finite (reference %zu)\n", n, bad, rbad);
  assert_true(rbad >= 2);
  assert_int_equal(bad, rbad);
  expect_bits("p", p, rp, n * 8);
  expect_bits("m", m, rm, n * 8);
  expect_bits("v", v, rv, n * 8);
}

int main(void) {
  omp_set_num_threads(3);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_f32, free_pool),
      cmocka_unit_test_teardown(test_bf16, free_pool),
      cmocka_unit_test_teardown(test_f16, free_pool),
      cmocka_unit_test_teardown(test_f64, free_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
