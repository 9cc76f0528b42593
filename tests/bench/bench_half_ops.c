/* bench_half_ops: the CPU kernels with 16-bit storage (bf16, fp16) against
 * the float build, at GPT-2 124M's shapes: N = 4 x 1024 rows, C 768, F
 * 3072, 12 heads of 64, T 1024.
 *
 *   OMP_NUM_THREADS=2 bench_half_ops [REPEATS] [--head]
 *
 * Per op, REPEATS timed calls (default 5) of each build after one untimed
 * call, the three builds interleaved in a rotating order; prints a
 * markdown table of the medians and the ratios 16-bit / float, then the
 * ops of one transformer block summed (each op as often as a block calls
 * it). --head adds the tied LM head's three GEMMs (vocabulary 50257; past
 * the 16-bit GEMM's scratch budget, so in blocks; 2.5 GB and minutes).
 * Before timing, each GEMM shape is run once per 16-bit format on
 * the same values in both builds and the 16-bit result compared with the
 * float one rounded once (the "rounded" column: mismatches, 0 expected).
 * A benchmark, not a test: it asserts nothing. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_path.h"
#include "kernels/cpu/ops.h"
#include "src/core/half.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "tests/bench/median.h"

enum { B = 4, T = 1024, N = B * T, C = 768, F = 3072, H = 12, HD = 64, V = 50257 };

/* Every op's buffers, in float and in each 16-bit format: X, Y, Y2, DY
 * [N, F] (an op uses their first rows x its width), W [F, C] (every
 * weight of a block fits); [N, V] and [V, C] with --head. The real ones
 * (parameter gradients, norm statistics, lse) are shared. */
typedef struct {
  float *x, *y, *y2, *dy, *w;
} fbufs;
typedef struct {
  uint16_t *x, *y, *y2, *dy, *w;
} hbufs;
static fbufs f32;
static hbufs h16[2];
static float *dw, *mean, *rstd, *lse, *dwv, *dbv;

static void *big(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "bench_half_ops: out of memory\n");
    exit(1);
  }
  memset(p, 0, bytes);
  return p;
}

/* Values rounded to format k, and the float buffers given them widened. */
static void fill(float *f, uint16_t *h, size_t n, const char *stream, float sd, int k) {
  zt_rng_normal_fill(zt_rng_key(3, stream), 0, (int64_t)n, sd, f);
  (k ? zt_f16_from_f32_n : zt_bf16_from_f32_n)(h, f, n);
  (k ? zt_f16_to_f32_n : zt_bf16_to_f32_n)(f, h, n);
}

/* The ops, as a block calls them: gemm(ta, tb, m, n, k) with x [N, in],
 * weights [out, in] (forward y = x W^T; dW += dy^T x; dx = dy W). */
typedef struct {
  const char *name;
  int kind; /* 0 gemm, 1 gemm_acc, 2.. the others */
  int ta, tb, m, n, k;
  int per_block; /* calls per block (0: the LM head) */
} op;

enum { GEMM, GEMM_ACC, LN_FWD, LN_BWD, GELU_FWD, GELU_BWD, ATTN_FWD, ATTN_BWD, ADD };

#define LINEAR(nm, out, in)                                                       \
  {nm " fwd", GEMM, 0, 1, N, out, in, 1}, {nm " dW", GEMM_ACC, 1, 0, out, in, N, 1}, \
      {nm " dx", GEMM, 0, 0, N, in, out, 1}

static const op ops[] = {
    LINEAR("qkv", 3 * C, C),
    LINEAR("attn out", C, C),
    LINEAR("fc", F, C),
    LINEAR("down", C, F),
    {"layernorm fwd", LN_FWD, 0, 0, 0, 0, 0, 2},
    {"layernorm bwd", LN_BWD, 0, 0, 0, 0, 0, 2},
    {"gelu fwd", GELU_FWD, 0, 0, 0, 0, 0, 1},
    {"gelu bwd", GELU_BWD, 0, 0, 0, 0, 0, 1},
    {"attention fwd", ATTN_FWD, 0, 0, 0, 0, 0, 1},
    {"attention bwd", ATTN_BWD, 0, 0, 0, 0, 0, 1},
    {"add", ADD, 0, 0, 0, 0, 0, 2},
    {"lm head fwd", GEMM, 0, 1, N, V, C, 0},
    {"lm head dW", GEMM_ACC, 1, 0, V, C, N, 0},
    {"lm head dx", GEMM, 0, 0, N, C, V, 0},
};
enum { NOPS = sizeof ops / sizeof *ops };

/* Runs op o in build b: 0 float, 1 bf16, 2 fp16. beta: the GEMM's (1 for
 * the weight gradient as the model calls it, 0 for the check). */
static void run(const op *o, int b, float beta) {
  /* forward x W^T; dW += dy^T x; dx = dy W */
  int lda = o->ta ? o->m : o->k, ldb = o->tb ? o->k : o->n, fwd = o->kind == GEMM && o->tb;
  const float *fa = fwd ? f32.x : f32.dy, *fb = o->kind == GEMM_ACC ? f32.x : f32.w;
  if (b == 0) {
    switch (o->kind) {
      case GEMM: zt_cpu_f32_gemm(o->ta, o->tb, o->m, o->n, o->k, 1, fa, lda, fb, ldb, 0, f32.y, o->n); break;
      case GEMM_ACC: zt_cpu_f32_gemm_acc(o->ta, o->tb, o->m, o->n, o->k, 1, fa, lda, fb, ldb, beta, dw, o->n); break;
      case LN_FWD: zt_cpu_f32_layernorm_fwd(f32.y, mean, rstd, f32.x, f32.w, f32.w + C, N, C, 1e-5f); break;
      case LN_BWD: zt_cpu_f32_layernorm_bwd(f32.y2, dwv, dbv, f32.dy, f32.x, f32.w, mean, rstd, N, C); break;
      case GELU_FWD: zt_cpu_f32_gelu_fwd(f32.y, f32.x, (size_t)N * F); break;
      case GELU_BWD: zt_cpu_f32_gelu_bwd(f32.y2, f32.x, f32.dy, (size_t)N * F); break;
      case ATTN_FWD: zt_cpu_f32_attn_fwd(f32.y, lse, f32.x, B, T, H, H, HD); break;
      case ATTN_BWD: zt_cpu_f32_attn_bwd(f32.y2, f32.dy, f32.x, f32.y, lse, B, T, H, H, HD); break;
      case ADD: zt_cpu_f32_add(f32.y, f32.x, (size_t)N * C); break;
    }
    return;
  }
  hbufs *h = &h16[b - 1];
  const uint16_t *ha = fwd ? h->x : h->dy, *hb = o->kind == GEMM_ACC ? h->x : h->w;
#define CALL16(fn, ...) (b == 1 ? zt_cpu_bf16_##fn(__VA_ARGS__) : zt_cpu_f16_##fn(__VA_ARGS__))
  switch (o->kind) {
    case GEMM: CALL16(gemm, o->ta, o->tb, o->m, o->n, o->k, 1, ha, lda, hb, ldb, 0, h->y, o->n); break;
    case GEMM_ACC: CALL16(gemm_acc, o->ta, o->tb, o->m, o->n, o->k, 1, ha, lda, hb, ldb, beta, dw, o->n); break;
    case LN_FWD: CALL16(layernorm_fwd, h->y, mean, rstd, h->x, h->w, h->w + C, N, C, 1e-5f); break;
    case LN_BWD: CALL16(layernorm_bwd, h->y2, dwv, dbv, h->dy, h->x, h->w, mean, rstd, N, C); break;
    case GELU_FWD: CALL16(gelu_fwd, h->y, h->x, (size_t)N * F); break;
    case GELU_BWD: CALL16(gelu_bwd, h->y2, h->x, h->dy, (size_t)N * F); break;
    case ATTN_FWD: CALL16(attn_fwd, h->y, lse, h->x, B, T, H, H, HD); break;
    case ATTN_BWD: CALL16(attn_bwd, h->y2, h->dy, h->x, h->y, lse, B, T, H, H, HD); break;
    case ADD: CALL16(add, h->y, h->x, (size_t)N * C); break;
  }
#undef CALL16
}

/* Format k's GEMM result (beta 0) against the float build's on the same
 * values, rounded once: how many differ. */
static size_t check(const op *o, int k) {
  size_t bad = 0, n = (size_t)o->m * o->n;
  run(o, 0, 0);
  float *ref = malloc(n * sizeof *ref);
  if (!ref) exit(1);
  memcpy(ref, o->kind == GEMM_ACC ? dw : f32.y, n * sizeof *ref);
  run(o, k + 1, 0);
  uint16_t *h = h16[k].y;
  for (size_t i = 0; i < n; i++) {
    if (o->kind == GEMM_ACC) bad += memcmp(dw + i, ref + i, sizeof *ref) != 0;
    else bad += h[i] != (k ? zt_f16_from_f32(ref[i]) : zt_bf16_from_f32(ref[i]));
  }
  free(ref);
  return bad;
}

int main(int argc, char **argv) {
  char why[512];
  if (zt_cpu_gemm_select(argv, why, sizeof why)) {
    fprintf(stderr, "bench_half_ops: %s\n", why);
    return 1;
  }
  int repeats = argc > 1 ? atoi(argv[1]) : 5, head = argc > 2 && !strcmp(argv[2], "--head");
  if (repeats < 1 || repeats > 100) repeats = 5;
  size_t NF = (size_t)N * (head ? V : F), FC = (size_t)(head ? V : F) * C;
  f32 = (fbufs){big(NF * 4), big(NF * 4), big(NF * 4), big(NF * 4), big(FC * 4)};
  for (int k = 0; k < 2; k++)
    h16[k] = (hbufs){big(NF * 2), big(NF * 2), big(NF * 2), big(NF * 2), big(FC * 2)};
  dw = big(FC * 4), mean = big(N * 4), rstd = big(N * 4), lse = big((size_t)B * H * T * 4);
  dwv = big(C * 4), dbv = big(C * 4);

  /* x N(0,1), weights N(0, 0.02) (GPT-2's), upstream gradients N(0,1):
   * every result well inside fp16's range */
  size_t check_bad[NOPS][2] = {{0}};
  for (int k = 0; k < 2; k++) {
    fill(f32.x, h16[k].x, NF, "x", 1, k);
    fill(f32.dy, h16[k].dy, NF, "dy", 1, k);
    fill(f32.w, h16[k].w, FC, "w", 0.02f, k);
    for (int i = 0; i < NOPS; i++)
      if (ops[i].kind <= GEMM_ACC && (head || ops[i].per_block))
        check_bad[i][k] = check(&ops[i], k);
  }

  char desc[256], other[256];
  zt_cpu_gemm_describe(desc, sizeof desc, other, sizeof other);
  printf("GEMMs: %s; %d threads; %d timed calls per op and build\n\n", desc,
         omp_get_max_threads(), repeats);
  printf("| op | float (ms) | bf16 (ms) | fp16 (ms) | bf16/float | fp16/float | rounded (bf16, fp16) |\n");
  printf("|---|---:|---:|---:|---:|---:|---|\n");
  double block[3] = {0}, gemms[3] = {0};
  /* a block's ops and their sums, then the LM head's */
  for (int pass = 0; pass < 1 + head; pass++) {
    for (int i = 0; i < NOPS; i++) {
      const op *o = &ops[i];
      double s[3][100], med[3];
      if ((o->per_block == 0) != pass) continue;
      for (int b = 0; b < 3; b++) run(o, b, 1); /* untimed */
      for (int r = 0; r < repeats; r++)
        for (int j = 0; j < 3; j++) {
          int b = (r + j) % 3;
          double t0 = zt_timer_now();
          run(o, b, 1);
          s[b][r] = zt_timer_now() - t0;
        }
      for (int b = 0; b < 3; b++) {
        med[b] = median(s[b], repeats);
        block[b] += o->per_block * med[b];
        if (o->kind <= GEMM_ACC) gemms[b] += o->per_block * med[b];
      }
      printf("| %s | %.1f | %.1f | %.1f | %.2f | %.2f |", o->name, 1e3 * med[0], 1e3 * med[1],
             1e3 * med[2], med[1] / med[0], med[2] / med[0]);
      if (o->kind <= GEMM_ACC) printf(" %zu, %zu |\n", check_bad[i][0], check_bad[i][1]);
      else printf(" |\n");
      fflush(stdout);
    }
    if (pass) continue;
    printf("| **12 GEMMs** | %.1f | %.1f | %.1f | **%.2f** | **%.2f** | |\n", 1e3 * gemms[0],
           1e3 * gemms[1], 1e3 * gemms[2], gemms[1] / gemms[0], gemms[2] / gemms[0]);
    printf("| **one block** | %.1f | %.1f | %.1f | **%.2f** | **%.2f** | |\n", 1e3 * block[0],
           1e3 * block[1], 1e3 * block[2], block[1] / block[0], block[2] / block[0]);
    fflush(stdout);
  }
  return 0;
}
