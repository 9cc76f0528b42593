/* gpu_test: what the GPU tests share. Each test runs a contract op on the
 * CPU backend (the reference) and on the CUDA backend with the same
 * inputs, and compares the results at a stated tolerance. Without a usable
 * GPU a test exits 77, which ctest reports as skipped (SKIP_RETURN_CODE),
 * never as passed.
 *
 * Inputs are drawn from the counter-based RNG (src/core/rng.h), so a
 * failure reproduces from its name. Values cross between the backends as
 * fp32 arrays on the host, converted to and from the op's dtype here, so
 * both backends see the same 16-bit bits. */
#ifndef ZT_GPU_TEST_H
#define ZT_GPU_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/core/half.h"
#include "src/core/rng.h"

#define GT_SKIP 77

typedef struct gt_ctx {
  const zt_backend *cpu, *gpu;
  zt_stream *cs, *gs;
  int failures, checks;
} gt_ctx;

/* Both backends, or exit 77 with the reason when no GPU can be used. */
static inline void gt_init(gt_ctx *g) {
  memset(g, 0, sizeof *g);
  char why[256] = "";
  g->cpu = zt_backend_cpu();
  g->gpu = zt_backend_cuda_devices() > 0 ? zt_backend_cuda(0, why, sizeof why) : NULL;
  if (!g->gpu) {
    printf("SKIP: no usable CUDA device (%s)\n", why[0] ? why : "none found");
    exit(GT_SKIP);
  }
  g->cs = g->cpu->stream_new();
  g->gs = g->gpu->stream_new();
}

/* n values ~ scale * N(0, 1), keyed by name. */
static inline float *gt_randn(const char *name, size_t n, float scale) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  if (!x) abort();
  zt_rng_normal_fill(zt_rng_key(20261201, name), 0, (int64_t)n, scale, x);
  return x;
}

/* x rounded to t in place (the values both backends then read exactly). */
static inline void gt_round(float *x, size_t n, zt_dtype t) {
  for (size_t i = 0; i < n; i++) {
    if (t == ZT_BF16) x[i] = zt_bf16_to_f32(zt_bf16_from_f32(x[i]));
    else if (t == ZT_F16) x[i] = zt_f16_to_f32(zt_f16_from_f32(x[i]));
  }
}

/* A buffer of n elements of t on backend be (stream s) holding host x. */
static inline void *gt_upload(const zt_backend *be, zt_stream *s, const float *x, size_t n,
                              zt_dtype t) {
  size_t bytes = (n ? n : 1) * zt_dtype_size(t);
  void *d = be->alloc(ZT_MEM_DEVICE, bytes);
  void *h = malloc(bytes);
  if (!d || !h) abort();
  if (t == ZT_F32) memcpy(h, x, n * sizeof *x);
  else if (t == ZT_BF16) zt_bf16_from_f32_n(h, x, n);
  else zt_f16_from_f32_n(h, x, n);
  be->copy(s, d, h, n * zt_dtype_size(t));
  be->stream_sync(s);
  free(h);
  return d;
}

/* Host fp32 copy of n elements of t at d on backend be. */
static inline float *gt_download(const zt_backend *be, zt_stream *s, const void *d, size_t n,
                                 zt_dtype t) {
  size_t bytes = (n ? n : 1) * zt_dtype_size(t);
  void *h = malloc(bytes);
  float *x = malloc((n ? n : 1) * sizeof *x);
  if (!h || !x) abort();
  be->copy(s, h, d, n * zt_dtype_size(t));
  be->stream_sync(s);
  if (t == ZT_F32) memcpy(x, h, n * sizeof *x);
  else if (t == ZT_BF16) zt_bf16_to_f32_n(x, h, n);
  else zt_f16_to_f32_n(x, h, n);
  free(h);
  return x;
}

/* Relative L2 distance of got from want (absolute when want is all zero). */
static inline double gt_rel_l2(const float *got, const float *want, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    double e = (double)got[i] - want[i];
    d += e * e;
    r += (double)want[i] * want[i];
  }
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* One comparison: the GPU's n values of t at dg against the CPU's at dc
 * (both device buffers of their backends), relative L2 within tol; any
 * non-finite value where the reference is finite fails. */
static inline void gt_expect(gt_ctx *g, const char *what, const void *dg, const void *dc,
                             size_t n, zt_dtype t, double tol) {
  float *a = gt_download(g->gpu, g->gs, dg, n, t), *b = gt_download(g->cpu, g->cs, dc, n, t);
  int finite = 1;
  for (size_t i = 0; i < n; i++) finite &= isfinite(a[i]) || !isfinite(b[i]);
  double rel = gt_rel_l2(a, b, n);
  int ok = finite && rel <= tol;
  char err[256];
  if (g->gpu->error(err, sizeof err)) {
    printf("FAIL %s: the CUDA backend reports: %s\n", what, err);
    ok = 0;
  }
  printf("%-4s %-44s %-5s rel L2 %.3e (tolerance %.1e)%s\n", ok ? "ok" : "FAIL", what,
         zt_dtype_name(t), rel, tol, finite ? "" : ", non-finite values");
  g->failures += !ok;
  g->checks++;
  free(a);
  free(b);
}

static inline int gt_finish(gt_ctx *g, const char *name) {
  printf("%s: %d of %d checks failed\n", name, g->failures, g->checks);
  return g->failures ? 1 : 0;
}

#endif
