/* median: the benchmarks' median of n timings (sorts s in place). */
#ifndef ZT_BENCH_MEDIAN_H
#define ZT_BENCH_MEDIAN_H

#include <stdlib.h>

static int zt_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *s, int n) {
  qsort(s, (size_t)n, sizeof *s, zt_cmp_double);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

#endif
