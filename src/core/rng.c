/* rng: Philox-4x32-10 (Salmon et al., SC'11), the generator behind
 * cuRAND and JAX, so a CUDA backend can produce the same numbers.
 *
 * Normals are Box-Muller in double, both halves: one Philox block gives
 * the normals of elements 2k and 2k+1. The log, cos and sin are our own
 * (fdlibm's algorithms as in FreeBSD's msun), not libm's: libm's are
 * opaque calls that keep the loop scalar (three quarters of a GPT-2 124M
 * start-up went there), and their last bits differ between libm versions
 * and CPU dispatch paths. These are plain IEEE double operations, so they
 * give the same bits on every machine, vectorised or not, at any vector
 * width; this file is compiled with -ffp-contract=off, since a fused
 * multiply-add where one machine has FMA and another does not would
 * change values. Each is within about one double ulp, far below the
 * float the result is rounded to. */
#include "src/core/rng.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

uint64_t zt_rng_key(uint64_t seed, const char *stream) {
  return XXH64(stream, strlen(stream), seed);
}

/* Philox's round keys depend on the key only: computed once per fill,
 * they are loop invariants that the vectorised loop broadcasts. */
typedef struct { uint64_t k0[10], k1[10]; } round_keys;

static inline round_keys round_keys_of(uint64_t key) {
  round_keys rk;
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
    rk.k0[r] = k0;
    rk.k1[r] = k1;
  }
  return rk;
}

/* Counter words (low, high, 0, 0). The 32-bit words live in 64-bit
 * integers so that the whole normal transform below runs in 64-bit
 * lanes: with 32-bit words GCC packs and unpacks lanes around every
 * product, 20% slower. */
static inline void philox(const round_keys *rk, uint64_t ctr, uint64_t out[4]) {
  const uint64_t lo = 0xffffffffu;
  uint64_t c0 = ctr & lo, c1 = ctr >> 32, c2 = 0, c3 = 0;
#pragma GCC unroll 10
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = 0xD2511F53u * c0, p1 = 0xCD9E8D57u * c2;
    uint64_t n0 = (p1 >> 32) ^ c1 ^ rk->k0[r], n1 = p1 & lo;
    uint64_t n2 = (p0 >> 32) ^ c3 ^ rk->k1[r], n3 = p0 & lo;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

void zt_rng_philox(uint64_t key, uint64_t ctr, uint32_t out[4]) {
  round_keys rk = round_keys_of(key);
  uint64_t w[4];
  philox(&rk, ctr, w);
  for (int i = 0; i < 4; i++) out[i] = (uint32_t)w[i];
}

static inline uint64_t bits_of(double x) {
  uint64_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

static inline double double_of(uint64_t b) {
  double x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* Exact conversion of an integer below 2^52 by the 2^52 trick: integer
 * lanes only, so it vectorises without AVX-512DQ's 64-bit conversions. */
static inline double double_of_small(uint64_t w) {
  return double_of(0x4330000000000000u | w) - 0x1p52;
}

/* log(x) for x in [2^-53, 1] (normal, positive): fdlibm's e_log.c without
 * its special cases, all of which lie outside that range, and with one of
 * its two final formulas (the one it uses for most arguments; the error
 * stays below one ulp). */
static inline double log_unit(double x) {
  const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10,
               Lg1 = 6.666666666666735130e-01, Lg2 = 3.999999999940941908e-01,
               Lg3 = 2.857142874366239149e-01, Lg4 = 2.222219843214978396e-01,
               Lg5 = 1.818357216161805012e-01, Lg6 = 1.531383769920937332e-01,
               Lg7 = 1.479819860511658591e-01;
  uint64_t b = bits_of(x);
  uint64_t hx = (b >> 32) & 0x000fffff;
  /* mantissa m in [sqrt(2)/2, sqrt(2)), x = 2^k m */
  uint64_t i = (hx + 0x95f64) & 0x100000;
  double m = double_of(((hx | (i ^ 0x3ff00000)) << 32) | (b & 0xffffffffu));
  uint64_t kb = (b >> 52) + (i >> 20); /* k + 1023 */
  double k = double_of(0x4330000000000000u | kb) - (0x1p52 + 1023.0);
  double f = m - 1.0, s = f / (2.0 + f), z = s * s, w = z * z;
  double t1 = w * (Lg2 + w * (Lg4 + w * Lg6));
  double t2 = z * (Lg1 + w * (Lg3 + w * (Lg5 + w * Lg7)));
  double R = t2 + t1, hfsq = 0.5 * f * f;
  return k * ln2_hi - ((hfsq - (s * (hfsq + R) + k * ln2_lo)) - f);
}

/* cos(x) and sin(x) for |x| <= pi/4: FreeBSD's k_cos.c and k_sin.c
 * (minimax polynomials, error below one ulp), without their tail
 * argument: the angle below is reduced exactly. */
static inline double kernel_cos(double x) {
  const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
               C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
               C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
  double z = x * x, w = z * z;
  double r = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6));
  double hz = 0.5 * z, v = 1.0 - hz;
  return v + (((1.0 - v) - hz) + z * r);
}

static inline double kernel_sin(double x) {
  const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
               S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
               S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
  double z = x * x, w = z * z;
  double r = S2 + z * (S3 + z * S4) + z * w * (S5 + z * S6);
  return x + z * x * (S1 + z * r);
}

/* The two normals of counter `ctr`: Box-Muller on 53-bit uniforms from
 * its four words, u1 = (x1 + 1) / 2^53 in (0, 1] so that log never sees
 * zero, and the angle 2 pi u2 with u2 = (x2 + 0.5) / 2^53. The angle is
 * reduced by pi/2 exactly, in integers: 4 u2 = n + r with n the nearest
 * integer and r in (-1/2, 1/2), so the kernels see y = r pi/2 with one
 * rounding. */
typedef struct { float c, s; } normal_pair;

static inline normal_pair normals_at(const round_keys *rk, uint64_t ctr) {
  uint64_t w[4];
  philox(rk, ctr, w);
  double u1 = (double_of_small(w[0]) * 0x1p21 + double_of_small((w[1] >> 11) + 1)) * 0x1p-53;
  double rad = sqrt(-2.0 * log_unit(u1));
  uint64_t x2 = (w[2] << 21) | (w[3] >> 11);
  uint64_t n = (x2 + ((uint64_t)1 << 50)) >> 51;     /* 0..4 */
  uint64_t d = x2 + ((uint64_t)1 << 51) - (n << 51); /* 2^51 r - 1/2, + 2^51 */
  double r = (double_of(0x4330000000000000u | d) - (0x1p52 + 0x1p51) + 0.5) * 0x1p-51;
  double y = r * 1.57079632679489661923;
  double c = kernel_cos(y), s = kernel_sin(y);
  /* (cos, sin)(n pi/2 + y) = (c, s), (-s, c), (-c, -s), (s, -c) for n mod 4 = 0..3 */
  uint64_t cb = bits_of(n & 1 ? s : c) ^ (((n + 1) & 2) << 62);
  uint64_t sb = bits_of(n & 1 ? c : s) ^ ((n & 2) << 62);
  return (normal_pair){(float)(rad * double_of(cb)), (float)(rad * double_of(sb))};
}

/* Element i is the cos half of counter i / 2 when i is even, the sin half
 * when odd: one Philox block, one log and one sqrt give two values. */
float zt_rng_normal(uint64_t key, uint64_t idx) {
  round_keys rk = round_keys_of(key);
  normal_pair p = normals_at(&rk, idx >> 1);
  return idx & 1 ? p.s : p.c;
}

void zt_rng_normal_fill(uint64_t key, uint64_t first, int64_t n, float scale, float *out) {
  if (n <= 0) return;
  round_keys rk = round_keys_of(key);
  int64_t i = 0;
  if (first & 1) /* a run may start with a sin half ... */
    out[i++] = scale * normals_at(&rk, first >> 1).s;
  uint64_t ctr = (first + 1) >> 1;
  int64_t pairs = (n - i) / 2;
  for (int64_t p = 0; p < pairs; p++) { /* the loop that vectorises */
    normal_pair v = normals_at(&rk, ctr + (uint64_t)p);
    out[i + 2 * p] = scale * v.c;
    out[i + 2 * p + 1] = scale * v.s;
  }
  i += 2 * pairs;
  if (i < n) /* ... and end with a cos half */
    out[i] = scale * normals_at(&rk, ctr + (uint64_t)pairs).c;
}

uint64_t zt_rng_below(uint64_t key, uint64_t idx, uint64_t n) {
  uint32_t w[4];
  zt_rng_philox(key, idx, w);
  uint64_t x = ((uint64_t)w[0] << 32) | w[1];
  /* Bias is n / 2^64: below anything a sample order could show. */
  return (uint64_t)(((unsigned __int128)x * n) >> 64);
}
