/* timer: monotonic wall-clock time for step timing and ETA. */
#ifndef ZT_TIMER_H
#define ZT_TIMER_H

/* Seconds since an arbitrary fixed point, monotonic. */
double zt_timer_now(void);

#endif
