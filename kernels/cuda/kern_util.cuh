// kern_util: device helpers that attn.cu and xent.cu share: 16-bit values
// widened to fp32 as they are read and rounded once (to nearest even) as
// they are stored, as the contract (kernels/kernels.h) requires; warp
// reductions; and the dispatch of a templated launch on the op's dtype.
#ifndef ZT_CUDA_KERN_UTIL_CUH
#define ZT_CUDA_KERN_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "kernels/cuda/cuda_impl.h"

#define ZT_FULL_MASK 0xffffffffu

__device__ __forceinline__ float zt_ld(const float *p) { return *p; }
__device__ __forceinline__ float zt_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float zt_ld(const __half *p) { return __half2float(*p); }

__device__ __forceinline__ void zt_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void zt_st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void zt_st(__half *p, float v) { *p = __float2half_rn(v); }

__device__ __forceinline__ float zt_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ZT_FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ float zt_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ZT_FULL_MASK, v, o));
  return v;
}

// 1 when the ops take t; else 0 with the failure kept for the backend's
// `error` (an op has no other way to report it).
static inline int zt_cuda_dtype_ok(zt_dtype t, const char *op) {
  if (t == ZT_F32 || t == ZT_BF16 || t == ZT_F16) return 1;
  zt_cuda_fail(op, "dtype not supported (f32, bf16 and f16 are)", __FILE__, __LINE__);
  return 0;
}

// Runs the statements with `elem` typedef'd to the storage type of t (one
// of the three dtypes zt_cuda_dtype_ok accepts).
#define ZT_DISPATCH(t, elem, ...)              \
  do {                                         \
    if ((t) == ZT_BF16) {                      \
      typedef __nv_bfloat16 elem;              \
      __VA_ARGS__;                             \
    } else if ((t) == ZT_F16) {                \
      typedef __half elem;                     \
      __VA_ARGS__;                             \
    } else {                                   \
      typedef float elem;                      \
      __VA_ARGS__;                             \
    }                                          \
  } while (0)

#endif
