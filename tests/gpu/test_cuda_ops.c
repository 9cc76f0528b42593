/* test_cuda_ops: the CUDA backend's own ops (everything but GEMM,
 * attention and cross-entropy) against the CPU backend on the same inputs,
 * in fp32, bf16 and fp16, at small shapes that are no multiple of 32 or of
 * a block; then memory of every kind and copies between them, ordering
 * across streams by events, and the sticky error. Exits 77 without a GPU.
 *
 * Tolerances (relative L2 over a whole output, gpu_test.h):
 *  - fp32 outputs (and the fp32 statistics and parameter gradients of any
 *    dtype): 1e-5. Both backends compute in float; they differ by FMA
 *    contraction, the order of a row's or a column's sum, and expf/tanhf
 *    against the CPU's own (about 2 ulp): each element agrees to a few
 *    1e-7 relative, so 1e-5 has room and still catches any wrong term.
 *  - 16-bit outputs: both backends round the same float result once, so
 *    they differ only where the float results straddle a rounding
 *    boundary: one ulp on a few elements. One ulp everywhere would be
 *    2^-8 = 3.9e-3 (bf16) or 2^-11 = 4.9e-4 (fp16) relative; 1e-2 and
 *    2e-3 allow that, and a wrong index or formula is O(1).
 *  - exact (0): copies, conversions, the embedding (the same float adds in
 *    the same order), AdamW's p, m and v (same float operations in the
 *    same order, no FMA on either side), integer counts. */
#include <stdint.h>

#include "tests/gpu/gpu_test.h"

static const zt_dtype DTS[3] = {ZT_F32, ZT_BF16, ZT_F16};

static double tol_out(zt_dtype t) { return t == ZT_F32 ? 1e-5 : t == ZT_BF16 ? 1e-2 : 2e-3; }
#define TOL32 1e-5

/* the same values on both backends: a CPU buffer and a GPU buffer */
typedef struct {
  void *c, *g;
} pair;

/* n values ~ scale N(0,1) + shift, named, rounded to t, on both backends */
static pair up(gt_ctx *g, const char *name, size_t n, float scale, float shift, zt_dtype t) {
  float *x = gt_randn(name, n, scale);
  for (size_t i = 0; i < n; i++) x[i] += shift;
  gt_round(x, n, t);
  pair p = {gt_upload(g->cpu, g->cs, x, n, t), gt_upload(g->gpu, g->gs, x, n, t)};
  free(x);
  return p;
}

static pair up_raw(gt_ctx *g, const void *h, size_t bytes) {
  pair p = {g->cpu->alloc(ZT_MEM_DEVICE, bytes), g->gpu->alloc(ZT_MEM_DEVICE, bytes)};
  if (!p.c || !p.g) abort();
  g->cpu->copy(g->cs, p.c, h, bytes);
  g->gpu->copy(g->gs, p.g, h, bytes);
  g->gpu->stream_sync(g->gs);
  return p;
}

static void pfree(gt_ctx *g, pair p) {
  g->cpu->free(ZT_MEM_DEVICE, p.c);
  g->gpu->free(ZT_MEM_DEVICE, p.g);
}

static void expect(gt_ctx *g, const char *what, pair p, size_t n, zt_dtype t, double tol) {
  g->gpu->stream_sync(g->gs);
  gt_expect(g, what, p.g, p.c, n, t, tol);
}

/* ---- ops ---- */

static void test_embed(gt_ctx *g, zt_dtype t) {
  enum { B = 3, T = 37, C = 100, V = 50, N = B * T };
  int32_t tok[N];
  for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7919u + 13u) % V); /* repeats: N > V */
  pair tk = up_raw(g, tok, sizeof tok);
  /* the whole table, and a shard [10, 35) that misses some tokens */
  for (int shard = 0; shard < 2; shard++) {
    int v0 = shard ? 10 : 0, Vl = shard ? 25 : V;
    pair wte = up(g, "embed.wte", (size_t)Vl * C, 1, 0, t), wpe = up(g, "embed.wpe", T * C, 1, 0, t);
    for (int with_pe = 0; with_pe < 2; with_pe++) {
      pair out = up(g, "embed.out", N * C, 1, 0, t); /* garbage to be overwritten */
      g->cpu->embed_fwd(g->cs, t, out.c, tk.c, wte.c, with_pe ? wpe.c : NULL, B, T, C, v0, Vl);
      g->gpu->embed_fwd(g->gs, t, out.g, tk.g, wte.g, with_pe ? wpe.g : NULL, B, T, C, v0, Vl);
      expect(g, with_pe ? "embed_fwd out (wte + wpe)" : "embed_fwd out (wte)", out, N * C, t, 0);
      pfree(g, out);
    }
    pair dout = up(g, "embed.dout", N * C, 1, 0, t);
    pair dwte = up(g, "embed.dwte", (size_t)Vl * C, 1, 0, ZT_F32); /* +=: start nonzero */
    pair dwpe = up(g, "embed.dwpe", T * C, 1, 0, ZT_F32);
    g->cpu->embed_bwd(g->cs, t, dwte.c, dwpe.c, tk.c, dout.c, B, T, C, v0, Vl);
    g->gpu->embed_bwd(g->gs, t, dwte.g, dwpe.g, tk.g, dout.g, B, T, C, v0, Vl);
    /* without dwpe too: a second pass into the same dwte */
    g->cpu->embed_bwd(g->cs, t, dwte.c, NULL, tk.c, dout.c, B, T, C, v0, Vl);
    g->gpu->embed_bwd(g->gs, t, dwte.g, NULL, tk.g, dout.g, B, T, C, v0, Vl);
    expect(g, shard ? "embed_bwd dwte (shard)" : "embed_bwd dwte", dwte, (size_t)Vl * C, ZT_F32, 0);
    expect(g, "embed_bwd dwpe", dwpe, T * C, ZT_F32, 0);
    pfree(g, wte), pfree(g, wpe), pfree(g, dout), pfree(g, dwte), pfree(g, dwpe);
  }
  pfree(g, tk);
}

static void test_layernorm(gt_ctx *g, zt_dtype t, int N, int C) {
  size_t n = (size_t)N * C;
  pair x = up(g, "ln.x", n, 1.5f, 0.7f, t), w = up(g, "ln.w", C, 0.3f, 1, t);
  pair b = up(g, "ln.b", C, 0.2f, 0, t), out = up(g, "ln.out", n, 1, 0, t);
  pair mean = up(g, "ln.mean", N, 1, 0, ZT_F32), rstd = up(g, "ln.rstd", N, 1, 0, ZT_F32);
  g->cpu->layernorm_fwd(g->cs, t, out.c, mean.c, rstd.c, x.c, w.c, b.c, N, C, 1e-5f);
  g->gpu->layernorm_fwd(g->gs, t, out.g, mean.g, rstd.g, x.g, w.g, b.g, N, C, 1e-5f);
  expect(g, "layernorm_fwd out", out, n, t, tol_out(t));
  expect(g, "layernorm_fwd mean", mean, N, ZT_F32, TOL32);
  expect(g, "layernorm_fwd rstd", rstd, N, ZT_F32, TOL32);
  /* backward from the CPU's statistics on both (the GPU's were checked) */
  g->gpu->copy(g->gs, mean.g, mean.c, (size_t)N * sizeof(float));
  g->gpu->copy(g->gs, rstd.g, rstd.c, (size_t)N * sizeof(float));
  pair dout = up(g, "ln.dout", n, 1, 0, t), dx = up(g, "ln.dx", n, 1, 0, t);
  pair dw = up(g, "ln.dw", C, 1, 0, ZT_F32), db = up(g, "ln.db", C, 1, 0, ZT_F32);
  g->cpu->layernorm_bwd(g->cs, t, dx.c, dw.c, db.c, dout.c, x.c, w.c, mean.c, rstd.c, N, C);
  g->gpu->layernorm_bwd(g->gs, t, dx.g, dw.g, db.g, dout.g, x.g, w.g, mean.g, rstd.g, N, C);
  expect(g, "layernorm_bwd dx (+=)", dx, n, t, tol_out(t));
  expect(g, "layernorm_bwd dw (+=)", dw, C, ZT_F32, TOL32);
  expect(g, "layernorm_bwd db (+=)", db, C, ZT_F32, TOL32);
  pfree(g, x), pfree(g, w), pfree(g, b), pfree(g, out), pfree(g, mean), pfree(g, rstd);
  pfree(g, dout), pfree(g, dx), pfree(g, dw), pfree(g, db);
}

static void test_rmsnorm(gt_ctx *g, zt_dtype t, int N, int C) {
  size_t n = (size_t)N * C;
  pair x = up(g, "rms.x", n, 1.5f, 0.2f, t), w = up(g, "rms.w", C, 0.3f, 1, t);
  pair out = up(g, "rms.out", n, 1, 0, t), rstd = up(g, "rms.rstd", N, 1, 0, ZT_F32);
  g->cpu->rmsnorm_fwd(g->cs, t, out.c, rstd.c, x.c, w.c, N, C, 1e-6f);
  g->gpu->rmsnorm_fwd(g->gs, t, out.g, rstd.g, x.g, w.g, N, C, 1e-6f);
  expect(g, "rmsnorm_fwd out", out, n, t, tol_out(t));
  expect(g, "rmsnorm_fwd rstd", rstd, N, ZT_F32, TOL32);
  g->gpu->copy(g->gs, rstd.g, rstd.c, (size_t)N * sizeof(float));
  pair dout = up(g, "rms.dout", n, 1, 0, t), dx = up(g, "rms.dx", n, 1, 0, t);
  pair dw = up(g, "rms.dw", C, 1, 0, ZT_F32);
  g->cpu->rmsnorm_bwd(g->cs, t, dx.c, dw.c, dout.c, x.c, w.c, rstd.c, N, C);
  g->gpu->rmsnorm_bwd(g->gs, t, dx.g, dw.g, dout.g, x.g, w.g, rstd.g, N, C);
  expect(g, "rmsnorm_bwd dx (+=)", dx, n, t, tol_out(t));
  expect(g, "rmsnorm_bwd dw (+=)", dw, C, ZT_F32, TOL32);
  pfree(g, x), pfree(g, w), pfree(g, out), pfree(g, rstd), pfree(g, dout), pfree(g, dx);
  pfree(g, dw);
}

static void test_bias(gt_ctx *g, zt_dtype t, int N, int C) {
  size_t n = (size_t)N * C;
  pair y = up(g, "bias.y", n, 1, 0, t), b = up(g, "bias.b", C, 1, 0, t);
  g->cpu->bias_fwd(g->cs, t, y.c, b.c, N, C);
  g->gpu->bias_fwd(g->gs, t, y.g, b.g, N, C);
  expect(g, "bias_fwd y (+=)", y, n, t, tol_out(t));
  pair dy = up(g, "bias.dy", n, 1, 0, t), db = up(g, "bias.db", C, 1, 0, ZT_F32);
  g->cpu->bias_bwd(g->cs, t, db.c, dy.c, N, C);
  g->gpu->bias_bwd(g->gs, t, db.g, dy.g, N, C);
  expect(g, "bias_bwd db (+=)", db, C, ZT_F32, TOL32);
  pfree(g, dy);
  pfree(g, y), pfree(g, b), pfree(g, db);
}

static void test_gelu(gt_ctx *g, zt_dtype t) {
  size_t n = 100003;
  pair x = up(g, "gelu.x", n, 2, 0, t), y = up(g, "gelu.y", n, 1, 0, t);
  pair dy = up(g, "gelu.dy", n, 1, 0, t), dx = up(g, "gelu.dx", n, 1, 0, t);
  g->cpu->gelu_fwd(g->cs, t, y.c, x.c, n);
  g->gpu->gelu_fwd(g->gs, t, y.g, x.g, n);
  expect(g, "gelu_fwd y", y, n, t, tol_out(t));
  g->cpu->gelu_bwd(g->cs, t, dx.c, x.c, dy.c, n);
  g->gpu->gelu_bwd(g->gs, t, dx.g, x.g, dy.g, n);
  expect(g, "gelu_bwd dx (=)", dx, n, t, tol_out(t));
  pfree(g, x), pfree(g, y), pfree(g, dy), pfree(g, dx);
}

static void test_swiglu(gt_ctx *g, zt_dtype t) {
  int N = 67, F = 300;
  size_t nh = (size_t)N * F;
  pair gu = up(g, "swiglu.gu", 2 * nh, 2, 0, t), h = up(g, "swiglu.h", nh, 1, 0, t);
  pair dh = up(g, "swiglu.dh", nh, 1, 0, t), dgu = up(g, "swiglu.dgu", 2 * nh, 1, 0, t);
  g->cpu->swiglu_fwd(g->cs, t, h.c, gu.c, N, F);
  g->gpu->swiglu_fwd(g->gs, t, h.g, gu.g, N, F);
  expect(g, "swiglu_fwd h", h, nh, t, tol_out(t));
  g->cpu->swiglu_bwd(g->cs, t, dgu.c, gu.c, dh.c, N, F);
  g->gpu->swiglu_bwd(g->gs, t, dgu.g, gu.g, dh.g, N, F);
  expect(g, "swiglu_bwd dgu (=)", dgu, 2 * nh, t, tol_out(t));
  pfree(g, gu), pfree(g, h), pfree(g, dh), pfree(g, dgu);
}

/* RoPE on the q and k heads of qkv rows: H = 4 query heads and KVH = 2,
 * nh = 6 heads rotated of the 8 in a row; the v heads must stay as they
 * are (the whole row is compared). */
static void test_rope(gt_ctx *g, zt_dtype t, int hd) {
  int B = 2, T = 37, N = B * T, nh = 6, rs = 8 * hd, half = hd / 2;
  size_t n = (size_t)N * rs;
  float *cs = malloc(sizeof *cs * 2 * T * half);
  if (!cs) abort();
  for (int p = 0; p < T; p++)
    for (int i = 0; i < half; i++) {
      double ang = p * pow(10000.0, -2.0 * i / hd);
      cs[p * half + i] = (float)cos(ang);
      cs[(T + p) * half + i] = (float)sin(ang);
    }
  pair c = up_raw(g, cs, sizeof *cs * 2 * T * half);
  pair x = up(g, "rope.x", n, 1, 0, t);
  g->cpu->rope_fwd(g->cs, t, x.c, c.c, N, T, nh, hd, rs);
  g->gpu->rope_fwd(g->gs, t, x.g, c.g, N, T, nh, hd, rs);
  expect(g, hd == 64 ? "rope_fwd x (hd 64)" : "rope_fwd x (hd 10)", x, n, t, tol_out(t));
  g->gpu->copy(g->gs, x.g, x.c, n * zt_dtype_size(t));
  g->cpu->rope_bwd(g->cs, t, x.c, c.c, N, T, nh, hd, rs);
  g->gpu->rope_bwd(g->gs, t, x.g, c.g, N, T, nh, hd, rs);
  expect(g, hd == 64 ? "rope_bwd dx (hd 64)" : "rope_bwd dx (hd 10)", x, n, t, tol_out(t));
  pfree(g, c), pfree(g, x);
  free(cs);
}

static void test_add(gt_ctx *g, zt_dtype t) {
  size_t n = 100003;
  pair y = up(g, "add.y", n, 1, 0, t), x = up(g, "add.x", n, 1, 0, t);
  g->cpu->add(g->cs, t, y.c, x.c, n);
  g->gpu->add(g->gs, t, y.g, x.g, n);
  /* one float add of the same two values, rounded once: exact */
  expect(g, "add y (+=)", y, n, t, 0);
  pfree(g, y), pfree(g, x);
}

/* every pair of f32, bf16, f16; the CPU backend converts only to and from
 * f32 and between equal types, so bf16 <-> f16 is checked against the
 * host's conversions (half.h) through f32, which is exact on the way in */
static void test_convert(gt_ctx *g) {
  size_t n = 5003;
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++) {
      zt_dtype ts = DTS[a], td = DTS[b];
      float *x = gt_randn("convert.x", n, 300);
      for (size_t i = 0; i < n; i += 7) x[i] *= 1e-6f; /* into fp16's subnormals */
      gt_round(x, n, ts);
      pair src = {gt_upload(g->cpu, g->cs, x, n, ts), gt_upload(g->gpu, g->gs, x, n, ts)}, dst;
      dst.c = g->cpu->alloc(ZT_MEM_DEVICE, n * zt_dtype_size(td));
      dst.g = g->gpu->alloc(ZT_MEM_DEVICE, n * zt_dtype_size(td));
      if ((ts == ZT_F32 || td == ZT_F32) || ts == td) {
        g->cpu->convert(g->cs, td, dst.c, ts, src.c, n);
      } else {
        gt_round(x, n, td); /* the one rounding, on the host */
        g->cpu->free(ZT_MEM_DEVICE, dst.c);
        dst.c = gt_upload(g->cpu, g->cs, x, n, td);
      }
      g->gpu->convert(g->gs, td, dst.g, ts, src.g, n);
      char what[64];
      snprintf(what, sizeof what, "convert %s -> %s", zt_dtype_name(ts), zt_dtype_name(td));
      expect(g, what, dst, n, td, 0);
      pfree(g, src), pfree(g, dst);
      free(x);
    }
}

/* rounding at the edges, bit for bit against half.h: ties to even, fp16's
 * overflow from 65520, its subnormals and 2^-25 (ties to 0), signed zero,
 * infinities; a NaN must stay a NaN */
static void test_convert_bits(gt_ctx *g) {
  const float x[] = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
                     65504.0f, 65519.99f, 65520.0f, 1e6f, 0x1p-25f, 0x3p-25f, 0x1p-24f,
                     0x1.8p-24f, 6.1e-5f, 1e-8f, -0.0f, 0.0f, INFINITY, -INFINITY,
                     -65520.0f, 3.3895314e38f, NAN};
  size_t n = sizeof x / sizeof *x;
  void *src = g->gpu->alloc(ZT_MEM_DEVICE, sizeof x), *dst = g->gpu->alloc(ZT_MEM_DEVICE, 2 * n);
  uint16_t got[32];
  if (!src || !dst) abort();
  g->gpu->copy(g->gs, src, x, sizeof x);
  for (int k = 0; k < 2; k++) {
    zt_dtype td = k ? ZT_F16 : ZT_BF16;
    g->gpu->convert(g->gs, td, dst, ZT_F32, src, n);
    g->gpu->copy(g->gs, got, dst, 2 * n);
    g->gpu->stream_sync(g->gs);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
      uint16_t want = k ? zt_f16_from_f32(x[i]) : zt_bf16_from_f32(x[i]);
      float gf = k ? zt_f16_to_f32(got[i]) : zt_bf16_to_f32(got[i]);
      int ok = isnan(x[i]) ? isnan(gf) : got[i] == want;
      if (!ok) printf("  %s(%a): got 0x%04x, want 0x%04x\n", zt_dtype_name(td), x[i], got[i], want);
      bad += !ok;
    }
    printf("%-4s %-44s %-5s %d of %zu values differ\n", bad ? "FAIL" : "ok",
           "convert f32 -> 16 bit at the edges (bits)", zt_dtype_name(td), bad, n);
    g->failures += bad != 0;
    g->checks++;
  }
  g->gpu->free(ZT_MEM_DEVICE, src);
  g->gpu->free(ZT_MEM_DEVICE, dst);
}

static zt_step_sums read_sums(const zt_backend *be, zt_stream *s, const void *d) {
  zt_step_sums h;
  be->copy(s, &h, d, sizeof h);
  be->stream_sync(s);
  return h;
}

static void check(gt_ctx *g, int ok, const char *what, const char *detail) {
  printf("%-4s %-44s %s\n", ok ? "ok" : "FAIL", what, detail);
  g->failures += !ok;
  g->checks++;
}

/* sumsq and count_nonfinite add to what the sums hold */
static void test_reductions(gt_ctx *g) {
  size_t n = 1000003;
  float *x = gt_randn("sums.x", n, 3);
  zt_step_sums init = {1.5, 7};
  pair s = up_raw(g, &init, sizeof init), xs = up_raw(g, x, n * sizeof *x);
  g->cpu->sumsq(g->cs, s.c, xs.c, n);
  g->gpu->sumsq(g->gs, s.g, xs.g, n);
  g->gpu->sumsq(g->gs, s.g, xs.g, 17); /* a second, short one */
  g->cpu->sumsq(g->cs, s.c, xs.c, 17);
  for (size_t i = 5; i < n; i += n / 9) x[i] = i % 2 ? NAN : -INFINITY; /* 9 of them */
  x[n - 1] = INFINITY;
  g->cpu->copy(g->cs, xs.c, x, n * sizeof *x);
  g->gpu->copy(g->gs, xs.g, x, n * sizeof *x);
  g->cpu->count_nonfinite(g->cs, s.c, xs.c, n);
  g->gpu->count_nonfinite(g->gs, s.g, xs.g, n);
  zt_step_sums a = read_sums(g->gpu, g->gs, s.g), b = read_sums(g->cpu, g->cs, s.c);
  /* each square is exact in double; the sums' orders differ, by ~1e-16 a term */
  double rel = fabs(a.sumsq - b.sumsq) / b.sumsq;
  char d[128];
  snprintf(d, sizeof d, "rel %.2e (tolerance 1e-12)", rel);
  check(g, rel <= 1e-12, "sumsq (+=, double)", d);
  snprintf(d, sizeof d, "%llu, the CPU %llu (exact)", (unsigned long long)a.nonfinite,
           (unsigned long long)b.nonfinite);
  check(g, a.nonfinite == b.nonfinite && b.nonfinite == 7 + 10, "count_nonfinite (+=)", d);
  pfree(g, s), pfree(g, xs);
  free(x);
}

/* AdamW with weight decay, a gradient scale and the bias corrections of
 * step 3; p16 in each 16-bit type (and none, and f32) */
static void test_adamw(gt_ctx *g) {
  size_t n = 100003;
  double lr = 3e-3, wd = 0.1, b1 = 0.9, b2 = 0.95;
  int step = 3;
  zt_adamw_args a = {.decay = (float)(1 - lr * wd), .b1 = (float)b1, .c1 = (float)(1 - b1),
                     .b2 = (float)b2, .c2 = (float)(1 - b2), .eps = 1e-8f,
                     .step = (float)(lr / (1 - pow(b1, step))),
                     .bc2_sqrt = (float)sqrt(1 - pow(b2, step)), .gscale = 0.37f};
  const zt_dtype t16s[4] = {ZT_F32, ZT_BF16, ZT_F16, ZT_F32};
  for (int k = 0; k < 4; k++) {
    int with16 = k < 3;
    zt_dtype t16 = t16s[k];
    pair p = up(g, "adamw.p", n, 1, 0, ZT_F32), gr = up(g, "adamw.g", n, 2, 0, ZT_F32);
    pair m = up(g, "adamw.m", n, 0.1f, 0, ZT_F32), v = up(g, "adamw.v", n, 0.1f, 0, ZT_F32);
    /* v >= 0 */
    float *vh = gt_randn("adamw.v", n, 0.1f);
    for (size_t i = 0; i < n; i++) vh[i] *= vh[i];
    g->cpu->copy(g->cs, v.c, vh, n * sizeof *vh);
    g->gpu->copy(g->gs, v.g, vh, n * sizeof *vh);
    free(vh);
    zt_step_sums init = {0, 2};
    pair s = up_raw(g, &init, sizeof init);
    pair p16 = {NULL, NULL};
    if (with16) p16 = up(g, "adamw.p16", n, 1, 0, t16);
    float *p0 = gt_download(g->cpu, g->cs, p.c, n, ZT_F32);
    g->cpu->adamw(g->cs, p.c, gr.c, m.c, v.c, n, &a, s.c, p16.c, t16);
    g->gpu->adamw(g->gs, p.g, gr.g, m.g, v.g, n, &a, s.g, p16.g, t16);
    g->gpu->stream_sync(g->gs);
    /* the update, not p: p's size would hide an error in the update */
    float *pg = gt_download(g->gpu, g->gs, p.g, n, ZT_F32);
    float *pc = gt_download(g->cpu, g->cs, p.c, n, ZT_F32);
    double num = 0, den = 0;
    size_t same = 0;
    for (size_t i = 0; i < n; i++) {
      double dg = (double)pg[i] - p0[i], dc = (double)pc[i] - p0[i];
      num += (dg - dc) * (dg - dc);
      den += dc * dc;
      same += memcmp(pg + i, pc + i, sizeof(float)) == 0;
    }
    char d[160];
    snprintf(d, sizeof d, "update rel L2 %.3e (tolerance 0), %zu of %zu p bitwise", sqrt(num / den),
             same, n);
    check(g, same == n, "adamw p", d);
    expect(g, "adamw m", m, n, ZT_F32, 0);
    expect(g, "adamw v", v, n, ZT_F32, 0);
    if (with16) expect(g, "adamw p16", p16, n, t16, 0);
    zt_step_sums sa = read_sums(g->gpu, g->gs, s.g), sb = read_sums(g->cpu, g->cs, s.c);
    snprintf(d, sizeof d, "%llu, the CPU %llu", (unsigned long long)sa.nonfinite,
             (unsigned long long)sb.nonfinite);
    check(g, sa.nonfinite == sb.nonfinite, "adamw nonfinite (+=)", d);
    free(p0), free(pg), free(pc);
    pfree(g, p), pfree(g, gr), pfree(g, m), pfree(g, v), pfree(g, s);
    if (with16) pfree(g, p16);
  }
  /* non-finite gradients make non-finite weights, counted */
  size_t n2 = 1000;
  float *gh = gt_randn("adamw.g2", n2, 1);
  gh[3] = NAN, gh[100] = INFINITY, gh[999] = -INFINITY;
  pair p = up(g, "adamw.p2", n2, 1, 0, ZT_F32), gr = up_raw(g, gh, n2 * sizeof *gh);
  pair m = up(g, "adamw.m2", n2, 0, 0, ZT_F32), v = up(g, "adamw.m2", n2, 0, 0, ZT_F32);
  zt_step_sums init = {0, 0};
  pair s = up_raw(g, &init, sizeof init);
  g->cpu->adamw(g->cs, p.c, gr.c, m.c, v.c, n2, &a, s.c, NULL, ZT_F32);
  g->gpu->adamw(g->gs, p.g, gr.g, m.g, v.g, n2, &a, s.g, NULL, ZT_F32);
  zt_step_sums sa = read_sums(g->gpu, g->gs, s.g), sb = read_sums(g->cpu, g->cs, s.c);
  char d[96];
  snprintf(d, sizeof d, "%llu, the CPU %llu", (unsigned long long)sa.nonfinite,
           (unsigned long long)sb.nonfinite);
  check(g, sa.nonfinite == sb.nonfinite && sb.nonfinite == 3, "adamw counts non-finite p", d);
  pfree(g, p), pfree(g, gr), pfree(g, m), pfree(g, v), pfree(g, s);
  free(gh);
}

/* ---- memory, copies, streams ---- */

static const char *kind_name(zt_mem_kind k) {
  return k == ZT_MEM_DEVICE ? "device" : k == ZT_MEM_PINNED ? "pinned" : "host";
}

/* a copy from a stack buffer that is gone (and overwritten) before the
 * stream runs: the runtime stages pageable sources before returning */
static void copy_from_stack(gt_ctx *g, void *dst, size_t n) {
  unsigned char buf[4096];
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 31 + 5);
  g->gpu->copy(g->gs, dst, buf, n);
}

static void scribble_stack(void) {
  volatile unsigned char buf[8192];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = 0xAB;
}

static void test_memory(gt_ctx *g) {
  const size_t n = (1 << 20) + 3;
  const zt_mem_kind kinds[3] = {ZT_MEM_DEVICE, ZT_MEM_PINNED, ZT_MEM_HOST};
  unsigned char *pat = malloc(n), *back = malloc(n);
  void *buf[3];
  if (!pat || !back) abort();
  for (size_t i = 0; i < n; i++) pat[i] = (unsigned char)(i * 7 + 3);
  char d[96];
  for (int k = 0; k < 3; k++) {
    buf[k] = g->gpu->alloc(kinds[k], n);
    if (!buf[k]) abort();
    memset(back, 0x5A, n);
    g->gpu->copy(g->gs, back, buf[k], n);
    g->gpu->stream_sync(g->gs);
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += back[i] != 0;
    snprintf(d, sizeof d, "%zu nonzero bytes of %zu", nz, n);
    char what[64];
    snprintf(what, sizeof what, "alloc %s is zeroed", kind_name(kinds[k]));
    check(g, nz == 0, what, d);
  }
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++) {
      if (a == b) continue;
      memset(back, 0, n);
      g->gpu->copy(g->gs, buf[a], pat, n);
      g->gpu->copy(g->gs, buf[b], buf[a], n);
      g->gpu->copy(g->gs, back, buf[b], n);
      g->gpu->stream_sync(g->gs);
      char what[64];
      snprintf(what, sizeof what, "copy host -> %s -> %s -> host", kind_name(kinds[a]),
               kind_name(kinds[b]));
      check(g, memcmp(back, pat, n) == 0, what, "");
    }
  /* memzero inside device and pinned buffers, unaligned */
  for (int k = 0; k < 2; k++) {
    g->gpu->copy(g->gs, buf[k], pat, n);
    g->gpu->memzero(g->gs, (char *)buf[k] + 5, 1001);
    g->gpu->copy(g->gs, back, buf[k], n);
    g->gpu->stream_sync(g->gs);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= back[i] == (i >= 5 && i < 1006 ? 0 : pat[i]);
    char what[64];
    snprintf(what, sizeof what, "memzero in %s memory", kind_name(kinds[k]));
    check(g, ok, what, "");
  }
  copy_from_stack(g, buf[0], 4096);
  scribble_stack();
  g->gpu->copy(g->gs, back, buf[0], 4096);
  g->gpu->stream_sync(g->gs);
  int ok = 1;
  for (size_t i = 0; i < 4096; i++) ok &= back[i] == (unsigned char)(i * 31 + 5);
  check(g, ok, "copy from a stack buffer gone before the sync", "");
  for (int k = 0; k < 3; k++) g->gpu->free(kinds[k], buf[k]);
  free(pat), free(back);
}

/* 100 adds of 1 on stream A, an event, stream B waits for it and copies
 * the result out: B must see 100 everywhere. Without the wait B's copy
 * would run while A is still adding (16 MiB a pass). */
static void test_streams(gt_ctx *g) {
  size_t n = (size_t)1 << 22;
  zt_stream *b = g->gpu->stream_new();
  zt_event *e = g->gpu->event_new();
  float *ones = malloc(n * sizeof *ones), *host = g->gpu->alloc(ZT_MEM_PINNED, n * sizeof *host);
  void *y = g->gpu->alloc(ZT_MEM_DEVICE, n * sizeof(float));
  void *x = g->gpu->alloc(ZT_MEM_DEVICE, n * sizeof(float));
  if (!b || !e || !ones || !host || !y || !x) abort();
  for (size_t i = 0; i < n; i++) ones[i] = 1;
  g->gpu->copy(g->gs, x, ones, n * sizeof *ones);
  for (int r = 0; r < 100; r++) g->gpu->add(g->gs, ZT_F32, y, x, n);
  g->gpu->event_record(e, g->gs);
  g->gpu->event_wait(b, e);
  g->gpu->copy(b, host, y, n * sizeof(float));
  g->gpu->stream_sync(b);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += host[i] != 100;
  char d[96];
  snprintf(d, sizeof d, "%zu of %zu values not 100", bad, n);
  check(g, bad == 0, "event orders stream B after stream A", d);
  /* event_sync: the host waits for A, then reads what A copied into pinned memory */
  for (int r = 0; r < 50; r++) g->gpu->add(g->gs, ZT_F32, y, x, n);
  g->gpu->copy(g->gs, host, y, n * sizeof(float));
  g->gpu->event_record(e, g->gs);
  g->gpu->event_sync(e);
  bad = 0;
  for (size_t i = 0; i < n; i++) bad += host[i] != 150;
  snprintf(d, sizeof d, "%zu of %zu values not 150", bad, n);
  check(g, bad == 0, "event_sync waits for the stream", d);
  g->gpu->event_free(e);
  g->gpu->stream_free(b);
  g->gpu->free(ZT_MEM_PINNED, host);
  g->gpu->free(ZT_MEM_DEVICE, y);
  g->gpu->free(ZT_MEM_DEVICE, x);
  free(ones);
}

/* Failures that are no op's: none is kept. Then an op's: the first is. */
static void test_errors(gt_ctx *g) {
  char msg[512], why[256];
  void *huge = g->gpu->alloc(ZT_MEM_DEVICE, (size_t)1 << 50);
  check(g, huge == NULL && !g->gpu->error(msg, sizeof msg), "alloc too large: NULL, no error",
        msg);
  const zt_backend *other = zt_backend_cuda(zt_backend_cuda_devices(), why, sizeof why);
  check(g, other == NULL && why[0] && !g->gpu->error(msg, sizeof msg),
        "a device out of range: NULL and why", why);
  check(g, zt_backend_cuda(0, why, sizeof why) == g->gpu, "the same table again", "");
  /* a kernel still runs after the failed allocation (its error cleared) */
  pair y = up(g, "err.y", 1000, 1, 0, ZT_F32), x = up(g, "err.x", 1000, 1, 0, ZT_F32);
  g->cpu->add(g->cs, ZT_F32, y.c, x.c, 1000);
  g->gpu->add(g->gs, ZT_F32, y.g, x.g, 1000);
  expect(g, "add after a failed alloc", y, 1000, ZT_F32, 0);
  /* an op given a dtype the backend does not implement */
  g->gpu->convert(g->gs, ZT_I32, x.g, ZT_F32, y.g, 1000);
  int first = g->gpu->error(msg, sizeof msg);
  check(g, first && strstr(msg, "convert"), "a bad dtype is kept as the error", msg);
  g->gpu->add(g->gs, ZT_I64, y.g, x.g, 1000);
  int still = g->gpu->error(msg, sizeof msg);
  check(g, still && strstr(msg, "convert") && !strstr(msg, "add"),
        "the first failure stays (sticky)", msg);
  pfree(g, y), pfree(g, x);
}

int main(void) {
  gt_ctx g;
  gt_init(&g);
  for (int k = 0; k < 3; k++) {
    zt_dtype t = DTS[k];
    test_embed(&g, t);
    test_layernorm(&g, t, 67, 300);
    test_layernorm(&g, t, 5, 40);
    test_layernorm(&g, t, 130, 1100);
    test_rmsnorm(&g, t, 67, 300);
    test_rmsnorm(&g, t, 3000, 72); /* chunks of 32 rows */
    test_bias(&g, t, 67, 300);
    test_bias(&g, t, 9000, 70); /* chunks of 36 rows */
    test_gelu(&g, t);
    test_swiglu(&g, t);
    test_rope(&g, t, 64);
    test_rope(&g, t, 10);
    test_add(&g, t);
  }
  test_convert(&g);
  test_convert_bits(&g);
  test_reductions(&g);
  test_adamw(&g);
  test_memory(&g);
  test_streams(&g);
  test_errors(&g); /* last: it leaves the sticky error set */
  return gt_finish(&g, "test_cuda_ops");
}
