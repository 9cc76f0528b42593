/* f16_simd: fp16 arrays to and from float on F16C's instructions where the
 * compiler targets them (vcvtph2ps, exact; vcvtps2ph with round to nearest
 * even named in the instruction, not taken from MXCSR), else half.h's
 * loops. The same bits as src/core/half.h's conversions, NaNs included
 * (test_half_ops compares every fp16 pattern one way and every fp16
 * value's neighbourhood and 2^20 random floats the other), at memory
 * speed where half.h's integer emulation of fp16 costs about three times
 * a bf16 conversion: the fp16 GEMMs and attention widen and round every
 * operand through these. */
#ifndef ZT_CPU_F16_SIMD_H
#define ZT_CPU_F16_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/half.h"

#ifdef __F16C__
#include <immintrin.h>

static inline void zt_f16_to_f32_fast_n(float *restrict dst, const uint16_t *restrict src,
                                        size_t n) {
  size_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#endif
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++) dst[i] = zt_f16_to_f32(src[i]);
}

static inline void zt_f16_from_f32_fast_n(uint16_t *restrict dst, const float *restrict src,
                                          size_t n) {
  size_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) dst[i] = zt_f16_from_f32(src[i]);
}
#else
#define zt_f16_to_f32_fast_n zt_f16_to_f32_n
#define zt_f16_from_f32_fast_n zt_f16_from_f32_n
#endif

#endif
