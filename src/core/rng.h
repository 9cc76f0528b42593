/* rng: counter-based randomness (Philox-4x32-10). A value depends only on
 * (seed, stream name, element index), never on which rank draws it or in
 * which order, so a model initialised on 64 ranks is bit-identical to the
 * one initialised on 1. */
#ifndef ZT_RNG_H
#define ZT_RNG_H

#include <stdint.h>

/* 64-bit key for a named stream under a seed. */
uint64_t zt_rng_key(uint64_t seed, const char *stream);

/* Four uniform 32-bit words for counter `ctr` under `key`. */
void zt_rng_philox(uint64_t key, uint64_t ctr, uint32_t out[4]);

/* Standard normal for element `idx` of the stream (Box-Muller on one block). */
float zt_rng_normal(uint64_t key, uint64_t idx);

/* Uniform integer in [0, n) for draw `idx` of the stream. */
uint64_t zt_rng_below(uint64_t key, uint64_t idx, uint64_t n);

#endif
