/* rss: this process's resident memory as the kernel counts it
 * (/proc/self/status), for the measured side of the memory planner: the
 * resident set now, its high-water mark, and a reset of that mark (so a
 * peak counts only what came after a moment: the "empty process"). */
#ifndef ZT_RSS_H
#define ZT_RSS_H

#include <stdint.h>

/* VmRSS and VmHWM in bytes (-1 where the system does not say). */
void zt_rss_read(int64_t *rss, int64_t *hwm);

/* Sets the high-water mark to the resident set now (Linux clear_refs 5);
 * 0, or -1 where the system refuses (the mark then counts from the start). */
int zt_rss_reset_peak(void);

#endif
