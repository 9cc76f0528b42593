/* backend_cpu: the CPU implementation of the kernels.h contract. Memory of
 * every kind is plain host memory, 64-byte aligned for the vector loops.
 * Work runs at once on the calling thread (with OpenMP inside), so a
 * stream is already done when an op returns: streams and events are
 * tokens with nothing to wait for. Each op picks the instantiation of
 * ops_impl.h for its dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "kernels/kernels.h"
#include "src/core/half.h"

struct zt_stream { int unused; };
struct zt_event { int unused; };

static int cpu_has_dtype(zt_dtype t) { return t == ZT_F32 || t == ZT_BF16 || t == ZT_F16; }

/* All its memory is host memory: nothing is "device" memory the host
 * cannot read (host_visible). */
static int cpu_is_device(const void *p) {
  (void)p;
  return 0;
}

static int cpu_error(char *msg, size_t n) {
  if (n) msg[0] = 0;
  return 0;
}

static void *cpu_alloc(zt_mem_kind kind, size_t bytes) {
  (void)kind;
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (p) memset(p, 0, rounded ? rounded : 64);
  return p;
}

static void cpu_free(zt_mem_kind kind, void *p) {
  (void)kind;
  free(p);
}

static void cpu_copy(zt_stream *s, void *dst, const void *src, size_t bytes) {
  (void)s;
  if (dst != src && bytes) memmove(dst, src, bytes);
}

static void cpu_memzero(zt_stream *s, void *dst, size_t bytes) {
  (void)s;
  if (bytes) memset(dst, 0, bytes);
}

static zt_stream *cpu_stream_new(void) { return calloc(1, sizeof(zt_stream)); }
static void cpu_stream_free(zt_stream *s) { free(s); }
static void cpu_stream_sync(zt_stream *s) { (void)s; }
static zt_event *cpu_event_new(void) { return calloc(1, sizeof(zt_event)); }
static void cpu_event_free(zt_event *e) { free(e); }
static void cpu_event_record(zt_event *e, zt_stream *s) { (void)e, (void)s; }
static void cpu_event_wait(zt_stream *s, zt_event *e) { (void)s, (void)e; }
static void cpu_event_sync(zt_event *e) { (void)e; }

/* ---- ops: the dtype picks the instantiation --------------------------- */

/* fn of the instantiation whose storage type is t (the pointers are void *:
 * each instantiation's own element type, as kernels.h's contract says) */
#define PICK(t, fn, ...)                                  \
  do {                                                    \
    if ((t) == ZT_BF16) zt_cpu_bf16_##fn(__VA_ARGS__);    \
    else if ((t) == ZT_F16) zt_cpu_f16_##fn(__VA_ARGS__); \
    else zt_cpu_f32_##fn(__VA_ARGS__);                    \
  } while (0)

static void cpu_gemm(zt_stream *s, zt_dtype t, zt_dtype tc, int ta, int tb, int m, int n, int k,
                     float alpha, const void *a, int lda, const void *b, int ldb, float beta,
                     void *c, int ldc) {
  (void)s;
  if (tc == t)
    PICK(t, gemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else /* a 16-bit product into an fp32 C: a weight gradient */
    PICK(t, gemm_acc, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static size_t cpu_gemm_scratch(zt_dtype t, zt_dtype tc, int m, int n, int k) {
  if (t == ZT_BF16) return zt_cpu_bf16_gemm_scratch_bytes(m, n, k, tc == t);
  if (t == ZT_F16) return zt_cpu_f16_gemm_scratch_bytes(m, n, k, tc == t);
  return zt_cpu_f32_gemm_scratch_bytes(m, n, k, 1);
}

static size_t cpu_op_scratch(zt_dtype t, int T, int hd, int V, int threads) {
  if (t == ZT_BF16) return zt_cpu_bf16_op_scratch_bytes(T, hd, V, threads);
  if (t == ZT_F16) return zt_cpu_f16_op_scratch_bytes(T, hd, V, threads);
  return zt_cpu_f32_op_scratch_bytes(T, hd, V, threads);
}

static void cpu_embed_fwd(zt_stream *s, zt_dtype t, void *out, const int32_t *tok,
                          const void *wte, const void *wpe, int B, int T, int C, int v0, int Vl) {
  (void)s;
  PICK(t, embed_fwd, out, tok, wte, wpe, B, T, C, v0, Vl);
}

static void cpu_embed_bwd(zt_stream *s, zt_dtype t, float *dwte, float *dwpe,
                          const int32_t *tok, const void *dout, int B, int T, int C, int v0,
                          int Vl) {
  (void)s;
  PICK(t, embed_bwd, dwte, dwpe, tok, dout, B, T, C, v0, Vl);
}

static void cpu_layernorm_fwd(zt_stream *s, zt_dtype t, void *out, float *mean, float *rstd,
                              const void *x, const void *w, const void *b, int N, int C,
                              float eps) {
  (void)s;
  PICK(t, layernorm_fwd, out, mean, rstd, x, w, b, N, C, eps);
}

static void cpu_layernorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, float *db,
                              const void *dout, const void *x, const void *w, const float *mean,
                              const float *rstd, int N, int C) {
  (void)s;
  PICK(t, layernorm_bwd, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

static void cpu_rmsnorm_fwd(zt_stream *s, zt_dtype t, void *out, float *rstd, const void *x,
                            const void *w, int N, int C, float eps) {
  (void)s;
  PICK(t, rmsnorm_fwd, out, rstd, x, w, N, C, eps);
}

static void cpu_rmsnorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, const void *dout,
                            const void *x, const void *w, const float *rstd, int N, int C) {
  (void)s;
  PICK(t, rmsnorm_bwd, dx, dw, dout, x, w, rstd, N, C);
}

static void cpu_bias_fwd(zt_stream *s, zt_dtype t, void *y, const void *b, int N, int C) {
  (void)s;
  PICK(t, bias_fwd, y, b, N, C);
}

static void cpu_bias_bwd(zt_stream *s, zt_dtype t, float *db, const void *dy, int N, int C) {
  (void)s;
  PICK(t, bias_bwd, db, dy, N, C);
}

static void cpu_gelu_fwd(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n) {
  (void)s;
  PICK(t, gelu_fwd, y, x, n);
}

static void cpu_gelu_bwd(zt_stream *s, zt_dtype t, void *dx, const void *x, const void *dy,
                         size_t n) {
  (void)s;
  PICK(t, gelu_bwd, dx, x, dy, n);
}

static void cpu_swiglu_fwd(zt_stream *s, zt_dtype t, void *h, const void *gu, int N, int F) {
  (void)s;
  PICK(t, swiglu_fwd, h, gu, N, F);
}

static void cpu_swiglu_bwd(zt_stream *s, zt_dtype t, void *dgu, const void *gu, const void *dh,
                           int N, int F) {
  (void)s;
  PICK(t, swiglu_bwd, dgu, gu, dh, N, F);
}

static void cpu_rope_fwd(zt_stream *s, zt_dtype t, void *x, const float *cs, int N, int T,
                         int nh, int hd, int rs) {
  (void)s;
  PICK(t, rope_fwd, x, cs, N, T, nh, hd, rs);
}

static void cpu_rope_bwd(zt_stream *s, zt_dtype t, void *dx, const float *cs, int N, int T,
                         int nh, int hd, int rs) {
  (void)s;
  PICK(t, rope_bwd, dx, cs, N, T, nh, hd, rs);
}

static void cpu_attn_fwd(zt_stream *s, zt_dtype t, void *out, float *lse, const void *qkv, int B,
                         int T, int H, int KVH, int hd) {
  (void)s;
  PICK(t, attn_fwd, out, lse, qkv, B, T, H, KVH, hd);
}

static void cpu_attn_bwd(zt_stream *s, zt_dtype t, void *dqkv, const void *dout, const void *qkv,
                         const void *out, const float *lse, int B, int T, int H, int KVH,
                         int hd) {
  (void)s;
  PICK(t, attn_bwd, dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
}

static void cpu_attn_decode(zt_stream *s, zt_dtype t, void *out, const void *qkv, int T, int n,
                            int H, int KVH, int hd) {
  (void)s;
  PICK(t, attn_decode, out, qkv, T, n, H, KVH, hd);
}

static void cpu_xent_fwd_bwd(zt_stream *s, zt_dtype t, void *logits, float *loss,
                             const int32_t *targets, int N, int V, float dscale) {
  (void)s;
  PICK(t, xent_fwd_bwd, logits, loss, targets, N, V, dscale);
}

static void cpu_xent_max(zt_stream *s, zt_dtype t, float *stats, const void *logits, int N,
                         int V) {
  (void)s;
  PICK(t, xent_max, stats, logits, N, V);
}

static void cpu_xent_sumexp(zt_stream *s, zt_dtype t, float *stats, const void *logits,
                            const int32_t *targets, int N, int V, int v0) {
  (void)s;
  PICK(t, xent_sumexp, stats, logits, targets, N, V, v0);
}

static void cpu_xent_finish(zt_stream *s, zt_dtype t, void *logits, float *loss,
                            const float *stats, const int32_t *targets, int N, int V, int v0,
                            float dscale) {
  (void)s;
  PICK(t, xent_finish, logits, loss, stats, targets, N, V, v0, dscale);
}

static void cpu_add(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n) {
  (void)s;
  PICK(t, add, y, x, n);
}

static void cpu_convert(zt_stream *s, zt_dtype td, void *dst, zt_dtype ts, const void *src,
                        size_t n) {
  (void)s;
  if (td == ts) {
    cpu_copy(s, dst, src, n * zt_dtype_size(td));
  } else if (ts == ZT_F32 && td == ZT_BF16) {
    zt_bf16_from_f32_n(dst, src, n);
  } else if (ts == ZT_F32 && td == ZT_F16) {
    zt_f16_from_f32_n(dst, src, n);
  } else if (ts == ZT_BF16 && td == ZT_F32) {
    zt_bf16_to_f32_n(dst, src, n);
  } else if (ts == ZT_F16 && td == ZT_F32) {
    zt_f16_to_f32_n(dst, src, n);
  }
}

static void cpu_sumsq(zt_stream *s, zt_step_sums *sums, const float *x, size_t n) {
  (void)s;
  sums->sumsq += zt_cpu_f32_sumsq(x, n);
}

static void cpu_count_nonfinite(zt_stream *s, zt_step_sums *sums, const float *x, size_t n) {
  (void)s;
  uint64_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
  for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
  sums->nonfinite += bad;
}

static void cpu_adamw(zt_stream *s, float *p, const float *g, float *m, float *v, size_t n,
                      const zt_adamw_args *a, zt_step_sums *sums, void *p16, zt_dtype t16) {
  (void)s;
  /* the new weights rounded to 16 bits in the same pass, when asked */
  size_t bad = !p16            ? zt_cpu_f32_adamw(p, g, m, v, n, a)
               : t16 == ZT_BF16 ? zt_cpu_bf16_adamw_p16(p, g, m, v, n, a, p16)
               : t16 == ZT_F16  ? zt_cpu_f16_adamw_p16(p, g, m, v, n, a, p16)
                                : zt_cpu_f32_adamw_p16(p, g, m, v, n, a, p16);
  sums->nonfinite += bad;
}

static const zt_backend cpu = {
    .name = "cpu",
    .host_visible = 1,
    .has_dtype = cpu_has_dtype,
    .error = cpu_error,
    .is_device = cpu_is_device,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memzero = cpu_memzero,
    .stream_new = cpu_stream_new,
    .stream_free = cpu_stream_free,
    .stream_sync = cpu_stream_sync,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_sync = cpu_event_sync,
    .gemm = cpu_gemm,
    .gemm_scratch = cpu_gemm_scratch,
    .op_scratch = cpu_op_scratch,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .bias_fwd = cpu_bias_fwd,
    .bias_bwd = cpu_bias_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .attn_fwd = cpu_attn_fwd,
    .attn_bwd = cpu_attn_bwd,
    .attn_decode = cpu_attn_decode,
    .xent_fwd_bwd = cpu_xent_fwd_bwd,
    .xent_max = cpu_xent_max,
    .xent_sumexp = cpu_xent_sumexp,
    .xent_finish = cpu_xent_finish,
    .add = cpu_add,
    .convert = cpu_convert,
    .sumsq = cpu_sumsq,
    .count_nonfinite = cpu_count_nonfinite,
    .adamw = cpu_adamw,
};

const zt_backend *zt_backend_cpu(void) { return &cpu; }

#ifndef ZT_HAVE_CUDA
int zt_backend_cuda_devices(void) { return 0; }

const zt_backend *zt_backend_cuda(int device, char *msg, size_t n) {
  (void)device;
  snprintf(msg, n, "this ztrain was built without CUDA (no nvcc at configure time)");
  return NULL;
}
#endif
