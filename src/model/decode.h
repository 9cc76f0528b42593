/* decode: incremental decoding with a KV cache, for `ztrain sample`. The
 * model's passes (layers.c) run whole micro-batches of seq rows; decoding
 * runs only the new rows, n at a time (the prompt in one or a few calls,
 * then one token a step), at positions pos .. pos + n - 1: each block
 * writes its new qkv rows into its cache, [seq, qkv_rows] per layer, and
 * attention reads the keys and values of every position so far from
 * there (zt_backend.attn_decode). The arithmetic is layers.c's for
 * tp = 1, in the same order, so the logits equal the full forward's up to
 * the GEMMs' and attention's summation order. One sequence, one process
 * (tp = 1, pp = 1); the weights are lent, not owned. */
#ifndef ZT_MODEL_DECODE_H
#define ZT_MODEL_DECODE_H

#include "src/model/model.h"

typedef struct zt_decode {
  const zt_model *m; /* its layout: parameter table and sizes (tp = 1) */
  const zt_backend *be;
  zt_stream *stream;
  zt_dtype dt;       /* activations, weights and cache: m->cfg.precision */
  const void *w;     /* the flat weights, in dt (device) */
  int cap;           /* rows one call takes at most */
  int pos;           /* positions in the cache */
  void *cache;       /* [layers][seq][qkv_rows], dt */
  void *x, *ln, *att, *mid, *fc, *act, *logits; /* [cap, ...] scratch */
  float *stats, *cs, *host_cs; /* norm statistics [2, cap]; rope rows [cap, hd] */
  float *logits32;   /* [cap, vocab] fp32 (16-bit runs convert into it) */
  int32_t *tok;      /* [cap] */
} zt_decode;

/* A decoder over model layout m (zt_model_layout or zt_model_init at
 * tp = 1, all blocks) with flat weights w (m->numel elements of
 * m->cfg.precision, device memory of be), taking up to `cap` rows a call
 * (1 <= cap <= seq). ZT_ERUNTIME when out of memory. */
int zt_decode_init(zt_decode *d, const zt_model *m, const zt_backend *be, const void *w, int cap,
                   zt_err *e);
void zt_decode_free(zt_decode *d);

/* Runs tokens[0..n) (host) at positions d->pos .. d->pos + n - 1 and
 * advances d->pos; 1 <= n <= cap and d->pos + n <= seq (ZT_EINPUT
 * otherwise, nothing run). Writes to host `logits` the fp32 logits of the
 * last `rows` new positions ([rows, vocab], 1 <= rows <= n): 1 to sample
 * the next token, n to see every position. */
int zt_decode_step(zt_decode *d, const int32_t *tokens, int n, int rows, float *logits,
                   zt_err *e);

#endif
