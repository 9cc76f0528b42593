/* half: 16-bit floats held as their bit patterns (uint16_t), and exact
 * conversions to and from float32. bf16 is float32's upper half (8-bit
 * exponent, 7-bit mantissa); fp16 is IEEE binary16 (5-bit exponent, 10-bit
 * mantissa, largest finite 65504).
 *
 * float -> 16 bit rounds to nearest, ties to even, as IEEE and PyTorch do;
 * fp16 overflows to infinity from 65520 (the midpoint between 65504 and
 * 2^16, which ties away from the odd 65504) and rounds into its subnormals
 * (down to 2^-24) exactly. 16 bit -> float is exact. A NaN stays a NaN in
 * every direction, made quiet (as F16C's and ARM's instructions do), with
 * the leading payload bits that fit kept.
 *
 * Pure integer bit manipulation, so the result never depends on the
 * floating-point environment (rounding mode, flush-to-zero) or on the CPU
 * having F16C; the scalar functions are inline so that loops over arrays
 * (half.c, the collectives' reduction operators) vectorise. */
#ifndef ZT_HALF_H
#define ZT_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t zt_half_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float zt_half_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* c ? a : b by masks: GCC turns a chain of ?: back into branches it then
 * cannot vectorise (a PHI of more than four values). */
static inline uint32_t zt_half_pick(int c, uint32_t a, uint32_t b) {
  uint32_t k = 0u - (uint32_t)(c != 0);
  return (a & k) | (b & ~k);
}

/* float32 -> bfloat16, round to nearest, ties to even. */
static inline uint16_t zt_bf16_from_f32(float x) {
  uint32_t u = zt_half_bits(x);
  /* a NaN is not rounded: carrying its low bits could make it infinity */
  uint32_t nan = (u >> 16) | 0x40;
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

static inline float zt_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  uint32_t quiet = (b & 0x7fffu) > 0x7f80u ? 0x00400000u : 0;
  return zt_half_float(u | quiet);
}

/* float32 -> IEEE binary16, round to nearest, ties to even. Every case is
 * computed and one picked, so that array loops vectorise. */
static inline uint16_t zt_f16_from_f32(float x) {
  uint32_t u = zt_half_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  /* normal results: rebias the exponent (127 -> 15), drop 13 mantissa
   * bits; a carry out of the mantissa rightly bumps the exponent */
  uint32_t nr = a - (112u << 23);
  uint32_t nq = nr >> 13, nrem = nr & 0x1fffu;
  nq += (nrem > 0x1000u) | ((nrem == 0x1000u) & nq);
  /* below 2^-14: a multiple of 2^-24, the significand (hidden bit made
   * explicit) shifted right by 126 - exponent, 14..24 for the inputs that
   * take this case (the clamps keep the shift defined for the others) */
  uint32_t e = a >> 23, sh = e < 102 ? 24 : e > 112 ? 14 : 126 - e;
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t sq = m >> sh, srem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
  sq += (srem > half) | ((srem == half) & sq);
  uint32_t r = zt_half_pick(a >= 0x38800000u, nq, sq);
  r = zt_half_pick(a < 0x33000000u, 0, r);        /* 2^-25 itself ties to 0 in sq */
  r = zt_half_pick(a >= 0x477ff000u, 0x7c00u, r); /* from 65520 up, and infinity */
  r = zt_half_pick(a > 0x7f800000u, 0x7e00u | ((a >> 13) & 0x3ffu), r);
  return (uint16_t)(sign | r);
}

static inline float zt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t normal = ((e + 112u) << 23) | (m << 13);
  uint32_t special = 0x7f800000u | (m << 13) | ((uint32_t)(m != 0) << 22); /* inf, NaN */
  /* subnormals are m * 2^-24 = 2^p * (m / 2^p), p = floor(log2 m), found
   * by comparisons rather than float arithmetic, which GCC will not
   * vectorise under a condition (it might trap) */
  uint32_t p = 0;
  for (int k = 1; k < 10; k++) p += m >> k != 0;
  uint32_t sub = m ? ((p + 103u) << 23) | ((m << (23 - p)) & 0x7fffffu) : 0;
  uint32_t r = e == 0 ? sub : e == 31 ? special : normal;
  return zt_half_float(sign | r);
}

/* The same over arrays of n elements (dst and src must not overlap). */
void zt_bf16_from_f32_n(uint16_t *restrict dst, const float *restrict src, size_t n);
void zt_bf16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n);
void zt_f16_from_f32_n(uint16_t *restrict dst, const float *restrict src, size_t n);
void zt_f16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n);

#endif
