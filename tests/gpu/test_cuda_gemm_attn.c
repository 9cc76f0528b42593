/* test_cuda_gemm_attn: the CUDA backend's GEMM, attention and
 * cross-entropy (kernels/cuda/gemm.cu, attn.cu, xent.cu), and attention
 * over a KV cache (attn_decode), against the CPU
 * backend on the same inputs, through the contract's table. Exits 77
 * without a usable GPU.
 *
 * Tolerances (relative L2, gt_expect), from what legitimately differs:
 * - fp32 results computed in fp32 by both: summation order and exp's last
 *   bits (the CPU's zt_expf is within 2 ulp): ~1e-7 per value, so 1e-5
 *   (GEMM, attention forward, losses, statistics); attention backward 5e-5,
 *   since dS = P (dP - D) cancels and dK, dV sum G * T such terms.
 * - 16-bit results: the same fp32 values rounded once by each side, so a
 *   value differs by an ulp only where the two fp32 results straddle a
 *   rounding boundary: a few 1e-4 at most for bf16 (ulp 2^-8 relative) and
 *   less for fp16; 1e-2 for bf16 and 2e-3 for fp16 stay well below what any
 *   wrong index, mask or missing tile gives (order 1).
 * - 16-bit GEMM into fp32: exact products, fp32 sums: 1e-4 leaves room for
 *   tensor-core accumulation order; TF32: 1e-2 (10-bit mantissa inputs).
 * Where the contract says an op overwrites (=), the GPU's output buffer is
 * filled with NaN first, so an element it fails to write shows. */
#include "tests/gpu/gpu_test.h"

#ifdef ZT_HAVE_CUDA
#include "kernels/cuda/cuda_impl.h" /* zt_cuda_gemm_allow_tf32: not in the table */
#endif

static const zt_dtype dtypes[3] = {ZT_F32, ZT_BF16, ZT_F16};

static double tol16(zt_dtype t, double f32) {
  return t == ZT_BF16 ? 1e-2 : t == ZT_F16 ? 2e-3 : f32;
}

/* Device copies of host x (already rounded to t) on both backends. */
typedef struct pair {
  void *g, *c;
} pair;

static pair put2(gt_ctx *g, const float *x, size_t n, zt_dtype t) {
  pair p = {gt_upload(g->gpu, g->gs, x, n, t), gt_upload(g->cpu, g->cs, x, n, t)};
  return p;
}

static void free2(gt_ctx *g, pair p) {
  g->gpu->free(ZT_MEM_DEVICE, p.g);
  g->cpu->free(ZT_MEM_DEVICE, p.c);
}

/* n random values ~ scale N(0,1) rounded to t, on both backends. */
static pair rand2(gt_ctx *g, const char *name, size_t n, float scale, zt_dtype t) {
  float *x = gt_randn(name, n, scale);
  gt_round(x, n, t);
  pair p = put2(g, x, n, t);
  free(x);
  return p;
}

/* n NaNs of t on the GPU, the same n values `fill` on the CPU. */
static pair nan2(gt_ctx *g, size_t n, zt_dtype t, const float *fill) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  if (!x) abort();
  for (size_t i = 0; i < n; i++) x[i] = NAN;
  void *gp = gt_upload(g->gpu, g->gs, x, n, t);
  for (size_t i = 0; i < n; i++) x[i] = fill ? fill[i] : 0.f;
  pair p = {gp, gt_upload(g->cpu, g->cs, x, n, t)};
  free(x);
  return p;
}

/* gt_expect on host arrays (got: the GPU's, want: the CPU's), each put
 * back on its own backend for it. */
static void expect_host(gt_ctx *g, const char *what, const float *got, const float *want,
                        size_t n, double tol) {
  void *dg = gt_upload(g->gpu, g->gs, got, n, ZT_F32), *dc = gt_upload(g->cpu, g->cs, want, n, ZT_F32);
  gt_expect(g, what, dg, dc, n, ZT_F32, tol);
  g->gpu->free(ZT_MEM_DEVICE, dg);
  g->cpu->free(ZT_MEM_DEVICE, dc);
}

static void *put_bytes(const zt_backend *be, zt_stream *s, const void *h, size_t bytes) {
  void *d = be->alloc(ZT_MEM_DEVICE, bytes ? bytes : 1);
  if (!d) abort();
  be->copy(s, d, h, bytes);
  be->stream_sync(s);
  return d;
}

/* ---- GEMM ----------------------------------------------------------- */

/* One GEMM of each transpose combination on a shape: row strides are the
 * rows' lengths plus pad; with off, A and C start `off` elements into their
 * buffers (an unaligned pointer, as the k, v columns of qkv are). */
static void gemm_case(gt_ctx *g, zt_dtype t, zt_dtype tc, int m, int n, int k, int pad, int off,
                      float beta) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      int lda = ac + pad, ldb = bc + pad, ldc = n + pad;
      size_t na = (size_t)ar * lda + off, nb = (size_t)br * ldb, nc = (size_t)m * ldc + off;
      char name[160];
      snprintf(name, sizeof name, "gemm %s->%s t%d%d %dx%dx%d pad%d off%d beta%g",
               zt_dtype_name(t), zt_dtype_name(tc), ta, tb, m, n, k, pad, off, beta);
      pair a = rand2(g, "gemm a", na, 1.f, t), b = rand2(g, "gemm b", nb, 1.f, t);
      float *c0 = gt_randn("gemm c", nc, 1.f);
      gt_round(c0, nc, tc);
      /* beta = 0 must not read C: NaN there on the GPU */
      pair c = beta == 0.f ? nan2(g, nc, tc, c0) : put2(g, c0, nc, tc);
      size_t ea = (size_t)off * zt_dtype_size(t), ec = (size_t)off * zt_dtype_size(tc);
      g->gpu->gemm(g->gs, t, tc, ta, tb, m, n, k, 0.75f, (char *)a.g + ea, lda, b.g, ldb, beta,
                   (char *)c.g + ec, ldc);
      g->cpu->gemm(g->cs, t, tc, ta, tb, m, n, k, 0.75f, (char *)a.c + ea, lda, b.c, ldb, beta,
                   (char *)c.c + ec, ldc);
      /* the padding between rows is never written: compare rows only */
      float *x = gt_download(g->gpu, g->gs, c.g, nc, tc);
      float *y = gt_download(g->cpu, g->cs, c.c, nc, tc);
      float *xr = malloc((size_t)m * n * sizeof *xr), *yr = malloc((size_t)m * n * sizeof *yr);
      if (!xr || !yr) abort();
      for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
          xr[(size_t)i * n + j] = x[off + (size_t)i * ldc + j];
          yr[(size_t)i * n + j] = y[off + (size_t)i * ldc + j];
        }
      double tol = tc == ZT_F32 ? (t == ZT_F32 ? 1e-5 : 1e-4) : tol16(tc, 1e-5);
      expect_host(g, name, xr, yr, (size_t)m * n, tol);
      free(x), free(y), free(xr), free(yr), free(c0);
      free2(g, a), free2(g, b), free2(g, c);
    }
}

static void test_gemm(gt_ctx *g) {
  /* the shapes: a small aligned one, odd sizes everywhere, one row, a
   * bigger one that takes cuBLASLt's tiled kernels */
  static const int shapes[][3] = {{64, 48, 32}, {37, 29, 53}, {1, 7, 5}, {130, 96, 200}};
  for (int d = 0; d < 3; d++) {
    zt_dtype t = dtypes[d];
    for (int s = 0; s < 4; s++) {
      int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
      gemm_case(g, t, t, m, n, k, 0, 0, 0.f);
      gemm_case(g, t, t, m, n, k, 3, 0, 1.f);
      if (t != ZT_F32) { /* weight gradients: 16-bit operands into fp32 */
        gemm_case(g, t, ZT_F32, m, n, k, 0, 0, 1.f);
        gemm_case(g, t, ZT_F32, m, n, k, 0, 1, 0.f);
      }
    }
    gemm_case(g, t, t, 64, 64, 64, 8, 5, 1.f); /* unaligned A and C pointers */
  }
  gemm_case(g, ZT_F32, ZT_F32, 17, 33, 0, 1, 0, 0.5f); /* k = 0: C = beta C */
#ifdef ZT_HAVE_CUDA
  /* TF32: only on request, and close to fp32 */
  zt_cuda_gemm_allow_tf32(1);
  float *a = gt_randn("tf32 a", 256 * 256, 1.f), *b = gt_randn("tf32 b", 256 * 256, 1.f);
  pair pa = put2(g, a, 256 * 256, ZT_F32), pb = put2(g, b, 256 * 256, ZT_F32);
  pair pc = nan2(g, 256 * 256, ZT_F32, NULL);
  g->gpu->gemm(g->gs, ZT_F32, ZT_F32, 0, 1, 256, 256, 256, 1.f, pa.g, 256, pb.g, 256, 0.f, pc.g,
               256);
  g->cpu->gemm(g->cs, ZT_F32, ZT_F32, 0, 1, 256, 256, 256, 1.f, pa.c, 256, pb.c, 256, 0.f, pc.c,
               256);
  gt_expect(g, "gemm f32 tf32 t01 256^3", pc.g, pc.c, 256 * 256, ZT_F32, 1e-2);
  zt_cuda_gemm_allow_tf32(0);
  free2(g, pa), free2(g, pb), free2(g, pc);
  free(a), free(b);
#endif
}

/* ---- attention ------------------------------------------------------ */

/* Column block [c0, c0 + w) of rows [N, rs] of host x, densely. */
static float *cols(const float *x, size_t N, int rs, int c0, int w) {
  size_t n = N * (size_t)w;
  float *y = malloc((n ? n : 1) * sizeof *y);
  if (!y) abort();
  for (size_t i = 0; i < N; i++) memcpy(y + i * w, x + i * rs + c0, (size_t)w * sizeof *y);
  return y;
}

/* The q, k and v parts of dqkv compared on their own: a bug in one kernel
 * of the backward (dQ, or dK and dV) then names itself. */
static void expect_qkv(gt_ctx *g, const char *what, const pair d, size_t N, int H, int KVH,
                       int hd, zt_dtype t, double tol) {
  int rs = (H + 2 * KVH) * hd;
  float *x = gt_download(g->gpu, g->gs, d.g, N * rs, t);
  float *y = gt_download(g->cpu, g->cs, d.c, N * rs, t);
  static const char *part[3] = {"dq", "dk", "dv"};
  int c0[3] = {0, H * hd, (H + KVH) * hd}, w[3] = {H * hd, KVH * hd, KVH * hd};
  for (int p = 0; p < 3; p++) {
    float *xp = cols(x, N, rs, c0[p], w[p]), *yp = cols(y, N, rs, c0[p], w[p]);
    char name[200];
    snprintf(name, sizeof name, "%.150s %s", what, part[p]);
    expect_host(g, name, xp, yp, N * w[p], tol);
    free(xp), free(yp);
  }
  free(x), free(y);
}

static void attn_case(gt_ctx *g, zt_dtype t, int B, int T, int H, int KVH, int hd) {
  size_t N = (size_t)B * T, rs = (size_t)(H + 2 * KVH) * hd, os = (size_t)H * hd;
  size_t nl = (size_t)B * H * T;
  char what[128];
  snprintf(what, sizeof what, "attn %s B%d T%d H%d KVH%d hd%d", zt_dtype_name(t), B, T, H, KVH,
           hd);
  pair qkv = rand2(g, "attn qkv", N * rs, 1.f, t);
  pair out = nan2(g, N * os, t, NULL), lse = nan2(g, nl, ZT_F32, NULL);
  g->gpu->attn_fwd(g->gs, t, out.g, lse.g, qkv.g, B, T, H, KVH, hd);
  g->cpu->attn_fwd(g->cs, t, out.c, lse.c, qkv.c, B, T, H, KVH, hd);
  char name[160];
  snprintf(name, sizeof name, "%s fwd out", what);
  gt_expect(g, name, out.g, out.c, N * os, t, tol16(t, 1e-5));
  snprintf(name, sizeof name, "%s fwd lse", what);
  gt_expect(g, name, lse.g, lse.c, nl, ZT_F32, 1e-5);

  /* backward on the CPU's out and lse for both, so that it is tested on
   * its own */
  float *o = gt_download(g->cpu, g->cs, out.c, N * os, t);
  float *l = gt_download(g->cpu, g->cs, lse.c, nl, ZT_F32);
  pair o2 = put2(g, o, N * os, t), l2 = put2(g, l, nl, ZT_F32);
  pair dout = rand2(g, "attn dout", N * os, 1.f, t);
  pair dqkv = nan2(g, N * rs, t, NULL);
  g->gpu->attn_bwd(g->gs, t, dqkv.g, dout.g, qkv.g, o2.g, l2.g, B, T, H, KVH, hd);
  g->cpu->attn_bwd(g->cs, t, dqkv.c, dout.c, qkv.c, o2.c, l2.c, B, T, H, KVH, hd);
  snprintf(name, sizeof name, "%s bwd", what);
  expect_qkv(g, name, dqkv, N, H, KVH, hd, t, tol16(t, 5e-5));
  free(o), free(l);
  free2(g, qkv), free2(g, out), free2(g, lse), free2(g, o2), free2(g, l2);
  free2(g, dout), free2(g, dqkv);
}

/* attn_decode: the last n rows of one sequence of T over its KV cache,
 * GPU against CPU; the output buffer NaN first (the op overwrites). */
static void decode_case(gt_ctx *g, zt_dtype t, int T, int n, int H, int KVH, int hd) {
  size_t rs = (size_t)(H + 2 * KVH) * hd, os = (size_t)H * hd;
  char name[128];
  snprintf(name, sizeof name, "attn_decode %s T%d n%d H%d KVH%d hd%d", zt_dtype_name(t), T, n, H,
           KVH, hd);
  pair qkv = rand2(g, "decode qkv", (size_t)T * rs, 1.f, t);
  pair out = nan2(g, (size_t)n * os, t, NULL);
  g->gpu->attn_decode(g->gs, t, out.g, qkv.g, T, n, H, KVH, hd);
  g->cpu->attn_decode(g->cs, t, out.c, qkv.c, T, n, H, KVH, hd);
  gt_expect(g, name, out.g, out.c, (size_t)n * os, t, tol16(t, 1e-5));
  free2(g, qkv), free2(g, out);
}

static void test_attn(gt_ctx *g) {
  /* (B, T, H, KVH, hd): multi-head; GQA with T not a multiple of the
   * tiles; one kv head and hd 128; hd not a multiple of 32 */
  static const int shapes[][5] = {
      {2, 64, 4, 4, 64}, {1, 257, 8, 2, 64}, {2, 128, 4, 1, 128}, {1, 45, 3, 1, 40}};
  for (int d = 0; d < 2; d++)
    for (int s = 0; s < 4; s++)
      attn_case(g, dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                shapes[s][4]);
  attn_case(g, ZT_F16, 1, 257, 8, 2, 64);
  attn_case(g, ZT_F32, 1, 1024, 4, 2, 64); /* long rows: many key tiles */
  attn_case(g, ZT_BF16, 1, 1024, 4, 2, 64);
  /* decoding: one new row, a prompt's rows across a tile edge, GQA and
   * hd not a multiple of 32, in each dtype */
  for (int d = 0; d < 3; d++) {
    decode_case(g, dtypes[d], 1, 1, 4, 2, 64);
    decode_case(g, dtypes[d], 300, 1, 8, 2, 64);
    decode_case(g, dtypes[d], 300, 45, 8, 2, 64);
    decode_case(g, dtypes[d], 77, 77, 3, 1, 40);
  }
}

/* ---- cross-entropy -------------------------------------------------- */

static int32_t *targets_for(int N, int V) {
  float *r = gt_randn("xent targets", (size_t)N, 1.f);
  int32_t *tg = malloc((size_t)N * sizeof *tg);
  if (!tg) abort();
  for (int n = 0; n < N; n++) tg[n] = (int32_t)((uint32_t)(fabsf(r[n]) * 1e6f) % (uint32_t)V);
  tg[0] = 0, tg[N - 1] = V - 1; /* the edges */
  free(r);
  return tg;
}

/* stats[k*N, (k+1)*N) combined over the shards on the host (max for k = 0,
 * else sum), then written back to every shard: what the caller does. */
static void combine(const zt_backend *be, zt_stream *s, float **st, int shards, int N, int k) {
  float *acc = malloc((size_t)N * sizeof *acc), *x = malloc((size_t)N * sizeof *x);
  if (!acc || !x) abort();
  for (int p = 0; p < shards; p++) {
    be->copy(s, x, st[p] + (size_t)k * N, (size_t)N * sizeof *x);
    be->stream_sync(s);
    for (int n = 0; n < N; n++)
      acc[n] = !p ? x[n] : k == 0 ? (x[n] > acc[n] ? x[n] : acc[n]) : acc[n] + x[n];
  }
  for (int p = 0; p < shards; p++) be->copy(s, st[p] + (size_t)k * N, acc, (size_t)N * sizeof *acc);
  be->stream_sync(s);
  free(acc), free(x);
}

/* The three vocab-parallel steps over two shards [0, V0), [V0, V) on
 * backend be; lg[p] holds shard p's logits [N, Vp], loss[p] its losses. */
static void xent_vp(const zt_backend *be, zt_stream *s, zt_dtype t, void **lg, float **loss,
                    float **st, const int32_t *tg, int N, const int *v0, const int *vl) {
  for (int p = 0; p < 2; p++) be->xent_max(s, t, st[p], lg[p], N, vl[p]);
  combine(be, s, st, 2, N, 0);
  for (int p = 0; p < 2; p++) be->xent_sumexp(s, t, st[p], lg[p], tg, N, vl[p], v0[p]);
  combine(be, s, st, 2, N, 1);
  combine(be, s, st, 2, N, 2);
  for (int p = 0; p < 2; p++)
    be->xent_finish(s, t, lg[p], loss[p], st[p], tg, N, vl[p], v0[p], 1.f / N);
}

static void xent_case(gt_ctx *g, zt_dtype t, int N, int V) {
  char what[96], name[160];
  snprintf(what, sizeof what, "xent %s N%d V%d", zt_dtype_name(t), N, V);
  int32_t *tg = targets_for(N, V);
  int32_t *tgg = put_bytes(g->gpu, g->gs, tg, (size_t)N * sizeof *tg);
  int32_t *tgc = put_bytes(g->cpu, g->cs, tg, (size_t)N * sizeof *tg);
  float *x = gt_randn("xent logits", (size_t)N * V, 2.f);
  gt_round(x, (size_t)N * V, t);

  /* fused */
  pair lg = put2(g, x, (size_t)N * V, t), loss = nan2(g, (size_t)N, ZT_F32, NULL);
  g->gpu->xent_fwd_bwd(g->gs, t, lg.g, loss.g, tgg, N, V, 1.f / N);
  g->cpu->xent_fwd_bwd(g->cs, t, lg.c, loss.c, tgc, N, V, 1.f / N);
  snprintf(name, sizeof name, "%s fused loss", what);
  gt_expect(g, name, loss.g, loss.c, (size_t)N, ZT_F32, 1e-5);
  snprintf(name, sizeof name, "%s fused dlogits", what);
  gt_expect(g, name, lg.g, lg.c, (size_t)N * V, t, tol16(t, 1e-5));
  free2(g, lg), free2(g, loss);

  /* vocab-parallel: two uneven shards, neither a multiple of the block */
  int v0[2] = {0, V / 3 + 1}, vl[2] = {V / 3 + 1, V - (V / 3 + 1)};
  void *lgg[2], *lgc[2];
  float *lsg[2], *lsc[2], *stg[2], *stc[2];
  pair lp[2], lsp[2], stp[2];
  for (int p = 0; p < 2; p++) {
    float *xs = cols(x, (size_t)N, V, v0[p], vl[p]);
    lp[p] = put2(g, xs, (size_t)N * vl[p], t);
    lsp[p] = nan2(g, (size_t)N, ZT_F32, NULL);
    stp[p] = nan2(g, (size_t)3 * N, ZT_F32, NULL);
    lgg[p] = lp[p].g, lgc[p] = lp[p].c, lsg[p] = lsp[p].g, lsc[p] = lsp[p].c;
    stg[p] = stp[p].g, stc[p] = stp[p].c;
    free(xs);
  }
  xent_vp(g->gpu, g->gs, t, lgg, lsg, stg, tgg, N, v0, vl);
  xent_vp(g->cpu, g->cs, t, lgc, lsc, stc, tgc, N, v0, vl);
  for (int p = 0; p < 2; p++) {
    snprintf(name, sizeof name, "%s shard %d stats", what, p);
    gt_expect(g, name, stg[p], stc[p], (size_t)3 * N, ZT_F32, 1e-5);
    snprintf(name, sizeof name, "%s shard %d loss", what, p);
    gt_expect(g, name, lsg[p], lsc[p], (size_t)N, ZT_F32, 1e-5);
    snprintf(name, sizeof name, "%s shard %d dlogits", what, p);
    gt_expect(g, name, lgg[p], lgc[p], (size_t)N * vl[p], t, tol16(t, 1e-5));
    free2(g, lp[p]), free2(g, lsp[p]), free2(g, stp[p]);
  }
  g->gpu->free(ZT_MEM_DEVICE, tgg);
  g->cpu->free(ZT_MEM_DEVICE, tgc);
  free(x), free(tg);
}

static void test_xent(gt_ctx *g) {
  for (int d = 0; d < 3; d++) {
    xent_case(g, dtypes[d], 33, 1000);
    xent_case(g, dtypes[d], 9, 50257);
  }
  xent_case(g, ZT_F32, 4, 7); /* fewer columns than a warp */
}

int main(void) {
  gt_ctx g;
  gt_init(&g);
  test_gemm(&g);
  test_attn(&g);
  test_xent(&g);
  return gt_finish(&g, "test_cuda_gemm_attn");
}
