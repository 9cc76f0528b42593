/* bench_attn: the CPU backend's causal attention kernels alone, in float.
 *
 *   bench_attn B T H KVH HD [REPEATS]
 *
 * Times attn_fwd and attn_bwd REPEATS times each (default 7) on qkv rows
 * of N(0,1) values, with whatever OMP_NUM_THREADS says, after one untimed
 * call of each (first-touch page faults and BLAS start-up are not the
 * kernel). Prints one JSON line:
 *   {"B": .., "T": .., "H": .., "KVH": .., "hd": .., "threads": ..,
 *    "fwd_s": [...], "bwd_s": [...], "fwd_median": S, "bwd_median": S,
 *    "saved_bytes": saved for backward besides qkv and out}
 * A benchmark, not a test: it checks nothing. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "tests/bench/median.h"

static void print_times(const char *name, const double *s, int n) {
  printf("\"%s\": [", name);
  for (int r = 0; r < n; r++) printf("%s%.6f", r ? ", " : "", s[r]);
  printf("], ");
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: bench_attn B T H KVH HD [REPEATS]\n");
    return 2;
  }
  int B = atoi(argv[1]), T = atoi(argv[2]), H = atoi(argv[3]), KVH = atoi(argv[4]);
  int hd = atoi(argv[5]), repeats = argc > 6 ? atoi(argv[6]) : 7;
  if (B < 1 || T < 1 || H < 1 || KVH < 1 || H % KVH || hd < 1) {
    fprintf(stderr, "bench_attn: bad shape\n");
    return 2;
  }
  if (repeats < 1 || repeats > 100) repeats = 7;
  const zt_backend *be = zt_backend_cpu();
  size_t N = (size_t)B * T, rs = (size_t)(H + 2 * KVH) * hd, os = (size_t)H * hd;
  size_t saved = (size_t)B * H * T; /* lse */
  float *qkv = be->alloc(ZT_MEM_DEVICE, N * rs * sizeof(float)), *dqkv = be->alloc(ZT_MEM_DEVICE, N * rs * sizeof(float));
  float *out = be->alloc(ZT_MEM_DEVICE, N * os * sizeof(float)), *dout = be->alloc(ZT_MEM_DEVICE, N * os * sizeof(float));
  float *lse = be->alloc(ZT_MEM_DEVICE, saved * sizeof(float));
  zt_stream *st = be->stream_new();
  if (!qkv || !dqkv || !out || !dout || !lse || !st) {
    fprintf(stderr, "bench_attn: out of memory\n");
    return 1;
  }
  uint64_t kq = zt_rng_key(1, "bench.qkv"), ko = zt_rng_key(1, "bench.dout");
  for (size_t i = 0; i < N * rs; i++) qkv[i] = (float)zt_rng_normal(kq, i);
  for (size_t i = 0; i < N * os; i++) dout[i] = (float)zt_rng_normal(ko, i);

  double fwd[100], bwd[100];
  for (int r = -1; r < repeats; r++) {
    double t0 = zt_timer_now();
    be->attn_fwd(st, ZT_F32, out, lse, qkv, B, T, H, KVH, hd);
    double t1 = zt_timer_now();
    be->attn_bwd(st, ZT_F32, dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
    double t2 = zt_timer_now();
    if (r >= 0) fwd[r] = t1 - t0, bwd[r] = t2 - t1;
  }
  printf("{\"B\": %d, \"T\": %d, \"H\": %d, \"KVH\": %d, \"hd\": %d, \"threads\": %d, ", B, T, H,
         KVH, hd, omp_get_max_threads());
  print_times("fwd_s", fwd, repeats);
  print_times("bwd_s", bwd, repeats);
  double mf = median(fwd, repeats), mb = median(bwd, repeats);
  printf("\"fwd_median\": %.6f, \"bwd_median\": %.6f, \"saved_bytes\": %zu}\n", mf, mb,
         saved * sizeof(float));
  be->free(ZT_MEM_DEVICE, qkv), be->free(ZT_MEM_DEVICE, dqkv), be->free(ZT_MEM_DEVICE, out), be->free(ZT_MEM_DEVICE, dout), be->free(ZT_MEM_DEVICE, lse);
  be->stream_free(st);
  return 0;
}
