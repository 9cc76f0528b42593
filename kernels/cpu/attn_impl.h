/* attn_impl: the CPU backend's causal attention, forward and backward
 * (FlashAttention-2), written once over ops_impl.h's `real` and `store`.
 * It is the part of the math with its own shape: tiles, per-thread tile
 * scratch and tasks laid out over (sample, head), where the rest of
 * ops_impl.h is GEMMs and loops over rows. Each ops_*.c includes it right
 * after ops_impl.h, which defines what it uses (real, store, FN, EXP,
 * FN(rgemm), and in the 16-bit builds FN(widen) and FN(narrow)), so the
 * pair is one instantiation. */
#ifndef ZT_FAST_MATH_DEFINED
#error "kernels/cpu/attn_impl.h extends an instantiation of kernels/cpu/ops_impl.h: include that first"
#endif
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h> /* log and sqrt of real in real, as in ops_impl.h */

/* Causal attention without the T x T matrix (FlashAttention-2): query
 * tiles of ATTN_BR rows meet key tiles of up to ATTN_BC keys, the scores
 * of one pair of tiles at a time in a per-thread scratch. Tiles above the
 * diagonal are never computed; the diagonal ones are masked (key j > query
 * i is the future). BLAS calls inside the parallel regions run
 * single-threaded (OpenBLAS/OpenMP). The tile loops work on real; the
 * 16-bit builds widen a head's q, k and v into real scratch first and
 * round its outputs once at the end. */
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

/* Reals per thread of attention's forward and backward scratch (below). */
static size_t FN(attn_per_fwd)(size_t Th) {
#ifdef STORE
  return (size_t)ATTN_BR * ATTN_BC + 3 * ATTN_BR + 4 * Th;
#else
  (void)Th;
  return (size_t)ATTN_BR * ATTN_BC + 3 * ATTN_BR;
#endif
}

static size_t FN(attn_per_bwd)(size_t Th) {
  size_t tiles = (size_t)2 * ATTN_BR * ATTN_BC + ATTN_BR;
#ifdef STORE
  return tiles + 8 * Th;
#else
  (void)Th;
  return tiles;
#endif
}

/* nt blocks of `per` reals, 64-byte aligned, one per thread: the tiles'
 * scratch, a few hundred KB in all (plus a head's rows in the 16-bit
 * builds). The ops have no error path, and a failure to find that much is
 * no state to train on. */
static size_t FN(attn_scratch_size)(size_t per, int nt, size_t *stride) {
  *stride = (per + 15) / 16 * 16;
  return ((size_t)nt * *stride * sizeof(real) + 63) / 64 * 64;
}

static real *FN(attn_scratch)(size_t per, size_t *stride) {
  size_t bytes = FN(attn_scratch_size)(per, omp_get_max_threads(), stride);
  real *p = aligned_alloc(64, bytes);
  if (!p) {
    fprintf(stderr, "ztrain: no memory for the attention tiles (%zu bytes)\n", bytes);
    abort();
  }
  return p;
}

/* One query tile, rows [i0, i0 + br) of one head, against its keys
 * [0, i0 + br): O[br, hd] (row stride os) and the rows' lse L[br]. Q (the
 * tile's first row), K and V (row 0) have row stride qs. Online softmax:
 * the tile keeps its rows' running max m and sum l and rescales its output
 * rows (in O itself) when m grows; at the end O /= l and lse = m + log l.
 * P, m, l: the thread's scratch. */
static void FN(attn_fwd_tile)(real *O, int os, real *L, const real *Q, const real *K,
                              const real *V, int qs, int i0, int br, int hd, real scale,
                              real *P, real *m, real *l) {
  for (int j0 = 0; j0 < i0 + br; j0 += ATTN_BC) {
    int kb = i0 + br - j0 < ATTN_BC ? i0 + br - j0 : ATTN_BC;
    /* P[br,kb] = scale * Q K^T, then the online softmax by row */
    FN(rgemm)(0, 1, br, kb, hd, scale, Q, qs, K + (size_t)j0 * qs, qs, 0, P, ATTN_BC);
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
    FN(rgemm)(0, 0, br, hd, kb, 1, P, ATTN_BC, V + (size_t)j0 * qs, qs, j0 ? 1 : 0, O, os);
  }
  for (int r = 0; r < br; r++) {
    real *o = O + (size_t)r * os;
    for (int d = 0; d < hd; d++) o[d] /= l[r];
    L[r] = m[r] + log(l[r]);
  }
}

/* Query rows [q0, T) of each sample against their keys [0, row]: out
 * [B, T - q0, H*hd] and lse [B, H, T - q0] (NULL: not kept). q0 = 0 is
 * the whole forward (attn_fwd); q0 = T - n the last n rows over a KV cache
 * (attn_decode), the same tiles from row q0 on. */
#ifndef STORE
/* Tasks are (query tile, sample, head), the longest rows (last tiles)
 * first, since the causal triangle makes them the most work. */
static void FN(attn_rows)(store *out, real *lse, const store *qkv, int B, int T, int q0, int H,
                          int KVH, int hd) {
  int rs = (H + 2 * KVH) * hd, G = H / KVH, os = H * hd, n = T - q0;
  int nq = (n + ATTN_BR - 1) / ATTN_BR;
  real scale = 1 / sqrt((real)hd);
  size_t stride;
  real *scratch = FN(attn_scratch)(FN(attn_per_fwd)(0), &stride);
#pragma omp parallel
  {
    real *P = scratch + (size_t)omp_get_thread_num() * stride;
    real *m = P + ATTN_BR * ATTN_BC, *l = m + ATTN_BR, *Lx = l + ATTN_BR;
#pragma omp for collapse(3) schedule(dynamic)
    for (int t = 0; t < nq; t++)
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
          int i0 = q0 + (nq - 1 - t) * ATTN_BR, br = T - i0 < ATTN_BR ? T - i0 : ATTN_BR;
          const real *base = qkv + (size_t)b * T * rs;
          FN(attn_fwd_tile)(out + ((size_t)b * n + i0 - q0) * os + (size_t)h * hd, os,
                            lse ? lse + ((size_t)b * H + h) * n + i0 - q0 : Lx,
                            base + (size_t)i0 * rs + (size_t)h * hd,
                            base + (size_t)(H + h / G) * hd,
                            base + (size_t)(H + KVH + h / G) * hd, rs, i0, br, hd, scale, P, m,
                            l);
        }
  }
  free(scratch);
}
#else
/* Tasks are (sample, head), all the same work: each widens its head's q
 * rows and its kv head's k and v ([T, hd] each) once, runs the query
 * tiles on them and rounds its output once. */
static void FN(attn_rows)(store *out, real *lse, const store *qkv, int B, int T, int q0, int H,
                          int KVH, int hd) {
  int rs = (H + 2 * KVH) * hd, G = H / KVH, os = H * hd, n = T - q0;
  real scale = 1 / sqrt((real)hd);
  size_t stride, Th = (size_t)T * hd;
  real *scratch = FN(attn_scratch)(FN(attn_per_fwd)(Th), &stride);
#pragma omp parallel
  {
    real *P = scratch + (size_t)omp_get_thread_num() * stride;
    real *m = P + ATTN_BR * ATTN_BC, *l = m + ATTN_BR, *Lx = l + ATTN_BR;
    real *Q = Lx + ATTN_BR, *K = Q + Th, *V = K + Th, *O = V + Th;
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++) {
        const store *base = qkv + (size_t)b * T * rs;
        FN(widen)(Q, base + (size_t)q0 * rs + (size_t)h * hd, (size_t)rs, n, hd, 0);
        FN(widen)(K, base + (size_t)(H + h / G) * hd, (size_t)rs, T, hd, 0);
        FN(widen)(V, base + (size_t)(H + KVH + h / G) * hd, (size_t)rs, T, hd, 0);
        for (int i0 = q0; i0 < T; i0 += ATTN_BR) {
          int br = T - i0 < ATTN_BR ? T - i0 : ATTN_BR;
          FN(attn_fwd_tile)(O + (size_t)(i0 - q0) * hd, hd,
                            lse ? lse + ((size_t)b * H + h) * n + i0 - q0 : Lx,
                            Q + (size_t)(i0 - q0) * hd, K, V, hd, i0, br, hd, scale, P, m, l);
        }
        FN(narrow)(out + (size_t)b * n * os + (size_t)h * hd, (size_t)os, O, n, hd, 0);
      }
  }
  free(scratch);
}
#endif

void FN(attn_fwd)(store *out, real *lse, const store *qkv, int B, int T, int H, int KVH,
                  int hd) {
  FN(attn_rows)(out, lse, qkv, B, T, 0, H, KVH, hd);
}

void FN(attn_decode)(store *out, const store *qkv, int T, int n, int H, int KVH, int hd) {
  FN(attn_rows)(out, NULL, qkv, 1, T, T - n, H, KVH, hd);
}

/* One query tile, rows [i0, i0 + br) of one head: its dQ rows (=) and its
 * share of dK and dV over keys [0, i0 + br) (+=). Recomputes P =
 * exp(scale QK^T - lse) tile by tile; with D = rowsum(dO * O) (= rowsum(P *
 * dP)): dV += P^T dO, dP = dO V^T, dS = scale P (dP - D), dQ = dS K,
 * dK += dS^T Q. Row strides: qs for Q (the tile's first row), K and V (row
 * 0); gs for dQ (the tile's), dK and dV (row 0); os for dO and O (the
 * tile's). P, dP, D: the thread's scratch. */
static void FN(attn_bwd_tile)(real *dQ, real *dK, real *dV, int gs, const real *Q,
                              const real *K, const real *V, int qs, const real *dO,
                              const real *O, int os, const real *L, int i0, int br, int hd,
                              real scale, real *P, real *dP, real *D) {
  for (int r = 0; r < br; r++) {
    real dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < hd; d++) dot += dO[(size_t)r * os + d] * O[(size_t)r * os + d];
    D[r] = dot;
  }
  for (int j0 = 0; j0 < i0 + br; j0 += ATTN_BC) {
    int kb = i0 + br - j0 < ATTN_BC ? i0 + br - j0 : ATTN_BC;
    const real *Kj = K + (size_t)j0 * qs, *Vj = V + (size_t)j0 * qs;
    /* P[br,kb] = exp(scale * Q K^T - lse), 0 in the future */
    FN(rgemm)(0, 1, br, kb, hd, scale, Q, qs, Kj, qs, 0, P, ATTN_BC);
    for (int r = 0; r < br; r++) {
      int n = zt_attn_seen(i0 + r, j0, kb);
      real *p = P + (size_t)r * ATTN_BC;
#pragma omp simd
      for (int j = 0; j < n; j++) p[j] = EXP(p[j] - L[r]);
      for (int j = n; j < kb; j++) p[j] = 0;
    }
    /* dV[kb,hd] += P^T dO;  dP[br,kb] = dO V^T */
    FN(rgemm)(1, 0, kb, hd, br, 1, P, ATTN_BC, dO, os, 1, dV + (size_t)j0 * gs, gs);
    FN(rgemm)(0, 1, br, kb, hd, 1, dO, os, Vj, qs, 0, dP, ATTN_BC);
    for (int r = 0; r < br; r++) {
      const real *p = P + (size_t)r * ATTN_BC;
      real *dp = dP + (size_t)r * ATTN_BC;
#pragma omp simd
      for (int j = 0; j < kb; j++) dp[j] = scale * p[j] * (dp[j] - D[r]);
    }
    /* dQ[br,hd] (+)= dS K;  dK[kb,hd] += dS^T Q */
    FN(rgemm)(0, 0, br, hd, kb, 1, dP, ATTN_BC, Kj, qs, j0 ? 1 : 0, dQ, gs);
    FN(rgemm)(1, 0, kb, hd, br, 1, dP, ATTN_BC, Q, qs, 1, dK + (size_t)j0 * gs, gs);
  }
}

/* One task per (sample, kv head): the query heads sharing a kv head run in
 * the same task, so their dK/dV accumulation needs no atomics. The 16-bit
 * builds widen the task's k and v and each head's q, dO and O once, keep
 * dQ, dK and dV in real scratch and round each once at the end. */
void FN(attn_bwd)(store *dqkv, const store *dout, const store *qkv, const store *out,
                  const real *lse, int B, int T, int H, int KVH, int hd) {
  int rs = (H + 2 * KVH) * hd, G = H / KVH, os = H * hd;
  real scale = 1 / sqrt((real)hd);
  size_t stride;
#ifdef STORE
  size_t Th = (size_t)T * hd;
#else
  size_t Th = 0;
#endif
  real *scratch = FN(attn_scratch)(FN(attn_per_bwd)(Th), &stride);
#pragma omp parallel
  {
    real *P = scratch + (size_t)omp_get_thread_num() * stride;
    real *dP = P + ATTN_BR * ATTN_BC, *D = dP + ATTN_BR * ATTN_BC;
#ifdef STORE
    real *K = D + ATTN_BR, *V = K + Th, *dK = V + Th, *dV = dK + Th;
    real *Q = dV + Th, *dO = Q + Th, *O = dO + Th, *dQ = O + Th;
#endif
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int kh = 0; kh < KVH; kh++) {
        const store *base = qkv + (size_t)b * T * rs;
        store *dbase = dqkv + (size_t)b * T * rs;
#ifdef STORE
        FN(widen)(K, base + (size_t)(H + kh) * hd, (size_t)rs, T, hd, 0);
        FN(widen)(V, base + (size_t)(H + KVH + kh) * hd, (size_t)rs, T, hd, 0);
        memset(dK, 0, sizeof(real) * 2 * Th); /* dK and dV */
        for (int h = kh * G; h < (kh + 1) * G; h++) {
          size_t o0 = (size_t)b * T * os + (size_t)h * hd;
          FN(widen)(Q, base + (size_t)h * hd, (size_t)rs, T, hd, 0);
          FN(widen)(dO, dout + o0, (size_t)os, T, hd, 0);
          FN(widen)(O, out + o0, (size_t)os, T, hd, 0);
          for (int i0 = 0; i0 < T; i0 += ATTN_BR) {
            size_t r0 = (size_t)i0 * hd;
            FN(attn_bwd_tile)(dQ + r0, dK, dV, hd, Q + r0, K, V, hd, dO + r0, O + r0, hd,
                              lse + ((size_t)b * H + h) * T + i0, i0,
                              T - i0 < ATTN_BR ? T - i0 : ATTN_BR, hd, scale, P, dP, D);
          }
          FN(narrow)(dbase + (size_t)h * hd, (size_t)rs, dQ, T, hd, 0);
        }
        FN(narrow)(dbase + (size_t)(H + kh) * hd, (size_t)rs, dK, T, hd, 0);
        FN(narrow)(dbase + (size_t)(H + KVH + kh) * hd, (size_t)rs, dV, T, hd, 0);
#else
        real *dK = dbase + (size_t)(H + kh) * hd;
        real *dV = dbase + (size_t)(H + KVH + kh) * hd;
        for (int t = 0; t < T; t++) {
          memset(dK + (size_t)t * rs, 0, sizeof(real) * hd);
          memset(dV + (size_t)t * rs, 0, sizeof(real) * hd);
        }
        for (int h = kh * G; h < (kh + 1) * G; h++)
          for (int i0 = 0; i0 < T; i0 += ATTN_BR) {
            size_t q0 = (size_t)i0 * rs + (size_t)h * hd, o0 = ((size_t)b * T + i0) * os + (size_t)h * hd;
            FN(attn_bwd_tile)(dbase + q0, dK, dV, rs, base + q0, base + (size_t)(H + kh) * hd,
                              base + (size_t)(H + KVH + kh) * hd, rs, dout + o0, out + o0, os,
                              lse + ((size_t)b * H + h) * T + i0, i0,
                              T - i0 < ATTN_BR ? T - i0 : ATTN_BR, hd, scale, P, dP, D);
          }
#endif
      }
  }
  free(scratch);
}

/* The ops' scratch of one call (see ops.h): attention's tiles (the larger
 * of forward and backward) and, in the 16-bit builds, the loss's widened
 * row of V per thread (ops_impl.h's rows). */
size_t FN(op_scratch_bytes)(int T, int hd, int V, int nt) {
  size_t Th = (size_t)T * hd, stride, f = FN(attn_per_fwd)(Th), b = FN(attn_per_bwd)(Th);
  size_t attn = FN(attn_scratch_size)(f > b ? f : b, nt, &stride), rows = 0;
#ifdef STORE
  rows = (size_t)nt * sizeof(real) * (size_t)V;
#else
  (void)V;
#endif
  return attn > rows ? attn : rows;
}
