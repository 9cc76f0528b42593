// ops: the CUDA backend's elementwise and row-local contract ops (embedding,
// bias, GELU, SwiGLU, RoPE, add, convert, the step's reductions, AdamW),
// each computing what the CPU backend's loop (kernels/cpu/ops_impl.h) does
// on the same values: 16-bit inputs widened to float, float arithmetic,
// each 16-bit result rounded once to nearest even. The norms are in
// norms.cu. Every op only enqueues on its stream; launch failures go to
// the sticky error.
#include "kernels/cuda/ops_cuda.cuh"

#define ZT_THREADS 256

// Rows that a kernel goes through block by block: a grid of at most 65535
// blocks, each taking rows blockIdx.x, blockIdx.x + gridDim.x, ...
static inline unsigned zt_row_blocks(int N) { return (unsigned)(N < 65535 ? N : 65535); }

// ---- embedding ----

// Block per row n (grid-stride over rows), threads over the C columns:
// coalesced reads of the table row and writes of out's row.
template <typename T>
__global__ void embed_fwd_k(T *out, const int32_t *tok, const T *wte, const T *wpe, int N, int T_,
                            int C, int v0, int Vl) {
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    int v = tok[n] - v0;
    const T *e = v >= 0 && v < Vl ? wte + (size_t)v * C : NULL;
    const T *p = wpe ? wpe + (size_t)(n % T_) * C : NULL;
    T *o = out + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      // as the CPU: a sum rounded once, a lone row copied, else zero
      if (e && p) o[c] = zt_st<T>(zt_ld(e[c]) + zt_ld(p[c]));
      else if (e) o[c] = e[c];
      else if (p) o[c] = p[c];
      else o[c] = zt_st<T>(0.0f);
    }
  }
}

void zt_cuda_embed_fwd(zt_stream *s, zt_dtype t, void *out, const int32_t *tok, const void *wte,
                       const void *wpe, int B, int T_, int C, int v0, int Vl) {
  int N = B * T_;
  if (N <= 0 || C <= 0) return;
  ZT_DISPATCH(t, "embed_fwd", {
    embed_fwd_k<T><<<zt_row_blocks(N), ZT_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)out, tok, (const T *)wte, (const T *)wpe, N, T_, C, v0, Vl);
    ZT_CUDA_LAUNCHED("embed_fwd");
  });
}

// dwte, deterministically and in the CPU's order: thread (column c, bucket
// k) walks all N tokens in order and adds the rows of the tokens v with
// v % K == k. A table row belongs to one bucket, so no two threads write
// the same element, and each element receives its rows in increasing n,
// one float add each: the CPU's sum, bit for bit. Grid (column tiles of
// 128, K buckets); the token read is the same address across a warp.
#define ZT_EMBED_BUCKETS 64
template <typename T>
__global__ void embed_bwd_wte_k(float *dwte, const int32_t *tok, const T *dout, int N, int C,
                                int v0, int Vl) {
  int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= C) return;
  for (int n = 0; n < N; n++) {
    int v = __ldg(tok + n) - v0;
    if (v >= 0 && v < Vl && v % ZT_EMBED_BUCKETS == k)
      dwte[(size_t)v * C + c] += zt_ld(dout[(size_t)n * C + c]);
  }
}

// dwpe[t, c] += dout[b*T + t, c] for b = 0, 1, ...: a thread per (t, c)
// element (grid-stride), the rows in the CPU's order.
template <typename T>
__global__ void embed_bwd_wpe_k(float *dwpe, const T *dout, int B, int T_, int C) {
  size_t total = (size_t)T_ * C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += zt_ld(dout[(size_t)b * total + i]);
    dwpe[i] = acc;
  }
}

void zt_cuda_embed_bwd(zt_stream *s, zt_dtype t, float *dwte, float *dwpe, const int32_t *tok,
                       const void *dout, int B, int T_, int C, int v0, int Vl) {
  int N = B * T_;
  if (N <= 0 || C <= 0) return;
  cudaStream_t st = zt_cuda_stream(s);
  ZT_DISPATCH(t, "embed_bwd", {
    dim3 grid((unsigned)((C + 127) / 128), ZT_EMBED_BUCKETS);
    embed_bwd_wte_k<T><<<grid, 128, 0, st>>>(dwte, tok, (const T *)dout, N, C, v0, Vl);
    ZT_CUDA_LAUNCHED("embed_bwd (wte)");
    if (dwpe) {
      embed_bwd_wpe_k<T><<<zt_cuda_blocks((size_t)T_ * C, ZT_THREADS), ZT_THREADS, 0, st>>>(
          dwpe, (const T *)dout, B, T_, C);
      ZT_CUDA_LAUNCHED("embed_bwd (wpe)");
    }
  });
}

// ---- bias ----

// y[n, c] += b[c]: block per row (grid-stride), threads over columns.
template <typename T> __global__ void bias_fwd_k(T *y, const T *b, int N, int C) {
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    T *yr = y + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = zt_st<T>(zt_ld(yr[c]) + zt_ld(b[c]));
  }
}

void zt_cuda_bias_fwd(zt_stream *s, zt_dtype t, void *y, const void *b, int N, int C) {
  if (N <= 0 || C <= 0) return;
  ZT_DISPATCH(t, "bias_fwd", {
    bias_fwd_k<T><<<zt_row_blocks(N), ZT_THREADS, 0, zt_cuda_stream(s)>>>((T *)y, (const T *)b,
                                                                          N, C);
    ZT_CUDA_LAUNCHED("bias_fwd");
  });
}

// bias_bwd is a column sum: norms.cu's deterministic column reduction.

// ---- GELU (tanh approximation, the CPU's constants) ----

#define ZT_GELU_K 0.7978845608028654f  // sqrt(2/pi)

// Thread per element, grid-stride (both GELU kernels).
template <typename T> __global__ void gelu_fwd_k(T *y, const T *x, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = zt_ld(x[i]);
    y[i] = zt_st<T>(0.5f * v * (1.0f + tanhf(ZT_GELU_K * (v + 0.044715f * v * v * v))));
  }
}

template <typename T> __global__ void gelu_bwd_k(T *dx, const T *x, const T *dy, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = zt_ld(x[i]);
    float u = ZT_GELU_K * (v + 0.044715f * v * v * v);
    float th = tanhf(u);
    float du = ZT_GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = zt_st<T>(zt_ld(dy[i]) * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du));
  }
}

void zt_cuda_gelu_fwd(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n) {
  if (!n) return;
  ZT_DISPATCH(t, "gelu_fwd", {
    gelu_fwd_k<T><<<zt_cuda_blocks(n, ZT_THREADS), ZT_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)y, (const T *)x, n);
    ZT_CUDA_LAUNCHED("gelu_fwd");
  });
}

void zt_cuda_gelu_bwd(zt_stream *s, zt_dtype t, void *dx, const void *x, const void *dy,
                      size_t n) {
  if (!n) return;
  ZT_DISPATCH(t, "gelu_bwd", {
    gelu_bwd_k<T><<<zt_cuda_blocks(n, ZT_THREADS), ZT_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)dx, (const T *)x, (const T *)dy, n);
    ZT_CUDA_LAUNCHED("gelu_bwd");
  });
}

// ---- SwiGLU: gu[N, 2F] = [gate | up] ----

// Block per row (grid-stride), threads over f.
template <typename T> __global__ void swiglu_fwd_k(T *h, const T *gu, int N, int F) {
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const T *g = gu + (size_t)n * 2 * F, *u = g + F;
    for (int f = threadIdx.x; f < F; f += blockDim.x) {
      float gf = zt_ld(g[f]);
      h[(size_t)n * F + f] = zt_st<T>(gf / (1.0f + expf(-gf)) * zt_ld(u[f]));
    }
  }
}

template <typename T>
__global__ void swiglu_bwd_k(T *dgu, const T *gu, const T *dh, int N, int F) {
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const T *g = gu + (size_t)n * 2 * F, *u = g + F;
    T *dg = dgu + (size_t)n * 2 * F, *du = dg + F;
    for (int f = threadIdx.x; f < F; f += blockDim.x) {
      float gf = zt_ld(g[f]), uf = zt_ld(u[f]), d = zt_ld(dh[(size_t)n * F + f]);
      float sig = 1.0f / (1.0f + expf(-gf));
      du[f] = zt_st<T>(d * gf * sig);
      dg[f] = zt_st<T>(d * uf * sig * (1.0f + gf * (1.0f - sig)));
    }
  }
}

void zt_cuda_swiglu_fwd(zt_stream *s, zt_dtype t, void *h, const void *gu, int N, int F) {
  if (N <= 0 || F <= 0) return;
  ZT_DISPATCH(t, "swiglu_fwd", {
    swiglu_fwd_k<T><<<zt_row_blocks(N), ZT_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)h, (const T *)gu, N, F);
    ZT_CUDA_LAUNCHED("swiglu_fwd");
  });
}

void zt_cuda_swiglu_bwd(zt_stream *s, zt_dtype t, void *dgu, const void *gu, const void *dh,
                        int N, int F) {
  if (N <= 0 || F <= 0) return;
  ZT_DISPATCH(t, "swiglu_bwd", {
    swiglu_bwd_k<T><<<zt_row_blocks(N), ZT_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)dgu, (const T *)gu, (const T *)dh, N, F);
    ZT_CUDA_LAUNCHED("swiglu_bwd");
  });
}

// ---- RoPE ("rotate half") ----

// Block per row n (grid-stride), thread per pair (head h, i < hd/2): the
// pair (i, i + hd/2) of head h is read and written by that thread alone.
// dir = 1 rotates by +angle, -1 back (the transpose).
template <typename T>
__global__ void rope_k(T *x, const float *cs, int N, int T_, int nh, int hd, int rs, float dir) {
  int half = hd / 2, pairs = nh * half;
  const float *cosv = cs, *sinv = cs + (size_t)T_ * half;
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const float *co = cosv + (size_t)(n % T_) * half, *si = sinv + (size_t)(n % T_) * half;
    T *xr = x + (size_t)n * rs;
    for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
      int h = j / half, i = j - h * half;
      T *a = xr + (size_t)h * hd + i, *b = a + half;
      float sn = dir * si[i], x0 = zt_ld(*a), x1 = zt_ld(*b);
      *a = zt_st<T>(x0 * co[i] - x1 * sn);
      *b = zt_st<T>(x1 * co[i] + x0 * sn);
    }
  }
}

static void zt_rope(zt_stream *s, zt_dtype t, void *x, const float *cs, int N, int T_, int nh,
                    int hd, int rs, float dir, const char *name) {
  if (N <= 0 || nh <= 0 || hd < 2) return;
  ZT_DISPATCH(t, name, {
    rope_k<T><<<zt_row_blocks(N), ZT_THREADS, 0, zt_cuda_stream(s)>>>((T *)x, cs, N, T_, nh, hd,
                                                                      rs, dir);
    ZT_CUDA_LAUNCHED(name);
  });
}

void zt_cuda_rope_fwd(zt_stream *s, zt_dtype t, void *x, const float *cs, int N, int T_, int nh,
                      int hd, int rs) {
  zt_rope(s, t, x, cs, N, T_, nh, hd, rs, 1.0f, "rope_fwd");
}

void zt_cuda_rope_bwd(zt_stream *s, zt_dtype t, void *dx, const float *cs, int N, int T_, int nh,
                      int hd, int rs) {
  zt_rope(s, t, dx, cs, N, T_, nh, hd, rs, -1.0f, "rope_bwd");
}

// ---- add, convert ----

// Thread per element, grid-stride.
template <typename T> __global__ void add_k(T *y, const T *x, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] = zt_st<T>(zt_ld(y[i]) + zt_ld(x[i]));
}

void zt_cuda_add(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n) {
  if (!n) return;
  ZT_DISPATCH(t, "add", {
    add_k<T><<<zt_cuda_blocks(n, ZT_THREADS), ZT_THREADS, 0, zt_cuda_stream(s)>>>(
        (T *)y, (const T *)x, n);
    ZT_CUDA_LAUNCHED("add");
  });
}

// Thread per element, grid-stride. Widening is exact, so one rounding from
// the source value: bf16 <-> f16 too rounds once.
template <typename TD, typename TS> __global__ void convert_k(TD *dst, const TS *src, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = zt_st<TD>(zt_ld(src[i]));
}

template <typename TD>
static void zt_convert_to(cudaStream_t st, TD *dst, zt_dtype ts, const void *src, size_t n) {
  unsigned blocks = zt_cuda_blocks(n, ZT_THREADS);
  switch (ts) {
    case ZT_F32: convert_k<TD, float><<<blocks, ZT_THREADS, 0, st>>>(dst, (const float *)src, n); break;
    case ZT_BF16:
      convert_k<TD, __nv_bfloat16><<<blocks, ZT_THREADS, 0, st>>>(dst, (const __nv_bfloat16 *)src, n);
      break;
    case ZT_F16: convert_k<TD, __half><<<blocks, ZT_THREADS, 0, st>>>(dst, (const __half *)src, n); break;
    default:
      zt_cuda_fail("convert", "the source dtype is none of f32, bf16, f16", __FILE__,
                   __LINE__);
      return;
  }
  ZT_CUDA_LAUNCHED("convert");
}

void zt_cuda_convert(zt_stream *s, zt_dtype td, void *dst, zt_dtype ts, const void *src,
                     size_t n) {
  if (!n) return;
  cudaStream_t st = zt_cuda_stream(s);
  if (td == ts && (td == ZT_F32 || td == ZT_BF16 || td == ZT_F16)) {
    if (dst != src) ZT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * zt_dtype_size(td),
                                                  cudaMemcpyDefault, st));
    return;
  }
  ZT_DISPATCH(td, "convert", zt_convert_to<T>(st, (T *)dst, ts, src, n));
}

// ---- the step's reductions ----

// sumsq, deterministically: a fixed grid of ZT_SUMSQ_BLOCKS blocks (not the
// device's size), thread i of the grid summing elements i, i + grid, ... in
// double (each square of a float is exact in double), the block's sum into
// part[block]; then one block adds the parts in a fixed order to
// sums->sumsq. The same bits on every run and every GPU.
#define ZT_SUMSQ_BLOCKS 512
__global__ void sumsq_part_k(double *part, const float *x, size_t n) {
  __shared__ double sh[32];
  double acc = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    acc += (double)x[i] * (double)x[i];
  acc = zt_block_sum(acc, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// One block of ZT_SUMSQ_BLOCKS threads: thread j takes part[j], the tree of
// zt_block_sum is fixed.
__global__ void sumsq_finish_k(zt_step_sums *sums, const double *part) {
  __shared__ double sh[32];
  double acc = zt_block_sum(part[threadIdx.x], sh);
  if (threadIdx.x == 0) sums->sumsq += acc;
}

void zt_cuda_sumsq(zt_stream *s, zt_step_sums *sums, const float *x, size_t n) {
  if (!n) return;
  cudaStream_t st = zt_cuda_stream(s);
  double *part = (double *)zt_cuda_scratch(st, ZT_SUMSQ_BLOCKS * sizeof(double), "sumsq");
  if (!part) return;
  sumsq_part_k<<<ZT_SUMSQ_BLOCKS, ZT_THREADS, 0, st>>>(part, x, n);
  ZT_CUDA_LAUNCHED("sumsq");
  sumsq_finish_k<<<1, ZT_SUMSQ_BLOCKS, 0, st>>>(sums, part);
  ZT_CUDA_LAUNCHED("sumsq (finish)");
  zt_cuda_scratch_free(st, part);
}

// Thread per element (grid-stride) counting, a block sum, one atomic add per
// block that found any: integer adds, so the total does not depend on
// their order.
__global__ void nonfinite_k(zt_step_sums *sums, const float *x, size_t n) {
  __shared__ unsigned long long sh[32];
  unsigned long long bad = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    bad += !isfinite(x[i]);
  bad = zt_block_sum(bad, sh);
  if (threadIdx.x == 0 && bad) atomicAdd((unsigned long long *)&sums->nonfinite, bad);
}

void zt_cuda_count_nonfinite(zt_stream *s, zt_step_sums *sums, const float *x, size_t n) {
  if (!n) return;
  nonfinite_k<<<zt_cuda_blocks(n, ZT_THREADS), ZT_THREADS, 0, zt_cuda_stream(s)>>>(sums, x, n);
  ZT_CUDA_LAUNCHED("count_nonfinite");
}

// ---- AdamW ----

// Thread per element (grid-stride). The CPU's formula in its order of
// float operations, each product, sum, quotient and square root rounded as
// written (the _rn intrinsics keep nvcc from contracting into FMA, which
// the CPU build does not do either), so the new p, m and v are the CPU's
// bits. The non-finite count as in nonfinite_k; p16 (T16) the new p
// rounded once, when not NULL.
template <typename T16>
__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, zt_adamw_args a,
                        zt_step_sums *sums, T16 *p16) {
  __shared__ unsigned long long sh[32];
  unsigned long long bad = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gi = __fmul_rn(g[i], a.gscale);
    float pi = __fmul_rn(p[i], a.decay);
    float mi = __fadd_rn(__fmul_rn(a.b1, m[i]), __fmul_rn(a.c1, gi));
    float vi = __fadd_rn(__fmul_rn(a.b2, v[i]), __fmul_rn(__fmul_rn(a.c2, gi), gi));
    float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
    pi = __fsub_rn(pi, __fdiv_rn(__fmul_rn(a.step, mi), den));
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p16) p16[i] = zt_st<T16>(pi);
    bad += !isfinite(pi);
  }
  bad = zt_block_sum(bad, sh);
  if (threadIdx.x == 0 && bad) atomicAdd((unsigned long long *)&sums->nonfinite, bad);
}

void zt_cuda_adamw(zt_stream *s, float *p, const float *g, float *m, float *v, size_t n,
                   const zt_adamw_args *a, zt_step_sums *sums, void *p16, zt_dtype t16) {
  if (!n) return;
  // the coefficients by value: a is host memory the caller may reuse
  zt_adamw_args av = *a;
  unsigned blocks = zt_cuda_blocks(n, ZT_THREADS);
  cudaStream_t st = zt_cuda_stream(s);
  if (!p16) t16 = ZT_F32;  // any instantiation: p16 NULL stores nothing
  ZT_DISPATCH(t16, "adamw (p16)", {
    adamw_k<T><<<blocks, ZT_THREADS, 0, st>>>(p, g, m, v, n, av, sums, (T *)p16);
    ZT_CUDA_LAUNCHED("adamw");
  });
}
