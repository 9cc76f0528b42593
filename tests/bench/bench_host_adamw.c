/* bench_host_adamw: the CPU backend's AdamW (what the offload engine runs
 * on host-resident optimizer state) against the machine's memory
 * bandwidth, measured in the same run by a STREAM triad.
 *
 *   OMP_NUM_THREADS=T bench_host_adamw [N_MI] [REPEATS]
 *
 * N_MI Mi float elements (default 64: 1 GiB of p, g, m, v, far beyond any
 * cache). Per repeat (default 7), in a rotating order after one untimed
 * round (page faults, thread start-up): zt_backend_cpu()->adamw without a
 * 16-bit copy, with the bf16 copy of the new weights (the mixed-precision
 * trainer's call), the triad a[i] = b[i] + s * c[i] on three float arrays
 * of N elements, and "same traffic": AdamW's reads and writes (p, m, v
 * updated in place from g) with one multiply-add each instead of AdamW's
 * arithmetic, the bandwidth this access pattern itself reaches. Every
 * buffer is first touched by the threads that use it (about the same
 * static split), as a trainer's would be after its first step.
 *
 * Bytes moved, as STREAM counts them (what the loop names, not the cache
 * line fills a write to a line not yet read may add): AdamW 28 per
 * element (reads p, g, m, v, writes p, m, v), 30 with the bf16 copy; the
 * triad 12. The triad's stores go to lines it never reads, so the CPU
 * reads each line first (write-allocate): its real traffic is 16 bytes an
 * element, and an in-place kernel like AdamW, whose every store hits a
 * line it has just read, can approach or pass "100%" of the triad's
 * counted figure. Prints one JSON line:
 *   {"n": .., "threads": .., "adamw_s": [...], "adamw_bf16_s": [...],
 *    "triad_s": [...], "traffic_s": [...], medians, "nonfinite": ..}
 * A benchmark, not a test: it checks nothing. "nonfinite" is AdamW's own
 * count, 0 expected (the driver warns otherwise: the values went wrong and
 * the timings would describe another loop). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "tests/bench/median.h"

static void *big(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "bench_host_adamw: out of memory (%zu bytes; try a smaller N_MI)\n", bytes);
    exit(1);
  }
  return p;
}

/* N(0, sd) values, written by the threads that will use them. */
static void fill(float *x, size_t n, const char *stream, float sd) {
  uint64_t key = zt_rng_key(5, stream);
#pragma omp parallel
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t i0 = n / nt * t, i1 = t == nt - 1 ? n : n / nt * (t + 1);
    zt_rng_normal_fill(key, (int64_t)i0, (int64_t)(i1 - i0), sd, x + i0);
  }
}

static void triad(float *a, const float *b, const float *c, float s, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

/* AdamW's 28 bytes an element with next to no arithmetic; s tiny, v stays
 * >= 0, so AdamW's next call sees sane state. */
static void same_traffic(float *p, const float *g, float *m, float *v, float s, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float sg = s * g[i];
    p[i] += sg, m[i] += sg, v[i] += sg * g[i];
  }
}

static void print_times(const char *name, const double *s, int n) {
  printf("\"%s\": [", name);
  for (int r = 0; r < n; r++) printf("%s%.6f", r ? ", " : "", s[r]);
  printf("], ");
}

int main(int argc, char **argv) {
  long nmi = argc > 1 ? atol(argv[1]) : 64;
  int repeats = argc > 2 ? atoi(argv[2]) : 7;
  if (nmi < 1 || nmi > 4096 || repeats < 1 || repeats > 1000) {
    fprintf(stderr,
            "bench_host_adamw: N_MI %ld, REPEATS %d: want 1 <= N_MI <= 4096 (Mi elements) and "
            "1 <= REPEATS <= 1000\n",
            nmi, repeats);
    return 2;
  }
  size_t n = (size_t)nmi << 20;
  const zt_backend *be = zt_backend_cpu();
  zt_stream *st = be->stream_new();
  float *p = big(n * 4), *g = big(n * 4), *m = big(n * 4), *v = big(n * 4);
  uint16_t *p16 = big(n * 2);
  float *a = big(n * 4), *b = big(n * 4), *c = big(n * 4);
  fill(p, n, "p", 0.02f);
  fill(g, n, "g", 1e-3f);
  fill(m, n, "m", 1e-4f);
  fill(a, n, "a", 1);
  fill(b, n, "b", 1);
  fill(c, n, "c", 1);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) v[i] = 1e-6f, p16[i] = 0;

  enum { K = 4 };
  double *ts[K];
  for (int k = 0; k < K; k++) ts[k] = calloc((size_t)repeats, sizeof(double));
  zt_step_sums sums = {0};
  /* A trainer's step t: GPT-2's hyperparameters, lr 6e-4, decay 0.1. */
  for (int r = -1; r < repeats; r++) {
    int64_t t = r + 2;
    double lr = 6e-4;
    zt_adamw_args args = {.decay = (float)(1 - lr * 0.1), .b1 = 0.9f, .c1 = 0.1f,
                          .b2 = 0.95f, .c2 = 0.05f, .eps = 1e-8f,
                          .step = (float)(lr / (1 - pow(0.9, (double)t))),
                          .bc2_sqrt = (float)sqrt(1 - pow(0.95, (double)t)), .gscale = 1};
    for (int j = 0; j < K; j++) {
      int k = r < 0 ? j : (j + r) % K; /* rotate: no kernel always runs first */
      double t0 = zt_timer_now();
      if (k == 0)
        be->adamw(st, p, g, m, v, n, &args, &sums, NULL, ZT_F32);
      else if (k == 1)
        be->adamw(st, p, g, m, v, n, &args, &sums, p16, ZT_BF16);
      else if (k == 2)
        triad(a, b, c, 0.5f, n);
      else
        same_traffic(p, g, m, v, 1e-7f, n);
      be->stream_sync(st);
      if (r >= 0) ts[k][r] = zt_timer_now() - t0;
    }
  }

  printf("{\"n\": %zu, \"threads\": %d, ", n, omp_get_max_threads());
  print_times("adamw_s", ts[0], repeats);
  print_times("adamw_bf16_s", ts[1], repeats);
  print_times("triad_s", ts[2], repeats);
  print_times("traffic_s", ts[3], repeats);
  double med[K];
  for (int k = 0; k < K; k++) med[k] = median(ts[k], repeats);
  printf("\"adamw_median\": %.6f, \"adamw_bf16_median\": %.6f, \"triad_median\": %.6f, "
         "\"traffic_median\": %.6f, \"nonfinite\": %llu}\n",
         med[0], med[1], med[2], med[3], (unsigned long long)sums.nonfinite);
  be->stream_free(st);
  for (int k = 0; k < K; k++) free(ts[k]);
  free(p), free(g), free(m), free(v), free(p16), free(a), free(b), free(c);
  return 0;
}
