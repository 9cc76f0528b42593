/* ops_impl: the CPU backend's math, written once for a generic compute type
 * `real` and a storage type `store`. ops_f32.c instantiates it as the
 * backend; ops_f64.c in double so that tests check these very loops against
 * central finite differences without float rounding in the way; ops_bf16.c
 * and ops_f16.c hold activations and compute weights in 16 bits and compute
 * in float (mixed precision).
 *
 * The includer defines REAL, FN(name) and GEMM (cblas_sgemm's arguments, on
 * real), and for a 16-bit build also STORE (uint16_t) with LD(x) (store ->
 * real, exact), ST(v) (real -> store, round to nearest even) and LD_N/ST_N,
 * their array versions (ST_BY_ARRAY: ST_N is much the faster in a loop).
 * Without STORE, store is real.
 *
 * What is store and what stays real (kernels.h's contract): activations,
 * the weights an op reads and input gradients are store; norm statistics,
 * attention's lse, losses, cross-entropy stats and every parameter gradient
 * an op accumulates are real. A 16-bit op widens its inputs once (a row,
 * a chunk, a head, a GEMM panel), computes on them as the f32 build does
 * and rounds each result once, so every 16-bit output is the f32 build's
 * output on the same values rounded once, and every real one is the f32
 * build's; an input gradient accumulated (+=) is widened, added in real
 * and rounded once. Where store is real, LD, ST and the row helpers below
 * hand back what they are given, so the f32 and f64 builds compute what
 * they did before storage had a type of its own.
 *
 * Plain loops with shape comments, OpenMP over rows; reductions over rows
 * (parameter gradients) are split over columns instead, so no two threads
 * write the same element. The GEMMs are in gemm_impl.h (included below);
 * attention, tiled, is in attn_impl.h, which each includer includes right
 * after this file. */
#include <cblas.h>
#include <tgmath.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

typedef REAL real;
#ifdef STORE
typedef STORE store;
#else
typedef REAL store;
#define LD(x) (x)
#define ST(v) (v)
#define LD_N(d, s, n) memcpy(d, s, sizeof(real) * (n))
#define ST_N(d, s, n) memcpy(d, s, sizeof(real) * (n))
#endif

/* EXP and TANH come from the includer: libm in the double build (the
 * reference the gradient checks need), zt_expf/zt_tanhf below in the float
 * builds. libm's scalar expf/tanhf were a third of a small model's step;
 * these vectorise. */
#ifndef ZT_FAST_MATH_DEFINED
#define ZT_FAST_MATH_DEFINED
/* e^x: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, and Cephes'
 * degree-6 polynomial for e^r; max error about 2 ulp. The clamp keeps
 * 2^n a normal float (results below 1e-38 and above 2e38 saturate). */
static inline float zt_expf(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  float n = floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
  return p * scale.f;
}

/* tanh from e^2x; near 0 the absolute error is a few 1e-8, which is all
 * GELU sees (it uses 1 + tanh). */
static inline float zt_tanhf(float x) { return 1.0f - 2.0f / (zt_expf(2.0f * x) + 1.0f); }
#endif

#include "kernels/cpu/gemm_impl.h"

/* Runs body(c0, c1) on disjoint column ranges, one per thread. */
#define ZT_COLUMN_SPLIT(C, ...)                                   \
  _Pragma("omp parallel") {                                       \
    int nt_ = omp_get_num_threads(), id_ = omp_get_thread_num(); \
    int c0 = (int)((int64_t)(C) * id_ / nt_);                     \
    int c1 = (int)((int64_t)(C) * (id_ + 1) / nt_);               \
    __VA_ARGS__                                                   \
  }

/* Rows [v0, v0 + Vl) of the table are here (all of it with v0 = 0, Vl = V;
 * a vocab-parallel shard otherwise). A token outside that range belongs to
 * another shard: its row is 0 here (plus the position), and the caller's sum
 * over shards adds exactly one token row, so the result is bit-identical to
 * the whole-table lookup. One call a step: the scalar LD and ST do. */
void FN(embed_fwd)(store *out, const int32_t *tok, const store *wte,
                   const store *wpe, int B, int T, int C, int v0, int Vl) {
  /* out[B*T, C] */
#pragma omp parallel for
  for (int n = 0; n < B * T; n++) {
    int v = tok[n] - v0;
    const store *e = v >= 0 && v < Vl ? wte + (size_t)v * C : NULL;
    const store *p = wpe ? wpe + (size_t)(n % T) * C : NULL;
    store *o = out + (size_t)n * C;
    if (e && p)
      for (int c = 0; c < C; c++) o[c] = ST(LD(e[c]) + LD(p[c]));
    else if (e || p)
      memcpy(o, e ? e : p, sizeof(store) * C);
    else
      memset(o, 0, sizeof(store) * C);
  }
}

void FN(embed_bwd)(real *dwte, real *dwpe, const int32_t *tok,
                   const store *dout, int B, int T, int C, int v0, int Vl) {
  ZT_COLUMN_SPLIT(C, {
    for (int n = 0; n < B * T; n++) {
      const store *d = dout + (size_t)n * C;
      int v = tok[n] - v0;
      if (v >= 0 && v < Vl) {
        real *e = dwte + (size_t)v * C;
        for (int c = c0; c < c1; c++) e[c] += LD(d[c]);
      }
      if (dwpe) {
        real *p = dwpe + (size_t)(n % T) * C;
        for (int c = c0; c < c1; c++) p[c] += LD(d[c]);
      }
    }
  })
}

/* Rows as real. The 16-bit builds widen a row (or a chunk of a flat array)
 * once into a thread's buffer, compute on it in real and round it back
 * once (FN(put)); where store is real, these hand back the array itself
 * and do nothing, so those builds run the loops they always ran. Two
 * reasons: sums along a row must run on real rows, since a vectorised sum
 * over 16-bit loads groups its partial sums otherwise (another vector
 * length) than the same sum over floats, and the 16-bit builds'
 * statistics are to be the float build's bits on the same values; and
 * array conversions run at memory speed (F16C's instructions for fp16),
 * where fp16's scalar LD and ST are an integer emulation.
 *   FN(rows)(k, C)          a thread's k rows of C reals (none: NULL)
 *   FN(row)(buf, i, x, C)   x as real, read only (widened into row i)
 *   FN(rowrw)(buf, i, x, C) x as real, to update (widened into row i)
 *   FN(rowout)(buf, i, x)   where to compute x (row i; not read)
 *   FN(put)(x, r, C)        r rounded into x (nothing where r is x) */
#define ZT_CHUNK 1024 /* elements of a flat array per widened piece */
#ifdef STORE
static real *FN(rows)(int k, size_t C) {
  real *p = malloc(sizeof(real) * (size_t)k * (C ? C : 1));
  if (!p) {
    fprintf(stderr, "ztrain: no memory for %d rows of %zu reals\n", k, C);
    abort();
  }
  return p;
}
static inline real *FN(rowrw)(real *buf, int i, const store *x, size_t C) {
  real *r = buf + (size_t)i * C;
  LD_N(r, x, C);
  return r;
}
static inline const real *FN(row)(real *buf, int i, const store *x, size_t C) {
  return FN(rowrw)(buf, i, x, C);
}
static inline real *FN(rowout)(real *buf, int i, size_t C, store *x) {
  (void)x;
  return buf + (size_t)i * C;
}
static inline void FN(put)(store *x, const real *r, size_t C) { ST_N(x, r, C); }
#else
static real *FN(rows)(int k, size_t C) {
  (void)k, (void)C;
  return NULL;
}
static inline real *FN(rowrw)(real *buf, int i, real *x, size_t C) {
  (void)buf, (void)i, (void)C;
  return x;
}
static inline const real *FN(row)(real *buf, int i, const real *x, size_t C) {
  (void)buf, (void)i, (void)C;
  return x;
}
static inline real *FN(rowout)(real *buf, int i, size_t C, real *x) {
  (void)buf, (void)i, (void)C;
  return x;
}
static inline void FN(put)(real *x, const real *r, size_t C) { (void)x, (void)r, (void)C; }
#endif

/* The norms' parameter gradients, column-split: dw += dout * xhat with
 * xhat = (x - mean) rstd, and db += dout (LayerNorm); RMSNorm has no mean
 * (NULL: x - 0 is x exactly) and no bias (db NULL). */
static void FN(norm_dw)(real *dw, real *db, const store *dout, const store *x,
                        const real *mean, const real *rstd, int N, int C) {
  ZT_COLUMN_SPLIT(C, {
    real *buf = FN(rows)(2, c1 - c0);
    for (int n = 0; n < N; n++) {
      const real *d = FN(row)(buf, 0, dout + (size_t)n * C + c0, c1 - c0);
      const real *xr = FN(row)(buf, 1, x + (size_t)n * C + c0, c1 - c0);
      real m = mean ? mean[n] : 0, s = rstd[n];
      for (int c = c0; c < c1; c++) dw[c] += d[c - c0] * (xr[c - c0] - m) * s;
      if (db)
        for (int c = c0; c < c1; c++) db[c] += d[c - c0];
    }
    free(buf);
  })
}

void FN(layernorm_fwd)(store *out, real *mean, real *rstd, const store *x,
                       const store *w, const store *b, int N, int C, real eps) {
  real *wb = FN(rows)(2, C);
  const real *wr = FN(row)(wb, 0, w, C), *br = FN(row)(wb, 1, b, C);
#pragma omp parallel
  {
    real *buf = FN(rows)(2, C);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *xr = FN(row)(buf, 0, x + (size_t)n * C, C);
      real *o = FN(rowout)(buf, 1, C, out + (size_t)n * C);
      real m = 0, v = 0;
#pragma omp simd reduction(+ : m)
      for (int c = 0; c < C; c++) m += xr[c];
      m /= C;
#pragma omp simd reduction(+ : v)
      for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
      v /= C;
      real s = 1 / sqrt(v + eps);
      for (int c = 0; c < C; c++) o[c] = (xr[c] - m) * s * wr[c] + br[c];
      FN(put)(out + (size_t)n * C, o, C);
      mean[n] = m;
      rstd[n] = s;
    }
    free(buf);
  }
  free(wb);
}

void FN(layernorm_bwd)(store *dx, real *dw, real *db, const store *dout,
                       const store *x, const store *w, const real *mean,
                       const real *rstd, int N, int C) {
  real *wb = FN(rows)(1, C);
  const real *wr = FN(row)(wb, 0, w, C);
#pragma omp parallel
  {
    real *buf = FN(rows)(3, C);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *d = FN(row)(buf, 0, dout + (size_t)n * C, C);
      const real *xr = FN(row)(buf, 1, x + (size_t)n * C, C);
      real m = mean[n], s = rstd[n];
      real g_mean = 0, g_norm_mean = 0; /* mean(dout*w), mean(dout*w*xhat) */
#pragma omp simd reduction(+ : g_mean, g_norm_mean)
      for (int c = 0; c < C; c++) {
        real g = d[c] * wr[c];
        g_mean += g;
        g_norm_mean += g * (xr[c] - m) * s;
      }
      g_mean /= C;
      g_norm_mean /= C;
      real *dxr = FN(rowrw)(buf, 2, dx + (size_t)n * C, C);
      for (int c = 0; c < C; c++) {
        real xhat = (xr[c] - m) * s;
        dxr[c] += (d[c] * wr[c] - g_mean - xhat * g_norm_mean) * s;
      }
      FN(put)(dx + (size_t)n * C, dxr, C);
    }
    free(buf);
  }
  free(wb);
  FN(norm_dw)(dw, db, dout, x, mean, rstd, N, C);
}

void FN(rmsnorm_fwd)(store *out, real *rstd, const store *x, const store *w,
                     int N, int C, real eps) {
  real *wb = FN(rows)(1, C);
  const real *wr = FN(row)(wb, 0, w, C);
#pragma omp parallel
  {
    real *buf = FN(rows)(2, C);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *xr = FN(row)(buf, 0, x + (size_t)n * C, C);
      real *o = FN(rowout)(buf, 1, C, out + (size_t)n * C);
      real ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int c = 0; c < C; c++) ss += xr[c] * xr[c];
      real s = 1 / sqrt(ss / C + eps);
      for (int c = 0; c < C; c++) o[c] = xr[c] * s * wr[c];
      FN(put)(out + (size_t)n * C, o, C);
      rstd[n] = s;
    }
    free(buf);
  }
  free(wb);
}

void FN(rmsnorm_bwd)(store *dx, real *dw, const store *dout, const store *x,
                     const store *w, const real *rstd, int N, int C) {
  real *wb = FN(rows)(1, C);
  const real *wr = FN(row)(wb, 0, w, C);
#pragma omp parallel
  {
    real *buf = FN(rows)(3, C);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *d = FN(row)(buf, 0, dout + (size_t)n * C, C);
      const real *xr = FN(row)(buf, 1, x + (size_t)n * C, C);
      real s = rstd[n], dot = 0; /* dot = sum(dout*w*x) */
#pragma omp simd reduction(+ : dot)
      for (int c = 0; c < C; c++) dot += d[c] * wr[c] * xr[c];
      real k = dot * s * s / C;
      real *dxr = FN(rowrw)(buf, 2, dx + (size_t)n * C, C);
      for (int c = 0; c < C; c++) dxr[c] += s * (d[c] * wr[c] - xr[c] * k);
      FN(put)(dx + (size_t)n * C, dxr, C);
    }
    free(buf);
  }
  free(wb);
  FN(norm_dw)(dw, NULL, dout, x, NULL, rstd, N, C);
}

void FN(bias_fwd)(store *y, const store *b, int N, int C) {
  real *bb = FN(rows)(1, C);
  const real *br = FN(row)(bb, 0, b, C);
#pragma omp parallel
  {
    real *buf = FN(rows)(1, C);
#pragma omp for
    for (int n = 0; n < N; n++) {
      real *yr = FN(rowrw)(buf, 0, y + (size_t)n * C, C);
      for (int c = 0; c < C; c++) yr[c] += br[c];
      FN(put)(y + (size_t)n * C, yr, C);
    }
    free(buf);
  }
  free(bb);
}

void FN(bias_bwd)(real *db, const store *dy, int N, int C) {
  ZT_COLUMN_SPLIT(C, {
    real *buf = FN(rows)(1, c1 - c0);
    for (int n = 0; n < N; n++) {
      const real *d = FN(row)(buf, 0, dy + (size_t)n * C + c0, c1 - c0);
      for (int c = c0; c < c1; c++) db[c] += d[c - c0];
    }
    free(buf);
  })
}

#define GELU_K ((real)0.7978845608028654) /* sqrt(2/pi) */

/* Flat arrays go in pieces of ZT_CHUNK, each widened once (FN(row)). */
#define ZT_CHUNKS(n, k, ...)                                   \
  _Pragma("omp parallel") {                                    \
    real *buf = FN(rows)(k, ZT_CHUNK);                         \
    _Pragma("omp for") for (size_t i0 = 0; i0 < (n); i0 += ZT_CHUNK) { \
      size_t len = (n) - i0 < ZT_CHUNK ? (n) - i0 : ZT_CHUNK;  \
      __VA_ARGS__                                              \
    }                                                          \
    free(buf);                                                 \
  }

void FN(gelu_fwd)(store *y, const store *x, size_t n) {
  ZT_CHUNKS(n, 2, {
    const real *xr = FN(row)(buf, 0, x + i0, len);
    real *yr = FN(rowout)(buf, 1, ZT_CHUNK, y + i0);
    for (size_t i = 0; i < len; i++) {
      real v = xr[i];
      yr[i] = (real)0.5 * v * (1 + TANH(GELU_K * (v + (real)0.044715 * v * v * v)));
    }
    FN(put)(y + i0, yr, len);
  })
}

void FN(gelu_bwd)(store *dx, const store *x, const store *dy, size_t n) {
  ZT_CHUNKS(n, 3, {
    const real *xr = FN(row)(buf, 0, x + i0, len), *dyr = FN(row)(buf, 1, dy + i0, len);
    real *dxr = FN(rowout)(buf, 2, ZT_CHUNK, dx + i0);
    for (size_t i = 0; i < len; i++) {
      real v = xr[i];
      real u = GELU_K * (v + (real)0.044715 * v * v * v);
      real t = TANH(u);
      real du = GELU_K * (1 + 3 * (real)0.044715 * v * v);
      dxr[i] = dyr[i] * ((real)0.5 * (1 + t) + (real)0.5 * v * (1 - t * t) * du);
    }
    FN(put)(dx + i0, dxr, len);
  })
}

void FN(swiglu_fwd)(store *h, const store *gu, int N, int F) {
#pragma omp parallel
  {
    real *buf = FN(rows)(3, F);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *g = FN(row)(buf, 0, gu + (size_t)n * 2 * F, F);
      const real *u = FN(row)(buf, 1, gu + (size_t)n * 2 * F + F, F);
      real *hr = FN(rowout)(buf, 2, F, h + (size_t)n * F);
      for (int f = 0; f < F; f++) hr[f] = g[f] / (1 + EXP(-g[f])) * u[f];
      FN(put)(h + (size_t)n * F, hr, F);
    }
    free(buf);
  }
}

void FN(swiglu_bwd)(store *dgu, const store *gu, const store *dh, int N, int F) {
#pragma omp parallel
  {
    real *buf = FN(rows)(5, F);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *g = FN(row)(buf, 0, gu + (size_t)n * 2 * F, F);
      const real *u = FN(row)(buf, 1, gu + (size_t)n * 2 * F + F, F);
      const real *d = FN(row)(buf, 2, dh + (size_t)n * F, F);
      real *dg = FN(rowout)(buf, 3, F, dgu + (size_t)n * 2 * F);
      real *du = FN(rowout)(buf, 4, F, dgu + (size_t)n * 2 * F + F);
      for (int f = 0; f < F; f++) {
        real sig = 1 / (1 + EXP(-g[f]));
        du[f] = d[f] * g[f] * sig;
        dg[f] = d[f] * u[f] * sig * (1 + g[f] * (1 - sig));
      }
      FN(put)(dgu + (size_t)n * 2 * F, dg, F);
      FN(put)(dgu + (size_t)n * 2 * F + F, du, F);
    }
    free(buf);
  }
}

/* Rotates pairs (i, i + hd/2) of each of the first nh heads by +angle
 * (dir = 1) or -angle (dir = -1, the transpose, for backward); the rest of
 * the row is not touched. The cos and sin tables stay real: the model
 * computes them, no activation. */
static void FN(rope_apply)(store *x, const real *cs, int N, int T, int nh,
                           int hd, int rs, real dir) {
  int half = hd / 2;
  const real *cosv = cs, *sinv = cs + (size_t)T * half;
#pragma omp parallel
  {
    real *buf = FN(rows)(1, (size_t)nh * hd);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *co = cosv + (size_t)(n % T) * half;
      const real *si = sinv + (size_t)(n % T) * half;
      real *xr = FN(rowrw)(buf, 0, x + (size_t)n * rs, (size_t)nh * hd);
      for (int h = 0; h < nh; h++) {
        real *a = xr + (size_t)h * hd, *b = a + half;
        for (int i = 0; i < half; i++) {
          real s = dir * si[i], x0 = a[i], x1 = b[i];
          a[i] = x0 * co[i] - x1 * s;
          b[i] = x1 * co[i] + x0 * s;
        }
      }
      FN(put)(x + (size_t)n * rs, xr, (size_t)nh * hd);
    }
    free(buf);
  }
}

void FN(rope_fwd)(store *x, const real *cs, int N, int T, int nh, int hd, int rs) {
  FN(rope_apply)(x, cs, N, T, nh, hd, rs, 1);
}

void FN(rope_bwd)(store *dx, const real *cs, int N, int T, int nh, int hd, int rs) {
  FN(rope_apply)(dx, cs, N, T, nh, hd, rs, -1);
}

/* Cross-entropy, row by row. The three pieces are shared by the fused
 * kernel (one pass while the row is in cache) and the vocab-parallel one
 * (the caller reduces max and sums over shards between them). The sums run
 * on real rows (FN(row)). */
static inline real FN(row_max)(const real *l, int V) {
  real mx = l[0];
#pragma omp simd reduction(max : mx)
  for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
  return mx;
}

/* V is large: sum in double even in the float builds */
static inline double FN(row_sumexp)(const real *l, real mx, int V) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < V; v++) sum += EXP(l[v] - mx);
  return sum;
}

/* l = (softmax - onehot) * dscale, in place on a real row; t is the
 * target's column here, or outside [0, V) when another shard holds it. */
static inline void FN(row_dlogits)(real *l, real lse, int t, int V, real dscale) {
#pragma omp simd
  for (int v = 0; v < V; v++) l[v] = EXP(l[v] - lse) * dscale;
  if (t >= 0 && t < V) l[t] -= dscale;
}

void FN(xent_fwd_bwd)(store *logits, real *loss, const int32_t *targets, int N,
                      int V, real dscale) {
#pragma omp parallel
  {
    real *buf = FN(rows)(1, V);
#pragma omp for
    for (int n = 0; n < N; n++) {
      real *l = FN(rowrw)(buf, 0, logits + (size_t)n * V, V);
      real mx = FN(row_max)(l, V);
      real lse = mx + (real)log(FN(row_sumexp)(l, mx, V));
      loss[n] = lse - l[targets[n]];
      FN(row_dlogits)(l, lse, targets[n], V, dscale);
      FN(put)(logits + (size_t)n * V, l, V);
    }
    free(buf);
  }
}

/* stats[3N] = [max | sum exp(l - max) | target logit]; see kernels.h */
void FN(xent_max)(real *stats, const store *logits, int N, int V) {
#pragma omp parallel
  {
    real *buf = FN(rows)(1, V);
#pragma omp for
    for (int n = 0; n < N; n++)
      stats[n] = FN(row_max)(FN(row)(buf, 0, logits + (size_t)n * V, V), V);
    free(buf);
  }
}

void FN(xent_sumexp)(real *stats, const store *logits, const int32_t *targets,
                     int N, int V, int v0) {
#pragma omp parallel
  {
    real *buf = FN(rows)(1, V);
#pragma omp for
    for (int n = 0; n < N; n++) {
      const real *l = FN(row)(buf, 0, logits + (size_t)n * V, V);
      int t = targets[n] - v0;
      stats[N + n] = (real)FN(row_sumexp)(l, stats[n], V);
      stats[2 * N + n] = t >= 0 && t < V ? l[t] : 0;
    }
    free(buf);
  }
}

void FN(xent_finish)(store *logits, real *loss, const real *stats,
                     const int32_t *targets, int N, int V, int v0, real dscale) {
#pragma omp parallel
  {
    real *buf = FN(rows)(1, V);
#pragma omp for
    for (int n = 0; n < N; n++) {
      real lse = stats[n] + (real)log(stats[N + n]);
      loss[n] = lse - stats[2 * N + n];
      real *l = FN(rowrw)(buf, 0, logits + (size_t)n * V, V);
      FN(row_dlogits)(l, lse, targets[n] - v0, V, dscale);
      FN(put)(logits + (size_t)n * V, l, V);
    }
    free(buf);
  }
}

void FN(add)(store *y, const store *x, size_t n) {
  ZT_CHUNKS(n, 2, {
    real *yr = FN(rowrw)(buf, 0, y + i0, len);
    const real *xr = FN(row)(buf, 1, x + i0, len);
    for (size_t i = 0; i < len; i++) yr[i] += xr[i];
    FN(put)(y + i0, yr, len);
  })
}

/* scale, sumsq and AdamW work on real: gradients and master weights. */
void FN(scale)(real *x, real s, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

double FN(sumsq)(const real *x, size_t n) {
  double s = 0;
#pragma omp parallel for simd reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

/* p16, when not NULL, gets the new weights rounded to store in the same
 * pass: the copy the model computes with.
 *
 * Same order of operations as torch.optim.AdamW (single-tensor path), and
 * the CUDA backend's kernel copies it: these float operations are the
 * contract, and test_adamw holds this loop to the plain scalar statement
 * of them bit for bit. The loop is memory-bound on a server (28 bytes an
 * element, 30 with a bf16 copy) and divider-bound within caches (two
 * divisions and a sqrt an element, which torch computes too), so what is
 * left to win is the overhead around them: each value is loaded once and
 * stored once from a local (through restrict pointers, so no aliasing
 * check or reload), the non-finite count is a 32-bit vector sum per piece
 * (not 64-bit lanes), and the 16-bit copy is rounded from the register as
 * it is stored instead of read back by a second loop (bf16: +10% in
 * cache), except where the includer defines ST_BY_ARRAY (fp16, whose
 * array rounding on F16C is 3x its inline integer emulation). with16 is a
 * constant where this is inlined, so each caller's loop is one straight
 * loop that GCC vectorises (-fopt-info-vec; sqrt only because zt_kernels
 * builds with -fno-math-errno). */
static inline unsigned FN(adamw_piece)(real *restrict p, const real *restrict g,
                                       real *restrict m, real *restrict v,
                                       store *restrict p16, int with16, size_t i0,
                                       size_t i1, const zt_adamw_args *a) {
  const real decay = a->decay, b1 = a->b1, c1 = a->c1, b2 = a->b2, c2 = a->c2;
  const real eps = a->eps, step = a->step, bc2s = a->bc2_sqrt, gs = a->gscale;
  unsigned bad = 0;
  /* 512-bit vectors where the CPU has them (GCC prefers 256): +3-4% on
   * the best calls out of cache, the same values (each lane is one
   * element's scalar arithmetic; the count is an integer sum) */
#pragma omp simd simdlen(16) reduction(+ : bad)
  for (size_t i = i0; i < i1; i++) {
    real gi = g[i] * gs;
    real pi = p[i] * decay;
    real mi = b1 * m[i] + c1 * gi;
    real vi = b2 * v[i] + c2 * gi * gi;
    pi -= step * mi / (sqrt(vi) / bc2s + eps);
    p[i] = pi, m[i] = mi, v[i] = vi;
    if (with16) p16[i] = ST(pi);
    /* counted while p is in a register: a check afterwards would read
     * every weight again */
    bad += !isfinite(pi);
  }
  return bad;
}

size_t FN(adamw_p16)(real *p, const real *g, real *m, real *v, size_t n,
                     const zt_adamw_args *a, store *p16) {
  size_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (size_t i0 = 0; i0 < n; i0 += ZT_CHUNK) {
    size_t i1 = n - i0 < ZT_CHUNK ? n : i0 + ZT_CHUNK;
#ifdef ST_BY_ARRAY
    bad += FN(adamw_piece)(p, g, m, v, NULL, 0, i0, i1, a);
    if (p16) ST_N(p16 + i0, p + i0, i1 - i0); /* the piece is in cache */
#else
    bad += p16 ? FN(adamw_piece)(p, g, m, v, p16, 1, i0, i1, a)
               : FN(adamw_piece)(p, g, m, v, NULL, 0, i0, i1, a);
#endif
  }
  return bad;
}

/* kernels.h's table, until it passes p16, names this one: no 16-bit copy. */
size_t FN(adamw)(real *p, const real *g, real *m, real *v, size_t n,
                 const zt_adamw_args *a) {
  return FN(adamw_p16)(p, g, m, v, n, a, NULL);
}
