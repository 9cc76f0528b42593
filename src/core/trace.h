/* trace: a timeline of what this process did, written in Chrome's
 * trace-event format (JSON; Perfetto and chrome://tracing open it). While
 * recording is on, the pipeline executor adds one slice per action and
 * comm one per collective or transfer wait; each rank writes its part and
 * one rank merges the parts into one file, a track per rank. The sink is
 * per process, like a log: every layer can record without being handed a
 * context. */
#ifndef ZT_TRACE_H
#define ZT_TRACE_H

#include "src/core/err.h"

/* Starts recording for track `pid` (the rank), named `label`. */
int zt_trace_start(int pid, const char *label, zt_err *e);
int zt_trace_on(void);
/* One slice [t0, t1] (zt_timer_now seconds): category, name, an optional
 * group (NULL) and two integer arguments named a_name/b_name (NULL: none).
 * Names must be string literals or outlive the trace; group is copied. */
void zt_trace_slice(const char *cat, const char *name, const char *group, double t0, double t1,
                    const char *a_name, long long a, const char *b_name, long long b);
/* Writes this process's events to `path` (its part of the trace), times
 * relative to `origin`, then stops recording and frees them. */
int zt_trace_write_part(const char *path, double origin, zt_err *e);
/* Joins parts[0..n) into one trace file at `path` (temporary name, then
 * rename) and removes the parts. */
int zt_trace_merge(const char *path, char *const *parts, int n, zt_err *e);

#endif
