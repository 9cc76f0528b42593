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

/* Standard normal for element `idx` of the stream: Box-Muller on the block
 * of counter idx / 2, its cos half for even idx and its sin half for odd
 * (since issue 10; before, one block per element and libm's log and cos,
 * so the same seed now gives other weights). The same bits on every
 * machine and at any vector width. */
float zt_rng_normal(uint64_t key, uint64_t idx);

/* out[i] = scale * zt_rng_normal(key, first + i) for i in [0, n), the
 * product rounded in float: the same bits as n single calls, computed
 * several counters at a time. A piece of a tensor is one call per run of
 * consecutive logical indices (zt_shard_runs). */
void zt_rng_normal_fill(uint64_t key, uint64_t first, int64_t n, float scale, float *out);

/* Uniform integer in [0, n) for draw `idx` of the stream. */
uint64_t zt_rng_below(uint64_t key, uint64_t idx, uint64_t n);

#endif
