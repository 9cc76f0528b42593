/* test_half: the float32 <-> bf16 / fp16 conversions (src/core/half.h).
 *   - Widening, all 65536 patterns of each format: the float is the value
 *     the format defines (computed here with ldexp from sign, exponent and
 *     mantissa), a NaN stays a NaN, made quiet with its payload; narrowing
 *     it again gives the pattern back exactly (a signalling NaN comes back
 *     quiet).
 *   - Narrowing against a reference written independently of the bit
 *     tricks: the nearest value of the format found by binary search over
 *     its patterns in double, ties to the even pattern, |x| past the
 *     midpoint between the largest finite value and the next power of two
 *     to infinity. Inputs: for every finite pattern and both signs, its
 *     value, its midpoint with the next pattern (the ties), and one float
 *     ulp either side of both; 2^20 random bit patterns; named cases at the
 *     overflow boundary, the subnormal range and 2^-25.
 *   - fp16 narrowing over all 2^32 float patterns against GCC's _Float16
 *     conversion where the compiler has the type (GCC 12 on x86-64: with
 *     -march=native on an F16C CPU that is the vcvtps2ph instruction,
 *     otherwise libgcc's soft-float __truncsfhf2), NaNs included.
 *   - The array versions agree with the scalar ones. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/half.h"
#include "src/core/rng.h"

/* One 16-bit format: field widths and its conversions under test. */
typedef struct {
  const char *name;
  int mbits, ebits, bias;
  uint16_t (*narrow)(float);
  float (*widen)(uint16_t);
  void (*narrow_n)(uint16_t *restrict, const float *restrict, size_t);
  void (*widen_n)(float *restrict, const uint16_t *restrict, size_t);
} format;

static const format BF16 = {"bf16", 7, 8, 127, zt_bf16_from_f32, zt_bf16_to_f32,
                            zt_bf16_from_f32_n, zt_bf16_to_f32_n};
static const format F16 = {"fp16", 10, 5, 15, zt_f16_from_f32, zt_f16_to_f32,
                           zt_f16_from_f32_n, zt_f16_to_f32_n};

static uint16_t inf_of(const format *f) { return (uint16_t)(((1u << f->ebits) - 1) << f->mbits); }
static uint16_t quiet_of(const format *f) { return (uint16_t)(1u << (f->mbits - 1)); }
static int is_nan16(const format *f, uint16_t h) { return (h & 0x7fffu) > inf_of(f); }

/* The value of a non-negative pattern by the format's definition; the
 * infinity pattern stands for 2^(emax+1), the place it takes when
 * rounding (so that the largest finite value's midpoint with it is where
 * overflow starts, and the tie goes to it: its mantissa is even). */
static double value_of(const format *f, uint32_t h) {
  int e = (int)(h >> f->mbits);
  double m = (double)(h & ((1u << f->mbits) - 1));
  if (e == 0) return ldexp(m, 1 - f->bias - f->mbits);
  return ldexp(1.0 + ldexp(m, -f->mbits), e - f->bias);
}

/* A random 32-bit pattern: draw idx of the stream. */
static uint32_t random_bits(uint64_t key, uint64_t idx) {
  uint32_t w[4];
  zt_rng_philox(key, idx, w);
  return w[0];
}

static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float ffrom(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* Round to nearest, ties to even, by search: the largest pattern not above
 * |x|, then the nearer of it and the next one. Not for NaN. */
static uint16_t reference(const format *f, float x) {
  double ax = fabs((double)x);
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  uint32_t inf = inf_of(f);
  if (ax >= value_of(f, inf)) return sign | (uint16_t)inf;
  uint32_t lo = 0, hi = inf; /* value(lo) <= ax < value(hi) */
  while (hi - lo > 1) {
    uint32_t mid = (lo + hi) / 2;
    if (value_of(f, mid) <= ax) lo = mid;
    else hi = mid;
  }
  double dlo = ax - value_of(f, lo), dhi = value_of(f, hi) - ax; /* exact */
  uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
  return sign | (uint16_t)r;
}

/* What narrowing must give: the reference, or for a NaN a quiet NaN with
 * the sign and the leading payload bits that fit. */
static uint16_t expected(const format *f, float x) {
  uint32_t u = fbits(x);
  if (!isnan(x)) return reference(f, x);
  int drop = 23 - f->mbits;
  uint32_t payload = (u & 0x7fffffu) >> drop;
  return (uint16_t)(((u >> 16) & 0x8000u) | inf_of(f) | quiet_of(f) | payload);
}

static int failures_shown;

static void check_narrow(const format *f, float x, int *bad) {
  uint16_t want = expected(f, x), got = f->narrow(x);
  if (got == want) return;
  if (failures_shown++ < 20)
    printf("  %s(%a = 0x%08x): got 0x%04x, want 0x%04x\n", f->name, (double)x, fbits(x), got,
           want);
  (*bad)++;
}

static void widen_all(const format *f) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float x = f->widen((uint16_t)h);
    uint16_t back = f->narrow(x);
    if (is_nan16(f, (uint16_t)h)) {
      uint32_t want = ((h & 0x8000u) << 16) | 0x7fc00000u |
                      ((h & ((1u << f->mbits) - 1)) << (23 - f->mbits));
      bad += !isnan(x) || fbits(x) != want || back != (h | quiet_of(f));
      continue;
    }
    double v = value_of(f, h & 0x7fffu);
    if ((h & 0x7fffu) == inf_of(f)) v = INFINITY;
    if (h & 0x8000u) v = -v;
    bad += (double)x != v || !!signbit(x) != !!(h & 0x8000u) || back != h;
  }
  printf("  %s: all 65536 patterns widened and narrowed back, %d wrong\n", f->name, bad);
  assert_int_equal(bad, 0);
}

static void test_widen_bf16(void **state) {
  (void)state;
  widen_all(&BF16);
}

static void test_widen_f16(void **state) {
  (void)state;
  widen_all(&F16);
}

/* Every finite pattern's value, its midpoint with the next (the ties) and
 * one float ulp either side of both, both signs; random bit patterns. */
static void narrow_sweep(const format *f) {
  int bad = 0, n = 0;
  for (uint32_t h = 0; h < inf_of(f); h++) {
    double v = value_of(f, h), mid = (v + value_of(f, h + 1)) / 2;
    float pts[2] = {(float)v, (float)mid}; /* both exact in float */
    assert_true((double)pts[0] == v && (double)pts[1] == mid);
    for (int k = 0; k < 2; k++)
      for (int s = 0; s < 2; s++) {
        float x = s ? -pts[k] : pts[k];
        check_narrow(f, x, &bad);
        check_narrow(f, nextafterf(x, INFINITY), &bad);
        check_narrow(f, nextafterf(x, -INFINITY), &bad);
        n += 3;
      }
  }
  uint64_t key = zt_rng_key(11, f->name);
  for (uint64_t i = 0; i < (1u << 20); i++, n++)
    check_narrow(f, ffrom(random_bits(key, i)), &bad);
  printf("  %s: %d values narrowed against the reference, %d wrong\n", f->name, n, bad);
  assert_int_equal(bad, 0);
}

static void test_narrow_bf16(void **state) {
  (void)state;
  narrow_sweep(&BF16);
}

static void test_narrow_f16(void **state) {
  (void)state;
  narrow_sweep(&F16);
}

/* The boundaries by name, so that a failure says which rule broke. */
static void test_named_cases(void **state) {
  (void)state;
  struct { const format *f; uint32_t in; uint16_t out; const char *what; } c[] = {
      {&F16, 0x477fe000, 0x7bff, "65504, the largest fp16"},
      {&F16, 0x477fefff, 0x7bff, "just below 65520"},
      {&F16, 0x477ff000, 0x7c00, "65520 ties to infinity (65504 is odd)"},
      {&F16, 0x47800000, 0x7c00, "65536"},
      {&F16, 0x7f7fffff, 0x7c00, "FLT_MAX"},
      {&F16, 0xff800000, 0xfc00, "-inf"},
      {&F16, 0x38800000, 0x0400, "2^-14, the smallest normal"},
      {&F16, 0x387fffff, 0x0400, "just below 2^-14 rounds up to it"},
      {&F16, 0x33800000, 0x0001, "2^-24, the smallest subnormal"},
      {&F16, 0x33000000, 0x0000, "2^-25 ties to zero"},
      {&F16, 0x33000001, 0x0001, "just above 2^-25"},
      {&F16, 0x33c00000, 0x0002, "1.5 * 2^-24 ties to 2"},
      {&F16, 0x34200000, 0x0002, "2.5 * 2^-24 ties to 2"},
      {&F16, 0x80000001, 0x8000, "the smallest negative float subnormal"},
      {&F16, 0x3f801000, 0x3c00, "1 + 2^-11 ties to 1"},
      {&F16, 0x3f803000, 0x3c02, "1 + 3 * 2^-11 ties to 1 + 2^-9"},
      {&F16, 0x7f800001, 0x7e00, "a signalling NaN comes back quiet"},
      {&F16, 0xffc00000, 0xfe00, "-NaN keeps its sign"},
      {&BF16, 0x7f7f7fff, 0x7f7f, "below the last bf16 midpoint"},
      {&BF16, 0x7f7f8000, 0x7f80, "the last midpoint ties to infinity"},
      {&BF16, 0x7f7fffff, 0x7f80, "FLT_MAX"},
      {&BF16, 0x3f808000, 0x3f80, "1 + 2^-8 ties to 1"},
      {&BF16, 0x3f818000, 0x3f82, "1 + 3 * 2^-8 ties up"},
      {&BF16, 0x00008000, 0x0000, "a float subnormal ties to zero"},
      {&BF16, 0x00018000, 0x0002, "a float subnormal ties to 2"},
      {&BF16, 0x7f800001, 0x7fc0, "a NaN whose payload is all low bits stays NaN"},
      {&BF16, 0xff80ffff, 0xffc0, "-NaN keeps its sign"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    uint16_t got = c[i].f->narrow(ffrom(c[i].in));
    if (got != c[i].out) {
      printf("  %s %s (0x%08x): got 0x%04x, want 0x%04x\n", c[i].f->name, c[i].what, c[i].in,
             got, c[i].out);
      bad++;
    }
    check_narrow(c[i].f, ffrom(c[i].in), &bad); /* the reference agrees */
  }
  assert_int_equal(bad, 0);
}

/* The array versions (the vectorised loops) against the scalar ones over
 * random patterns and every 16-bit pattern. */
static void test_arrays(void **state) {
  (void)state;
  enum { N = 65536 };
  float *x = malloc(N * sizeof *x), *w = malloc(N * sizeof *w);
  uint16_t *h = malloc(N * sizeof *h), *all = malloc(N * sizeof *all);
  assert_non_null(x && w && h && all);
  uint64_t key = zt_rng_key(12, "arrays");
  for (uint32_t i = 0; i < N; i++) {
    x[i] = ffrom(random_bits(key, i));
    all[i] = (uint16_t)i;
  }
  const format *fs[2] = {&BF16, &F16};
  for (int k = 0; k < 2; k++) {
    const format *f = fs[k];
    int bad = 0;
    f->narrow_n(h, x, N);
    for (int i = 0; i < N; i++) bad += h[i] != f->narrow(x[i]);
    f->widen_n(w, all, N);
    for (int i = 0; i < N; i++) bad += fbits(w[i]) != fbits(f->widen(all[i]));
    printf("  %s: array and scalar conversions, %d differ\n", f->name, bad);
    assert_int_equal(bad, 0);
  }
  free(x);
  free(w);
  free(h);
  free(all);
}

#ifdef __FLT16_MAX__
/* All 2^32 floats, in blocks, through the array conversion and _Float16. */
static void test_f16_all_floats(void **state) {
  (void)state;
  enum { N = 1 << 16 };
  float *x = malloc(N * sizeof *x);
  uint16_t *got = malloc(N * sizeof *got);
  assert_non_null(x && got);
  uint64_t bad = 0;
  for (uint64_t base = 0; base < (1ull << 32); base += N) {
    for (uint32_t i = 0; i < N; i++) x[i] = ffrom((uint32_t)(base + i));
    zt_f16_from_f32_n(got, x, N);
    for (uint32_t i = 0; i < N; i++) {
      _Float16 r = (_Float16)x[i];
      uint16_t want;
      memcpy(&want, &r, sizeof want);
      if (got[i] != want) {
        if (bad < 10)
          printf("  fp16(0x%08x): got 0x%04x, _Float16 0x%04x\n", (uint32_t)(base + i), got[i],
                 want);
        bad++;
      }
    }
  }
  printf("  fp16: all 2^32 floats against _Float16, %llu differ\n", (unsigned long long)bad);
  assert_true(bad == 0);
  free(x);
  free(got);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_widen_bf16),  cmocka_unit_test(test_widen_f16),
      cmocka_unit_test(test_narrow_bf16), cmocka_unit_test(test_narrow_f16),
      cmocka_unit_test(test_named_cases), cmocka_unit_test(test_arrays),
#ifdef __FLT16_MAX__
      cmocka_unit_test(test_f16_all_floats),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
