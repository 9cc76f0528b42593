/* kernels: the one interface every device implements (ggml-style table of
 * function pointers). Pointers passed to the ops are device pointers: the
 * caller never dereferences them, and moves data only through upload and
 * download, so the CPU and CUDA backends are two implementations of one
 * contract. Shapes: N = rows (batch*time), C = channels, T = time.
 * Ops named *_bwd accumulate (+=) into parameter gradients; whether an input
 * gradient is accumulated or overwritten is stated per op, because the
 * residual stream relies on accumulation. */
#ifndef ZT_KERNELS_H
#define ZT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* AdamW coefficients, each computed once in double and rounded to float, as
 * torch.optim.AdamW does with its Python scalars: rounding 1 - b1 in float
 * instead would bias every update the same way, step after step. */
typedef struct zt_adamw_args {
  float decay;     /* 1 - lr * weight_decay */
  float b1, c1;    /* beta1, 1 - beta1 */
  float b2, c2;    /* beta2, 1 - beta2 */
  float eps;
  float step;      /* lr / (1 - beta1^t) */
  float bc2_sqrt;  /* sqrt(1 - beta2^t) */
  float gscale;    /* each gradient times this as it is read (the clipping
                    * coefficient; 1 = none): the same float product as
                    * scaling the gradients first, without a pass over them */
} zt_adamw_args;

typedef struct zt_backend {
  const char *name;
  /* memory */
  void *(*alloc)(size_t bytes); /* zeroed; NULL on failure */
  void (*free)(void *p);
  void (*upload)(void *dst_dev, const void *src_host, size_t bytes);
  void (*download)(void *dst_host, const void *src_dev, size_t bytes);
  void (*zero)(float *x, size_t n);
  void (*copy)(float *dst, const float *src, size_t n);

  /* C[m,n] = alpha * op(A) op(B) + beta * C, row-major, op = transpose if t*. */
  void (*gemm)(int ta, int tb, int m, int n, int k, float alpha,
               const float *a, int lda, const float *b, int ldb, float beta,
               float *c, int ldc);

  /* Embedding lookup from a table of which rows [v0, v0 + Vl) are here
   * (v0 = 0, Vl = V: the whole table; else a vocab-parallel shard).
   * out[N,C] = wte[tok - v0] for tokens in range, 0 for the others (another
   * shard's), + wpe[t] when wpe != NULL; N = B*T. Summing the outputs of all
   * shards, wpe passed to one of them, gives the whole lookup exactly. */
  void (*embed_fwd)(float *out, const int32_t *tok, const float *wte,
                    const float *wpe, int B, int T, int C, int v0, int Vl);
  /* dwte[tok - v0] += dout for tokens in range; dwpe[t] += dout (when
   * dwpe != NULL) */
  void (*embed_bwd)(float *dwte, float *dwpe, const int32_t *tok,
                    const float *dout, int B, int T, int C, int v0, int Vl);

  /* LayerNorm with weight and bias; dx += */
  void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *x,
                        const float *w, const float *b, int N, int C, float eps);
  void (*layernorm_bwd)(float *dx, float *dw, float *db, const float *dout,
                        const float *x, const float *w, const float *mean,
                        const float *rstd, int N, int C);
  /* RMSNorm with weight; dx += */
  void (*rmsnorm_fwd)(float *out, float *rstd, const float *x, const float *w,
                      int N, int C, float eps);
  void (*rmsnorm_bwd)(float *dx, float *dw, const float *dout, const float *x,
                      const float *w, const float *rstd, int N, int C);

  /* y[N,C] += b[C];  db[C] += colsum(dy) */
  void (*bias_fwd)(float *y, const float *b, int N, int C);
  void (*bias_bwd)(float *db, const float *dy, int N, int C);

  /* tanh-approximated GELU, elementwise; dx = */
  void (*gelu_fwd)(float *y, const float *x, size_t n);
  void (*gelu_bwd)(float *dx, const float *x, const float *dy, size_t n);
  /* SwiGLU: gu[N, 2F] holds gate then up; h[N,F] = silu(gate) * up; dgu = */
  void (*swiglu_fwd)(float *h, const float *gu, int N, int F);
  void (*swiglu_bwd)(float *dgu, const float *gu, const float *dh, int N, int F);

  /* Rotary embedding ("rotate half") in place on the first `nh` heads of
   * each row of x (row stride rs), position = row % T; cs holds cos then sin
   * tables [T, hd/2] each. bwd rotates back (the transpose). */
  void (*rope_fwd)(float *x, const float *cs, int N, int T, int nh, int hd, int rs);
  void (*rope_bwd)(float *dx, const float *cs, int N, int T, int nh, int hd, int rs);

  /* Causal attention over qkv rows [q: H*hd | k: KVH*hd | v: KVH*hd]; query
   * head h reads kv head h / (H/KVH); scores scaled by 1/sqrt(hd). fwd
   * writes out[N, H*hd] and lse[B, H, T], each row's log-sum-exp of its
   * scaled causal scores (row max included), which is all backward keeps
   * besides qkv and out: memory O(N), never [T, T]. bwd recomputes the
   * probabilities from qkv and lse and writes dqkv (=). */
  void (*attn_fwd)(float *out, float *lse, const float *qkv, int B, int T,
                   int H, int KVH, int hd);
  void (*attn_bwd)(float *dqkv, const float *dout, const float *qkv,
                   const float *out, const float *lse, int B, int T, int H,
                   int KVH, int hd);

  /* Cross-entropy: per-row loss[N] = logsumexp(logits) - logits[target];
   * logits are overwritten by dlogits = (softmax - onehot) * dscale. */
  void (*xent_fwd_bwd)(float *logits, float *loss, const int32_t *targets,
                       int N, int V, float dscale);
  /* The same in three steps over a vocab-parallel shard, logits[N, V]
   * being columns [v0, v0 + V) of the full rows; the caller combines the
   * shards' stats[3N] = [max | sumexp | target logit] in between:
   *   xent_max     stats[0:N) = row max            -> max over shards
   *   xent_sumexp  stats[N:2N) = sum exp(l - max), stats[2N:3N) = l[target]
   *                when the target is in this shard, else 0  -> sum over
   *                shards of stats[N:3N)
   *   xent_finish  loss[N] = max + log(sumexp) - target logit; logits
   *                overwritten by this shard's (softmax - onehot) * dscale. */
  void (*xent_max)(float *stats, const float *logits, int N, int V);
  void (*xent_sumexp)(float *stats, const float *logits,
                      const int32_t *targets, int N, int V, int v0);
  void (*xent_finish)(float *logits, float *loss, const float *stats,
                      const int32_t *targets, int N, int V, int v0,
                      float dscale);

  /* y += x */
  void (*add)(float *y, const float *x, size_t n);
  void (*scale)(float *x, float s, size_t n);
  /* sum of squares, accumulated in double */
  double (*sumsq)(const float *x, size_t n);
  /* AdamW on n elements: p = p*decay; m = b1*m + c1*g; v = b2*v + c2*g^2;
   * p -= step * m / (sqrt(v)/bc2_sqrt + eps). Returns how many of the new
   * p are not finite (counted in the same pass). */
  size_t (*adamw)(float *p, const float *g, float *m, float *v, size_t n,
                  const struct zt_adamw_args *a);
} zt_backend;

/* The CPU backend (BLAS + OpenMP). Always available. */
const zt_backend *zt_backend_cpu(void);

/* Number of CUDA devices usable by this build and process (0 without CUDA). */
int zt_backend_cuda_devices(void);

#endif
