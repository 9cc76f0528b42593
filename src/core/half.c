/* half: array conversions between float32 and 16-bit floats. Plain loops
 * over the inline scalar conversions of half.h, which GCC vectorises. */
#include "src/core/half.h"

void zt_bf16_from_f32_n(uint16_t *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = zt_bf16_from_f32(src[i]);
}

void zt_bf16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = zt_bf16_to_f32(src[i]);
}

void zt_f16_from_f32_n(uint16_t *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = zt_f16_from_f32(src[i]);
}

void zt_f16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = zt_f16_to_f32(src[i]);
}
