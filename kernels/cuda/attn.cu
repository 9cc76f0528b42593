// attn: the contract's causal attention (kernels/kernels.h) on the GPU,
// FlashAttention-2's algorithm in plain fp32 SIMT code, with the CPU
// backend's semantics (kernels/cpu/ops_impl.h, attn_fwd_tile and
// attn_bwd_tile): qkv rows [q: H*hd | k: KVH*hd | v: KVH*hd] (row b*T + t),
// query head h reads kv head h / (H/KVH), scores scaled by 1/sqrt(hd), the
// key j seen by query i when j <= i. Forward writes out[N, H*hd] and
// lse[B, H, T] (natural log, the row max included); backward recomputes
// the probabilities from qkv and lse and overwrites all of dqkv. No [T, T]
// matrix is ever stored: scores live in registers, one tile at a time.
//
// Shapes: hd <= 128 (a lane holds up to 4 of a row's hd values); tiles of
// ATT_TILE = 32 query rows and 32 keys, so that a warp's 32 lanes map to
// the 32 keys (or queries) of a tile. A block is 8 warps; each warp owns 4
// rows of the block's tile (ATT_ROWS), the rows whose results it keeps in
// registers. Tiles are widened to fp32 in shared memory once; the [32][hd]
// tiles a lane reads a row of (lane = key or query) are padded to hd + 1
// floats a row, so that 32 lanes reading column d of 32 rows hit 32
// different banks whenever hd is even.
//
// Backward is deterministic (no atomics): one kernel per key tile
// accumulates dK and dV over all query tiles and the query heads sharing
// the kv head (FA2's loop order), another per query tile accumulates dQ
// over the key tiles; each recomputes the probabilities it needs, and
// D = rowsum(dO * O) for the rows it visits.
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/ops_cuda.cuh"

#define ATT_TILE 32                     /* query rows and keys a tile */
#define ATT_WARPS 8                     /* a block's warps */
#define ATT_ROWS (ATT_TILE / ATT_WARPS) /* a warp's rows of its block's tile */
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_NC 4                        /* hd values a lane holds: hd <= 128 */
#define ATT_HD_MAX (ATT_NC * 32)

// dst[r * ds + d] = src[(row0 + r) * ss + d] widened, for the tile's rows
// r < ATT_TILE and d < hd; 0 for rows past T (they then add nothing).
// Thread mapping: the block's threads over the tile's elements, d fastest,
// so consecutive threads read consecutive columns of a row.
template <typename T>
__device__ void att_load(float *dst, int ds, const T *src, size_t ss, int row0, int T_, int hd) {
  for (int e = threadIdx.x; e < ATT_TILE * hd; e += ATT_THREADS) {
    int r = e / hd, d = e - r * hd;
    dst[r * ds + d] = row0 + r < T_ ? zt_ld(src + (size_t)(row0 + r) * ss + d) : 0.f;
  }
}

// acc[r][c] += sum over the tile's 32 rows jj of w_r(jj) * M[jj][lane + 32c]:
// the weight of row jj for the warp's row r is lane jj's p[r] (a shuffle),
// M a [32][stride] tile in shared memory (consecutive lanes read
// consecutive columns). O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.
__device__ __forceinline__ void att_accum(float (*acc)[ATT_NC], const float *p, const float *M,
                                          int stride, int hd) {
  int lane = threadIdx.x & 31;
  for (int jj = 0; jj < ATT_TILE; jj++) {
    const float *row = M + jj * stride;
    float x[ATT_NC];
#pragma unroll
    for (int c = 0; c < ATT_NC; c++) x[c] = lane + 32 * c < hd ? row[lane + 32 * c] : 0.f;
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      float wt = __shfl_sync(ZT_FULL_MASK, p[r], jj);
#pragma unroll
      for (int c = 0; c < ATT_NC; c++) acc[r][c] += wt * x[c];
    }
  }
}

// Forward of query rows [q0, T) (q0 = 0: attn_fwd; T - n: attn_decode's
// last n rows over a KV cache), out [B, T - q0, H*hd] and lse
// [B, H, T - q0] (NULL: not kept). Block (b*H + h, query tile), the last
// tiles (the longest rows of the causal triangle) first. Per key tile: lane j computes the scores of
// key j0 + j against its warp's 4 query rows (q broadcast from shared
// memory), the warp updates each row's running max m and sum l (online
// softmax, as attn_fwd_tile), and then lane c accumulates output columns
// c, c + 32, ... of its rows from the tile's V rows, each key's probability
// broadcast by a shuffle.
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    att_fwd_kernel(T *out, float *lse, const T *qkv, int T_, int q0, int H, int KVH, int hd,
                   float scale) {
  extern __shared__ float sm[];
  float *Qs = sm;                    // [32][hd]
  float *Ks = Qs + ATT_TILE * hd;    // [32][hd + 1]
  float *Vs = Ks + ATT_TILE * (hd + 1); // [32][hd]
  int b = blockIdx.x / H, h = blockIdx.x % H, kvh = h / (H / KVH);
  int n = T_ - q0, nq = (n + ATT_TILE - 1) / ATT_TILE;
  int i0 = q0 + (nq - 1 - (int)blockIdx.y) * ATT_TILE;
  int rs = (H + 2 * KVH) * hd, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T *base = qkv + (size_t)b * T_ * rs;
  att_load(Qs, hd, base + (size_t)h * hd, rs, i0, T_, hd);
  float o[ATT_ROWS][ATT_NC], m[ATT_ROWS], l[ATT_ROWS];
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < ATT_NC; c++) o[r][c] = 0.f;
  }
  const float *q = Qs + w * ATT_ROWS * hd; // the warp's rows
  int kend = min(T_, i0 + ATT_TILE);      // keys some row of the tile sees
  for (int j0 = 0; j0 < kend; j0 += ATT_TILE) {
    __syncthreads(); // every warp is done with the previous K, V tiles
    att_load(Ks, hd + 1, base + (size_t)(H + kvh) * hd, rs, j0, T_, hd);
    att_load(Vs, hd, base + (size_t)(H + KVH + kvh) * hd, rs, j0, T_, hd);
    __syncthreads();
    float s[ATT_ROWS];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) s[r] = 0.f;
    const float *kr = Ks + lane * (hd + 1);
#pragma unroll 4
    for (int d = 0; d < hd; d++) {
      float kv = kr[d];
#pragma unroll
      for (int r = 0; r < ATT_ROWS; r++) s[r] += q[r * hd + d] * kv;
    }
    int j = j0 + lane;
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      int i = i0 + w * ATT_ROWS + r;
      float x = j <= i && j < T_ ? scale * s[r] : -INFINITY;
      // key 0 is in the first tile and every row sees it, so mx is finite
      // from the first tile on; the guards keep an unseen row at l = 0
      float mx = fmaxf(m[r], zt_warp_max(x));
      float p = x == -INFINITY ? 0.f : expf(x - mx);
      float alpha = m[r] == -INFINITY ? 0.f : expf(m[r] - mx);
      l[r] = alpha * l[r] + zt_warp_sum(p);
      m[r] = mx;
#pragma unroll
      for (int c = 0; c < ATT_NC; c++) o[r][c] *= alpha;
      s[r] = p;
    }
    att_accum(o, s, Vs, hd, hd); // O += P V
  }
  size_t os = (size_t)H * hd;
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    int i = i0 + w * ATT_ROWS + r;
    if (i >= T_) continue;
    T *orow = out + ((size_t)b * n + i - q0) * os + (size_t)h * hd;
#pragma unroll
    for (int c = 0; c < ATT_NC; c++)
      if (lane + 32 * c < hd) zt_st(orow + lane + 32 * c, o[r][c] / l[r]);
    if (lane == 0 && lse) lse[((size_t)b * H + h) * n + i - q0] = m[r] + logf(l[r]);
  }
}

// D = rowsum(dO * O) of query row i (0 past T): warp-wide, dO from the
// shared row g (column d at g[d]), O from global memory.
template <typename T>
__device__ float att_rowdot(const float *g, const T *out, size_t orow, int i, int T_, int hd) {
  int lane = threadIdx.x & 31;
  float acc = 0.f;
  if (i < T_) {
#pragma unroll
    for (int c = 0; c < ATT_NC; c++)
      if (lane + 32 * c < hd) acc += g[lane + 32 * c] * zt_ld(out + orow + lane + 32 * c);
  }
  return zt_warp_sum(acc);
}

// Two sets of dot products over hd for the backward kernels: s[r] = x . X_r
// and dp[r] = y . Y_r for the warp's rows r, with x, y this lane's own rows
// (padded: lanes hit different banks) and X_r, Y_r rows r of the warp's
// [ATT_ROWS][hd] block (the same address in every lane: a broadcast).
__device__ __forceinline__ void att_dots(float *s, float *dp, const float *x, const float *X,
                                         const float *y, const float *Y, int hd) {
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) s[r] = dp[r] = 0.f;
#pragma unroll 4
  for (int d = 0; d < hd; d++) {
    float xv = x[d], yv = y[d];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      s[r] += xv * X[r * hd + d];
      dp[r] += yv * Y[r * hd + d];
    }
  }
}

// Backward, dQ. Block (b*H + h, query tile), longest rows first. Per key
// tile: lane j computes, for key j0 + j and each of its warp's 4 rows, the
// score s and dP = dO . v; then P = exp(scale s - lse), dS = scale P (dP -
// D) (attn_bwd_tile's order of operations), and lane c accumulates dQ
// columns c, c + 32, ... over the tile's K rows, dS broadcast by shuffles.
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    att_bwd_dq_kernel(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse,
                      int T_, int H, int KVH, int hd, float scale) {
  extern __shared__ float sm[];
  float *Qs = sm;                        // [32][hd]
  float *Gs = Qs + ATT_TILE * hd;        // dO [32][hd]
  float *Ks = Gs + ATT_TILE * hd;        // [32][hd + 1]
  float *Vs = Ks + ATT_TILE * (hd + 1);  // [32][hd + 1]
  int b = blockIdx.x / H, h = blockIdx.x % H, kvh = h / (H / KVH);
  int nq = (T_ + ATT_TILE - 1) / ATT_TILE, i0 = (nq - 1 - (int)blockIdx.y) * ATT_TILE;
  int rs = (H + 2 * KVH) * hd, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  size_t os = (size_t)H * hd;
  const T *base = qkv + (size_t)b * T_ * rs;
  att_load(Qs, hd, base + (size_t)h * hd, rs, i0, T_, hd);
  att_load(Gs, hd, dout + (size_t)b * T_ * os + (size_t)h * hd, os, i0, T_, hd);
  __syncthreads();
  float D[ATT_ROWS], L[ATT_ROWS], dq[ATT_ROWS][ATT_NC];
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    int rr = w * ATT_ROWS + r, i = i0 + rr;
    D[r] = att_rowdot(Gs + rr * hd, out, ((size_t)b * T_ + i) * os + (size_t)h * hd, i, T_, hd);
    L[r] = i < T_ ? lse[((size_t)b * H + h) * T_ + i] : 0.f;
#pragma unroll
    for (int c = 0; c < ATT_NC; c++) dq[r][c] = 0.f;
  }
  const float *q = Qs + w * ATT_ROWS * hd, *g = Gs + w * ATT_ROWS * hd;
  int kend = min(T_, i0 + ATT_TILE);
  for (int j0 = 0; j0 < kend; j0 += ATT_TILE) {
    __syncthreads();
    att_load(Ks, hd + 1, base + (size_t)(H + kvh) * hd, rs, j0, T_, hd);
    att_load(Vs, hd + 1, base + (size_t)(H + KVH + kvh) * hd, rs, j0, T_, hd);
    __syncthreads();
    float s[ATT_ROWS], dp[ATT_ROWS];
    att_dots(s, dp, Ks + lane * (hd + 1), q, Vs + lane * (hd + 1), g, hd);
    int j = j0 + lane;
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      int i = i0 + w * ATT_ROWS + r;
      float p = j <= i && j < T_ ? expf(scale * s[r] - L[r]) : 0.f;
      s[r] = scale * p * (dp[r] - D[r]); // dS
    }
    att_accum(dq, s, Ks, hd + 1, hd); // dQ += dS K
  }
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    int i = i0 + w * ATT_ROWS + r;
    if (i >= T_) continue;
    T *drow = dqkv + ((size_t)b * T_ + i) * rs + (size_t)h * hd;
#pragma unroll
    for (int c = 0; c < ATT_NC; c++)
      if (lane + 32 * c < hd) zt_st(drow + lane + 32 * c, dq[r][c]);
  }
}

// Backward, dK and dV. Block (b*KVH + kv head, key tile j0); each warp owns
// 4 of the tile's keys and keeps their dK, dV rows in registers. For each
// query head of the group and each query tile from the diagonal on, lane i
// computes, for query q0 + i and each of its warp's keys, P and dS as the
// dQ kernel does; then lane c accumulates dV += P^T dO and dK += dS^T Q
// over the tile's 32 queries, P and dS broadcast by shuffles. One block
// sums everything its keys receive: no atomics, the same order each run.
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    att_bwd_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse,
                       int T_, int H, int KVH, int hd, float scale) {
  extern __shared__ float sm[];
  float *Ks = sm;                        // [32][hd]
  float *Vs = Ks + ATT_TILE * hd;        // [32][hd]
  float *Qs = Vs + ATT_TILE * hd;        // [32][hd + 1]
  float *Gs = Qs + ATT_TILE * (hd + 1);  // dO [32][hd + 1]
  float *Ls = Gs + ATT_TILE * (hd + 1);  // [32] the query rows' lse
  float *Ds = Ls + ATT_TILE;             // [32] and D
  int b = blockIdx.x / KVH, kvh = blockIdx.x % KVH, G = H / KVH;
  int j0 = blockIdx.y * ATT_TILE;
  int rs = (H + 2 * KVH) * hd, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  size_t os = (size_t)H * hd;
  const T *base = qkv + (size_t)b * T_ * rs;
  att_load(Ks, hd, base + (size_t)(H + kvh) * hd, rs, j0, T_, hd);
  att_load(Vs, hd, base + (size_t)(H + KVH + kvh) * hd, rs, j0, T_, hd);
  float dk[ATT_ROWS][ATT_NC], dv[ATT_ROWS][ATT_NC];
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++)
#pragma unroll
    for (int c = 0; c < ATT_NC; c++) dk[r][c] = dv[r][c] = 0.f;
  const float *k = Ks + w * ATT_ROWS * hd, *v = Vs + w * ATT_ROWS * hd; // the warp's keys
  for (int h = kvh * G; h < (kvh + 1) * G; h++) {
    const float *lrow = lse + ((size_t)b * H + h) * T_;
    // queries before j0 see none of these keys
    for (int q0 = j0; q0 < T_; q0 += ATT_TILE) {
      __syncthreads(); // every warp is done with the previous Q, dO, L, D
      att_load(Qs, hd + 1, base + (size_t)h * hd, rs, q0, T_, hd);
      att_load(Gs, hd + 1, dout + (size_t)b * T_ * os + (size_t)h * hd, os, q0, T_, hd);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < ATT_ROWS; r++) {
        int rr = w * ATT_ROWS + r, i = q0 + rr;
        float D = att_rowdot(Gs + rr * (hd + 1), out, ((size_t)b * T_ + i) * os + (size_t)h * hd,
                             i, T_, hd);
        if (lane == 0) Ds[rr] = D, Ls[rr] = i < T_ ? lrow[i] : 0.f;
      }
      __syncthreads();
      float s[ATT_ROWS], dp[ATT_ROWS];
      att_dots(s, dp, Qs + lane * (hd + 1), k, Gs + lane * (hd + 1), v, hd);
      int i = q0 + lane;
      float Li = Ls[lane], Di = Ds[lane];
#pragma unroll
      for (int r = 0; r < ATT_ROWS; r++) {
        int j = j0 + w * ATT_ROWS + r;
        float p = j <= i && i < T_ ? expf(scale * s[r] - Li) : 0.f;
        s[r] = p;
        dp[r] = scale * p * (dp[r] - Di); // dS
      }
      att_accum(dv, s, Gs, hd + 1, hd);  // dV += P^T dO
      att_accum(dk, dp, Qs, hd + 1, hd); // dK += dS^T Q
    }
  }
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    int j = j0 + w * ATT_ROWS + r;
    if (j >= T_) continue;
    T *krow = dqkv + ((size_t)b * T_ + j) * rs + (size_t)(H + kvh) * hd;
    T *vrow = dqkv + ((size_t)b * T_ + j) * rs + (size_t)(H + KVH + kvh) * hd;
#pragma unroll
    for (int c = 0; c < ATT_NC; c++) {
      int d = lane + 32 * c;
      if (d < hd) zt_st(krow + d, dk[r][c]), zt_st(vrow + d, dv[r][c]);
    }
  }
}

// 1 when the shape is one the kernels take; else 0 with the reason kept.
static int att_shape_ok(const char *op, int B, int T_, int H, int KVH, int hd) {
  const char *why = NULL;
  if (hd < 1 || hd > ATT_HD_MAX) why = "head dim must be 1..128";
  else if (KVH < 1 || H % KVH) why = "H must be a multiple of KVH";
  else if ((long long)B * H > 0x7fffffffLL) why = "B*H too large for the grid";
  else if ((T_ + ATT_TILE - 1) / ATT_TILE > 65535) why = "T too large for the grid";
  if (!why) return 1;
  char msg[160];
  snprintf(msg, sizeof msg, "%s (B %d, T %d, H %d, KVH %d, hd %d)", why, B, T_, H, KVH, hd);
  zt_cuda_fail(op, msg, __FILE__, __LINE__);
  return 0;
}

// Launches kern with `bytes` of dynamic shared memory, above the default
// 48 KB limit when hd is large (the attribute is per kernel).
#define ATT_LAUNCH(kern, grid, bytes, stream, ...)                                            \
  do {                                                                                       \
    ZT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,   \
                                       (int)(bytes)));                                       \
    kern<<<grid, ATT_THREADS, bytes, stream>>>(__VA_ARGS__);                                  \
    ZT_CUDA_LAUNCHED(#kern);                                                                 \
  } while (0)

extern "C" void zt_cuda_attn_fwd(zt_stream *s, zt_dtype t, void *out, float *lse,
                                 const void *qkv, int B, int T, int H, int KVH, int hd) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  if (!zt_cuda_dtype_ok(t, "attn_fwd") || !att_shape_ok("attn_fwd", B, T, H, KVH, hd)) return;
  float scale = 1.f / sqrtf((float)hd);
  dim3 grid((unsigned)(B * H), (unsigned)((T + ATT_TILE - 1) / ATT_TILE));
  size_t bytes = sizeof(float) * ATT_TILE * (3 * (size_t)hd + 1);
  ZT_DISPATCH_AS(t, "attn", E,
              ATT_LAUNCH(att_fwd_kernel<E>, grid, bytes, zt_cuda_stream(s), (E *)out, lse,
                         (const E *)qkv, T, 0, H, KVH, hd, scale));
}

extern "C" void zt_cuda_attn_decode(zt_stream *s, zt_dtype t, void *out, const void *qkv, int T,
                                    int n, int H, int KVH, int hd) {
  if (n <= 0 || T < n || H <= 0) return;
  if (!zt_cuda_dtype_ok(t, "attn_decode") || !att_shape_ok("attn_decode", 1, T, H, KVH, hd))
    return;
  float scale = 1.f / sqrtf((float)hd);
  dim3 grid((unsigned)H, (unsigned)((n + ATT_TILE - 1) / ATT_TILE));
  size_t bytes = sizeof(float) * ATT_TILE * (3 * (size_t)hd + 1);
  ZT_DISPATCH_AS(t, "attn", E,
              ATT_LAUNCH(att_fwd_kernel<E>, grid, bytes, zt_cuda_stream(s), (E *)out,
                         (float *)NULL, (const E *)qkv, T, T - n, H, KVH, hd, scale));
}

extern "C" void zt_cuda_attn_bwd(zt_stream *s, zt_dtype t, void *dqkv, const void *dout,
                                 const void *qkv, const void *out, const float *lse, int B,
                                 int T, int H, int KVH, int hd) {
  if (B <= 0 || T <= 0 || H <= 0) return;
  if (!zt_cuda_dtype_ok(t, "attn_bwd") || !att_shape_ok("attn_bwd", B, T, H, KVH, hd)) return;
  float scale = 1.f / sqrtf((float)hd);
  unsigned tiles = (unsigned)((T + ATT_TILE - 1) / ATT_TILE);
  size_t tile4 = sizeof(float) * ATT_TILE * (4 * (size_t)hd + 2); // two [32][hd], two padded
  cudaStream_t cs = zt_cuda_stream(s);
  ZT_DISPATCH_AS(t, "attn", E, {
    ATT_LAUNCH(att_bwd_dq_kernel<E>, dim3((unsigned)(B * H), tiles), tile4, cs, (E *)dqkv,
               (const E *)dout, (const E *)qkv, (const E *)out, lse, T, H, KVH, hd, scale);
    ATT_LAUNCH(att_bwd_dkv_kernel<E>, dim3((unsigned)(B * KVH), tiles),
               tile4 + sizeof(float) * 2 * ATT_TILE, cs, (E *)dqkv, (const E *)dout,
               (const E *)qkv, (const E *)out, lse, T, H, KVH, hd, scale);
  });
}
