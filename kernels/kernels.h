/* kernels: the device contract every backend implements (ggml-style table
 * of function pointers), so that the CPU and CUDA backends are two
 * implementations of one interface. It has two parts.
 *
 * Memory: buffers of a kind (device memory, pinned host memory that a
 * device copies to and from asynchronously, plain host memory). Pointers
 * to device memory are never dereferenced by the caller; data moves only
 * through `copy`, which is ordered on a stream like any op.
 *
 * Execution: a stream is a queue of work that runs in order; every op and
 * copy takes one and only enqueues (on the CPU backend it runs at once, so
 * its streams and events are trivial). Work on two streams is ordered by
 * an event recorded on one and waited for on the other; the host waits by
 * stream_sync or event_sync before it reads what a stream wrote into host
 * memory.
 *
 * Element types: an op states the dtype `t` of the tensors it reads and
 * writes as activations and compute weights (ZT_F32, ZT_BF16, ZT_F16;
 * pointers `void *`); its statistics (norms' mean and rstd, attention's
 * lse, losses) and the parameter gradients it accumulates are always fp32
 * (`float *`), and so is all arithmetic inside (16-bit values are widened
 * as they are read and rounded once, to nearest even, as they are stored).
 * A backend may refuse a dtype it does not implement: `has_dtype` says.
 *
 * Shapes: N = rows (batch*time), C = channels, T = time. Ops named *_bwd
 * accumulate (+=) into parameter gradients; whether an input gradient is
 * accumulated or overwritten is stated per op, because the residual stream
 * relies on accumulation. */
#ifndef ZT_KERNELS_H
#define ZT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/tensor.h"

#ifdef __cplusplus /* the CUDA backend's .cu files define some of these */
extern "C" {
#endif

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
                    * coefficient and the loss scale; 1 = none): the same float
                    * product as scaling the gradients first, without a pass */
} zt_adamw_args;

typedef enum {
  ZT_MEM_DEVICE = 0, /* where ops run */
  ZT_MEM_PINNED,     /* host memory a device copies asynchronously */
  ZT_MEM_HOST        /* plain host memory */
} zt_mem_kind;

typedef struct zt_stream zt_stream; /* a backend's own */
typedef struct zt_event zt_event;

/* What a step reads back from the device once, at its end: filled by the
 * reductions below on the device, read with one copy. */
typedef struct zt_step_sums {
  double sumsq;       /* sum of squares of the gradients reduced */
  uint64_t nonfinite; /* elements found NaN or infinite */
} zt_step_sums;

typedef struct zt_backend {
  const char *name;
  /* ZT_MEM_DEVICE memory is host memory that the host may read and write
   * directly (the CPU backend): code may then skip staging copies. 0 on a
   * GPU (and for zt_backend_remote). */
  int host_visible;
  /* Whether p points into this backend's ZT_MEM_DEVICE memory. */
  int (*is_device)(const void *p);
  /* dtypes the ops take as `t` on this backend */
  int (*has_dtype)(zt_dtype t);
  /* A device reports failures asynchronously, and ops return nothing: the
   * backend keeps its first failure. 0 while there is none; else nonzero
   * with what failed and why in msg[n] (the CPU backend never fails here:
   * it reports running out of memory by alloc's NULL). */
  int (*error)(char *msg, size_t n);

  /* ---- memory ---- */
  void *(*alloc)(zt_mem_kind kind, size_t bytes); /* zeroed; NULL on failure */
  void (*free)(zt_mem_kind kind, void *p);
  /* bytes from src to dst (any kinds), in order on s. A source in plain
   * host memory (ZT_MEM_HOST, a stack variable) may be reused as soon as
   * copy returns; pinned memory, source or destination, belongs to the
   * stream until it has passed the copy (stream_sync, event_sync). */
  void (*copy)(zt_stream *s, void *dst, const void *src, size_t bytes);
  /* dst: device or pinned memory */
  void (*memzero)(zt_stream *s, void *dst, size_t bytes);

  /* ---- execution ---- */
  zt_stream *(*stream_new)(void); /* NULL on failure */
  void (*stream_free)(zt_stream *s);
  void (*stream_sync)(zt_stream *s); /* the host waits for all s holds */
  zt_event *(*event_new)(void);
  void (*event_free)(zt_event *e);
  void (*event_record)(zt_event *e, zt_stream *s); /* e: when s reaches here */
  void (*event_wait)(zt_stream *s, zt_event *e);   /* s goes on after e */
  void (*event_sync)(zt_event *e);                 /* the host waits for e */

  /* ---- ops ---- */
  /* C[m,n] = alpha * op(A) op(B) + beta * C, row-major, op = transpose if
   * t*; A and B of dtype t, products summed in fp32 (a 16-bit product is
   * exact in fp32, so this is a GPU's 16-bit GEMM with fp32 accumulation),
   * C of dtype tc: t, or ZT_F32 for gradients accumulated in fp32. */
  void (*gemm)(zt_stream *s, zt_dtype t, zt_dtype tc, int ta, int tb, int m, int n, int k,
               float alpha, const void *a, int lda, const void *b, int ldb, float beta,
               void *c, int ldc);
  /* Bytes of host memory that a gemm of this shape (t and tc as above)
   * leaves held by the thread that calls it, beyond its operands: the CPU
   * backend's 16-bit GEMMs widen their operands into a scratch of their
   * thread (at most 128 MiB) that they keep between calls and grow to the
   * largest GEMM the thread has run, so it is held for the whole run. A
   * planner takes the largest figure over the GEMMs a thread runs, summed
   * over the threads that run GEMMs; 0 where none is kept (fp32). */
  size_t (*gemm_scratch)(zt_dtype t, zt_dtype tc, int m, int n, int k);
  /* Bytes of host memory the ops allocate inside one call and free before
   * they return, at the most over the calls of a model with T positions,
   * head dim hd and V vocabulary rows on this rank, on `threads` threads:
   * the CPU backend's attention tiles per thread (and in 16 bits a head's
   * rows widened) and its loss's widened row of V per thread. A planner
   * adds it to the peak. NULL: none. */
  size_t (*op_scratch)(zt_dtype t, int T, int hd, int V, int threads);

  /* Embedding lookup from a table of which rows [v0, v0 + Vl) are here
   * (v0 = 0, Vl = V: the whole table; else a vocab-parallel shard).
   * out[N,C] = wte[tok - v0] for tokens in range, 0 for the others (another
   * shard's), + wpe[t] when wpe != NULL; N = B*T. Summing the outputs of all
   * shards, wpe passed to one of them, gives the whole lookup exactly. */
  void (*embed_fwd)(zt_stream *s, zt_dtype t, void *out, const int32_t *tok, const void *wte,
                    const void *wpe, int B, int T, int C, int v0, int Vl);
  /* dwte[tok - v0] += dout for tokens in range; dwpe[t] += dout (when
   * dwpe != NULL) */
  void (*embed_bwd)(zt_stream *s, zt_dtype t, float *dwte, float *dwpe, const int32_t *tok,
                    const void *dout, int B, int T, int C, int v0, int Vl);

  /* LayerNorm with weight and bias; dx += */
  void (*layernorm_fwd)(zt_stream *s, zt_dtype t, void *out, float *mean, float *rstd,
                        const void *x, const void *w, const void *b, int N, int C, float eps);
  void (*layernorm_bwd)(zt_stream *s, zt_dtype t, void *dx, float *dw, float *db,
                        const void *dout, const void *x, const void *w, const float *mean,
                        const float *rstd, int N, int C);
  /* RMSNorm with weight; dx += */
  void (*rmsnorm_fwd)(zt_stream *s, zt_dtype t, void *out, float *rstd, const void *x,
                      const void *w, int N, int C, float eps);
  void (*rmsnorm_bwd)(zt_stream *s, zt_dtype t, void *dx, float *dw, const void *dout,
                      const void *x, const void *w, const float *rstd, int N, int C);

  /* y[N,C] += b[C];  db[C] += colsum(dy) */
  void (*bias_fwd)(zt_stream *s, zt_dtype t, void *y, const void *b, int N, int C);
  void (*bias_bwd)(zt_stream *s, zt_dtype t, float *db, const void *dy, int N, int C);

  /* tanh-approximated GELU, elementwise; dx = */
  void (*gelu_fwd)(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n);
  void (*gelu_bwd)(zt_stream *s, zt_dtype t, void *dx, const void *x, const void *dy, size_t n);
  /* SwiGLU: gu[N, 2F] holds gate then up; h[N,F] = silu(gate) * up; dgu = */
  void (*swiglu_fwd)(zt_stream *s, zt_dtype t, void *h, const void *gu, int N, int F);
  void (*swiglu_bwd)(zt_stream *s, zt_dtype t, void *dgu, const void *gu, const void *dh, int N,
                     int F);

  /* Rotary embedding ("rotate half") in place on the first `nh` heads of
   * each row of x (row stride rs), position = row % T; cs holds cos then sin
   * tables [T, hd/2] each (fp32). bwd rotates back (the transpose). */
  void (*rope_fwd)(zt_stream *s, zt_dtype t, void *x, const float *cs, int N, int T, int nh,
                   int hd, int rs);
  void (*rope_bwd)(zt_stream *s, zt_dtype t, void *dx, const float *cs, int N, int T, int nh,
                   int hd, int rs);

  /* Causal attention over qkv rows [q: H*hd | k: KVH*hd | v: KVH*hd]; query
   * head h reads kv head h / (H/KVH); scores scaled by 1/sqrt(hd). fwd
   * writes out[N, H*hd] and lse[B, H, T], each row's log-sum-exp of its
   * scaled causal scores (row max included), which is all backward keeps
   * besides qkv and out: memory O(N), never [T, T]. bwd recomputes the
   * probabilities from qkv and lse and writes dqkv (=). */
  void (*attn_fwd)(zt_stream *s, zt_dtype t, void *out, float *lse, const void *qkv, int B,
                   int T, int H, int KVH, int hd);
  void (*attn_bwd)(zt_stream *s, zt_dtype t, void *dqkv, const void *dout, const void *qkv,
                   const void *out, const float *lse, int B, int T, int H, int KVH, int hd);
  /* Incremental decoding over a KV cache: qkv holds rows [0, T) of one
   * sequence (as attn_fwd reads them: the keys and values of every
   * position so far, with the queries of the last n); out[n, H*hd] =
   * attn_fwd's output rows T - n .. T - 1 for B = 1 (each over its keys
   * [0, row]), computed as attn_fwd computes them (the same online
   * softmax over the same key tiles, query tiles from row T - n on),
   * without lse; out is overwritten (=). One new token a step is n = 1:
   * its cost grows with T, not T^2. */
  void (*attn_decode)(zt_stream *s, zt_dtype t, void *out, const void *qkv, int T, int n, int H,
                      int KVH, int hd);

  /* Cross-entropy: per-row loss[N] = logsumexp(logits) - logits[target];
   * logits are overwritten by dlogits = (softmax - onehot) * dscale. */
  void (*xent_fwd_bwd)(zt_stream *s, zt_dtype t, void *logits, float *loss,
                       const int32_t *targets, int N, int V, float dscale);
  /* The same in three steps over a vocab-parallel shard, logits[N, V]
   * being columns [v0, v0 + V) of the full rows; the caller combines the
   * shards' stats[3N] = [max | sumexp | target logit] in between:
   *   xent_max     stats[0:N) = row max            -> max over shards
   *   xent_sumexp  stats[N:2N) = sum exp(l - max), stats[2N:3N) = l[target]
   *                when the target is in this shard, else 0  -> sum over
   *                shards of stats[N:3N)
   *   xent_finish  loss[N] = max + log(sumexp) - target logit; logits
   *                overwritten by this shard's (softmax - onehot) * dscale. */
  void (*xent_max)(zt_stream *s, zt_dtype t, float *stats, const void *logits, int N, int V);
  void (*xent_sumexp)(zt_stream *s, zt_dtype t, float *stats, const void *logits,
                      const int32_t *targets, int N, int V, int v0);
  void (*xent_finish)(zt_stream *s, zt_dtype t, void *logits, float *loss, const float *stats,
                      const int32_t *targets, int N, int V, int v0, float dscale);

  /* y += x (n elements of t) */
  void (*add)(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n);
  /* dst[n] (dtype td) = src[n] (dtype ts), rounded to nearest even */
  void (*convert)(zt_stream *s, zt_dtype td, void *dst, zt_dtype ts, const void *src, size_t n);

  /* Reductions a step reads back once (zt_step_sums in device memory):
   * sums->sumsq += sum of x^2 (in double); sums->nonfinite += NaN and
   * infinite elements of x. */
  void (*sumsq)(zt_stream *s, zt_step_sums *sums, const float *x, size_t n);
  void (*count_nonfinite)(zt_stream *s, zt_step_sums *sums, const float *x, size_t n);
  /* AdamW on n fp32 elements: p = p*decay; m = b1*m + c1*g*gscale;
   * v = b2*v + c2*(g*gscale)^2; p -= step * m / (sqrt(v)/bc2_sqrt + eps);
   * sums->nonfinite += new p not finite (counted in the same pass). With
   * p16 != NULL the new p is also stored there in t16 (the 16-bit weights
   * the model computes with). p, g, m, v and p16 must not overlap (the CPU
   * loop reads and writes each once, through restrict pointers). */
  void (*adamw)(zt_stream *s, float *p, const float *g, float *m, float *v, size_t n,
                const zt_adamw_args *a, zt_step_sums *sums, void *p16, zt_dtype t16);
} zt_backend;

/* The CPU backend (BLAS + OpenMP). Always available. */
const zt_backend *zt_backend_cpu(void);

/* For tests: the CPU backend with device memory the host cannot address
 * (any dereference outside the contract faults), as on a GPU. */
const zt_backend *zt_backend_remote(void);

/* Number of CUDA devices usable by this build and process (0 without CUDA). */
int zt_backend_cuda_devices(void);

/* The CUDA backend on device `device` of this process (0 <= device <
 * zt_backend_cuda_devices()), which becomes the process's current device;
 * NULL with the reason in msg[n] when the build has no CUDA or the device
 * cannot be used. Every call returns the same table: one device per
 * process. */
const zt_backend *zt_backend_cuda(int device, char *msg, size_t n);

#ifdef __cplusplus
}
#endif

#endif
