/* rss: see rss.h. */
#include "src/core/rss.h"

#include <stdio.h>
#include <string.h>

void zt_rss_read(int64_t *rss, int64_t *hwm) {
  *rss = *hwm = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return;
  char line[256];
  long long kb;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) *rss = kb * 1024;
    if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) *hwm = kb * 1024;
  }
  fclose(f);
}

int zt_rss_reset_peak(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return -1;
  int ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}
