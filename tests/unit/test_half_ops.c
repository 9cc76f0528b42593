/* test_half_ops: the 16-bit storage builds (zt_cpu_bf16_*, zt_cpu_f16_*)
 * against the float build on the same values. Inputs are random values
 * already rounded to the 16-bit format, so both builds see the very same
 * numbers; the 16-bit build computes in float like the float build and
 * rounds once where it writes, so each of its 16-bit outputs must be the
 * float build's output rounded once, bit for bit, and each real output
 * (norm statistics, lse, losses, cross-entropy stats, parameter gradients,
 * AdamW's state) the float build's exactly. Accumulated outputs start from
 * random contents: an input gradient (+=) is widened, added in float and
 * rounded once, a parameter gradient is added to in float.
 *
 * One case is not bitwise, by design: a 16-bit model feeds attention's
 * backward the forward's output rounded to 16 bits where the float model
 * keeps it in float. test_attention_chain runs each build on its own
 * forward and checks the difference against a bound derived from that one
 * rounding. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "kernels/cpu/f16_simd.h"
#include "kernels/cpu/ops.h"
#include "src/core/half.h"
#include "src/core/rng.h"
#include "tests/unit/pool.h"

/* ops_impl.h again, the bf16 build's definitions, with a small GEMM
 * scratch budget: see test_gemm_blocks. */
#include "kernels/cpu/ops_bf16.h"
#define FN(name) tiny_bf16_##name
#define GEMM16_SCRATCH ((size_t)1 << 16)
#include "kernels/cpu/ops_impl.h"

/* One 16-bit build: its rounding, its unit roundoff u (half an ulp,
 * relative: 2^-8 for bf16's 8 significant bits, 2^-11 for fp16's 11), the
 * smallest fp16 subnormal's half (absolute error below fp16's normals) and
 * its ops. */
typedef struct {
  const char *name;
  uint16_t (*from)(float);
  float (*to)(uint16_t);
  double u, tiny;
  void (*gemm)(int, int, int, int, int, float, const uint16_t *, int, const uint16_t *, int,
               float, uint16_t *, int);
  void (*gemm_acc)(int, int, int, int, int, float, const uint16_t *, int, const uint16_t *, int,
                   float, float *, int);
  void (*embed_fwd)(uint16_t *, const int32_t *, const uint16_t *, const uint16_t *, int, int,
                    int, int, int);
  void (*embed_bwd)(float *, float *, const int32_t *, const uint16_t *, int, int, int, int, int);
  void (*layernorm_fwd)(uint16_t *, float *, float *, const uint16_t *, const uint16_t *,
                        const uint16_t *, int, int, float);
  void (*layernorm_bwd)(uint16_t *, float *, float *, const uint16_t *, const uint16_t *,
                        const uint16_t *, const float *, const float *, int, int);
  void (*rmsnorm_fwd)(uint16_t *, float *, const uint16_t *, const uint16_t *, int, int, float);
  void (*rmsnorm_bwd)(uint16_t *, float *, const uint16_t *, const uint16_t *, const uint16_t *,
                      const float *, int, int);
  void (*bias_fwd)(uint16_t *, const uint16_t *, int, int);
  void (*bias_bwd)(float *, const uint16_t *, int, int);
  void (*gelu_fwd)(uint16_t *, const uint16_t *, size_t);
  void (*gelu_bwd)(uint16_t *, const uint16_t *, const uint16_t *, size_t);
  void (*swiglu_fwd)(uint16_t *, const uint16_t *, int, int);
  void (*swiglu_bwd)(uint16_t *, const uint16_t *, const uint16_t *, int, int);
  void (*rope_fwd)(uint16_t *, const float *, int, int, int, int, int);
  void (*rope_bwd)(uint16_t *, const float *, int, int, int, int, int);
  void (*attn_fwd)(uint16_t *, float *, const uint16_t *, int, int, int, int, int);
  void (*attn_bwd)(uint16_t *, const uint16_t *, const uint16_t *, const uint16_t *,
                   const float *, int, int, int, int, int);
  void (*xent_fwd_bwd)(uint16_t *, float *, const int32_t *, int, int, float);
  void (*xent_max)(float *, const uint16_t *, int, int);
  void (*xent_sumexp)(float *, const uint16_t *, const int32_t *, int, int, int);
  void (*xent_finish)(uint16_t *, float *, const float *, const int32_t *, int, int, int, float);
  void (*add)(uint16_t *, const uint16_t *, size_t);
  double (*sumsq)(const float *, size_t);
  size_t (*adamw_p16)(float *, const float *, float *, float *, size_t, const zt_adamw_args *,
                      uint16_t *);
} fmt16;

#define FMT16(P, NAME, FROM, TO, U, TINY)                                                   \
  {NAME, FROM, TO, U, TINY, P##gemm, P##gemm_acc, P##embed_fwd, P##embed_bwd,              \
   P##layernorm_fwd, P##layernorm_bwd, P##rmsnorm_fwd, P##rmsnorm_bwd, P##bias_fwd,        \
   P##bias_bwd, P##gelu_fwd, P##gelu_bwd, P##swiglu_fwd, P##swiglu_bwd, P##rope_fwd,       \
   P##rope_bwd, P##attn_fwd, P##attn_bwd, P##xent_fwd_bwd, P##xent_max, P##xent_sumexp,   \
   P##xent_finish, P##add, P##sumsq, P##adamw_p16}

static const fmt16 BF16 = FMT16(zt_cpu_bf16_, "bf16", zt_bf16_from_f32, zt_bf16_to_f32,
                                0x1p-8, 0);
static const fmt16 F16 = FMT16(zt_cpu_f16_, "fp16", zt_f16_from_f32, zt_f16_to_f32, 0x1p-11,
                               0x1p-25);

/* The same n values twice: h in the 16-bit format, f widened to float. */
typedef struct { uint16_t *h; float *f; size_t n; } hv;

static hv hzeros(size_t n) {
  return (hv){keep(calloc(n ? n : 1, 2)), keep(calloc(n ? n : 1, 4)), n};
}
/* mean + sd * N(0,1) from a named stream, rounded to the format */
static hv hrand(const fmt16 *F, size_t n, const char *stream, double mean, double sd) {
  hv x = hzeros(n);
  zt_rng_normal_fill(zt_rng_key(11, stream), 0, (int64_t)n, (float)sd, x.f);
  for (size_t i = 0; i < n; i++) {
    x.h[i] = F->from((float)(mean + x.f[i]));
    x.f[i] = F->to(x.h[i]);
  }
  return x;
}
static hv hdup(hv x) {
  hv y = hzeros(x.n);
  memcpy(y.h, x.h, x.n * 2);
  memcpy(y.f, x.f, x.n * 4);
  return y;
}
static float *fzeros(size_t n) { return keep(calloc(n ? n : 1, sizeof(float))); }
static float *frand(size_t n, const char *stream, double sd) {
  float *x = fzeros(n);
  zt_rng_normal_fill(zt_rng_key(11, stream), 0, (int64_t)n, (float)sd, x);
  return x;
}
static float *fdup(const float *x, size_t n) { return memcpy(fzeros(n), x, n * sizeof(float)); }

/* The 16-bit output h against the float build's output ref: h must be ref
 * rounded once, bit for bit. Checks that the values are not all zero, so
 * that a kernel that wrote nothing fails. */
static void expect_rounded(const fmt16 *F, const char *what, const uint16_t *h, const float *ref,
                           size_t n) {
  size_t bad = 0, first = n, nonzero = 0;
  for (size_t i = 0; i < n; i++) {
    if (h[i] != F->from(ref[i]) && !bad++) first = i;
    nonzero += ref[i] != 0;
  }
  print_message("  %s %-34s %zu values, %zu not the float result rounded once\n", F->name, what,
                n, bad);
  if (bad)
    print_message("    first at %zu: 0x%04x (%.9g), float %.9g rounds to 0x%04x\n", first, h[first],
                  (double)F->to(h[first]), (double)ref[first], F->from(ref[first]));
  assert_int_equal(bad, 0);
  assert_true(nonzero > 0);
}

/* Real outputs: the float build's bits exactly. */
static void expect_same(const fmt16 *F, const char *what, const float *a, const float *ref,
                        size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp(a + i, ref + i, sizeof(float)) != 0;
  print_message("  %s %-34s %zu values, %zu differ from the float build\n", F->name, what, n, bad);
  assert_int_equal(bad, 0);
}

static const fmt16 *fmt(void **state) { return *state; }

/* ------------------------------------------------------------------ gemm */
/* All four transposes, strides larger than the widths, alpha and beta
 * other than 1 and 0; beta = 0 over a C holding NaN (BLAS ignores C then);
 * gemm_acc adding into a real C. */
static void test_gemm(void **state) {
  const fmt16 *F = fmt(state);
  enum { m = 37, n = 29, k = 45, pad = 3 };
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      int lda = ac + pad, ldb = bc + pad, ldc = n + pad;
      hv a = hrand(F, (size_t)ar * lda, "gemm.a", 0, 1), b = hrand(F, (size_t)br * ldb, "gemm.b", 0, 1);
      hv c = hrand(F, (size_t)m * ldc, "gemm.c", 0, 1);
      char what[48];
      snprintf(what, sizeof what, "gemm(%c,%c) beta 0.3", ta ? 'T' : 'N', tb ? 'T' : 'N');
      F->gemm(ta, tb, m, n, k, 0.7f, a.h, lda, b.h, ldb, 0.3f, c.h, ldc);
      zt_cpu_f32_gemm(ta, tb, m, n, k, 0.7f, a.f, lda, b.f, ldb, 0.3f, c.f, ldc);
      expect_rounded(F, what, c.h, c.f, c.n); /* the pads too: left as they were */

      hv z = hzeros((size_t)m * ldc);
      for (size_t i = 0; i < z.n; i++) z.h[i] = 0x7fff, z.f[i] = NAN;
      F->gemm(ta, tb, m, n, k, 1, a.h, lda, b.h, ldb, 0, z.h, ldc);
      zt_cpu_f32_gemm(ta, tb, m, n, k, 1, a.f, lda, b.f, ldb, 0, z.f, ldc);
      for (int i = 0; i < m; i++) /* the pads keep their NaN, which rounds as NaN */
        for (int j = n; j < ldc; j++) assert_true(z.h[(size_t)i * ldc + j] == 0x7fff);
      for (int i = 0; i < m; i++)
        for (int j = n; j < ldc; j++) z.f[(size_t)i * ldc + j] = F->to(0x7fff);
      snprintf(what, sizeof what, "gemm(%c,%c) beta 0 over NaN", ta ? 'T' : 'N', tb ? 'T' : 'N');
      expect_rounded(F, what, z.h, z.f, z.n);

      float *acc = frand((size_t)m * ldc, "gemm.acc", 1), *ref = fdup(acc, (size_t)m * ldc);
      F->gemm_acc(ta, tb, m, n, k, 1, a.h, lda, b.h, ldb, 1, acc, ldc);
      zt_cpu_f32_gemm(ta, tb, m, n, k, 1, a.f, lda, b.f, ldb, 1, ref, ldc);
      snprintf(what, sizeof what, "gemm_acc(%c,%c) +=", ta ? 'T' : 'N', tb ? 'T' : 'N');
      expect_same(F, what, acc, ref, (size_t)m * ldc);
    }
  /* k = 0: whatever the float GEMM makes of C (OpenBLAS: beta C; oneDNN
   * leaves it) */
  hv c = hrand(F, (size_t)m * n, "gemm.c", 0, 1);
  F->gemm(0, 0, m, n, 0, 1, c.h, 1, c.h, n, 0.5f, c.h, n);
  zt_cpu_f32_gemm(0, 0, m, n, 0, 1, c.f, 1, c.f, n, 0.5f, c.f, n);
  expect_rounded(F, "gemm k = 0, beta 0.5", c.h, c.f, c.n);
}

/* Shapes past the 16-bit GEMM's scratch budget, which it cuts into blocks
 * (ops_impl.h): this file instantiates ops_impl.h once more, in bf16, with
 * a budget of 64K reals instead of 32M, so that small shapes take each way
 * (the blocking does not depend on the format). A block's float GEMM may
 * group its sums otherwise than the whole's, so the result is held to
 * float accumulation's bound instead of bitwise: every sum, however
 * grouped, within γ_{k+2} (Σ_p |α a_ip b_pj| + |β c_ij|) of the exact one
 * (γ_j = j 2^-24 / (1 - j 2^-24)), so E = twice that apart, and a 16-bit C
 * rounded once more: u (|ref| + E). */
static void test_gemm_blocks(void **state) {
  (void)state;
  const fmt16 *F = &BF16;
  struct { int m, n, k; const char *way; } cs[] = {
      {40, 2000, 100, "A whole, 6 column blocks (gemm_acc 4)"},
      {2000, 40, 100, "B whole, 6 row blocks (gemm_acc 4)"},
      {150, 120, 1000, "8 k blocks (gemm_acc 6)"},
      {300, 200, 1000, "3 row x 16 k blocks (gemm_acc 8 k)"},
  };
  for (size_t q = 0; q < sizeof cs / sizeof *cs; q++)
    for (int t = 0; t < 4; t++) {
      int m = cs[q].m, n = cs[q].n, k = cs[q].k, ta = t >> 1, tb = t & 1, pad = 3;
      int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      int lda = ac + pad, ldb = bc + pad, ldc = n + pad;
      hv a = hrand(F, (size_t)ar * lda, "blocks.a", 0, 1), b = hrand(F, (size_t)br * ldb, "blocks.b", 0, 1);
      hv c = hrand(F, (size_t)m * ldc, "blocks.c", 0, 1);
      float *acc = fdup(c.f, c.n), *ref = fdup(c.f, c.n);
      tiny_bf16_gemm(ta, tb, m, n, k, 0.7f, a.h, lda, b.h, ldb, 0.3f, c.h, ldc);
      tiny_bf16_gemm_acc(ta, tb, m, n, k, 0.7f, a.h, lda, b.h, ldb, 0.3f, acc, ldc);
      zt_cpu_f32_gemm(ta, tb, m, n, k, 0.7f, a.f, lda, b.f, ldb, 0.3f, ref, ldc);
      double g = (k + 2) * 0x1p-24 / (1 - (k + 2) * 0x1p-24), worst16 = 0, worst32 = 0;
      size_t moved = 0;
      for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
          size_t x = (size_t)i * ldc + j;
          if (j >= n) { /* the pads: untouched */
            assert_true(c.h[x] == F->from(c.f[x]) && acc[x] == c.f[x]);
            continue;
          }
          double mag = 0.3 * fabs(c.f[x]);
          for (int p = 0; p < k; p++)
            mag += 0.7 * fabs((double)a.f[ta ? (size_t)p * lda + i : (size_t)i * lda + p] *
                              b.f[tb ? (size_t)j * ldb + p : (size_t)p * ldb + j]);
          double E = 2 * g * mag, r = ref[x];
          worst32 = fmax(worst32, fabs(acc[x] - r) / E);
          worst16 = fmax(worst16, fabs(F->to(c.h[x]) - r) / (E + F->u * (fabs(r) + E)));
          moved += acc[x] != ref[x];
        }
      print_message("  bf16 gemm(%c,%c) %dx%dx%d, %s: %.3f of the bound (16-bit C), %.3f "
                    "(gemm_acc, %zu not the float build's bits)\n", ta ? 'T' : 'N',
                    tb ? 'T' : 'N', m, n, k, cs[q].way, worst16, worst32, moved);
      assert_true(worst16 <= 1 && worst32 <= 1);
      free_pool(NULL);
    }
}

/* ---------------------------------------------------------- gemm scratch */
/* What the backend says a 16-bit GEMM keeps (zt_backend.gemm_scratch, from
 * which a run reports scratch_bytes) against what the GEMM holds once it
 * ran. Each case runs on a thread of its own, whose scratch starts empty
 * (the scratch is the calling thread's); a thread that runs several GEMMs
 * holds the largest one's. The small-budget build takes every way of
 * cutting a GEMM (test_gemm_blocks' shapes); the backend's own builds a
 * GEMM that fits and, in bf16, one past its 128 MiB budget (a head-like
 * B of 40000 x 1000, cut into column blocks). */
typedef struct {
  int tiny;  /* the small-budget bf16 build, else the backend in dtype t */
  zt_dtype t;
  int n;
  int shape[4][4]; /* m, n, k, c16 (0: gemm_acc into fp32) */
  size_t said, held;
} scratch_case;

static int scratch_run(void *arg) {
  scratch_case *c = arg;
  const zt_backend *be = zt_backend_cpu();
  for (int i = 0; i < c->n; i++) {
    int m = c->shape[i][0], n = c->shape[i][1], k = c->shape[i][2], c16 = c->shape[i][3];
    zt_dtype tc = c16 ? c->t : ZT_F32;
    /* zeros of 4 bytes each: enough for any dtype, and values do not matter */
    void *a = calloc((size_t)m * k, 4), *b = calloc((size_t)k * n, 4), *cc = calloc((size_t)m * n, 4);
    if (!a || !b || !cc) abort();
    size_t said;
    if (c->tiny) {
      if (c16) tiny_bf16_gemm(0, 0, m, n, k, 1, a, k, b, n, 0, cc, n);
      else tiny_bf16_gemm_acc(0, 0, m, n, k, 1, a, k, b, n, 0, cc, n);
      said = tiny_bf16_gemm_scratch_bytes(m, n, k, c16);
    } else {
      be->gemm(NULL, c->t, tc, 0, 0, m, n, k, 1, a, k, b, n, 0, cc, n);
      said = be->gemm_scratch(c->t, tc, m, n, k);
    }
    c->said = said > c->said ? said : c->said;
    free(a), free(b), free(cc);
  }
  c->held = c->tiny            ? tiny_bf16_gemm_scratch_held()
            : c->t == ZT_BF16 ? zt_cpu_bf16_gemm_scratch_held()
            : c->t == ZT_F16  ? zt_cpu_f16_gemm_scratch_held()
                              : zt_cpu_f32_gemm_scratch_held();
  return 0;
}

static void test_gemm_scratch(void **state) {
  (void)state;
  scratch_case cs[] = {
      {1, ZT_BF16, 1, {{37, 29, 45, 1}}, 0, 0},
      {1, ZT_BF16, 1, {{37, 29, 45, 0}}, 0, 0},
      {1, ZT_BF16, 1, {{40, 2000, 100, 1}}, 0, 0},
      {1, ZT_BF16, 1, {{2000, 40, 100, 0}}, 0, 0},
      {1, ZT_BF16, 1, {{150, 120, 1000, 1}}, 0, 0},
      {1, ZT_BF16, 1, {{300, 200, 1000, 1}}, 0, 0},
      {1, ZT_BF16, 3, {{37, 29, 45, 1}, {300, 200, 1000, 0}, {40, 2000, 100, 1}}, 0, 0},
      {0, ZT_BF16, 2, {{37, 29, 45, 1}, {64, 48, 80, 0}}, 0, 0},
      {0, ZT_F16, 2, {{64, 48, 80, 0}, {37, 29, 45, 1}}, 0, 0},
      {0, ZT_F32, 1, {{37, 29, 45, 1}}, 0, 0},
      {0, ZT_BF16, 1, {{1, 40000, 1000, 1}}, 0, 0},
  };
  for (size_t q = 0; q < sizeof cs / sizeof *cs; q++) {
    scratch_case *c = &cs[q];
    thrd_t th;
    assert_int_equal(thrd_create(&th, scratch_run, c), thrd_success);
    assert_int_equal(thrd_join(th, NULL), thrd_success);
    print_message("  %s, %d GEMM(s), the last %dx%dx%d: %zu bytes said, %zu held\n",
                  c->tiny ? "bf16 (small budget)" : zt_dtype_name(c->t), c->n,
                  c->shape[c->n - 1][0], c->shape[c->n - 1][1], c->shape[c->n - 1][2], c->said,
                  c->held);
    assert_true(c->said == c->held);
    assert_true(c->t == ZT_F32 ? c->held == 0 : c->held > 0);
  }
  /* past the budget, the figure is the budget's 128 MiB and no more */
  assert_true(cs[10].held <= (size_t)128 << 20 && cs[10].held > (size_t)120 << 20);
}

/* ------------------------------------------------------------- embedding */
static void test_embed(void **state) {
  const fmt16 *F = fmt(state);
  enum { B = 2, T = 16, C = 40, V = 50, N = B * T };
  hv wte = hrand(F, V * C, "wte", 0, 1), wpe = hrand(F, T * C, "wpe", 0, 1);
  int32_t tok[N];
  uint64_t key = zt_rng_key(11, "tok");
  for (int i = 0; i < N; i++) tok[i] = (int32_t)zt_rng_below(key, (uint64_t)i, V);
  /* the whole table with positions, then a shard of rows [20, 45) without
   * them (tokens outside it give zero rows) */
  for (int s = 0; s < 2; s++) {
    int v0 = s ? 20 : 0, Vl = s ? 25 : V;
    hv out = hzeros(N * C);
    F->embed_fwd(out.h, tok, wte.h + (size_t)v0 * C, s ? NULL : wpe.h, B, T, C, v0, Vl);
    zt_cpu_f32_embed_fwd(out.f, tok, wte.f + (size_t)v0 * C, s ? NULL : wpe.f, B, T, C, v0, Vl);
    expect_rounded(F, s ? "embed_fwd shard, no wpe" : "embed_fwd", out.h, out.f, out.n);

    hv dout = hrand(F, N * C, "embed.dout", 0, 1);
    float *dwte = frand(V * C, "dwte", 1), *dwpe = frand(T * C, "dwpe", 1);
    float *rwte = fdup(dwte, V * C), *rwpe = fdup(dwpe, T * C);
    F->embed_bwd(dwte + (size_t)v0 * C, s ? NULL : dwpe, tok, dout.h, B, T, C, v0, Vl);
    zt_cpu_f32_embed_bwd(rwte + (size_t)v0 * C, s ? NULL : rwpe, tok, dout.f, B, T, C, v0, Vl);
    expect_same(F, "embed_bwd dwte +=", dwte, rwte, V * C);
    expect_same(F, "embed_bwd dwpe +=", dwpe, rwpe, T * C);
  }
}

/* ----------------------------------------------------------------- norms */
static void test_layernorm(void **state) {
  const fmt16 *F = fmt(state);
  enum { N = 48, C = 200 };
  hv x = hrand(F, N * C, "ln.x", 0.3, 1.5), w = hrand(F, C, "ln.w", 1, 0.5);
  hv b = hrand(F, C, "ln.b", 0, 0.5), out = hzeros(N * C);
  float *mean = fzeros(N), *rstd = fzeros(N), *rmean = fzeros(N), *rrstd = fzeros(N);
  F->layernorm_fwd(out.h, mean, rstd, x.h, w.h, b.h, N, C, 1e-5f);
  zt_cpu_f32_layernorm_fwd(out.f, rmean, rrstd, x.f, w.f, b.f, N, C, 1e-5f);
  expect_rounded(F, "layernorm out", out.h, out.f, out.n);
  expect_same(F, "layernorm mean", mean, rmean, N);
  expect_same(F, "layernorm rstd", rstd, rrstd, N);

  hv dout = hrand(F, N * C, "ln.dout", 0, 1), dx = hrand(F, N * C, "ln.dx", 0, 1);
  float *dw = frand(C, "ln.dw", 1), *db = frand(C, "ln.db", 1);
  float *rdw = fdup(dw, C), *rdb = fdup(db, C);
  F->layernorm_bwd(dx.h, dw, db, dout.h, x.h, w.h, mean, rstd, N, C);
  zt_cpu_f32_layernorm_bwd(dx.f, rdw, rdb, dout.f, x.f, w.f, rmean, rrstd, N, C);
  expect_rounded(F, "layernorm dx +=", dx.h, dx.f, dx.n);
  expect_same(F, "layernorm dw +=", dw, rdw, C);
  expect_same(F, "layernorm db +=", db, rdb, C);
}

static void test_rmsnorm(void **state) {
  const fmt16 *F = fmt(state);
  enum { N = 48, C = 200 };
  hv x = hrand(F, N * C, "rms.x", 0.3, 1.5), w = hrand(F, C, "rms.w", 1, 0.5), out = hzeros(N * C);
  float *rstd = fzeros(N), *rrstd = fzeros(N);
  F->rmsnorm_fwd(out.h, rstd, x.h, w.h, N, C, 1e-5f);
  zt_cpu_f32_rmsnorm_fwd(out.f, rrstd, x.f, w.f, N, C, 1e-5f);
  expect_rounded(F, "rmsnorm out", out.h, out.f, out.n);
  expect_same(F, "rmsnorm rstd", rstd, rrstd, N);

  hv dout = hrand(F, N * C, "rms.dout", 0, 1), dx = hrand(F, N * C, "rms.dx", 0, 1);
  float *dw = frand(C, "rms.dw", 1), *rdw = fdup(dw, C);
  F->rmsnorm_bwd(dx.h, dw, dout.h, x.h, w.h, rstd, N, C);
  zt_cpu_f32_rmsnorm_bwd(dx.f, rdw, dout.f, x.f, w.f, rrstd, N, C);
  expect_rounded(F, "rmsnorm dx +=", dx.h, dx.f, dx.n);
  expect_same(F, "rmsnorm dw +=", dw, rdw, C);
}

/* ----------------------------------------- bias, gelu, swiglu, rope, add */
static void test_elementwise(void **state) {
  const fmt16 *F = fmt(state);
  enum { N = 40, C = 96, n = N * C };
  hv y = hrand(F, n, "bias.y", 0, 1), b = hrand(F, C, "bias.b", 0, 1);
  F->bias_fwd(y.h, b.h, N, C);
  zt_cpu_f32_bias_fwd(y.f, b.f, N, C);
  expect_rounded(F, "bias_fwd y +=", y.h, y.f, n);
  for (int i = 0; i < n; i++) y.f[i] = F->to(y.h[i]); /* the same dy for both */
  float *db = frand(C, "bias.db", 1), *rdb = fdup(db, C);
  F->bias_bwd(db, y.h, N, C);
  zt_cpu_f32_bias_bwd(rdb, y.f, N, C);
  expect_same(F, "bias_bwd db +=", db, rdb, C);

  /* sd 3 reaches GELU's tails and its curved middle */
  hv x = hrand(F, n, "gelu.x", 0, 3), dy = hrand(F, n, "gelu.dy", 0, 1);
  hv g = hzeros(n), dx = hrand(F, n, "gelu.stale", 0, 1); /* dx is written (=) */
  F->gelu_fwd(g.h, x.h, n);
  zt_cpu_f32_gelu_fwd(g.f, x.f, n);
  expect_rounded(F, "gelu_fwd", g.h, g.f, n);
  F->gelu_bwd(dx.h, x.h, dy.h, n);
  zt_cpu_f32_gelu_bwd(dx.f, x.f, dy.f, n);
  expect_rounded(F, "gelu_bwd dx =", dx.h, dx.f, n);

  hv gu = hrand(F, 2 * n, "swiglu.gu", 0, 4), dh = hrand(F, n, "swiglu.dh", 0, 1);
  hv h = hzeros(n), dgu = hrand(F, 2 * n, "swiglu.stale", 0, 1);
  F->swiglu_fwd(h.h, gu.h, N, C);
  zt_cpu_f32_swiglu_fwd(h.f, gu.f, N, C);
  expect_rounded(F, "swiglu_fwd", h.h, h.f, n);
  F->swiglu_bwd(dgu.h, gu.h, dh.h, N, C);
  zt_cpu_f32_swiglu_bwd(dgu.f, gu.f, dh.f, N, C);
  expect_rounded(F, "swiglu_bwd dgu =", dgu.h, dgu.f, 2 * (size_t)n);

  hv s = hrand(F, n, "add.x", 0, 1), t = hrand(F, n, "add.y", 0, 1);
  F->add(t.h, s.h, n);
  zt_cpu_f32_add(t.f, s.f, n);
  expect_rounded(F, "add y +=", t.h, t.f, n);
}

static void test_rope(void **state) {
  const fmt16 *F = fmt(state);
  /* rows of qkv: q and k heads rotated (nh = 3 of 4), v passed through */
  enum { B = 2, T = 12, hd = 16, half = hd / 2, nh = 3, rs = 4 * hd, N = B * T, n = N * rs };
  float *cs = fzeros(T * hd); /* the tables stay float */
  for (int p = 0; p < T; p++)
    for (int i = 0; i < half; i++) {
      double fr = pow(10000.0, -2.0 * i / hd);
      cs[p * half + i] = (float)cos(p * fr);
      cs[T * half + p * half + i] = (float)sin(p * fr);
    }
  hv x = hrand(F, n, "rope.x", 0, 1);
  F->rope_fwd(x.h, cs, N, T, nh, hd, rs);
  zt_cpu_f32_rope_fwd(x.f, cs, N, T, nh, hd, rs);
  expect_rounded(F, "rope_fwd", x.h, x.f, n);
  hv dx = hrand(F, n, "rope.dx", 0, 1);
  F->rope_bwd(dx.h, cs, N, T, nh, hd, rs);
  zt_cpu_f32_rope_bwd(dx.f, cs, N, T, nh, hd, rs);
  expect_rounded(F, "rope_bwd", dx.h, dx.f, n);
}

/* ------------------------------------------------------------- attention */
/* T = 300: several query tiles, a partial one, and two key tiles (the
 * online softmax's rescaling) at 64 x 256 tiles; grouped-query (4 heads on
 * 2 kv heads). sd 2 gives scores of a few units: a wide softmax. */
enum { AB = 2, AT = 300, AH = 4, AKVH = 2, AHD = 16 };
#define ARS ((AH + 2 * AKVH) * AHD)
#define AOS (AH * AHD)

static void test_attention(void **state) {
  const fmt16 *F = fmt(state);
  size_t N = (size_t)AB * AT;
  hv qkv = hrand(F, N * ARS, "attn.qkv", 0, 2), out = hzeros(N * AOS);
  float *lse = fzeros((size_t)AB * AH * AT), *rlse = fzeros((size_t)AB * AH * AT);
  F->attn_fwd(out.h, lse, qkv.h, AB, AT, AH, AKVH, AHD);
  zt_cpu_f32_attn_fwd(out.f, rlse, qkv.f, AB, AT, AH, AKVH, AHD);
  expect_rounded(F, "attn_fwd out", out.h, out.f, out.n);
  expect_same(F, "attn_fwd lse", lse, rlse, (size_t)AB * AH * AT);

  /* backward on the same inputs: the float build gets out as the 16-bit
   * build holds it */
  for (size_t i = 0; i < out.n; i++) out.f[i] = F->to(out.h[i]);
  hv dout = hrand(F, N * AOS, "attn.dout", 0, 1), dqkv = hrand(F, N * ARS, "attn.stale", 0, 1);
  F->attn_bwd(dqkv.h, dout.h, qkv.h, out.h, lse, AB, AT, AH, AKVH, AHD);
  zt_cpu_f32_attn_bwd(dqkv.f, dout.f, qkv.f, out.f, lse, AB, AT, AH, AKVH, AHD);
  expect_rounded(F, "attn_bwd dqkv =", dqkv.h, dqkv.f, dqkv.n);
}

/* Each build on its own forward: the float backward reads the float out,
 * the 16-bit one out rounded (by ΔO, |ΔO| <= u|O|). out enters backward
 * only through D_i = sum_d dO_id O_id, so with E_i = sum_d |dO_id ΔO_id|:
 * dS_ij = scale P_ij (dP_ij - D_i) moves by at most scale P_ij E_i, hence
 *   |ΔdQ_id| <= scale E_i sum_j P_ij |K_jd|,
 *   |ΔdK_jd| <= scale sum_{h, i} P_ij E_i |Q_id| (the kv head's query heads),
 *   ΔdV = 0 (dV = P^T dO has no D: bitwise the float result rounded once),
 * plus the 16-bit build's final rounding, u (|ref| + bound) (+ fp16's
 * smallest subnormal's half, for results below its normals), and the float
 * builds' own rounding in sums of up to T terms, T 2^-24 of the part's
 * largest value (test_f32's attention bound). P is recomputed in double. */
static void test_attention_chain(void **state) {
  const fmt16 *F = fmt(state);
  size_t N = (size_t)AB * AT, nl = (size_t)AB * AH * AT;
  hv qkv = hrand(F, N * ARS, "attn.qkv", 0, 2), out = hzeros(N * AOS);
  hv dout = hrand(F, N * AOS, "attn.dout", 0, 1), dqkv = hzeros(N * ARS);
  float *lse = fzeros(nl), *rlse = fzeros(nl);
  F->attn_fwd(out.h, lse, qkv.h, AB, AT, AH, AKVH, AHD);
  F->attn_bwd(dqkv.h, dout.h, qkv.h, out.h, lse, AB, AT, AH, AKVH, AHD);
  zt_cpu_f32_attn_fwd(out.f, rlse, qkv.f, AB, AT, AH, AKVH, AHD);
  zt_cpu_f32_attn_bwd(dqkv.f, dout.f, qkv.f, out.f, rlse, AB, AT, AH, AKVH, AHD);

  double *bound = keep(calloc(N * ARS, sizeof(double))), *E = keep(calloc(AT, sizeof(double)));
  double *P = keep(calloc((size_t)AT * AT, sizeof(double))), scale = 1 / sqrt(AHD);
  for (int b = 0; b < AB; b++)
    for (int h = 0; h < AH; h++) {
      int kh = h / (AH / AKVH);
      const float *q = qkv.f + (size_t)b * AT * ARS + h * AHD;
      const float *k = qkv.f + (size_t)b * AT * ARS + (AH + kh) * AHD;
      for (int i = 0; i < AT; i++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
          double s = 0;
          for (int d = 0; d < AHD; d++) s += (double)q[(size_t)i * ARS + d] * k[(size_t)j * ARS + d];
          P[(size_t)i * AT + j] = s * scale;
          mx = fmax(mx, s * scale);
        }
        for (int j = 0; j <= i; j++) sum += P[(size_t)i * AT + j] = exp(P[(size_t)i * AT + j] - mx);
        for (int j = 0; j <= i; j++) P[(size_t)i * AT + j] /= sum;
        size_t o = ((size_t)b * AT + i) * AOS + h * AHD;
        E[i] = 0;
        for (int d = 0; d < AHD; d++)
          E[i] += fabs((double)dout.f[o + d] * ((double)F->to(out.h[o + d]) - out.f[o + d]));
      }
      for (int i = 0; i < AT; i++)
        for (int j = 0; j <= i; j++) {
          double w = scale * P[(size_t)i * AT + j] * E[i];
          for (int d = 0; d < AHD; d++) {
            bound[((size_t)b * AT + i) * ARS + h * AHD + d] += w * fabs(k[(size_t)j * ARS + d]);
            bound[((size_t)b * AT + j) * ARS + (AH + kh) * AHD + d] += w * fabs(q[(size_t)i * ARS + d]);
          }
        }
    }
  /* q, k and v parts separately: each its own largest value */
  const char *part[3] = {"dq", "dk", "dv"};
  int c0[4] = {0, AH * AHD, (AH + AKVH) * AHD, ARS};
  for (int p = 0; p < 3; p++) {
    double mx = 0, worst = 0, diff = 0;
    size_t moved = 0;
    for (size_t r = 0; r < N; r++)
      for (int c = c0[p]; c < c0[p + 1]; c++) mx = fmax(mx, fabs(dqkv.f[r * ARS + c]));
    for (size_t r = 0; r < N; r++)
      for (int c = c0[p]; c < c0[p + 1]; c++) {
        size_t i = r * ARS + c;
        double ref = dqkv.f[i], got = F->to(dqkv.h[i]), d = fabs(got - ref);
        double tol = bound[i] + F->u * (fabs(ref) + bound[i]) + F->tiny + AT * 0x1p-24 * mx;
        worst = fmax(worst, d / tol);
        diff = fmax(diff, d / mx);
        moved += dqkv.h[i] != F->from(dqkv.f[i]);
      }
    print_message("  %s attn chain %s: max |16-bit - float| %.2e of the largest, %.2f of the "
                  "bound; %zu not the float result rounded once\n",
                  F->name, part[p], diff, worst, moved);
    assert_true(worst <= 1);
    /* out's rounding moved some of dq and dk, and none of dv */
    assert_true(p == 2 ? moved == 0 : moved > 0);
  }
}

/* --------------------------------------------------------- cross-entropy */
static void test_xent(void **state) {
  const fmt16 *F = fmt(state);
  enum { N = 8, V = 1000 };
  int32_t tgt[N] = {0, 1, 999, 500, 3, 77, 640, 12};
  /* sd 8: the softmax sees a wide range, rows dominated by a few logits */
  hv l = hrand(F, N * V, "xent.logits", 0, 8), l2 = hdup(l);
  float *loss = fzeros(N), *rloss = fzeros(N);
  F->xent_fwd_bwd(l.h, loss, tgt, N, V, 0.5f);
  zt_cpu_f32_xent_fwd_bwd(l.f, rloss, tgt, N, V, 0.5f);
  expect_same(F, "xent loss", loss, rloss, N);
  expect_rounded(F, "xent dlogits", l.h, l.f, l.n);

  /* vocab-parallel: two shards of 500 columns, each with stats of its own
   * (as if the others' max and sums were its), the second holding targets
   * 999, 500, 640 and not the others */
  for (int s = 0; s < 2; s++) {
    hv x = hzeros(N * 500);
    for (int r = 0; r < N; r++) {
      memcpy(x.h + r * 500, l2.h + r * V + s * 500, 500 * 2);
      memcpy(x.f + r * 500, l2.f + r * V + s * 500, 500 * 4);
    }
    float *st = fzeros(3 * N), *rst = fzeros(3 * N);
    F->xent_max(st, x.h, N, 500);
    zt_cpu_f32_xent_max(rst, x.f, N, 500);
    F->xent_sumexp(st, x.h, tgt, N, 500, s * 500);
    zt_cpu_f32_xent_sumexp(rst, x.f, tgt, N, 500, s * 500);
    expect_same(F, "xent shard stats", st, rst, 3 * N);
    F->xent_finish(x.h, loss, st, tgt, N, 500, s * 500, 0.25f);
    zt_cpu_f32_xent_finish(x.f, rloss, rst, tgt, N, 500, s * 500, 0.25f);
    expect_same(F, "xent shard loss", loss, rloss, N);
    expect_rounded(F, "xent shard dlogits", x.h, x.f, x.n);
  }
}

/* ---------------------------------------------------- adamw, sumsq */
/* AdamW stays float: p, m and v the float build's bits, p16 the new p
 * rounded once; 0 non-finite counted. */
static void test_adamw(void **state) {
  const fmt16 *F = fmt(state);
  enum { n = 1000 };
  float *p = frand(n, "adamw.p", 1), *m = fzeros(n), *v = fzeros(n);
  float *rp = fdup(p, n), *rm = fzeros(n), *rv = fzeros(n);
  hv p16 = hzeros(n);
  for (int t = 1; t <= 3; t++) {
    char name[16];
    snprintf(name, sizeof name, "adamw.g%d", t);
    float *g = frand(n, name, 1);
    zt_adamw_args a = {.decay = 0.999f, .b1 = 0.9f, .c1 = 0.1f, .b2 = 0.95f, .c2 = 0.05f,
                       .eps = 1e-8f, .step = (float)(1e-2 / (1 - pow(0.9, t))),
                       .bc2_sqrt = (float)sqrt(1 - pow(0.95, t)), .gscale = t == 3 ? 0.37f : 1};
    assert_int_equal(F->adamw_p16(p, g, m, v, n, &a, p16.h), 0);
    assert_int_equal(zt_cpu_f32_adamw(rp, g, rm, rv, n, &a), 0);
  }
  expect_same(F, "adamw p", p, rp, n);
  expect_same(F, "adamw m", m, rm, n);
  expect_same(F, "adamw v", v, rv, n);
  expect_rounded(F, "adamw p16", p16.h, rp, n);
  /* the float build's p16 is a float copy */
  float *q = frand(n, "adamw.p", 1), *qm = fzeros(n), *qv = fzeros(n), *q16 = fzeros(n);
  zt_adamw_args a = {.decay = 1, .b1 = 0.9f, .c1 = 0.1f, .b2 = 0.95f, .c2 = 0.05f, .eps = 1e-8f,
                     .step = 0.1f, .bc2_sqrt = 0.2236068f, .gscale = 1};
  zt_cpu_f32_adamw_p16(q, frand(n, "adamw.g1", 1), qm, qv, n, &a, q16);
  expect_same(F, "adamw float p16", q16, q, n);

  float *x = frand(n, "sumsq.x", 3);
  double s = F->sumsq(x, n), r = zt_cpu_f32_sumsq(x, n);
  assert_memory_equal(&s, &r, sizeof s);
}

/* ------------------------------------------ fp16 array conversions */
static void expect_same_bits(const char *what, const void *a, const void *b, size_t n,
                             size_t size) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0;
  print_message("  %-44s %zu values, %zu differ from half.h\n", what, n, bad);
  assert_int_equal(bad, 0);
}

/* f16_simd.h (the fp16 build's LD_N, ST_N) against half.h: every pattern
 * widened; narrowed, every fp16 value, its midpoint with the next (the
 * ties) and one float ulp either side, both signs, and 2^20 random bit
 * patterns (NaNs, infinities, float subnormals among them); lengths that
 * leave the vector loops' tails. */
static void test_f16_simd(void **state) {
  (void)state;
  enum { P = 65536, R = 1 << 20 };
  uint16_t *h = keep(malloc(P * 2));
  float *got = keep(malloc(P * 4)), *ref = keep(malloc(P * 4));
  for (int i = 0; i < P; i++) h[i] = (uint16_t)i, ref[i] = zt_f16_to_f32(h[i]);
  zt_f16_to_f32_fast_n(got, h, P);
  expect_same_bits("fp16 -> float, all patterns", got, ref, P, 4);
  zt_f16_to_f32_fast_n(got, h + 3, 29); /* 16 + 8 + 5 */
  expect_same_bits("fp16 -> float, 29 from pattern 3", got, ref + 3, 29, 4);

  size_t n = 0, cap = 8 * 0x7c00 + R;
  float *x = keep(malloc(cap * 4));
  for (uint32_t p = 0; p < 0x7c00; p++) /* finite positive fp16 values */
    for (int sgn = 0; sgn < 2; sgn++) {
      float v = zt_f16_to_f32((uint16_t)(p | sgn << 15));
      float next = zt_f16_to_f32((uint16_t)((p + 1) | sgn << 15)); /* 0x7c00: infinity */
      float mid = isinf(next) ? (sgn ? -65520.0f : 65520.0f) : (v + next) / 2;
      x[n++] = v, x[n++] = mid;
      x[n++] = nextafterf(mid, 0), x[n++] = nextafterf(mid, 2 * mid);
    }
  uint64_t key = zt_rng_key(11, "f16.bits");
  for (uint64_t i = 0; i < R / 4; i++) {
    uint32_t r[4];
    zt_rng_philox(key, i, r);
    for (int j = 0; j < 4; j++) memcpy(x + n++, &r[j], 4);
  }
  uint16_t *hg = keep(malloc(n * 2)), *hr = keep(malloc(n * 2));
  for (size_t i = 0; i < n; i++) hr[i] = zt_f16_from_f32(x[i]);
  zt_f16_from_f32_fast_n(hg, x, n);
  expect_same_bits("float -> fp16, neighbourhoods and random", hg, hr, n, 2);
  zt_f16_from_f32_fast_n(hg, x + 5, 29);
  expect_same_bits("float -> fp16, 29 from the 6th", hg, hr + 5, 29, 2);
}

int main(void) {
#define T2(f)                                                                       \
  cmocka_unit_test_prestate_setup_teardown(f, NULL, free_pool, (void *)&BF16),      \
      cmocka_unit_test_prestate_setup_teardown(f, NULL, free_pool, (void *)&F16)
  const struct CMUnitTest tests[] = {
      T2(test_gemm),      cmocka_unit_test_teardown(test_gemm_blocks, free_pool),
      cmocka_unit_test(test_gemm_scratch), T2(test_embed),     T2(test_layernorm),
      T2(test_rmsnorm),   T2(test_elementwise), T2(test_rope),      T2(test_attention),
      T2(test_attention_chain), T2(test_xent),  T2(test_adamw),
      cmocka_unit_test_teardown(test_f16_simd, free_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
