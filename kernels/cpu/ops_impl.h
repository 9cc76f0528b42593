/* ops_impl: the CPU backend's math, written once for a generic `real`.
 * ops_f32.c instantiates it as the backend; ops_f64.c instantiates it in
 * double so that tests check these very loops against central finite
 * differences without float rounding in the way. The includer defines REAL,
 * FN(name) and GEMM (cblas_sgemm or cblas_dgemm). Plain loops with shape
 * comments, OpenMP over rows; reductions over rows (parameter gradients) are
 * split over columns instead, so no two threads write the same element. */
#include <cblas.h>
#include <tgmath.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef REAL real;

/* EXP and TANH come from the includer: libm in the double build (the
 * reference the gradient checks need), zt_expf/zt_tanhf below in the float
 * build. libm's scalar expf/tanhf were a third of a small model's step;
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

void FN(gemm)(int ta, int tb, int m, int n, int k, real alpha, const real *a,
              int lda, const real *b, int ldb, real beta, real *c, int ldc) {
  GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
       tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
       ldc);
}

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
 * the whole-table lookup. */
void FN(embed_fwd)(real *out, const int32_t *tok, const real *wte,
                   const real *wpe, int B, int T, int C, int v0, int Vl) {
  /* out[B*T, C] */
#pragma omp parallel for
  for (int n = 0; n < B * T; n++) {
    int v = tok[n] - v0;
    const real *e = v >= 0 && v < Vl ? wte + (size_t)v * C : NULL;
    const real *p = wpe ? wpe + (size_t)(n % T) * C : NULL;
    real *o = out + (size_t)n * C;
    if (e && p)
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    else if (e || p)
      memcpy(o, e ? e : p, sizeof(real) * C);
    else
      memset(o, 0, sizeof(real) * C);
  }
}

void FN(embed_bwd)(real *dwte, real *dwpe, const int32_t *tok,
                   const real *dout, int B, int T, int C, int v0, int Vl) {
  ZT_COLUMN_SPLIT(C, {
    for (int n = 0; n < B * T; n++) {
      const real *d = dout + (size_t)n * C;
      int v = tok[n] - v0;
      if (v >= 0 && v < Vl) {
        real *e = dwte + (size_t)v * C;
        for (int c = c0; c < c1; c++) e[c] += d[c];
      }
      if (dwpe) {
        real *p = dwpe + (size_t)(n % T) * C;
        for (int c = c0; c < c1; c++) p[c] += d[c];
      }
    }
  })
}

void FN(layernorm_fwd)(real *out, real *mean, real *rstd, const real *x,
                       const real *w, const real *b, int N, int C, real eps) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *xr = x + (size_t)n * C;
    real *o = out + (size_t)n * C;
    real m = 0, v = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += xr[c];
    m /= C;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
    v /= C;
    real s = 1 / sqrt(v + eps);
    for (int c = 0; c < C; c++) o[c] = (xr[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void FN(layernorm_bwd)(real *dx, real *dw, real *db, const real *dout,
                       const real *x, const real *w, const real *mean,
                       const real *rstd, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *d = dout + (size_t)n * C, *xr = x + (size_t)n * C;
    real m = mean[n], s = rstd[n];
    real g_mean = 0, g_norm_mean = 0; /* mean(dout*w), mean(dout*w*xhat) */
#pragma omp simd reduction(+ : g_mean, g_norm_mean)
    for (int c = 0; c < C; c++) {
      real g = d[c] * w[c];
      g_mean += g;
      g_norm_mean += g * (xr[c] - m) * s;
    }
    g_mean /= C;
    g_norm_mean /= C;
    real *dxr = dx + (size_t)n * C;
    for (int c = 0; c < C; c++) {
      real xhat = (xr[c] - m) * s;
      dxr[c] += (d[c] * w[c] - g_mean - xhat * g_norm_mean) * s;
    }
  }
  ZT_COLUMN_SPLIT(C, {
    for (int n = 0; n < N; n++) {
      const real *d = dout + (size_t)n * C, *xr = x + (size_t)n * C;
      real m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; c++) {
        dw[c] += d[c] * (xr[c] - m) * s;
        db[c] += d[c];
      }
    }
  })
}

void FN(rmsnorm_fwd)(real *out, real *rstd, const real *x, const real *w,
                     int N, int C, real eps) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *xr = x + (size_t)n * C;
    real *o = out + (size_t)n * C;
    real ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += xr[c] * xr[c];
    real s = 1 / sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) o[c] = xr[c] * s * w[c];
    rstd[n] = s;
  }
}

void FN(rmsnorm_bwd)(real *dx, real *dw, const real *dout, const real *x,
                     const real *w, const real *rstd, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *d = dout + (size_t)n * C, *xr = x + (size_t)n * C;
    real s = rstd[n], dot = 0; /* dot = sum(dout*w*x) */
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < C; c++) dot += d[c] * w[c] * xr[c];
    real k = dot * s * s / C;
    real *dxr = dx + (size_t)n * C;
    for (int c = 0; c < C; c++) dxr[c] += s * (d[c] * w[c] - xr[c] * k);
  }
  ZT_COLUMN_SPLIT(C, {
    for (int n = 0; n < N; n++) {
      const real *d = dout + (size_t)n * C, *xr = x + (size_t)n * C;
      real s = rstd[n];
      for (int c = c0; c < c1; c++) dw[c] += d[c] * xr[c] * s;
    }
  })
}

void FN(bias_fwd)(real *y, const real *b, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    real *yr = y + (size_t)n * C;
    for (int c = 0; c < C; c++) yr[c] += b[c];
  }
}

void FN(bias_bwd)(real *db, const real *dy, int N, int C) {
  ZT_COLUMN_SPLIT(C, {
    for (int n = 0; n < N; n++) {
      const real *d = dy + (size_t)n * C;
      for (int c = c0; c < c1; c++) db[c] += d[c];
    }
  })
}

#define GELU_K ((real)0.7978845608028654) /* sqrt(2/pi) */

void FN(gelu_fwd)(real *y, const real *x, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) {
    real v = x[i];
    y[i] = (real)0.5 * v * (1 + TANH(GELU_K * (v + (real)0.044715 * v * v * v)));
  }
}

void FN(gelu_bwd)(real *dx, const real *x, const real *dy, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) {
    real v = x[i];
    real u = GELU_K * (v + (real)0.044715 * v * v * v);
    real t = TANH(u);
    real du = GELU_K * (1 + 3 * (real)0.044715 * v * v);
    dx[i] = dy[i] * ((real)0.5 * (1 + t) + (real)0.5 * v * (1 - t * t) * du);
  }
}

void FN(swiglu_fwd)(real *h, const real *gu, int N, int F) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *g = gu + (size_t)n * 2 * F, *u = g + F;
    real *hr = h + (size_t)n * F;
    for (int f = 0; f < F; f++) hr[f] = g[f] / (1 + EXP(-g[f])) * u[f];
  }
}

void FN(swiglu_bwd)(real *dgu, const real *gu, const real *dh, int N, int F) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *g = gu + (size_t)n * 2 * F, *u = g + F;
    const real *d = dh + (size_t)n * F;
    real *dg = dgu + (size_t)n * 2 * F, *du = dg + F;
    for (int f = 0; f < F; f++) {
      real sig = 1 / (1 + EXP(-g[f]));
      du[f] = d[f] * g[f] * sig;
      dg[f] = d[f] * u[f] * sig * (1 + g[f] * (1 - sig));
    }
  }
}

/* Rotates pairs (i, i + hd/2) of each of the first nh heads by +angle
 * (dir = 1) or -angle (dir = -1, the transpose, for backward). */
static void FN(rope_apply)(real *x, const real *cs, int N, int T, int nh,
                           int hd, int rs, real dir) {
  int half = hd / 2;
  const real *cosv = cs, *sinv = cs + (size_t)T * half;
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *co = cosv + (size_t)(n % T) * half;
    const real *si = sinv + (size_t)(n % T) * half;
    for (int h = 0; h < nh; h++) {
      real *a = x + (size_t)n * rs + (size_t)h * hd, *b = a + half;
      for (int i = 0; i < half; i++) {
        real s = dir * si[i], x0 = a[i], x1 = b[i];
        a[i] = x0 * co[i] - x1 * s;
        b[i] = x1 * co[i] + x0 * s;
      }
    }
  }
}

void FN(rope_fwd)(real *x, const real *cs, int N, int T, int nh, int hd, int rs) {
  FN(rope_apply)(x, cs, N, T, nh, hd, rs, 1);
}

void FN(rope_bwd)(real *dx, const real *cs, int N, int T, int nh, int hd, int rs) {
  FN(rope_apply)(dx, cs, N, T, nh, hd, rs, -1);
}

/* Causal attention without the T x T matrix (FlashAttention-2): query
 * tiles of ATTN_BR rows meet key tiles of up to ATTN_BC keys, the scores
 * of one pair of tiles at a time in a per-thread scratch. Tiles above the
 * diagonal are never computed; the diagonal ones are masked (key j > query
 * i is the future). BLAS calls inside the parallel regions run
 * single-threaded (OpenBLAS/OpenMP). */
#ifndef ATTN_BR
#define ATTN_BR 64
#define ATTN_BC 256
/* How many of the keys j0 .. j0 + kb - 1 query i sees: the others are its
 * future. */
static inline int zt_attn_seen(int i, int j0, int kb) {
  int v = i - j0 + 1;
  return v < 0 ? 0 : v > kb ? kb : v;
}
#endif

/* nt blocks of `per` reals, 64-byte aligned, one per thread: the tiles'
 * scratch, a few hundred KB in all. The ops have no error path, and a
 * failure to find that much is no state to train on. */
static real *FN(attn_scratch)(size_t per, int *stride) {
  *stride = (int)((per + 15) / 16 * 16);
  size_t bytes = (size_t)omp_get_max_threads() * *stride * sizeof(real);
  real *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "ztrain: no memory for the attention tiles (%zu bytes)\n", bytes);
    abort();
  }
  return p;
}

/* Online softmax: each query tile keeps its rows' running max m and sum l
 * and rescales its output rows (in `out` itself) when m grows; at the end
 * out /= l and lse = m + log l. Tasks are (query tile, sample, head), the
 * longest rows (last tiles) first, since the causal triangle makes them
 * the most work. */
void FN(attn_fwd)(real *out, real *lse, const real *qkv, int B, int T, int H, int KVH,
                  int hd) {
  int rs = (H + 2 * KVH) * hd, G = H / KVH, os = H * hd, nq = (T + ATTN_BR - 1) / ATTN_BR;
  real scale = 1 / sqrt((real)hd);
  int stride;
  real *scratch = FN(attn_scratch)((size_t)ATTN_BR * ATTN_BC + 2 * ATTN_BR, &stride);
#pragma omp parallel
  {
    real *P = scratch + (size_t)omp_get_thread_num() * stride;
    real *m = P + ATTN_BR * ATTN_BC, *l = m + ATTN_BR;
#pragma omp for collapse(3) schedule(dynamic)
    for (int t = 0; t < nq; t++)
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
          int i0 = (nq - 1 - t) * ATTN_BR, br = T - i0 < ATTN_BR ? T - i0 : ATTN_BR;
          const real *base = qkv + (size_t)b * T * rs;
          const real *Q = base + (size_t)i0 * rs + (size_t)h * hd;
          const real *K = base + (size_t)(H + h / G) * hd;
          const real *V = base + (size_t)(H + KVH + h / G) * hd;
          real *O = out + ((size_t)b * T + i0) * os + (size_t)h * hd;
          for (int j0 = 0; j0 < i0 + br; j0 += ATTN_BC) {
            int kb = i0 + br - j0 < ATTN_BC ? i0 + br - j0 : ATTN_BC;
            /* P[br,kb] = scale * Q K^T, then the online softmax by row */
            FN(gemm)(0, 1, br, kb, hd, scale, Q, rs, K + (size_t)j0 * rs, rs, 0, P, ATTN_BC);
            for (int r = 0; r < br; r++) {
              int n = zt_attn_seen(i0 + r, j0, kb);
              real *p = P + (size_t)r * ATTN_BC, mx = -INFINITY, sum = 0;
#pragma omp simd reduction(max : mx)
              for (int j = 0; j < n; j++) mx = p[j] > mx ? p[j] : mx;
              real mnew = j0 && m[r] > mx ? m[r] : mx;
#pragma omp simd reduction(+ : sum)
              for (int j = 0; j < n; j++) sum += (p[j] = EXP(p[j] - mnew));
              for (int j = n; j < kb; j++) p[j] = 0;
              if (!j0) {
                m[r] = mnew, l[r] = sum;
              } else if (n) { /* n = 0: nothing seen here, nothing changes */
                real alpha = EXP(m[r] - mnew), *o = O + (size_t)r * os;
                for (int d = 0; d < hd; d++) o[d] *= alpha;
                m[r] = mnew, l[r] = alpha * l[r] + sum;
              }
            }
            /* O[br,hd] (+)= P[br,kb] V[kb,hd] */
            FN(gemm)(0, 0, br, hd, kb, 1, P, ATTN_BC, V + (size_t)j0 * rs, rs, j0 ? 1 : 0, O,
                     os);
          }
          real *L = lse + ((size_t)b * H + h) * T + i0;
          for (int r = 0; r < br; r++) {
            real *o = O + (size_t)r * os;
            for (int d = 0; d < hd; d++) o[d] /= l[r];
            L[r] = m[r] + log(l[r]);
          }
        }
  }
  free(scratch);
}

/* Recomputes P = exp(scale QK^T - lse) tile by tile. One task per (sample,
 * kv head): the query heads sharing a kv head run in the same task, so
 * their dK/dV accumulation needs no atomics. With D = rowsum(dO * O)
 * (= rowsum(P * dP)): dV += P^T dO, dP = dO V^T, dS = scale P (dP - D),
 * dQ = dS K, dK += dS^T Q. */
void FN(attn_bwd)(real *dqkv, const real *dout, const real *qkv, const real *out,
                  const real *lse, int B, int T, int H, int KVH, int hd) {
  int rs = (H + 2 * KVH) * hd, G = H / KVH, os = H * hd;
  real scale = 1 / sqrt((real)hd);
  int stride;
  real *scratch = FN(attn_scratch)((size_t)2 * ATTN_BR * ATTN_BC + ATTN_BR, &stride);
#pragma omp parallel
  {
    real *P = scratch + (size_t)omp_get_thread_num() * stride;
    real *dP = P + ATTN_BR * ATTN_BC, *D = dP + ATTN_BR * ATTN_BC;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int kh = 0; kh < KVH; kh++) {
        const real *base = qkv + (size_t)b * T * rs;
        real *dbase = dqkv + (size_t)b * T * rs;
        const real *K = base + (size_t)(H + kh) * hd;
        const real *V = base + (size_t)(H + KVH + kh) * hd;
        real *dK = dbase + (size_t)(H + kh) * hd;
        real *dV = dbase + (size_t)(H + KVH + kh) * hd;
        for (int t = 0; t < T; t++) {
          memset(dK + (size_t)t * rs, 0, sizeof(real) * hd);
          memset(dV + (size_t)t * rs, 0, sizeof(real) * hd);
        }
        for (int h = kh * G; h < (kh + 1) * G; h++)
          for (int i0 = 0; i0 < T; i0 += ATTN_BR) {
            int br = T - i0 < ATTN_BR ? T - i0 : ATTN_BR;
            const real *Q = base + (size_t)i0 * rs + (size_t)h * hd;
            const real *dO = dout + ((size_t)b * T + i0) * os + (size_t)h * hd;
            const real *O = out + ((size_t)b * T + i0) * os + (size_t)h * hd;
            const real *L = lse + ((size_t)b * H + h) * T + i0;
            real *dQ = dbase + (size_t)i0 * rs + (size_t)h * hd;
            for (int r = 0; r < br; r++) {
              real dot = 0;
#pragma omp simd reduction(+ : dot)
              for (int d = 0; d < hd; d++) dot += dO[(size_t)r * os + d] * O[(size_t)r * os + d];
              D[r] = dot;
            }
            for (int j0 = 0; j0 < i0 + br; j0 += ATTN_BC) {
              int kb = i0 + br - j0 < ATTN_BC ? i0 + br - j0 : ATTN_BC;
              const real *Kj = K + (size_t)j0 * rs, *Vj = V + (size_t)j0 * rs;
              /* P[br,kb] = exp(scale * Q K^T - lse), 0 in the future */
              FN(gemm)(0, 1, br, kb, hd, scale, Q, rs, Kj, rs, 0, P, ATTN_BC);
              for (int r = 0; r < br; r++) {
                int n = zt_attn_seen(i0 + r, j0, kb);
                real *p = P + (size_t)r * ATTN_BC;
#pragma omp simd
                for (int j = 0; j < n; j++) p[j] = EXP(p[j] - L[r]);
                for (int j = n; j < kb; j++) p[j] = 0;
              }
              /* dV[kb,hd] += P^T dO;  dP[br,kb] = dO V^T */
              FN(gemm)(1, 0, kb, hd, br, 1, P, ATTN_BC, dO, os, 1, dV + (size_t)j0 * rs, rs);
              FN(gemm)(0, 1, br, kb, hd, 1, dO, os, Vj, rs, 0, dP, ATTN_BC);
              for (int r = 0; r < br; r++) {
                const real *p = P + (size_t)r * ATTN_BC;
                real *dp = dP + (size_t)r * ATTN_BC;
#pragma omp simd
                for (int j = 0; j < kb; j++) dp[j] = scale * p[j] * (dp[j] - D[r]);
              }
              /* dQ[br,hd] (+)= dS K;  dK[kb,hd] += dS^T Q */
              FN(gemm)(0, 0, br, hd, kb, 1, dP, ATTN_BC, Kj, rs, j0 ? 1 : 0, dQ, rs);
              FN(gemm)(1, 0, kb, hd, br, 1, dP, ATTN_BC, Q, rs, 1, dK + (size_t)j0 * rs, rs);
            }
          }
      }
  }
  free(scratch);
}

/* Cross-entropy, row by row. The three pieces are shared by the fused
 * kernel (one pass while the row is in cache) and the vocab-parallel one
 * (the caller reduces max and sums over shards between them). */
static inline real FN(row_max)(const real *l, int V) {
  real mx = l[0];
#pragma omp simd reduction(max : mx)
  for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
  return mx;
}

/* V is large: sum in double even in the f32 build */
static inline double FN(row_sumexp)(const real *l, real mx, int V) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < V; v++) sum += EXP(l[v] - mx);
  return sum;
}

/* l = (softmax - onehot) * dscale; t is the target's column here, or
 * outside [0, V) when another shard holds it */
static inline void FN(row_dlogits)(real *l, real lse, int t, int V, real dscale) {
#pragma omp simd
  for (int v = 0; v < V; v++) l[v] = EXP(l[v] - lse) * dscale;
  if (t >= 0 && t < V) l[t] -= dscale;
}

void FN(xent_fwd_bwd)(real *logits, real *loss, const int32_t *targets, int N,
                      int V, real dscale) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    real *l = logits + (size_t)n * V;
    real mx = FN(row_max)(l, V);
    real lse = mx + (real)log(FN(row_sumexp)(l, mx, V));
    loss[n] = lse - l[targets[n]];
    FN(row_dlogits)(l, lse, targets[n], V, dscale);
  }
}

/* stats[3N] = [max | sum exp(l - max) | target logit]; see kernels.h */
void FN(xent_max)(real *stats, const real *logits, int N, int V) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) stats[n] = FN(row_max)(logits + (size_t)n * V, V);
}

void FN(xent_sumexp)(real *stats, const real *logits, const int32_t *targets,
                     int N, int V, int v0) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * V;
    int t = targets[n] - v0;
    stats[N + n] = (real)FN(row_sumexp)(l, stats[n], V);
    stats[2 * N + n] = t >= 0 && t < V ? l[t] : 0;
  }
}

void FN(xent_finish)(real *logits, real *loss, const real *stats,
                     const int32_t *targets, int N, int V, int v0, real dscale) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    real lse = stats[n] + (real)log(stats[N + n]);
    loss[n] = lse - stats[2 * N + n];
    FN(row_dlogits)(logits + (size_t)n * V, lse, targets[n] - v0, V, dscale);
  }
}

void FN(add)(real *y, const real *x, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

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

size_t FN(adamw)(real *p, const real *g, real *m, real *v, size_t n,
                 const zt_adamw_args *a) {
  /* Same order of operations as torch.optim.AdamW (single-tensor path). */
  real decay = a->decay, b1 = a->b1, c1 = a->c1, b2 = a->b2, c2 = a->c2;
  real eps = a->eps, step = a->step, bc2s = a->bc2_sqrt, gs = a->gscale;
  /* Counting here, while p[i] is still in a register, costs a compare and
   * an add per element; a check afterwards would read every weight again. */
  size_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
  for (size_t i = 0; i < n; i++) {
    real gi = g[i] * gs;
    p[i] *= decay;
    m[i] = b1 * m[i] + c1 * gi;
    v[i] = b2 * v[i] + c2 * gi * gi;
    p[i] -= step * m[i] / (sqrt(v[i]) / bc2s + eps);
    bad += !isfinite(p[i]);
  }
  return bad;
}
