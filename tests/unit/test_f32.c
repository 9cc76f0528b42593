/* test_f32: the float backend against the double instantiation of the same
 * loops. They differ only where the float build uses its own vectorised
 * exp/tanh (kernels/cpu/ops_impl.h) and in float rounding, so agreement to
 * a few float ulps proves those functions over the ranges training feeds
 * them: wide arguments for GELU and SwiGLU, large logits for softmax and
 * cross-entropy. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/ops.h"
#include "src/core/rng.h"

/* A few float ulps relative to the largest value compared. */
#define TOL 2e-6

typedef struct { float *f; double *d; size_t n; } pair;

/* n values sd * N(0,1) from a named stream, in float and in double. */
static pair randp(size_t n, const char *stream, double sd) {
  pair p = {malloc(n * sizeof(float)), malloc(n * sizeof(double)), n};
  uint64_t key = zt_rng_key(7, stream);
  for (size_t i = 0; i < n; i++) {
    p.f[i] = (float)(sd * zt_rng_normal(key, i));
    p.d[i] = p.f[i]; /* same inputs exactly */
  }
  return p;
}
static pair outp(size_t n) {
  return (pair){calloc(n, sizeof(float)), calloc(n, sizeof(double)), n};
}
static void freep(pair p) { free(p.f); free(p.d); }

static void expect_within(const char *what, pair p, double tol) {
  double d = 0, m = 0;
  for (size_t i = 0; i < p.n; i++) {
    d = fmax(d, fabs(p.f[i] - p.d[i]));
    m = fmax(m, fabs(p.d[i]));
  }
  double err = d / fmax(m, 1e-30);
  printf("  %-22s float vs double %.2e (tolerance %.1e)\n", what, err, tol);
  assert_true(err <= tol);
}

static void expect_same(const char *what, pair p) { expect_within(what, p, TOL); }

static void test_gelu(void **state) {
  (void)state;
  size_t n = 4096;
  pair x = randp(n, "gelu.x", 4.0), dy = randp(n, "gelu.dy", 1.0);
  pair y = outp(n), dx = outp(n);
  zt_cpu_f32_gelu_fwd(y.f, x.f, n);
  zt_cpu_f64_gelu_fwd(y.d, x.d, n);
  expect_same("gelu forward", y);
  zt_cpu_f32_gelu_bwd(dx.f, x.f, dy.f, n);
  zt_cpu_f64_gelu_bwd(dx.d, x.d, dy.d, n);
  expect_same("gelu backward", dx);
  freep(x); freep(dy); freep(y); freep(dx);
}

static void test_swiglu(void **state) {
  (void)state;
  int N = 64, F = 32;
  pair gu = randp((size_t)N * 2 * F, "swiglu.gu", 6.0), dh = randp((size_t)N * F, "swiglu.dh", 1.0);
  pair h = outp((size_t)N * F), dgu = outp((size_t)N * 2 * F);
  zt_cpu_f32_swiglu_fwd(h.f, gu.f, N, F);
  zt_cpu_f64_swiglu_fwd(h.d, gu.d, N, F);
  expect_same("swiglu forward", h);
  zt_cpu_f32_swiglu_bwd(dgu.f, gu.f, dh.f, N, F);
  zt_cpu_f64_swiglu_bwd(dgu.d, gu.d, dh.d, N, F);
  expect_same("swiglu backward", dgu);
  freep(gu); freep(dh); freep(h); freep(dgu);
}

static void test_attention(void **state) {
  (void)state;
  /* T = 300: several query tiles, two key tiles, the second partial (attn_impl.h) */
  int B = 2, T = 300, H = 4, KVH = 2, hd = 8, rs = (H + 2 * KVH) * hd;
  /* sd 3 gives scores of tens: the softmax's exp sees a wide range */
  pair qkv = randp((size_t)B * T * rs, "attn.qkv", 3.0);
  pair out = outp((size_t)B * T * H * hd), lse = outp((size_t)B * H * T);
  zt_cpu_f32_attn_fwd(out.f, lse.f, qkv.f, B, T, H, KVH, hd);
  zt_cpu_f64_attn_fwd(out.d, lse.d, qkv.d, B, T, H, KVH, hd);
  expect_same("attention lse", lse);
  expect_same("attention out", out);
  /* The backward takes exp(s - lse) with lse ~ 30 at these scores, where
   * one ulp of a float lse is 2e-6 of P: the two backwards get the very
   * same inputs (the float forward's out and lse), so that what is compared
   * is the backward's own float arithmetic and exp */
  for (size_t i = 0; i < out.n; i++) out.d[i] = out.f[i];
  for (size_t i = 0; i < lse.n; i++) lse.d[i] = lse.f[i];
  pair dout = randp(out.n, "attn.dout", 1.0), dqkv = outp(qkv.n);
  zt_cpu_f32_attn_bwd(dqkv.f, dout.f, qkv.f, out.f, lse.f, B, T, H, KVH, hd);
  zt_cpu_f64_attn_bwd(dqkv.d, dout.d, qkv.d, out.d, lse.d, B, T, H, KVH, hd);
  /* its dK and dV sum over up to T query rows and dQ over T keys: float's
   * worst case for a sum of T terms is T ulps (T * 2^-24 = 1.8e-5 here) */
  expect_within("attention backward", dqkv, T * 0x1p-24);
  freep(qkv); freep(out); freep(lse); freep(dout); freep(dqkv);
}

static void test_xent(void **state) {
  (void)state;
  int N = 8, V = 1000;
  pair logits = randp((size_t)N * V, "xent.logits", 8.0);
  pair loss = outp((size_t)N);
  int32_t tgt[8] = {0, 1, 999, 500, 3, 77, 640, 12};
  zt_cpu_f32_xent_fwd_bwd(logits.f, loss.f, tgt, N, V, 0.5f);
  zt_cpu_f64_xent_fwd_bwd(logits.d, loss.d, tgt, N, V, 0.5);
  expect_same("cross-entropy loss", loss);
  expect_same("cross-entropy dlogits", logits);
  freep(logits); freep(loss);
}

/* The vocab-parallel steps on one shard (the whole row): the same
 * functions as the fused kernel, but the sum of exps is handed on in float */
static void test_xent_steps(void **state) {
  (void)state;
  int N = 8, V = 1000;
  pair logits = randp((size_t)N * V, "xent.logits", 8.0);
  pair loss = outp((size_t)N), stats = outp(3 * (size_t)N);
  int32_t tgt[8] = {0, 1, 999, 500, 3, 77, 640, 12};
  zt_cpu_f32_xent_max(stats.f, logits.f, N, V);
  zt_cpu_f32_xent_sumexp(stats.f, logits.f, tgt, N, V, 0);
  zt_cpu_f32_xent_finish(logits.f, loss.f, stats.f, tgt, N, V, 0, 0.5f);
  zt_cpu_f64_xent_fwd_bwd(logits.d, loss.d, tgt, N, V, 0.5);
  expect_same("xent steps loss", loss);
  expect_same("xent steps dlogits", logits);
  freep(logits); freep(loss); freep(stats);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gelu), cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_attention), cmocka_unit_test(test_xent),
      cmocka_unit_test(test_xent_steps)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
