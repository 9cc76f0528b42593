// xent: the contract's cross-entropy ops on the GPU (kernels/kernels.h),
// with the CPU backend's semantics (kernels/cpu/ops_impl.h): the fused
// forward and backward over whole rows, and the three steps of the
// vocab-parallel version, whose stats[3N] = [max | sumexp | target logit]
// the caller combines over the shards between the steps.
//
// Thread mapping, every kernel: one block of XENT_THREADS threads per row
// n (blockIdx.x); thread i reads columns i, i + XENT_THREADS, ... so that a
// warp's loads are consecutive, and the block reduces its threads' partial
// results (warp shuffles, then one value per warp through shared memory).
// Rows are long (V up to ~128k) and few (N = batch * time), so a block a
// row keeps every SM busy without splitting a row over blocks.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/ops_cuda.cuh"

#define XENT_THREADS 512
#define XENT_WARPS (XENT_THREADS / 32)

// (m, s) pairs meaning s * e^m: the running max and the sum of e^(x - m)
// below it. A pair with m = -inf holds nothing (s = 0).
__device__ __forceinline__ void xent_pair_add(float &m, float &s, float m2, float s2) {
  float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return; // both empty
  s = (m == -INFINITY ? 0.f : s * expf(m - mx)) + (m2 == -INFINITY ? 0.f : s2 * expf(m2 - mx));
  m = mx;
}

// Every thread gets the block's combined pair. sh: 2 * XENT_WARPS floats.
__device__ void xent_block_pair(float &m, float &s, float *sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(ZT_FULL_MASK, m, o), s2 = __shfl_xor_sync(ZT_FULL_MASK, s, o);
    xent_pair_add(m, s, m2, s2);
  }
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sh[w] = m, sh[XENT_WARPS + w] = s;
  __syncthreads();
  m = lane < XENT_WARPS ? sh[lane] : -INFINITY;
  s = lane < XENT_WARPS ? sh[XENT_WARPS + lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(ZT_FULL_MASK, m, o), s2 = __shfl_xor_sync(ZT_FULL_MASK, s, o);
    xent_pair_add(m, s, m2, s2);
  }
}

// Every thread gets the block's sum (max when is_max). sh: XENT_WARPS floats.
__device__ float xent_block_reduce(float v, float *sh, bool is_max) {
  v = is_max ? zt_warp_max(v) : zt_warp_sum(v);
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < XENT_WARPS ? sh[lane] : (is_max ? -INFINITY : 0.f);
  return is_max ? zt_warp_max(v) : zt_warp_sum(v);
}

// row = (softmax - onehot) * dscale in place, from the row's lse; t is the
// target's column in this row, or outside [0, V) when another shard holds
// it. The same float operations as the CPU's row_dlogits.
template <typename T>
__device__ void xent_dlogits_row(T *row, int V, float lse, int t, float dscale) {
  for (int v = threadIdx.x; v < V; v += XENT_THREADS) {
    float d = expf(zt_ld(row + v) - lse) * dscale;
    if (v == t) d -= dscale;
    zt_st(row + v, d);
  }
}

template <typename T>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_fused_kernel(T *logits, float *loss, const int32_t *targets, int V, float dscale) {
  __shared__ float sh[2 * XENT_WARPS];
  size_t n = blockIdx.x;
  T *row = logits + n * (size_t)V;
  int t = targets[n];
  // read before the row is overwritten: every write below comes after the
  // barrier in xent_block_pair. A target outside the row (the CPU would
  // read out of bounds) counts as a target logit of 0 and no onehot.
  float lt = t >= 0 && t < V ? zt_ld(row + t) : 0.f;
  // one pass for max and sum: each thread's online pair over its columns
  float m = -INFINITY, s = 0.f;
  for (int v = threadIdx.x; v < V; v += XENT_THREADS) {
    float x = zt_ld(row + v);
    if (x > m) {
      s = s * expf(m - x) + 1.f;
      m = x;
    } else if (m != -INFINITY) {
      s += expf(x - m);
    }
  }
  xent_block_pair(m, s, sh);
  float lse = m + logf(s);
  if (threadIdx.x == 0) loss[n] = lse - lt;
  xent_dlogits_row(row, V, lse, t, dscale);
}

template <typename T>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_max_kernel(float *stats, const T *logits, int V) {
  __shared__ float sh[XENT_WARPS];
  size_t n = blockIdx.x;
  const T *row = logits + n * (size_t)V;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += XENT_THREADS) m = fmaxf(m, zt_ld(row + v));
  m = xent_block_reduce(m, sh, true);
  if (threadIdx.x == 0) stats[n] = m;
}

template <typename T>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_sumexp_kernel(float *stats, const T *logits, const int32_t *targets, int N, int V,
                       int v0) {
  __shared__ float sh[XENT_WARPS];
  size_t n = blockIdx.x;
  const T *row = logits + n * (size_t)V;
  float mx = stats[n], s = 0.f;
  for (int v = threadIdx.x; v < V; v += XENT_THREADS) s += expf(zt_ld(row + v) - mx);
  s = xent_block_reduce(s, sh, false);
  if (threadIdx.x == 0) {
    int t = targets[n] - v0;
    stats[N + n] = s;
    stats[2 * (size_t)N + n] = t >= 0 && t < V ? zt_ld(row + t) : 0.f;
  }
}

template <typename T>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_finish_kernel(T *logits, float *loss, const float *stats, const int32_t *targets,
                       int N, int V, int v0, float dscale) {
  size_t n = blockIdx.x;
  float lse = stats[n] + logf(stats[N + n]);
  if (threadIdx.x == 0) loss[n] = lse - stats[2 * (size_t)N + n];
  xent_dlogits_row(logits + n * (size_t)V, V, lse, targets[n] - v0, dscale);
}

extern "C" void zt_cuda_xent_fwd_bwd(zt_stream *s, zt_dtype t, void *logits, float *loss,
                                     const int32_t *targets, int N, int V, float dscale) {
  if (N <= 0 || V <= 0 || !zt_cuda_dtype_ok(t, "xent_fwd_bwd")) return;
  ZT_DISPATCH_AS(t, "xent", T,
              xent_fused_kernel<T><<<N, XENT_THREADS, 0, zt_cuda_stream(s)>>>(
                  (T *)logits, loss, targets, V, dscale));
  ZT_CUDA_LAUNCHED("xent_fused_kernel");
}

extern "C" void zt_cuda_xent_max(zt_stream *s, zt_dtype t, float *stats, const void *logits,
                                 int N, int V) {
  if (N <= 0 || V <= 0 || !zt_cuda_dtype_ok(t, "xent_max")) return;
  ZT_DISPATCH_AS(t, "xent", T,
              xent_max_kernel<T><<<N, XENT_THREADS, 0, zt_cuda_stream(s)>>>(
                  stats, (const T *)logits, V));
  ZT_CUDA_LAUNCHED("xent_max_kernel");
}

extern "C" void zt_cuda_xent_sumexp(zt_stream *s, zt_dtype t, float *stats, const void *logits,
                                    const int32_t *targets, int N, int V, int v0) {
  if (N <= 0 || V <= 0 || !zt_cuda_dtype_ok(t, "xent_sumexp")) return;
  ZT_DISPATCH_AS(t, "xent", T,
              xent_sumexp_kernel<T><<<N, XENT_THREADS, 0, zt_cuda_stream(s)>>>(
                  stats, (const T *)logits, targets, N, V, v0));
  ZT_CUDA_LAUNCHED("xent_sumexp_kernel");
}

extern "C" void zt_cuda_xent_finish(zt_stream *s, zt_dtype t, void *logits, float *loss,
                                    const float *stats, const int32_t *targets, int N, int V,
                                    int v0, float dscale) {
  if (N <= 0 || V <= 0 || !zt_cuda_dtype_ok(t, "xent_finish")) return;
  ZT_DISPATCH_AS(t, "xent", T,
              xent_finish_kernel<T><<<N, XENT_THREADS, 0, zt_cuda_stream(s)>>>(
                  (T *)logits, loss, stats, targets, N, V, v0, dscale));
  ZT_CUDA_LAUNCHED("xent_finish_kernel");
}
