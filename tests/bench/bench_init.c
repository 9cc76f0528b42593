/* bench_init: weight initialisation alone, for tests/bench/bench_startup.py.
 *
 *   bench_init VOCAB SEQ DIM LAYERS HEADS [REPEATS]
 *
 * Builds a gpt model (tied head) as ztrain does at tp = 1 in one process
 * (the flat buffer is allocated and zeroed first, so the timing is the
 * generator and the copy, not first-touch page faults), then
 * times zt_model_init_weights REPEATS times (default 5) with whatever
 * OMP_NUM_THREADS says. Prints one JSON line:
 *   {"numel": N, "threads": T, "s": [...], "s_median": S, "elements_per_s": N / S}
 * A benchmark, not a test: it checks nothing. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "src/core/timer.h"
#include "src/model/model.h"
#include "tests/bench/median.h"

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: bench_init VOCAB SEQ DIM LAYERS HEADS [REPEATS]\n");
    return 2;
  }
  zt_model_cfg c = {.arch = ZT_ARCH_GPT, .vocab = atoi(argv[1]), .seq = atoi(argv[2]),
                    .dim = atoi(argv[3]), .layers = atoi(argv[4]), .heads = atoi(argv[5]),
                    .norm_eps = 1e-5f, .rope_theta = 10000.0f, .tied = 1};
  c.kv_heads = c.heads;
  c.ffn_dim = 4 * c.dim;
  int repeats = argc > 6 ? atoi(argv[6]) : 5;
  if (repeats < 1 || repeats > 100) repeats = 5;
  zt_model m;
  zt_err e = {0};
  if (zt_model_cfg_check(&c, &e) || zt_model_init(&m, &c, zt_backend_cpu(), 1, NULL, NULL, &e)) {
    fprintf(stderr, "bench_init: %s\n", e.msg);
    return 1;
  }
  int64_t numel = 0;
  for (int i = 0; i < m.n_params; i++)
    if (m.params[i].here) numel += m.params[i].t.numel;
  float *w = zt_backend_cpu()->alloc(ZT_MEM_DEVICE, (size_t)(m.numel ? m.numel : 1) * sizeof *w);
  if (!w) {
    fprintf(stderr, "bench_init: out of memory\n");
    return 1;
  }
  double s[100];
  for (int r = 0; r < repeats; r++) {
    double t0 = zt_timer_now();
    if (zt_model_init_weights(&m, 1234 + (uint64_t)r, w, 0, m.numel, &e)) {
      fprintf(stderr, "bench_init: %s\n", e.msg);
      return 1;
    }
    s[r] = zt_timer_now() - t0;
  }
  printf("{\"numel\": %lld, \"threads\": %d, \"s\": [", (long long)numel, omp_get_max_threads());
  for (int r = 0; r < repeats; r++) printf("%s%.6f", r ? ", " : "", s[r]);
  double med = median(s, repeats);
  printf("], \"s_median\": %.6f, \"elements_per_s\": %.4g}\n", med, (double)numel / med);
  zt_backend_cpu()->free(ZT_MEM_DEVICE, w);
  zt_model_free(&m);
  return 0;
}
