/* test_gradcheck: every layer's backward against central finite differences,
 * in double precision, on the double instantiation of the CPU loops
 * (zt_cpu_f64_*, compiled from the same ops_impl.h as the float backend), so
 * a wrong derivative shows up as an O(1) error instead of hiding in float
 * noise. For each op: L = sum(out * R) with a random projection R, analytic
 * gradients from the *_bwd op fed dout = R, numeric ones by central
 * differences on every input element. Also: forward values against naive
 * references, the += / = conventions of kernels.h, gemm transposes, AdamW
 * against torch's formula. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "src/core/rng.h"
#include "tests/unit/pool.h"

/* h = 1e-5 balances truncation (h^2 f''' ~ 1e-10) against cancellation
 * (1e-16 |L| / h ~ 1e-10); double-precision agreement is then ~1e-9, so
 * 1e-6 only fails on a real bug. */
#define FD_H 1e-5
#define FD_TOL 1e-6
/* Forward values against naive loops: only rounding differs. */
#define FWD_TOL 1e-12
static double *zeros(size_t n) { return keep(calloc(n, sizeof(double))); }
static double *randn(size_t n, const char *stream, double mean, double sd) {
  double *x = zeros(n);
  uint64_t key = zt_rng_key(42, stream);
  for (size_t i = 0; i < n; i++) x[i] = mean + sd * zt_rng_normal(key, i);
  return x;
}
static double *dup(const double *x, size_t n) {
  return memcpy(zeros(n), x, n * sizeof(double));
}
static double dot(const double *a, const double *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* max|a-n| / max(1e-8, max|n|) over columns [c0, c1) of `rows` rows of
 * stride rs: relative to the largest gradient, so tiny entries do not make
 * the ratio explode. */
static double relerr_cols(const double *a, const double *n, int rows, int rs,
                          int c0, int c1) {
  double d = 0, m = 0;
  for (int r = 0; r < rows; r++)
    for (int c = c0; c < c1; c++) {
      size_t i = (size_t)r * rs + c;
      d = fmax(d, fabs(a[i] - n[i]));
      m = fmax(m, fabs(n[i]));
    }
  return d / fmax(1e-8, m);
}
static double relerr(const double *a, const double *n, size_t len) {
  return relerr_cols(a, n, 1, (int)len, 0, (int)len);
}

/* The printed errors are the evidence in the log; the assertion the gate. */
static void expect_close(const char *what, double err, double tol) {
  print_message("  %-28s rel err %.2e\n", what, err);
  assert_true(err <= tol);
}

typedef double (*loss_fn)(void *ctx);

/* Numeric gradient of f with respect to x[i] (numgrad: all of x[0, n)),
 * perturbing x in place (and restoring it). The context reads x through
 * its own pointer. */
static double numgrad_at(loss_fn f, void *ctx, double *x, size_t i) {
  double s = x[i];
  x[i] = s + FD_H;
  double lp = f(ctx);
  x[i] = s - FD_H;
  double lm = f(ctx);
  x[i] = s;
  return (lp - lm) / (2 * FD_H);
}
static double *numgrad(loss_fn f, void *ctx, double *x, size_t n) {
  double *g = zeros(n);
  for (size_t i = 0; i < n; i++) g[i] = numgrad_at(f, ctx, x, i);
  return g;
}

/* ----------------------------------------------------------------- embed */
typedef struct { int B, T, C, V; int32_t *tok; double *wte, *wpe, *R, *out; } embed_ctx;
static double embed_loss(void *p) {
  embed_ctx *c = p;
  zt_cpu_f64_embed_fwd(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C, 0, c->V);
  return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_embed(void **state) {
  (void)state;
  enum { B = 2, T = 4, C = 8, V = 5, N = B * T };
  embed_ctx c = {B, T, C, V, keep(calloc(N, sizeof(int32_t))), randn(V * C, "wte", 0, 1),
                 randn(T * C, "wpe", 0, 1), randn(N * C, "R", 0, 1), zeros(N * C)};
  /* N > V, so some token repeats and its dwte rows must sum */
  uint64_t key = zt_rng_key(42, "tok");
  for (int n = 0; n < N; n++) c.tok[n] = (int32_t)zt_rng_below(key, n, V);
  embed_loss(&c);
  for (int n = 0; n < N; n++)
    for (int k = 0; k < C; k++)
      assert_true(c.out[n * C + k] == c.wte[c.tok[n] * C + k] + c.wpe[(n % T) * C + k]);

  double *dwte = zeros(V * C), *dwpe = zeros(T * C);
  zt_cpu_f64_embed_bwd(dwte, dwpe, c.tok, c.R, B, T, C, 0, V);
  expect_close("embed dwte", relerr(dwte, numgrad(embed_loss, &c, c.wte, V * C), V * C), FD_TOL);
  expect_close("embed dwpe", relerr(dwpe, numgrad(embed_loss, &c, c.wpe, T * C), T * C), FD_TOL);

  /* parameter gradients accumulate: a second call doubles them */
  double *dwte1 = dup(dwte, V * C), *dwpe1 = dup(dwpe, T * C);
  zt_cpu_f64_embed_bwd(dwte, dwpe, c.tok, c.R, B, T, C, 0, V);
  for (int i = 0; i < V * C; i++) assert_true(dwte[i] == 2 * dwte1[i]);
  for (int i = 0; i < T * C; i++) assert_true(dwpe[i] == 2 * dwpe1[i]);

  /* without positions: out = wte[tok], and dwpe = NULL is allowed */
  zt_cpu_f64_embed_fwd(c.out, c.tok, c.wte, NULL, B, T, C, 0, V);
  for (int n = 0; n < N; n++) assert_true(c.out[n * C + 3] == c.wte[c.tok[n] * C + 3]);
  zt_cpu_f64_embed_bwd(dwte, NULL, c.tok, c.R, B, T, C, 0, V);
  for (int i = 0; i < V * C; i++) assert_true(fabs(dwte[i] - 3 * dwte1[i]) <= 1e-12);
}

/* Vocab-parallel: P shards of V/P table rows, shard s being rows
 * [s*V/P, (s+1)*V/P) (a pointer into the whole table), positions passed to
 * shard 0 only, outputs summed as the model's all-reduce does. */
typedef struct { embed_ctx e; int P; double *part; } vp_embed_ctx;
static double vp_embed_loss(void *p) {
  vp_embed_ctx *c = p;
  int Vl = c->e.V / c->P, C = c->e.C;
  size_t NC = (size_t)c->e.B * c->e.T * C;
  memset(c->e.out, 0, NC * sizeof(double));
  for (int s = 0; s < c->P; s++) {
    zt_cpu_f64_embed_fwd(c->part, c->e.tok, c->e.wte + (size_t)s * Vl * C,
                         s ? NULL : c->e.wpe, c->e.B, c->e.T, C, s * Vl, Vl);
    for (size_t i = 0; i < NC; i++) c->e.out[i] += c->part[i];
  }
  return dot(c->e.out, c->e.R, NC);
}

static void test_embed_vocab_parallel(void **state) {
  (void)state;
  enum { B = 2, T = 4, C = 8, V = 6, N = B * T };
  embed_ctx w = {B, T, C, V, keep(calloc(N, sizeof(int32_t))), randn(V * C, "wte", 0, 1),
                 randn(T * C, "wpe", 0, 1), randn(N * C, "R", 0, 1), zeros(N * C)};
  for (int n = 0; n < N; n++) w.tok[n] = (int32_t)((n * 5 + 1) % V); /* every shard, repeats */
  embed_loss(&w);
  double *dwte = zeros(V * C), *dwpe = zeros(T * C);
  zt_cpu_f64_embed_bwd(dwte, dwpe, w.tok, w.R, B, T, C, 0, V);

  for (int P = 2; P <= 3; P++) {
    vp_embed_ctx c = {w, P, zeros(N * C)};
    c.e.out = zeros(N * C);
    vp_embed_loss(&c);
    /* one shard contributes the token row, the others exact zeros */
    for (int i = 0; i < N * C; i++) assert_true(c.e.out[i] == w.out[i]);
    /* each shard accumulates exactly its rows of dwte, and all of dwpe */
    int Vl = V / P;
    double *sdwte = zeros(V * C);
    for (int s = 0; s < P; s++) {
      double *sdwpe = zeros(T * C);
      zt_cpu_f64_embed_bwd(sdwte + (size_t)s * Vl * C, sdwpe, w.tok, w.R, B, T, C, s * Vl, Vl);
      for (int i = 0; i < T * C; i++) assert_true(sdwpe[i] == dwpe[i]);
    }
    for (int i = 0; i < V * C; i++) assert_true(sdwte[i] == dwte[i]);
    char what[40];
    snprintf(what, sizeof what, "embed %d shards: dwte FD", P);
    expect_close(what, relerr(sdwte, numgrad(vp_embed_loss, &c, c.e.wte, V * C), V * C), FD_TOL);
  }
}

/* ------------------------------------------------------- layernorm, rmsnorm */
typedef struct { int N, C, rms; double eps; double *x, *w, *b, *R, *out, *mean, *rstd; } norm_ctx;
static double norm_loss(void *p) {
  norm_ctx *c = p;
  if (c->rms)
    zt_cpu_f64_rmsnorm_fwd(c->out, c->rstd, c->x, c->w, c->N, c->C, c->eps);
  else
    zt_cpu_f64_layernorm_fwd(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C, c->eps);
  return dot(c->out, c->R, (size_t)c->N * c->C);
}

static norm_ctx norm_setup(int rms, int N, int C) {
  norm_ctx c = {N, C, rms, 1e-5, randn(N * C, "x", 0.3, 1.5), randn(C, "w", 1, 0.5),
                randn(C, "b", 0, 0.5), randn(N * C, "R", 0, 1), zeros(N * C),
                zeros(N), zeros(N)};
  return c;
}

static void test_layernorm(void **state) {
  (void)state;
  enum { N = 6, C = 8 };
  norm_ctx c = norm_setup(0, N, C);

  /* before the affine part (w = 1, b = 0, eps = 0) each row has mean 0 and
   * variance 1 */
  norm_ctx id = c;
  id.w = randn(C, "one", 1, 0);
  id.b = zeros(C);
  id.eps = 0;
  norm_loss(&id);
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int k = 0; k < C; k++) m += id.out[n * C + k] / C;
    for (int k = 0; k < C; k++) v += (id.out[n * C + k] - m) * (id.out[n * C + k] - m) / C;
    assert_true(fabs(m) <= FWD_TOL && fabs(v - 1) <= FWD_TOL);
  }

  norm_loss(&c);
  double *dx = zeros(N * C), *dw = zeros(C), *db = zeros(C);
  zt_cpu_f64_layernorm_bwd(dx, dw, db, c.R, c.x, c.w, c.mean, c.rstd, N, C);
  /* numgrad reruns forward, so analytic gradients are taken first */
  double *dx1 = dup(dx, N * C);
  expect_close("layernorm dx", relerr(dx, numgrad(norm_loss, &c, c.x, N * C), N * C), FD_TOL);
  expect_close("layernorm dw", relerr(dw, numgrad(norm_loss, &c, c.w, C), C), FD_TOL);
  expect_close("layernorm db", relerr(db, numgrad(norm_loss, &c, c.b, C), C), FD_TOL);

  /* dx is accumulated too (the residual stream relies on it) */
  norm_loss(&c);
  zt_cpu_f64_layernorm_bwd(dx, dw, db, c.R, c.x, c.w, c.mean, c.rstd, N, C);
  for (int i = 0; i < N * C; i++) assert_true(fabs(dx[i] - 2 * dx1[i]) <= 1e-12);
}

static void test_rmsnorm(void **state) {
  (void)state;
  enum { N = 6, C = 8 };
  norm_ctx c = norm_setup(1, N, C);

  /* w = 1, eps = 0: every row has mean square 1 */
  norm_ctx id = c;
  id.w = randn(C, "one", 1, 0);
  id.eps = 0;
  norm_loss(&id);
  for (int n = 0; n < N; n++) {
    double ms = 0;
    for (int k = 0; k < C; k++) ms += id.out[n * C + k] * id.out[n * C + k] / C;
    assert_true(fabs(ms - 1) <= FWD_TOL);
  }

  norm_loss(&c);
  double *dx = zeros(N * C), *dw = zeros(C);
  zt_cpu_f64_rmsnorm_bwd(dx, dw, c.R, c.x, c.w, c.rstd, N, C);
  double *dx1 = dup(dx, N * C);
  expect_close("rmsnorm dx", relerr(dx, numgrad(norm_loss, &c, c.x, N * C), N * C), FD_TOL);
  expect_close("rmsnorm dw", relerr(dw, numgrad(norm_loss, &c, c.w, C), C), FD_TOL);

  norm_loss(&c);
  zt_cpu_f64_rmsnorm_bwd(dx, dw, c.R, c.x, c.w, c.rstd, N, C);
  for (int i = 0; i < N * C; i++) assert_true(fabs(dx[i] - 2 * dx1[i]) <= 1e-12);
}

/* ------------------------------------------------- bias, gelu, swiglu */
typedef struct { int N, C; double *x, *p, *R, *out; } elem_ctx; /* p: bias or unused */
static double bias_loss(void *q) {
  elem_ctx *c = q;
  memcpy(c->out, c->x, sizeof(double) * c->N * c->C);
  zt_cpu_f64_bias_fwd(c->out, c->p, c->N, c->C);
  return dot(c->out, c->R, (size_t)c->N * c->C);
}
static double gelu_loss(void *q) {
  elem_ctx *c = q;
  zt_cpu_f64_gelu_fwd(c->out, c->x, (size_t)c->N * c->C);
  return dot(c->out, c->R, (size_t)c->N * c->C);
}
/* swiglu: x is gu[N, 2F] with C = F */
static double swiglu_loss(void *q) {
  elem_ctx *c = q;
  zt_cpu_f64_swiglu_fwd(c->out, c->x, c->N, c->C);
  return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_bias(void **state) {
  (void)state;
  enum { N = 6, C = 8 };
  elem_ctx c = {N, C, randn(N * C, "x", 0, 1), randn(C, "b", 0, 1), randn(N * C, "R", 0, 1),
                zeros(N * C)};
  double *db = zeros(C);
  zt_cpu_f64_bias_bwd(db, c.R, N, C);
  expect_close("bias db", relerr(db, numgrad(bias_loss, &c, c.p, C), C), FD_TOL);
  double *db1 = dup(db, C);
  zt_cpu_f64_bias_bwd(db, c.R, N, C);
  for (int i = 0; i < C; i++) assert_true(db[i] == 2 * db1[i]);
}

static void test_gelu(void **state) {
  (void)state;
  enum { N = 6, C = 8, n = N * C };
  /* sd 2 reaches both tails and the curved middle */
  elem_ctx c = {N, C, randn(n, "x", 0, 2), NULL, randn(n, "R", 0, 1), zeros(n)};
  gelu_loss(&c);
  for (int i = 0; i < n; i++) {
    double v = c.x[i];
    double ref = 0.5 * v * (1 + tanh(sqrt(2 / acos(-1.0)) * (v + 0.044715 * v * v * v)));
    assert_true(fabs(c.out[i] - ref) <= FWD_TOL);
  }
  /* dx is written (=): stale contents must not leak in */
  double *dx = randn(n, "garbage", 100, 1);
  zt_cpu_f64_gelu_bwd(dx, c.x, c.R, n);
  expect_close("gelu dx", relerr(dx, numgrad(gelu_loss, &c, c.x, n), n), FD_TOL);
}

static void test_swiglu(void **state) {
  (void)state;
  enum { N = 6, F = 8 };
  elem_ctx c = {N, F, randn(N * 2 * F, "gu", 0, 2), NULL, randn(N * F, "R", 0, 1),
                zeros(N * F)};
  swiglu_loss(&c);
  for (int r = 0; r < N; r++)
    for (int f = 0; f < F; f++) {
      double g = c.x[r * 2 * F + f], u = c.x[r * 2 * F + F + f];
      assert_true(fabs(c.out[r * F + f] - g / (1 + exp(-g)) * u) <= FWD_TOL);
    }
  double *dgu = randn(N * 2 * F, "garbage", 100, 1);
  zt_cpu_f64_swiglu_bwd(dgu, c.x, c.R, N, F);
  double *num = numgrad(swiglu_loss, &c, c.x, N * 2 * F);
  expect_close("swiglu dgate", relerr_cols(dgu, num, N, 2 * F, 0, F), FD_TOL);
  expect_close("swiglu dup", relerr_cols(dgu, num, N, 2 * F, F, 2 * F), FD_TOL);
}

/* ------------------------------------------------------------------ rope */
typedef struct { int N, T, nh, hd, rs; double *x, *xs, *cs, *R; } rope_ctx;
static double rope_loss(void *p) {
  rope_ctx *c = p;
  memcpy(c->xs, c->x, sizeof(double) * c->N * c->rs);
  zt_cpu_f64_rope_fwd(c->xs, c->cs, c->N, c->T, c->nh, c->hd, c->rs);
  return dot(c->xs, c->R, (size_t)c->N * c->rs);
}

static void test_rope(void **state) {
  (void)state;
  /* as in the model: rows of qkv, rotating the q and k heads (nh = 3 of 4),
   * the v head must pass through untouched */
  enum { B = 2, T = 4, hd = 8, half = hd / 2, nh = 3, rs = 4 * hd, N = B * T, n = N * rs };
  double *cs = zeros(T * hd);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double fr = pow(10000.0, -2.0 * i / hd);
      cs[t * half + i] = cos(t * fr);
      cs[T * half + t * half + i] = sin(t * fr);
    }
  rope_ctx c = {N, T, nh, hd, rs, randn(n, "x", 0, 1), zeros(n), cs, randn(n, "R", 0, 1)};

  /* forward against "rotate half" written out; position 0 is the identity */
  rope_loss(&c);
  for (int r = 0; r < N; r++)
    for (int h = 0; h < rs / hd; h++)
      for (int i = 0; i < half; i++) {
        int a = r * rs + h * hd + i, b = a + half, t = r % T;
        double co = cs[t * half + i], si = cs[T * half + t * half + i];
        double ea = h < nh ? c.x[a] * co - c.x[b] * si : c.x[a];
        double eb = h < nh ? c.x[b] * co + c.x[a] * si : c.x[b];
        assert_true(fabs(c.xs[a] - ea) <= FWD_TOL && fabs(c.xs[b] - eb) <= FWD_TOL);
        if (t == 0 || h >= nh) assert_true(c.xs[a] == c.x[a] && c.xs[b] == c.x[b]);
      }

  /* bwd is the transpose of fwd: <fwd(x), y> = <x, bwd(y)> */
  double *y = randn(n, "y", 0, 1), *by = dup(y, n);
  zt_cpu_f64_rope_bwd(by, cs, N, T, nh, hd, rs);
  double lhs = dot(c.xs, y, n), rhs = dot(c.x, by, n);
  expect_close("rope adjoint", fabs(lhs - rhs) / fabs(lhs), FWD_TOL);

  double *dx = dup(c.R, n);
  zt_cpu_f64_rope_bwd(dx, cs, N, T, nh, hd, rs);
  expect_close("rope dx", relerr(dx, numgrad(rope_loss, &c, c.x, n), n), FD_TOL);
}

/* ------------------------------------------------------------- attention */
/* The kernels work in tiles of 64 query rows and 256 keys (attn_impl.h), so
 * T = 64, 65, 130, 300 and 512 cover one tile, a partial query tile of one
 * row, several query tiles, a partial second key tile and several of each
 * (the online softmax rescaling when a row's max grows from one key tile
 * to the next). */
typedef struct { int B, T, H, KVH, hd; double *qkv, *R, *out, *lse; } attn_ctx;
static double attn_loss(void *p) {
  attn_ctx *c = p;
  zt_cpu_f64_attn_fwd(c->out, c->lse, c->qkv, c->B, c->T, c->H, c->KVH, c->hd);
  return dot(c->out, c->R, (size_t)c->B * c->T * c->H * c->hd);
}

/* Forward and lse against a naive full softmax: every query's scores
 * against all keys of its past (head h reads kv head h / (H / KVH)). */
static void check_attention_fwd(const attn_ctx *c) {
  int T = c->T, H = c->H, KVH = c->KVH, hd = c->hd, rs = (H + 2 * KVH) * hd, os = H * hd;
  double *s = zeros((size_t)T), err_o = 0, err_l = 0, max_o = 0, max_l = 0;
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        const double *q = c->qkv + (size_t)(b * T + i) * rs + h * hd;
        int kh = h / (H / KVH);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
          s[j] = dot(q, c->qkv + (size_t)(b * T + j) * rs + (H + kh) * hd, hd) / sqrt(hd);
          mx = fmax(mx, s[j]);
        }
        for (int j = 0; j <= i; j++) sum += (s[j] = exp(s[j] - mx));
        err_l = fmax(err_l, fabs(c->lse[((size_t)b * H + h) * T + i] - (mx + log(sum))));
        max_l = fmax(max_l, fabs(mx + log(sum)));
        for (int d = 0; d < hd; d++) {
          double o = 0;
          for (int j = 0; j <= i; j++)
            o += s[j] / sum * c->qkv[(size_t)(b * T + j) * rs + (H + KVH + kh) * hd + d];
          err_o = fmax(err_o, fabs(c->out[(size_t)(b * T + i) * os + h * hd + d] - o));
          max_o = fmax(max_o, fabs(o));
        }
      }
  expect_close("  out vs naive", err_o / fmax(1e-8, max_o), FWD_TOL);
  expect_close("  lse vs naive", err_l / fmax(1e-8, max_l), FWD_TOL);
}

/* Backward against central differences: at every element of columns
 * [c0, c1) of the qkv rows when `samples` is 0, else at `samples` random
 * ones plus each of the rows that end or start a tile. Relative to the
 * largest analytic gradient of those columns (the rows' scale: a sample
 * may miss the largest). */
static double attn_fd_err(attn_ctx *c, const double *an, int c0, int c1, int samples,
                          const char *stream) {
  int T = c->T, N = c->B * T, rs = (c->H + 2 * c->KVH) * c->hd, w = c1 - c0;
  if (!samples) return relerr_cols(an, numgrad(attn_loss, c, c->qkv, (size_t)N * rs), N, rs, c0, c1);
  int edge[] = {0, 63, 64, 255, 256, T - 1}, ne = sizeof edge / sizeof *edge;
  uint64_t key = zt_rng_key(42, stream);
  double d = 0, m = 0;
  for (int r = 0; r < N; r++)
    for (int k = c0; k < c1; k++) m = fmax(m, fabs(an[(size_t)r * rs + k]));
  for (int s = 0; s < samples + ne; s++) {
    int row = s < ne ? (edge[s] < T ? edge[s] : T - 1) + (int)zt_rng_below(key, 2 * s, c->B) * T
                     : (int)zt_rng_below(key, 2 * s, N);
    size_t i = (size_t)row * rs + c0 + (int)zt_rng_below(key, 2 * s + 1, w);
    d = fmax(d, fabs(an[i] - numgrad_at(attn_loss, c, c->qkv, i)));
  }
  return d / fmax(1e-8, m);
}

static void check_attention(int B, int T, int H, int KVH, int samples) {
  enum { hd = 8 };
  int rs = (H + 2 * KVH) * hd, os = H * hd, N = B * T;
  /* out and lse are written (=): they start as junk */
  attn_ctx c = {B, T, H, KVH, hd, randn((size_t)N * rs, "qkv", 0, 1),
                randn((size_t)N * os, "R", 0, 1), randn((size_t)N * os, "junk.out", 100, 1),
                randn((size_t)B * H * T, "junk.lse", -100, 1)};
  print_message("  H%d/KV%d B=%d T=%d (%s)\n", H, KVH, B, T,
                samples ? "sampled elements" : "every element");
  attn_loss(&c);
  check_attention_fwd(&c);

  /* dqkv is written (=): it starts as junk */
  double *dqkv = randn((size_t)N * rs, "garbage", 100, 1);
  zt_cpu_f64_attn_bwd(dqkv, c.R, c.qkv, c.out, c.lse, B, T, H, KVH, hd);
  const char *part[3] = {"  dq", "  dk", "  dv"};
  int col[4] = {0, H * hd, (H + KVH) * hd, rs};
  for (int k = 0; k < 3; k++)
    expect_close(part[k], attn_fd_err(&c, dqkv, col[k], col[k + 1], samples, part[k] + 2),
                 FD_TOL);
}

/* every element at T <= 4; beyond, 16 random ones per part and the tile
 * edges, two forward passes each, which keeps the whole test near 2 s */
static void check_attention_lengths(int H, int KVH, const int *Ts, int n) {
  for (int i = 0; i < n; i++) {
    check_attention(Ts[i] > 128 ? 1 : 2, Ts[i], H, KVH, Ts[i] <= 4 ? 0 : 16);
    free_pool(NULL); /* the cases' buffers, one case at a time */
  }
}
static const int attn_T[] = {1, 3, 4, 64, 65, 130, 300, 512};
static void test_attention_mha(void **state) {
  (void)state;
  check_attention_lengths(2, 2, attn_T, sizeof attn_T / sizeof *attn_T);
}
static void test_attention_gqa(void **state) {
  (void)state;
  check_attention_lengths(4, 2, attn_T, sizeof attn_T / sizeof *attn_T);
}
static void test_attention_mqa(void **state) {
  (void)state;
  int Ts[] = {4, 130};
  check_attention_lengths(4, 1, Ts, 2);
}

/* --------------------------------------------------------- cross-entropy */
/* P = 0: the fused kernel; P >= 1: the three vocab-parallel steps on P
 * column shards of V/P (in sh, shard s at sh + s*N*V/P, with its stats at
 * st + s*3N), combined as the model's all-reduces do. */
typedef struct { int N, V, P; int32_t *tgt; double *logits, *work, *loss, *sh, *st; } xent_ctx;

static void xent_shards(xent_ctx *c, double dscale) {
  int N = c->N, V = c->V, P = c->P, Vl = V / P;
  for (int s = 0; s < P; s++) /* columns [s*Vl, (s+1)*Vl) of each row */
    for (int n = 0; n < N; n++)
      memcpy(c->sh + ((size_t)s * N + n) * Vl, c->work + (size_t)n * V + s * Vl, Vl * sizeof(double));
  for (int s = 0; s < P; s++) zt_cpu_f64_xent_max(c->st + s * 3 * N, c->sh + (size_t)s * N * Vl, N, Vl);
  for (int n = 0; n < N; n++) { /* all-reduce max */
    double mx = c->st[n];
    for (int s = 1; s < P; s++) mx = fmax(mx, c->st[s * 3 * N + n]);
    for (int s = 0; s < P; s++) c->st[s * 3 * N + n] = mx;
  }
  for (int s = 0; s < P; s++)
    zt_cpu_f64_xent_sumexp(c->st + s * 3 * N, c->sh + (size_t)s * N * Vl, c->tgt, N, Vl, s * Vl);
  for (int i = N; i < 3 * N; i++) { /* all-reduce sum */
    double sum = 0;
    for (int s = 0; s < P; s++) sum += c->st[s * 3 * N + i];
    for (int s = 0; s < P; s++) c->st[s * 3 * N + i] = sum;
  }
  for (int s = 0; s < P; s++) {
    double *loss = s ? c->st + s * 3 * N : c->loss; /* stats are spent: reuse */
    zt_cpu_f64_xent_finish(c->sh + (size_t)s * N * Vl, loss, c->st + s * 3 * N, c->tgt,
                           N, Vl, s * Vl, dscale);
    for (int n = 0; n < N; n++) assert_true(loss[n] == c->loss[n]); /* same on every shard */
  }
  for (int s = 0; s < P; s++)
    for (int n = 0; n < N; n++)
      memcpy(c->work + (size_t)n * V + s * Vl, c->sh + ((size_t)s * N + n) * Vl, Vl * sizeof(double));
}

static double xent_sum(void *p) {
  xent_ctx *c = p;
  memcpy(c->work, c->logits, sizeof(double) * c->N * c->V);
  if (c->P) xent_shards(c, 1);
  else zt_cpu_f64_xent_fwd_bwd(c->work, c->loss, c->tgt, c->N, c->V, 1);
  double s = 0;
  for (int n = 0; n < c->N; n++) s += c->loss[n];
  return s;
}

static void test_xent(void **state) {
  (void)state;
  enum { N = 6, V = 7 };
  xent_ctx c = {N, V, 0, keep(calloc(N, sizeof(int32_t))), randn(N * V, "logits", 0, 2),
                zeros(N * V), zeros(N), NULL, NULL};
  uint64_t key = zt_rng_key(42, "targets");
  for (int n = 0; n < N; n++) c.tgt[n] = (int32_t)zt_rng_below(key, n, V);
  xent_sum(&c);
  for (int n = 0; n < N; n++) {
    double s = 0;
    for (int v = 0; v < V; v++) s += exp(c.logits[n * V + v]);
    assert_true(fabs(c.loss[n] - (log(s) - c.logits[n * V + c.tgt[n]])) <= FWD_TOL);
  }
  double *dl = dup(c.work, N * V);
  expect_close("xent dlogits", relerr(dl, numgrad(xent_sum, &c, c.logits, N * V), N * V), FD_TOL);

  /* dscale scales the gradient only; a shift of +1000 (exp overflows without
   * the max subtraction) changes neither loss nor gradient */
  xent_sum(&c); /* numgrad left the buffers at a perturbed point */
  double *loss1 = dup(c.loss, N), *w = dup(c.logits, N * V);
  for (int i = 0; i < N * V; i++) w[i] += 1000;
  zt_cpu_f64_xent_fwd_bwd(w, c.loss, c.tgt, N, V, 0.25);
  for (int n = 0; n < N; n++) assert_true(fabs(c.loss[n] - loss1[n]) <= 1e-9);
  for (int i = 0; i < N * V; i++) assert_true(fabs(w[i] - 0.25 * dl[i]) <= 1e-12);
}

static void test_xent_vocab_parallel(void **state) {
  (void)state;
  enum { N = 6, V = 12 };
  xent_ctx w = {N, V, 0, keep(calloc(N, sizeof(int32_t))), randn(N * V, "logits", 0, 2),
                zeros(N * V), zeros(N), zeros(N * V), zeros(4 * 3 * N)};
  for (int n = 0; n < N; n++) w.tgt[n] = (int32_t)((n * 5 + 1) % V); /* in every shard */
  xent_sum(&w);
  double *loss = dup(w.loss, N), *dl = dup(w.work, N * V);
  for (int P = 1; P <= 4; P++) {
    xent_ctx c = w;
    c.P = P;
    c.loss = zeros(N);
    c.work = zeros(N * V);
    xent_sum(&c);
    char what[48];
    snprintf(what, sizeof what, "xent %d shards: loss", P);
    expect_close(what, relerr(c.loss, loss, N), FWD_TOL);
    snprintf(what, sizeof what, "xent %d shards: dlogits", P);
    expect_close(what, relerr(c.work, dl, N * V), FWD_TOL);
    if (P == 3) {
      double *an = dup(c.work, N * V);
      expect_close("xent 3 shards: dlogits FD", relerr(an, numgrad(xent_sum, &c, c.logits, N * V), N * V), FD_TOL);
    }
  }
}

/* ------------------------------------------------------- gemm and linear */
static void test_gemm_transposes(void **state) {
  (void)state;
  enum { m = 3, n = 5, k = 4, pad = 2 };
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      /* stored shapes: A is [m,k] or [k,m]; B is [k,n] or [n,k]; padded rows
       * check that lda/ldb/ldc are honoured */
      int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      int lda = ac + pad, ldb = bc + pad, ldc = n + pad;
      double *a = randn(ar * lda, "A", 0, 1), *b = randn(br * ldb, "B", 0, 1);
      double *c = randn(m * ldc, "C", 0, 1), *c0 = dup(c, m * ldc);
      zt_cpu_f64_gemm(ta, tb, m, n, k, 0.7, a, lda, b, ldb, 0.3, c, ldc);
      for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
          double s = 0;
          for (int p = 0; p < k; p++)
            s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
          assert_true(fabs(c[i * ldc + j] - (0.7 * s + 0.3 * c0[i * ldc + j])) <= FWD_TOL);
        }
        for (int j = n; j < ldc; j++) assert_true(c[i * ldc + j] == c0[i * ldc + j]);
      }
    }
}

/* The model's linear layer: y = x W^T (W is [out, in]), dW += dy^T x,
 * dx = dy W, each one gemm call with the transposes model.c uses. */
typedef struct { int N, I, O; double *x, *W, *R, *y; } lin_ctx;
static double lin_loss(void *p) {
  lin_ctx *c = p;
  zt_cpu_f64_gemm(0, 1, c->N, c->O, c->I, 1, c->x, c->I, c->W, c->I, 0, c->y, c->O);
  return dot(c->y, c->R, (size_t)c->N * c->O);
}

static void test_linear(void **state) {
  (void)state;
  enum { N = 6, I = 8, O = 5 };
  lin_ctx c = {N, I, O, randn(N * I, "x", 0, 1), randn(O * I, "W", 0, 1),
               randn(N * O, "R", 0, 1), zeros(N * O)};
  double *dW = zeros(O * I), *dx = zeros(N * I);
  zt_cpu_f64_gemm(1, 0, O, I, N, 1, c.R, O, c.x, I, 1, dW, I);
  zt_cpu_f64_gemm(0, 0, N, I, O, 1, c.R, O, c.W, I, 0, dx, I);
  expect_close("linear dx", relerr(dx, numgrad(lin_loss, &c, c.x, N * I), N * I), FD_TOL);
  expect_close("linear dW", relerr(dW, numgrad(lin_loss, &c, c.W, O * I), O * I), FD_TOL);
}

/* ------------------------------------------------------- adamw and misc */
static void test_adamw(void **state) {
  (void)state;
  enum { n = 16 };
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  double *p = randn(n, "p", 0, 1), *m = zeros(n), *v = zeros(n);
  double *rp = dup(p, n), *rm = zeros(n), *rv = zeros(n), *p0 = dup(p, n);
  for (int t = 1; t <= 3; t++) {
    char name[16];
    snprintf(name, sizeof name, "g%d", t);
    double *g = randn(n, name, 0, 1);
    /* the coefficients as optim.c builds them: in double, rounded to float */
    zt_adamw_args a = {.decay = (float)(1 - lr * wd), .b1 = (float)b1,
                       .c1 = (float)(1 - b1), .b2 = (float)b2, .c2 = (float)(1 - b2),
                       .eps = (float)eps, .step = (float)(lr / (1 - pow(b1, t))),
                       .bc2_sqrt = (float)sqrt(1 - pow(b2, t)),
                       .gscale = t == 3 ? 0.37f : 1}; /* step 3: clipped */
    zt_cpu_f64_adamw(p, g, m, v, n, &a);
    /* clip_grad_norm_ then torch.optim.AdamW, single-tensor path, with
     * those coefficients */
    for (int i = 0; i < n; i++) {
      double gi = g[i] * a.gscale;
      rp[i] *= a.decay;
      rm[i] = a.b1 * rm[i] + a.c1 * gi;
      rv[i] = a.b2 * rv[i] + a.c2 * gi * gi;
      rp[i] -= a.step * rm[i] / (sqrt(rv[i]) / a.bc2_sqrt + a.eps);
    }
    expect_close("adamw p", relerr(p, rp, n), 1e-14);
    expect_close("adamw m", relerr(m, rm, n), 1e-14);
    expect_close("adamw v", relerr(v, rv, n), 1e-14);
    /* Adam's first step moves every weight by lr against its gradient's
     * sign, independently of the gradient's size (up to eps / |g|) */
    if (t == 1)
      for (int i = 0; i < n; i++)
        assert_true(fabs(p[i] - (p0[i] * a.decay - lr * copysign(1, g[i]))) <= 1e-5 * lr);
  }
}

static void test_add_scale_sumsq(void **state) {
  (void)state;
  enum { n = 37 };
  double *x = randn(n, "x", 0, 1), *y = randn(n, "y", 0, 1), *y0 = dup(y, n);
  zt_cpu_f64_add(y, x, n);
  zt_cpu_f64_scale(y, -0.5, n);
  double ss = 0;
  for (int i = 0; i < n; i++) {
    assert_true(fabs(y[i] - -0.5 * (y0[i] + x[i])) <= FWD_TOL);
    ss += x[i] * x[i];
  }
  assert_true(fabs(zt_cpu_f64_sumsq(x, n) - ss) <= FWD_TOL * ss);
}

int main(void) {
#define T_(f) cmocka_unit_test_teardown(f, free_pool)
  const struct CMUnitTest tests[] = {
      T_(test_embed),          T_(test_embed_vocab_parallel),
      T_(test_layernorm),      T_(test_rmsnorm),
      T_(test_bias),           T_(test_gelu),             T_(test_swiglu),
      T_(test_rope),           T_(test_attention_mha),    T_(test_attention_gqa),
      T_(test_attention_mqa),  T_(test_xent),             T_(test_xent_vocab_parallel),
      T_(test_gemm_transposes),
      T_(test_linear),         T_(test_adamw),            T_(test_add_scale_sumsq),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
