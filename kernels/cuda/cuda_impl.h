/* cuda_impl: what the CUDA backend's files share; not part of the device
 * contract (kernels/kernels.h), which is all the rest of ztrain sees.
 *
 * The backend's table lives in backend_cuda.cu; the GEMMs (cuBLASLt) in
 * gemm.cu, attention in attn.cu and the cross-entropy in xent.cu, each
 * implementing the contract op of the same name with the same arguments
 * and semantics as the CPU backend (kernels/cpu), which their tests
 * compare against.
 *
 * Errors: ops return nothing (they only enqueue) and CUDA reports many
 * failures later, at a synchronisation. Every CUDA, cuBLAS and launch
 * status goes through ZT_CUDA_CHECK / zt_cuda_fail, which keeps the first
 * failure (what failed, where, the library's message) for the backend's
 * `error` entry; the trainer reads it once per step. Nothing here prints
 * or exits. */
#ifndef ZT_CUDA_IMPL_H
#define ZT_CUDA_IMPL_H

#include <cuda_runtime.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The contract's opaque types on this backend. */
struct zt_stream {
  cudaStream_t s;
};
struct zt_event {
  cudaEvent_t e;
};

/* Keeps the first failure: `what` failed at file:line with message msg. */
void zt_cuda_fail(const char *what, const char *msg, const char *file, int line);
#define ZT_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    cudaError_t zt_rc_ = (call);                                                     \
    if (zt_rc_ != cudaSuccess)                                                       \
      zt_cuda_fail(#call, cudaGetErrorString(zt_rc_), __FILE__, __LINE__);           \
  } while (0)
/* After a kernel launch: a bad configuration is reported at once. */
#define ZT_CUDA_LAUNCHED(name) ZT_CUDA_CHECK(cudaPeekAtLastError())

/* The stream's handle (the default stream for NULL). */
static inline cudaStream_t zt_cuda_stream(zt_stream *s) { return s ? s->s : (cudaStream_t)0; }

/* gemm.cu: cuBLASLt, row-major as the contract states (C = alpha op(A)
 * op(B) + beta C); fp32 GEMMs use TF32 only after zt_cuda_gemm_allow_tf32(1). */
void zt_cuda_gemm(zt_stream *s, zt_dtype t, zt_dtype tc, int ta, int tb, int m, int n, int k,
                  float alpha, const void *a, int lda, const void *b, int ldb, float beta, void *c,
                  int ldc);
void zt_cuda_gemm_allow_tf32(int allow);
/* What a GEMM keeps (zt_backend.gemm_scratch): the calling stream's
 * cuBLASLt workspace, made at its first GEMM, the same for every shape. */
size_t zt_cuda_gemm_scratch(zt_dtype t, zt_dtype tc, int m, int n, int k);
void zt_cuda_gemm_release(void); /* the handle and workspace, at exit */

/* attn.cu */
void zt_cuda_attn_fwd(zt_stream *s, zt_dtype t, void *out, float *lse, const void *qkv, int B,
                      int T, int H, int KVH, int hd);
void zt_cuda_attn_bwd(zt_stream *s, zt_dtype t, void *dqkv, const void *dout, const void *qkv,
                      const void *out, const float *lse, int B, int T, int H, int KVH, int hd);
void zt_cuda_attn_decode(zt_stream *s, zt_dtype t, void *out, const void *qkv, int T, int n,
                         int H, int KVH, int hd);

/* xent.cu */
void zt_cuda_xent_fwd_bwd(zt_stream *s, zt_dtype t, void *logits, float *loss,
                          const int32_t *targets, int N, int V, float dscale);
void zt_cuda_xent_max(zt_stream *s, zt_dtype t, float *stats, const void *logits, int N, int V);
void zt_cuda_xent_sumexp(zt_stream *s, zt_dtype t, float *stats, const void *logits,
                         const int32_t *targets, int N, int V, int v0);
void zt_cuda_xent_finish(zt_stream *s, zt_dtype t, void *logits, float *loss,
                         const float *stats, const int32_t *targets, int N, int V, int v0,
                         float dscale);

#ifdef __cplusplus
}
#endif

#endif
