/* ops: declarations of the CPU loops in ops_impl.h and attn_impl.h, one
 * set per instantiation: float (the backend), double (gradient checks in
 * tests), and bf16 and fp16 storage computed in float (mixed precision; 16-bit
 * values as their bit patterns, src/core/half.h). `real` is the compute
 * type, `store` how activations, the weights an op reads and input
 * gradients are held; norm statistics, lse, losses, cross-entropy stats and
 * parameter gradients stay real. Semantics: see kernels.h. */
#ifndef ZT_CPU_OPS_H
#define ZT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define ZT_CPU_OPS_DECLARE(real, store, P)                                     \
  /* C = alpha op(A) op(B) + beta C, products and sums in real; gemm_acc    \
   * accumulates a weight gradient into a real C */                          \
  void P##gemm(int ta, int tb, int m, int n, int k, real alpha,              \
               const store *a, int lda, const store *b, int ldb, real beta,  \
               store *c, int ldc);                                           \
  void P##gemm_acc(int ta, int tb, int m, int n, int k, real alpha,          \
                   const store *a, int lda, const store *b, int ldb,         \
                   real beta, real *c, int ldc);                             \
  /* bytes of scratch a gemm (c16 = 0: gemm_acc) of this shape leaves on   \
   * its calling thread, and what this thread's scratch holds now: the     \
   * largest of the former over its GEMMs (0 where store is real) */        \
  size_t P##gemm_scratch_bytes(int m, int n, int k, int c16);                \
  size_t P##gemm_scratch_held(void);                                         \
  /* bytes the ops allocate inside one call on nt threads and free on       \
   * return, at the most (attention at T, hd; the loss over V) */          \
  size_t P##op_scratch_bytes(int T, int hd, int V, int nt);                 \
  void P##embed_fwd(store *out, const int32_t *tok, const store *wte,        \
                    const store *wpe, int B, int T, int C, int v0, int Vl);  \
  void P##embed_bwd(real *dwte, real *dwpe, const int32_t *tok,              \
                    const store *dout, int B, int T, int C, int v0, int Vl); \
  void P##layernorm_fwd(store *out, real *mean, real *rstd, const store *x,  \
                        const store *w, const store *b, int N, int C,        \
                        real eps);                                           \
  void P##layernorm_bwd(store *dx, real *dw, real *db, const store *dout,    \
                        const store *x, const store *w, const real *mean,    \
                        const real *rstd, int N, int C);                     \
  void P##rmsnorm_fwd(store *out, real *rstd, const store *x,                \
                      const store *w, int N, int C, real eps);               \
  void P##rmsnorm_bwd(store *dx, real *dw, const store *dout,                \
                      const store *x, const store *w, const real *rstd,      \
                      int N, int C);                                         \
  void P##bias_fwd(store *y, const store *b, int N, int C);                  \
  void P##bias_bwd(real *db, const store *dy, int N, int C);                 \
  void P##gelu_fwd(store *y, const store *x, size_t n);                      \
  void P##gelu_bwd(store *dx, const store *x, const store *dy, size_t n);    \
  void P##swiglu_fwd(store *h, const store *gu, int N, int F);               \
  void P##swiglu_bwd(store *dgu, const store *gu, const store *dh, int N,    \
                     int F);                                                 \
  void P##rope_fwd(store *x, const real *cs, int N, int T, int nh, int hd,   \
                   int rs);                                                  \
  void P##rope_bwd(store *dx, const real *cs, int N, int T, int nh, int hd,  \
                   int rs);                                                  \
  void P##attn_fwd(store *out, real *lse, const store *qkv, int B, int T,    \
                   int H, int KVH, int hd);                                  \
  void P##attn_bwd(store *dqkv, const store *dout, const store *qkv,         \
                   const store *out, const real *lse, int B, int T, int H,   \
                   int KVH, int hd);                                         \
  void P##attn_decode(store *out, const store *qkv, int T, int n, int H,     \
                      int KVH, int hd);                                      \
  void P##xent_fwd_bwd(store *logits, real *loss, const int32_t *targets,    \
                       int N, int V, real dscale);                           \
  void P##xent_max(real *stats, const store *logits, int N, int V);          \
  void P##xent_sumexp(real *stats, const store *logits,                      \
                      const int32_t *targets, int N, int V, int v0);         \
  void P##xent_finish(store *logits, real *loss, const real *stats,          \
                      const int32_t *targets, int N, int V, int v0,          \
                      real dscale);                                          \
  void P##add(store *y, const store *x, size_t n);                           \
  void P##scale(real *x, real s, size_t n);                                  \
  double P##sumsq(const real *x, size_t n);                                  \
  /* AdamW on real master weights; p16 (may be NULL) gets the new weights  \
   * rounded to store in the same pass */                                    \
  size_t P##adamw_p16(real *p, const real *g, real *m, real *v, size_t n,    \
                      const zt_adamw_args *a, store *p16);                   \
  /* the same without p16, for kernels.h's table of today */                \
  size_t P##adamw(real *p, const real *g, real *m, real *v, size_t n,        \
                  const zt_adamw_args *a);

ZT_CPU_OPS_DECLARE(float, float, zt_cpu_f32_)
ZT_CPU_OPS_DECLARE(double, double, zt_cpu_f64_)
ZT_CPU_OPS_DECLARE(float, uint16_t, zt_cpu_bf16_)
ZT_CPU_OPS_DECLARE(float, uint16_t, zt_cpu_f16_)

#endif
