/* test_decode: incremental decoding with a KV cache (src/model/decode.c)
 * gives the logits of the model's full forward (layers.c) at every
 * position, for gpt (tied head, learned positions) and llama (RoPE, GQA:
 * 4 query heads over 2 kv heads), decoded three ways: the whole sequence
 * in one call, one token a call, and a prompt of 7 then one at a time.
 * The full forward only hands out losses, so it runs once per vocab id v
 * as the target of every row: loss[r][v] = logsumexp(z_r) - z_r[v], which
 * is every logit up to the row's constant, i.e. the whole next-token
 * distribution. Decoding's logits give the same numbers (in double).
 * Tolerance: 1e-5 relative (absolute 1e-6 below a loss of 0.1): both are
 * fp32 sums of the same products in another order (a GEMM of 1 row
 * against one of 24, attention tiles starting at another row); measured
 * ~2e-7. The weights are the seeded initial ones times 2 (std 0.04), so
 * that attention and positions move the logits by far more than that: the
 * test also checks that a row's distribution depends on its context (a
 * one-token context moves it by > 0.05; measured 0.4), without which a
 * cache that attended to nothing earlier would pass. (The differences
 * grow with the network's gain, smoothly: weights times 4 give 3e-6,
 * times 6 1.5e-5, as rounding amplified, not a wrong value.) Bad calls (past seq, more
 * rows than the decoder takes, a token outside the vocab) are refused.
 * The op alone (attn_decode), in each CPU build (fp32, bf16, fp16): the
 * last n = 1, 5, 70 rows over T = 300 keys (partial and several query
 * and key tiles, 4 heads on 2 kv heads) against attn_fwd's rows: within
 * 4e-6 of the rows' largest value in fp32 (measured 7e-7: the tiles'
 * GEMMs of other heights sum the scores in another order, and one
 * rounding of a score of 30 (inputs of sd 2) moves its weight by 3e-6),
 * and within one rounding of the 16-bit format
 * (2^-8 bf16, 2^-11 fp16, relative) in the 16-bit builds, whose float
 * results may fall on either side of a rounding boundary. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/ops.h"
#include "kernels/kernels.h"
#include "src/core/half.h"
#include "src/core/rng.h"
#include "src/model/decode.h"
#include "src/model/model.h"

#define V 64
#define T 24
#define TOL 1e-5

typedef struct {
  zt_model m;
  float *w, *g;
  int32_t tok[T];
  double loss[T][V]; /* the full forward's */
} fixture;

static void setup(fixture *f, zt_model_cfg cfg) {
  const zt_backend *be = zt_backend_cpu();
  zt_err e = {0};
  assert_int_equal(zt_model_init(&f->m, &cfg, be, 1, NULL, NULL, &e), ZT_OK);
  size_t bytes = (size_t)f->m.numel * sizeof(float);
  f->w = be->alloc(ZT_MEM_DEVICE, bytes);
  f->g = be->alloc(ZT_MEM_DEVICE, bytes);
  assert_non_null(f->w);
  assert_non_null(f->g);
  assert_int_equal(zt_model_init_weights(&f->m, 7, f->w, 0, f->m.numel, &e), ZT_OK);
  float *h = malloc(bytes);
  be->copy(f->m.stream, h, f->w, bytes);
  be->stream_sync(f->m.stream);
  for (int64_t i = 0; i < f->m.numel; i++) h[i] *= 2;
  be->copy(f->m.stream, f->w, h, bytes);
  be->stream_sync(f->m.stream);
  free(h);
  zt_model_bind(&f->m, f->w, f->g);
  uint64_t key = zt_rng_key(3, "test_decode");
  for (int t = 0; t < T; t++) f->tok[t] = (int32_t)zt_rng_below(key, (uint64_t)t, V);
  int32_t targets[T];
  float losses[T];
  for (int v = 0; v < V; v++) {
    for (int t = 0; t < T; t++) targets[t] = v;
    zt_model_fwd(&f->m, 0, 0, f->tok, targets, 0);
    be->copy(f->m.stream, losses, f->m.chunks[0].slots[0].losses, sizeof losses);
    be->stream_sync(f->m.stream);
    for (int t = 0; t < T; t++) f->loss[t][v] = losses[t];
  }
}

static void teardown(fixture *f) {
  f->m.be->free(ZT_MEM_DEVICE, f->w);
  f->m.be->free(ZT_MEM_DEVICE, f->g);
  zt_model_free(&f->m);
}

/* Largest relative difference of row z's losses (logsumexp(z) - z[v])
 * from the full forward's at position t. */
static double row_error(const fixture *f, int t, const float *z) {
  double mx = z[0], s = 0, worst = 0;
  for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
  for (int v = 0; v < V; v++) s += exp(z[v] - mx);
  double lse = mx + log(s);
  for (int v = 0; v < V; v++) {
    double ref = f->loss[t][v], err = fabs(lse - z[v] - ref) / fmax(fabs(ref), 0.1);
    worst = err > worst ? err : worst;
  }
  return worst;
}

/* Decodes the tokens in calls of the sizes in `parts` (summing to T),
 * asking for every new row's logits, and checks every position. */
static void check_decoding(fixture *f, const int *parts, int nparts, const char *how) {
  zt_decode d;
  zt_err e = {0};
  assert_int_equal(zt_decode_init(&d, &f->m, f->m.be, f->w, T, &e), ZT_OK);
  static float z[T * V];
  double worst = 0;
  for (int p = 0, t = 0; p < nparts; t += parts[p++]) {
    assert_int_equal(zt_decode_step(&d, f->tok + t, parts[p], parts[p], z, &e), ZT_OK);
    for (int r = 0; r < parts[p]; r++) {
      double err = row_error(f, t + r, z + (size_t)r * V);
      worst = err > worst ? err : worst;
    }
  }
  printf("  %s %s: largest relative difference from the full forward %.2e\n",
         f->m.cfg.arch == ZT_ARCH_GPT ? "gpt" : "llama", how, worst);
  assert_true(worst <= TOL);
  assert_int_equal(d.pos, T);
  /* past the last position: refused, nothing run */
  assert_int_equal(zt_decode_step(&d, f->tok, 1, 1, z, &e), ZT_EINPUT);
  assert_int_equal(d.pos, T);
  zt_decode_free(&d);
}

static void check_model(zt_model_cfg cfg) {
  static fixture f;
  setup(&f, cfg);
  int whole[] = {T}, ones[T], prompt[T - 6] = {7};
  for (int i = 0; i < T; i++) ones[i] = 1;
  for (int i = 1; i < T - 6; i++) prompt[i] = 1;
  check_decoding(&f, whole, 1, "whole sequence in one call");
  check_decoding(&f, ones, T, "one token a call");
  check_decoding(&f, prompt, T - 6, "7 then one a call");

  /* the context matters: the last token alone, at position 0 */
  zt_decode d;
  zt_err e = {0};
  static float z[V];
  assert_int_equal(zt_decode_init(&d, &f.m, f.m.be, f.w, 4, &e), ZT_OK);
  assert_int_equal(zt_decode_step(&d, f.tok + T - 1, 1, 1, z, &e), ZT_OK);
  double moved = row_error(&f, T - 1, z);
  printf("  without its context the last row moves by %.2f (relative)\n", moved);
  assert_true(moved > 0.05);
  /* more rows than the decoder takes, or a token outside the vocab */
  assert_int_equal(zt_decode_step(&d, f.tok, 5, 1, z, &e), ZT_EINPUT);
  int32_t bad = V;
  assert_int_equal(zt_decode_step(&d, &bad, 1, 1, z, &e), ZT_EINPUT);
  assert_int_equal(d.pos, 1);
  zt_decode_free(&d);
  teardown(&f);
}

#define AT 300
#define AH 4
#define AKV 2
#define AHD 16
#define ARS ((AH + 2 * AKV) * AHD)

/* |got - want| over the largest |want|, elementwise against one rounding
 * when ulp > 0 (16 bits). */
static double op_error(const float *got, const float *want, size_t n, double ulp) {
  double mx = 0, worst = 0;
  for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(want[i]));
  for (size_t i = 0; i < n; i++) {
    double d = fabs(got[i] - want[i]);
    worst = fmax(worst, ulp > 0 ? d / (ulp * fmax(fabs(want[i]), 1e-30)) : d / mx);
  }
  return worst;
}

static void test_attn_decode_op(void **state) {
  (void)state;
  static float qkv[AT * ARS], full[AT * AH * AHD], lse[AH * AT], part[70 * AH * AHD];
  static uint16_t q16[AT * ARS], f16[AT * AH * AHD], p16[70 * AH * AHD];
  static float f32[AT * AH * AHD], pw[70 * AH * AHD];
  uint64_t key = zt_rng_key(5, "attn_decode");
  for (int i = 0; i < AT * ARS; i++) qkv[i] = 2 * zt_rng_normal(key, (uint64_t)i);
  zt_cpu_f32_attn_fwd(full, lse, qkv, 1, AT, AH, AKV, AHD);
  int ns[] = {1, 5, 70};
  for (int k = 0; k < 3; k++) {
    int n = ns[k];
    size_t cnt = (size_t)n * AH * AHD, skip = (size_t)(AT - n) * AH * AHD;
    zt_cpu_f32_attn_decode(part, qkv, AT, n, AH, AKV, AHD);
    double err = op_error(part, full + skip, cnt, 0);
    printf("  attn_decode fp32 n %d: %.1e of the largest value\n", n, err);
    assert_true(err <= 4e-6);
    for (int b = 0; b < 2; b++) { /* bf16, then fp16: the same values rounded */
      for (int i = 0; i < AT * ARS; i++) q16[i] = b ? zt_f16_from_f32(qkv[i]) : zt_bf16_from_f32(qkv[i]);
      if (b) {
        zt_cpu_f16_attn_fwd(f16, lse, q16, 1, AT, AH, AKV, AHD);
        zt_cpu_f16_attn_decode(p16, q16, AT, n, AH, AKV, AHD);
      } else {
        zt_cpu_bf16_attn_fwd(f16, lse, q16, 1, AT, AH, AKV, AHD);
        zt_cpu_bf16_attn_decode(p16, q16, AT, n, AH, AKV, AHD);
      }
      for (size_t i = 0; i < cnt; i++) {
        f32[i] = b ? zt_f16_to_f32(f16[skip + i]) : zt_bf16_to_f32(f16[skip + i]);
        pw[i] = b ? zt_f16_to_f32(p16[i]) : zt_bf16_to_f32(p16[i]);
      }
      double ulp = b ? 1.0 / 2048 : 1.0 / 256;
      err = op_error(pw, f32, cnt, ulp);
      printf("  attn_decode %s n %d: %.2f roundings\n", b ? "fp16" : "bf16", n, err);
      assert_true(err <= 1);
    }
  }
}

static void test_gpt(void **state) {
  (void)state;
  check_model((zt_model_cfg){.arch = ZT_ARCH_GPT, .vocab = V, .seq = T, .dim = 32, .layers = 2,
                             .heads = 4, .kv_heads = 4, .ffn_dim = 128, .norm_eps = 1e-5f,
                             .tied = 1});
}

static void test_llama_gqa(void **state) {
  (void)state;
  check_model((zt_model_cfg){.arch = ZT_ARCH_LLAMA, .vocab = V, .seq = T, .dim = 32,
                             .layers = 2, .heads = 4, .kv_heads = 2, .ffn_dim = 48,
                             .norm_eps = 1e-5f, .rope_theta = 10000});
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_attn_decode_op),
                                     cmocka_unit_test(test_gpt), cmocka_unit_test(test_llama_gqa)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
