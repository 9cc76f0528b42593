/* timer: see timer.h. */
#include "src/core/timer.h"

#include <time.h>

double zt_timer_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
