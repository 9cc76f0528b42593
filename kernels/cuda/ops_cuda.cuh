// ops_cuda: what the CUDA backend's .cu files share besides cuda_impl.h:
// the element types' loads and stores, the dtype dispatch, the warp and
// block reductions, the stream-ordered scratch, and the declarations of
// the contract ops ops.cu and norms.cu implement (the table in
// backend_cuda.cu points at them). CUDA C++ only; nothing here is seen by C.
#ifndef ZT_OPS_CUDA_CUH
#define ZT_OPS_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_impl.h"

// ---- element types: widened exactly to float as read, rounded once (to
// nearest even) as stored ----
__device__ __forceinline__ float zt_ld(float x) { return x; }
__device__ __forceinline__ float zt_ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float zt_ld(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T zt_st(float v);
template <> __device__ __forceinline__ float zt_st<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 zt_st<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half zt_st<__half>(float v) { return __float2half_rn(v); }
// the same through pointers
template <typename T> __device__ __forceinline__ float zt_ld(const T *p) { return zt_ld(*p); }
template <typename T> __device__ __forceinline__ void zt_st(T *p, float v) { *p = zt_st<T>(v); }

// Runs the statements with the type name `Type` standing for the element
// type of dtype t; another dtype is a caller's bug, reported through the
// sticky error (nothing is launched). ZT_DISPATCH names it T.
#define ZT_DISPATCH_AS(t, opname, Type, ...)                                         \
  do {                                                                               \
    switch (t) {                                                                     \
      case ZT_F32: { typedef float Type; __VA_ARGS__; } break;                       \
      case ZT_BF16: { typedef __nv_bfloat16 Type; __VA_ARGS__; } break;              \
      case ZT_F16: { typedef __half Type; __VA_ARGS__; } break;                      \
      default:                                                                       \
        zt_cuda_fail(opname, "the CUDA backend computes in f32, bf16 and f16 only; " \
                     "another dtype was asked", __FILE__, __LINE__);                 \
    }                                                                                \
  } while (0)
#define ZT_DISPATCH(t, opname, ...) ZT_DISPATCH_AS(t, opname, T, __VA_ARGS__)

// 1 when the ops take t; else 0 with the failure kept (an op that checks
// its shapes first refuses a dtype before them).
static inline int zt_cuda_dtype_ok(zt_dtype t, const char *op) {
  if (t == ZT_F32 || t == ZT_BF16 || t == ZT_F16) return 1;
  zt_cuda_fail(op, "the CUDA backend computes in f32, bf16 and f16 only; another dtype was asked",
               __FILE__, __LINE__);
  return 0;
}

// Blocks for a grid-stride loop over n items, threads per block each: enough
// to fill an H200 several times over, never more than the items need (the
// loops cover the rest).
static inline unsigned zt_cuda_blocks(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 8192 ? (b ? b : 1) : 8192);
}

// ---- reductions ----
#define ZT_FULL_MASK 0xffffffffu

// The sum over the warp, in every lane (butterfly: all 32 lanes active).
template <typename V> __device__ __forceinline__ V zt_warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ZT_FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ float zt_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ZT_FULL_MASK, v, o));
  return v;
}

// The sum over the block, in every thread. blockDim.x is a multiple of 32
// (at most 1024) and every thread calls it; sh holds 32 V. The first
// barrier lets a previous call's readers of sh finish before it is reused.
template <typename V> __device__ __forceinline__ V zt_block_sum(V v, V *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = zt_warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : (V)0;
  return zt_warp_sum(v);
}

// bytes of scratch ordered on stream s (cudaMallocAsync: no device
// synchronisation, served from the device's pool); NULL with the failure
// kept. zt_cuda_scratch_free gives it back in stream order.
void *zt_cuda_scratch(cudaStream_t s, size_t bytes, const char *what);
void zt_cuda_scratch_free(cudaStream_t s, void *p);

// ---- the contract ops of ops.cu and norms.cu (kernels.h states them) ----
void zt_cuda_embed_fwd(zt_stream *s, zt_dtype t, void *out, const int32_t *tok, const void *wte,
                       const void *wpe, int B, int T, int C, int v0, int Vl);
void zt_cuda_embed_bwd(zt_stream *s, zt_dtype t, float *dwte, float *dwpe, const int32_t *tok,
                       const void *dout, int B, int T, int C, int v0, int Vl);
void zt_cuda_layernorm_fwd(zt_stream *s, zt_dtype t, void *out, float *mean, float *rstd,
                           const void *x, const void *w, const void *b, int N, int C, float eps);
void zt_cuda_layernorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, float *db,
                           const void *dout, const void *x, const void *w, const float *mean,
                           const float *rstd, int N, int C);
void zt_cuda_rmsnorm_fwd(zt_stream *s, zt_dtype t, void *out, float *rstd, const void *x,
                         const void *w, int N, int C, float eps);
void zt_cuda_rmsnorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, const void *dout,
                         const void *x, const void *w, const float *rstd, int N, int C);
void zt_cuda_bias_fwd(zt_stream *s, zt_dtype t, void *y, const void *b, int N, int C);
void zt_cuda_bias_bwd(zt_stream *s, zt_dtype t, float *db, const void *dy, int N, int C);
void zt_cuda_gelu_fwd(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n);
void zt_cuda_gelu_bwd(zt_stream *s, zt_dtype t, void *dx, const void *x, const void *dy,
                      size_t n);
void zt_cuda_swiglu_fwd(zt_stream *s, zt_dtype t, void *h, const void *gu, int N, int F);
void zt_cuda_swiglu_bwd(zt_stream *s, zt_dtype t, void *dgu, const void *gu, const void *dh,
                        int N, int F);
void zt_cuda_rope_fwd(zt_stream *s, zt_dtype t, void *x, const float *cs, int N, int T, int nh,
                      int hd, int rs);
void zt_cuda_rope_bwd(zt_stream *s, zt_dtype t, void *dx, const float *cs, int N, int T, int nh,
                      int hd, int rs);
void zt_cuda_add(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n);
void zt_cuda_convert(zt_stream *s, zt_dtype td, void *dst, zt_dtype ts, const void *src,
                     size_t n);
void zt_cuda_sumsq(zt_stream *s, zt_step_sums *sums, const float *x, size_t n);
void zt_cuda_count_nonfinite(zt_stream *s, zt_step_sums *sums, const float *x, size_t n);
void zt_cuda_adamw(zt_stream *s, float *p, const float *g, float *m, float *v, size_t n,
                   const zt_adamw_args *a, zt_step_sums *sums, void *p16, zt_dtype t16);

#endif
