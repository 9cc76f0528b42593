// norms: LayerNorm and RMSNorm forward and backward, and the column sums
// that accumulate their parameter gradients and bias_bwd's, for the CUDA
// backend; the same formulas as kernels/cpu/ops_impl.h on float.
//
// Rows: one block per row (grid-stride over rows), its threads striding
// over the C columns; a row's sums are block reductions (warp shuffles,
// then one value per warp in shared memory). A row is read again for each
// pass over it, from L1/L2.
//
// Parameter gradients (dw, db += a sum over the N rows) are deterministic:
// rows are cut into fixed chunks (their count depends on N only), a thread
// per (column, chunk) sums its chunk's rows in order into scratch, and a
// thread per column adds the chunks' sums in order to dw/db. No atomics, so
// a run repeats its bits; the grouping differs from the CPU's one running
// sum, so the values agree to float rounding, not bitwise.
#include "kernels/cuda/ops_cuda.cuh"

#define ZT_NORM_THREADS 256

static inline unsigned zt_norm_blocks(int N) { return (unsigned)(N < 65535 ? N : 65535); }

// ---- forward ----

// mean and variance in two passes over the row, as the CPU: m = sum x / C,
// var = sum (x - m)^2 / C, rstd = 1 / sqrt(var + eps).
template <typename T>
__global__ void layernorm_fwd_k(T *out, float *mean, float *rstd, const T *x, const T *w,
                                const T *b, int N, int C, float eps) {
  __shared__ float sh[32];
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const T *xr = x + (size_t)n * C;
    float s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += zt_ld(xr[c]);
    float m = zt_block_sum(s, sh) / (float)C;
    float q = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float d = zt_ld(xr[c]) - m;
      q += d * d;
    }
    float var = zt_block_sum(q, sh) / (float)C;
    float r = 1.0f / sqrtf(var + eps);
    T *o = out + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      o[c] = zt_st<T>((zt_ld(xr[c]) - m) * r * zt_ld(w[c]) + zt_ld(b[c]));
    if (threadIdx.x == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
}

template <typename T>
__global__ void rmsnorm_fwd_k(T *out, float *rstd, const T *x, const T *w, int N, int C,
                              float eps) {
  __shared__ float sh[32];
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const T *xr = x + (size_t)n * C;
    float ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float v = zt_ld(xr[c]);
      ss += v * v;
    }
    float r = 1.0f / sqrtf(zt_block_sum(ss, sh) / (float)C + eps);
    T *o = out + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = zt_st<T>(zt_ld(xr[c]) * r * zt_ld(w[c]));
    if (threadIdx.x == 0) rstd[n] = r;
  }
}

void zt_cuda_layernorm_fwd(zt_stream *s, zt_dtype t, void *out, float *mean, float *rstd,
                           const void *x, const void *w, const void *b, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  ZT_DISPATCH(t, "layernorm_fwd", {
    layernorm_fwd_k<T><<<zt_norm_blocks(N), ZT_NORM_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)out, mean, rstd, (const T *)x, (const T *)w, (const T *)b, N, C, eps);
    ZT_CUDA_LAUNCHED("layernorm_fwd");
  });
}

void zt_cuda_rmsnorm_fwd(zt_stream *s, zt_dtype t, void *out, float *rstd, const void *x,
                         const void *w, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  ZT_DISPATCH(t, "rmsnorm_fwd", {
    rmsnorm_fwd_k<T><<<zt_norm_blocks(N), ZT_NORM_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)out, rstd, (const T *)x, (const T *)w, N, C, eps);
    ZT_CUDA_LAUNCHED("rmsnorm_fwd");
  });
}

// ---- backward: the input gradient (dx +=) ----

// LayerNorm: g = dout * w; dx += (g - mean(g) - xhat * mean(g * xhat)) * rstd,
// xhat = (x - mean) * rstd.
template <typename T>
__global__ void layernorm_dx_k(T *dx, const T *dout, const T *x, const T *w, const float *mean,
                               const float *rstd, int N, int C) {
  __shared__ float sh[32];
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const T *d = dout + (size_t)n * C, *xr = x + (size_t)n * C;
    float m = mean[n], r = rstd[n], gs = 0, gxs = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float g = zt_ld(d[c]) * zt_ld(w[c]);
      gs += g;
      gxs += g * (zt_ld(xr[c]) - m) * r;
    }
    float g_mean = zt_block_sum(gs, sh) / (float)C;
    float g_norm_mean = zt_block_sum(gxs, sh) / (float)C;
    T *dxr = dx + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float xhat = (zt_ld(xr[c]) - m) * r;
      float g = zt_ld(d[c]) * zt_ld(w[c]);
      dxr[c] = zt_st<T>(zt_ld(dxr[c]) + (g - g_mean - xhat * g_norm_mean) * r);
    }
  }
}

// RMSNorm: k = sum(dout * w * x) * rstd^2 / C; dx += rstd * (dout * w - x * k).
template <typename T>
__global__ void rmsnorm_dx_k(T *dx, const T *dout, const T *x, const T *w, const float *rstd,
                             int N, int C) {
  __shared__ float sh[32];
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const T *d = dout + (size_t)n * C, *xr = x + (size_t)n * C;
    float r = rstd[n], dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      dot += zt_ld(d[c]) * zt_ld(w[c]) * zt_ld(xr[c]);
    float k = zt_block_sum(dot, sh) * r * r / (float)C;
    T *dxr = dx + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      dxr[c] = zt_st<T>(zt_ld(dxr[c]) + r * (zt_ld(d[c]) * zt_ld(w[c]) - zt_ld(xr[c]) * k));
  }
}

// ---- the column sums: dw += sum_n dout * (x - mean) * rstd, db += sum_n dout ----

// Rows per chunk: at least 32, and few enough chunks (at most about 256)
// that the finishing pass is short. Depends on N only.
static inline int zt_chunk_rows(int N) {
  int r = (N + 255) / 256;
  return r < 32 ? 32 : r;
}

// Grid (column tiles of blockDim.x, chunks); thread (c, chunk) sums the
// chunk's rows in order, reading row after row across the tile's columns
// (coalesced). pw gets the dw terms when x != NULL (mean NULL: RMSNorm, x - 0
// is x), pb the db terms when pb != NULL; both [chunks, C].
template <typename T>
__global__ void colsum_part_k(float *pw, float *pb, const T *dout, const T *x, const float *mean,
                              const float *rstd, int N, int C, int rows) {
  int c = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
  if (c >= C) return;
  int n0 = ch * rows, n1 = n0 + rows < N ? n0 + rows : N;
  float sw = 0, sb = 0;
  for (int n = n0; n < n1; n++) {
    float d = zt_ld(dout[(size_t)n * C + c]);
    if (x) sw += d * (zt_ld(x[(size_t)n * C + c]) - (mean ? mean[n] : 0.0f)) * rstd[n];
    sb += d;
  }
  if (x) pw[(size_t)ch * C + c] = sw;
  if (pb) pb[(size_t)ch * C + c] = sb;
}

// Thread per column (grid-stride): the chunks' sums in order, added once.
__global__ void colsum_finish_k(float *dw, float *db, const float *pw, const float *pb,
                                int chunks, int C) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    if (dw) {
      float a = 0;
      for (int k = 0; k < chunks; k++) a += pw[(size_t)k * C + c];
      dw[c] += a;
    }
    if (db) {
      float a = 0;
      for (int k = 0; k < chunks; k++) a += pb[(size_t)k * C + c];
      db[c] += a;
    }
  }
}

// dw (when x != NULL) and db (when db != NULL) += the column sums.
static void zt_colsums(cudaStream_t st, zt_dtype t, float *dw, float *db, const void *dout,
                       const void *x, const float *mean, const float *rstd, int N, int C,
                       const char *name) {
  if (!zt_cuda_dtype_ok(t, name)) return;  // else the finish would add garbage
  int rows = zt_chunk_rows(N), chunks = (N + rows - 1) / rows;
  size_t per = (size_t)chunks * C;
  float *part = (float *)zt_cuda_scratch(st, per * ((x ? 1 : 0) + (db ? 1 : 0)) * sizeof(float),
                                         name);
  if (!part) return;
  float *pw = x ? part : NULL, *pb = db ? part + (x ? per : 0) : NULL;
  dim3 grid((unsigned)((C + 127) / 128), (unsigned)chunks);
  ZT_DISPATCH(t, name, {
    colsum_part_k<T><<<grid, 128, 0, st>>>(pw, pb, (const T *)dout, (const T *)x, mean, rstd, N,
                                           C, rows);
    ZT_CUDA_LAUNCHED(name);
  });
  colsum_finish_k<<<zt_cuda_blocks((size_t)C, 128), 128, 0, st>>>(x ? dw : NULL, db, pw, pb,
                                                                  chunks, C);
  ZT_CUDA_LAUNCHED(name);
  zt_cuda_scratch_free(st, part);
}

void zt_cuda_layernorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, float *db,
                           const void *dout, const void *x, const void *w, const float *mean,
                           const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  cudaStream_t st = zt_cuda_stream(s);
  ZT_DISPATCH(t, "layernorm_bwd", {
    layernorm_dx_k<T><<<zt_norm_blocks(N), ZT_NORM_THREADS, 0, st>>>(
        (T *)dx, (const T *)dout, (const T *)x, (const T *)w, mean, rstd, N, C);
    ZT_CUDA_LAUNCHED("layernorm_bwd");
  });
  zt_colsums(st, t, dw, db, dout, x, mean, rstd, N, C, "layernorm_bwd (dw, db)");
}

void zt_cuda_rmsnorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, const void *dout,
                         const void *x, const void *w, const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  cudaStream_t st = zt_cuda_stream(s);
  ZT_DISPATCH(t, "rmsnorm_bwd", {
    rmsnorm_dx_k<T><<<zt_norm_blocks(N), ZT_NORM_THREADS, 0, st>>>(
        (T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, N, C);
    ZT_CUDA_LAUNCHED("rmsnorm_bwd");
  });
  zt_colsums(st, t, dw, NULL, dout, x, NULL, rstd, N, C, "rmsnorm_bwd (dw)");
}

void zt_cuda_bias_bwd(zt_stream *s, zt_dtype t, float *db, const void *dy, int N, int C) {
  if (N <= 0 || C <= 0) return;
  zt_colsums(zt_cuda_stream(s), t, NULL, db, dy, NULL, NULL, NULL, N, C, "bias_bwd");
}
