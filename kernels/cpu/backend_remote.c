/* backend_remote: the CPU backend with device memory that the host cannot
 * address, for tests. A GPU's memory is reachable only through the
 * contract (ops and copies); host code that reads or writes it directly
 * works on the CPU backend, whose "device" memory is host memory, and
 * crashes on a GPU. Here every ZT_MEM_DEVICE pointer is the host address
 * moved by REMOTE_BIAS into non-canonical x86-64 space: pointer arithmetic
 * on it works, any dereference faults at once (SIGSEGV at the culprit,
 * not a wrong number later). Each op moves its pointers back and calls
 * the CPU backend, so results are bitwise the CPU backend's.
 * ZT_TEST_BACKEND=remote selects it in ztrain; ZT_TEST_DEVICE_FAIL=K makes
 * its K-th GEMM report a failure through `error`, as a device would. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"

/* Above every canonical user address (< 2^47) and far below 2^64. */
#define REMOTE_BIAS ((uintptr_t)1 << 62)

static const zt_backend *cpu(void) { return zt_backend_cpu(); }

static int is_remote(const void *p) { return (uintptr_t)p >= REMOTE_BIAS; }

/* Where a device pointer really is (NULL and host pointers unchanged). */
static void *H(const void *p) {
  return is_remote(p) ? (void *)((uintptr_t)p - REMOTE_BIAS) : (void *)(uintptr_t)p;
}
#define HF(p) ((float *)H(p))
#define HI(p) ((const int32_t *)H(p))

static void *remote_alloc(zt_mem_kind kind, size_t bytes) {
  void *p = cpu()->alloc(kind, bytes);
  return p && kind == ZT_MEM_DEVICE ? (void *)((uintptr_t)p + REMOTE_BIAS) : p;
}
static void remote_free(zt_mem_kind kind, void *p) { cpu()->free(kind, H(p)); }
static void remote_copy(zt_stream *s, void *dst, const void *src, size_t bytes) {
  cpu()->copy(s, H(dst), H(src), bytes);
}
static void remote_memzero(zt_stream *s, void *dst, size_t bytes) {
  cpu()->memzero(s, H(dst), bytes);
}

/* The first failure, as a device keeps it (test hook ZT_TEST_DEVICE_FAIL). */
static char failure[160];
static long long gemms, fail_at = -1;

static int remote_error(char *msg, size_t n) {
  if (n) snprintf(msg, n, "%s", failure);
  return failure[0] != 0;
}

static void remote_gemm(zt_stream *s, zt_dtype t, zt_dtype tc, int ta, int tb, int m, int n, int k,
                        float alpha, const void *a, int lda, const void *b, int ldb, float beta,
                        void *c, int ldc) {
  if (++gemms == fail_at && !failure[0])
    snprintf(failure, sizeof failure, "test: injected failure of GEMM %lld (%d x %d x %d)",
             gemms, m, n, k);
  cpu()->gemm(s, t, tc, ta, tb, m, n, k, alpha, H(a), lda, H(b), ldb, beta, H(c), ldc);
}
static void remote_embed_fwd(zt_stream *s, zt_dtype t, void *out, const int32_t *tok,
                             const void *wte, const void *wpe, int B, int T, int C, int v0,
                             int Vl) {
  cpu()->embed_fwd(s, t, H(out), HI(tok), H(wte), H(wpe), B, T, C, v0, Vl);
}
static void remote_embed_bwd(zt_stream *s, zt_dtype t, float *dwte, float *dwpe,
                             const int32_t *tok, const void *dout, int B, int T, int C, int v0,
                             int Vl) {
  cpu()->embed_bwd(s, t, HF(dwte), HF(dwpe), HI(tok), H(dout), B, T, C, v0, Vl);
}
static void remote_layernorm_fwd(zt_stream *s, zt_dtype t, void *out, float *mean, float *rstd,
                                 const void *x, const void *w, const void *b, int N, int C,
                                 float eps) {
  cpu()->layernorm_fwd(s, t, H(out), HF(mean), HF(rstd), H(x), H(w), H(b), N, C, eps);
}
static void remote_layernorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, float *db,
                                 const void *dout, const void *x, const void *w,
                                 const float *mean, const float *rstd, int N, int C) {
  cpu()->layernorm_bwd(s, t, H(dx), HF(dw), HF(db), H(dout), H(x), H(w), HF(mean), HF(rstd), N,
                       C);
}
static void remote_rmsnorm_fwd(zt_stream *s, zt_dtype t, void *out, float *rstd, const void *x,
                               const void *w, int N, int C, float eps) {
  cpu()->rmsnorm_fwd(s, t, H(out), HF(rstd), H(x), H(w), N, C, eps);
}
static void remote_rmsnorm_bwd(zt_stream *s, zt_dtype t, void *dx, float *dw, const void *dout,
                               const void *x, const void *w, const float *rstd, int N, int C) {
  cpu()->rmsnorm_bwd(s, t, H(dx), HF(dw), H(dout), H(x), H(w), HF(rstd), N, C);
}
static void remote_bias_fwd(zt_stream *s, zt_dtype t, void *y, const void *b, int N, int C) {
  cpu()->bias_fwd(s, t, H(y), H(b), N, C);
}
static void remote_bias_bwd(zt_stream *s, zt_dtype t, float *db, const void *dy, int N, int C) {
  cpu()->bias_bwd(s, t, HF(db), H(dy), N, C);
}
static void remote_gelu_fwd(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n) {
  cpu()->gelu_fwd(s, t, H(y), H(x), n);
}
static void remote_gelu_bwd(zt_stream *s, zt_dtype t, void *dx, const void *x, const void *dy,
                            size_t n) {
  cpu()->gelu_bwd(s, t, H(dx), H(x), H(dy), n);
}
static void remote_swiglu_fwd(zt_stream *s, zt_dtype t, void *h, const void *gu, int N, int F) {
  cpu()->swiglu_fwd(s, t, H(h), H(gu), N, F);
}
static void remote_swiglu_bwd(zt_stream *s, zt_dtype t, void *dgu, const void *gu, const void *dh,
                              int N, int F) {
  cpu()->swiglu_bwd(s, t, H(dgu), H(gu), H(dh), N, F);
}
static void remote_rope_fwd(zt_stream *s, zt_dtype t, void *x, const float *cs, int N, int T,
                            int nh, int hd, int rs) {
  cpu()->rope_fwd(s, t, H(x), HF(cs), N, T, nh, hd, rs);
}
static void remote_rope_bwd(zt_stream *s, zt_dtype t, void *dx, const float *cs, int N, int T,
                            int nh, int hd, int rs) {
  cpu()->rope_bwd(s, t, H(dx), HF(cs), N, T, nh, hd, rs);
}
static void remote_attn_fwd(zt_stream *s, zt_dtype t, void *out, float *lse, const void *qkv,
                            int B, int T, int Hh, int KVH, int hd) {
  cpu()->attn_fwd(s, t, H(out), HF(lse), H(qkv), B, T, Hh, KVH, hd);
}
static void remote_attn_bwd(zt_stream *s, zt_dtype t, void *dqkv, const void *dout,
                            const void *qkv, const void *out, const float *lse, int B, int T,
                            int Hh, int KVH, int hd) {
  cpu()->attn_bwd(s, t, H(dqkv), H(dout), H(qkv), H(out), HF(lse), B, T, Hh, KVH, hd);
}
static void remote_attn_decode(zt_stream *s, zt_dtype t, void *out, const void *qkv, int T,
                               int n, int Hh, int KVH, int hd) {
  cpu()->attn_decode(s, t, H(out), H(qkv), T, n, Hh, KVH, hd);
}
static void remote_xent_fwd_bwd(zt_stream *s, zt_dtype t, void *logits, float *loss,
                                const int32_t *targets, int N, int V, float dscale) {
  cpu()->xent_fwd_bwd(s, t, H(logits), HF(loss), HI(targets), N, V, dscale);
}
static void remote_xent_max(zt_stream *s, zt_dtype t, float *stats, const void *logits, int N,
                            int V) {
  cpu()->xent_max(s, t, HF(stats), H(logits), N, V);
}
static void remote_xent_sumexp(zt_stream *s, zt_dtype t, float *stats, const void *logits,
                               const int32_t *targets, int N, int V, int v0) {
  cpu()->xent_sumexp(s, t, HF(stats), H(logits), HI(targets), N, V, v0);
}
static void remote_xent_finish(zt_stream *s, zt_dtype t, void *logits, float *loss,
                               const float *stats, const int32_t *targets, int N, int V, int v0,
                               float dscale) {
  cpu()->xent_finish(s, t, H(logits), HF(loss), HF(stats), HI(targets), N, V, v0, dscale);
}
static void remote_add(zt_stream *s, zt_dtype t, void *y, const void *x, size_t n) {
  cpu()->add(s, t, H(y), H(x), n);
}
static void remote_convert(zt_stream *s, zt_dtype td, void *dst, zt_dtype ts, const void *src,
                           size_t n) {
  cpu()->convert(s, td, H(dst), ts, H(src), n);
}
static void remote_sumsq(zt_stream *s, zt_step_sums *sums, const float *x, size_t n) {
  cpu()->sumsq(s, H(sums), HF(x), n);
}
static void remote_count_nonfinite(zt_stream *s, zt_step_sums *sums, const float *x, size_t n) {
  cpu()->count_nonfinite(s, H(sums), HF(x), n);
}
static void remote_adamw(zt_stream *s, float *p, const float *g, float *m, float *v, size_t n,
                         const zt_adamw_args *a, zt_step_sums *sums, void *p16, zt_dtype t16) {
  cpu()->adamw(s, HF(p), HF(g), HF(m), HF(v), n, a, H(sums), H(p16), t16);
}

static zt_backend remote;

const zt_backend *zt_backend_remote(void) {
  if (!remote.name) {
    remote = *cpu(); /* streams, events, has_dtype, error: the CPU backend's */
    remote.name = "cpu-remote";
    remote.host_visible = 0;
    remote.error = remote_error;
    remote.is_device = is_remote;
    const char *at = getenv("ZT_TEST_DEVICE_FAIL");
    fail_at = at ? atoll(at) : -1;
    remote.alloc = remote_alloc;
    remote.free = remote_free;
    remote.copy = remote_copy;
    remote.memzero = remote_memzero;
    remote.gemm = remote_gemm;
    remote.embed_fwd = remote_embed_fwd;
    remote.embed_bwd = remote_embed_bwd;
    remote.layernorm_fwd = remote_layernorm_fwd;
    remote.layernorm_bwd = remote_layernorm_bwd;
    remote.rmsnorm_fwd = remote_rmsnorm_fwd;
    remote.rmsnorm_bwd = remote_rmsnorm_bwd;
    remote.bias_fwd = remote_bias_fwd;
    remote.bias_bwd = remote_bias_bwd;
    remote.gelu_fwd = remote_gelu_fwd;
    remote.gelu_bwd = remote_gelu_bwd;
    remote.swiglu_fwd = remote_swiglu_fwd;
    remote.swiglu_bwd = remote_swiglu_bwd;
    remote.rope_fwd = remote_rope_fwd;
    remote.rope_bwd = remote_rope_bwd;
    remote.attn_fwd = remote_attn_fwd;
    remote.attn_bwd = remote_attn_bwd;
    remote.attn_decode = remote_attn_decode;
    remote.xent_fwd_bwd = remote_xent_fwd_bwd;
    remote.xent_max = remote_xent_max;
    remote.xent_sumexp = remote_xent_sumexp;
    remote.xent_finish = remote_xent_finish;
    remote.add = remote_add;
    remote.convert = remote_convert;
    remote.sumsq = remote_sumsq;
    remote.count_nonfinite = remote_count_nonfinite;
    remote.adamw = remote_adamw;
  }
  return &remote;
}
