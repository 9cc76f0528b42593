/* ops: declarations of the CPU loops in ops_impl.h, for float (the backend)
 * and for double (gradient checks in tests). Semantics: see kernels.h. */
#ifndef ZT_CPU_OPS_H
#define ZT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define ZT_CPU_OPS_DECLARE(real, P)                                            \
  void P##gemm(int ta, int tb, int m, int n, int k, real alpha, const real *a, \
               int lda, const real *b, int ldb, real beta, real *c, int ldc);  \
  void P##embed_fwd(real *out, const int32_t *tok, const real *wte,            \
                    const real *wpe, int B, int T, int C, int v0, int Vl);     \
  void P##embed_bwd(real *dwte, real *dwpe, const int32_t *tok,                \
                    const real *dout, int B, int T, int C, int v0, int Vl);    \
  void P##layernorm_fwd(real *out, real *mean, real *rstd, const real *x,      \
                        const real *w, const real *b, int N, int C, real eps); \
  void P##layernorm_bwd(real *dx, real *dw, real *db, const real *dout,        \
                        const real *x, const real *w, const real *mean,        \
                        const real *rstd, int N, int C);                       \
  void P##rmsnorm_fwd(real *out, real *rstd, const real *x, const real *w,     \
                      int N, int C, real eps);                                 \
  void P##rmsnorm_bwd(real *dx, real *dw, const real *dout, const real *x,     \
                      const real *w, const real *rstd, int N, int C);          \
  void P##bias_fwd(real *y, const real *b, int N, int C);                      \
  void P##bias_bwd(real *db, const real *dy, int N, int C);                    \
  void P##gelu_fwd(real *y, const real *x, size_t n);                          \
  void P##gelu_bwd(real *dx, const real *x, const real *dy, size_t n);         \
  void P##swiglu_fwd(real *h, const real *gu, int N, int F);                   \
  void P##swiglu_bwd(real *dgu, const real *gu, const real *dh, int N, int F); \
  void P##rope_fwd(real *x, const real *cs, int N, int T, int nh, int hd,      \
                   int rs);                                                    \
  void P##rope_bwd(real *dx, const real *cs, int N, int T, int nh, int hd,     \
                   int rs);                                                    \
  void P##attn_fwd(real *out, real *lse, const real *qkv, int B, int T,        \
                   int H, int KVH, int hd);                                    \
  void P##attn_bwd(real *dqkv, const real *dout, const real *qkv,              \
                   const real *out, const real *lse, int B, int T, int H,      \
                   int KVH, int hd);                                           \
  void P##xent_fwd_bwd(real *logits, real *loss, const int32_t *targets,       \
                       int N, int V, real dscale);                             \
  void P##xent_max(real *stats, const real *logits, int N, int V);             \
  void P##xent_sumexp(real *stats, const real *logits, const int32_t *targets, \
                      int N, int V, int v0);                                   \
  void P##xent_finish(real *logits, real *loss, const real *stats,             \
                      const int32_t *targets, int N, int V, int v0,            \
                      real dscale);                                            \
  void P##add(real *y, const real *x, size_t n);                               \
  void P##scale(real *x, real s, size_t n);                                    \
  double P##sumsq(const real *x, size_t n);                                    \
  size_t P##adamw(real *p, const real *g, real *m, real *v, size_t n,         \
                  const zt_adamw_args *a);

ZT_CPU_OPS_DECLARE(float, zt_cpu_f32_)
ZT_CPU_OPS_DECLARE(double, zt_cpu_f64_)

#endif
