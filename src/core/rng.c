/* rng: Philox-4x32-10 (Salmon et al., SC'11), the generator behind
 * cuRAND and JAX, so a CUDA backend can produce the same numbers. */
#include "src/core/rng.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

uint64_t zt_rng_key(uint64_t seed, const char *stream) {
  return XXH64(stream, strlen(stream), seed);
}

void zt_rng_philox(uint64_t key, uint64_t ctr, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

float zt_rng_normal(uint64_t key, uint64_t idx) {
  uint32_t w[4];
  zt_rng_philox(key, idx, w);
  /* 53-bit uniforms in (0, 1]: log() never sees zero. */
  double u1 = ((((uint64_t)w[0] << 21) ^ (w[1] >> 11)) + 1.0) / 9007199254740992.0;
  double u2 = ((((uint64_t)w[2] << 21) ^ (w[3] >> 11)) + 0.5) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t zt_rng_below(uint64_t key, uint64_t idx, uint64_t n) {
  uint32_t w[4];
  zt_rng_philox(key, idx, w);
  uint64_t x = ((uint64_t)w[0] << 32) | w[1];
  /* Bias is n / 2^64: below anything a sample order could show. */
  return (uint64_t)(((unsigned __int128)x * n) >> 64);
}
