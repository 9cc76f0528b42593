/* ztrain report: a run's metrics (`--metrics`, JSON Lines) drawn as one
 * self-contained HTML page of SVG plots: loss and validation loss, learning
 * rate, gradient norm, tokens/s, MFU, memory, pipeline bubble, traffic and
 * loss scale over steps, under a table that sums the run up. */
#ifndef ZT_ZTRAIN_REPORT_H
#define ZT_ZTRAIN_REPORT_H

#include <stddef.h>

#include "src/core/err.h"

/* The columns of a step line; a key absent from a line or null in it reads
 * as NaN (a gap in its plot). */
enum {
  ZT_RR_STEP, ZT_RR_LOSS, ZT_RR_LR, ZT_RR_GRAD_NORM, ZT_RR_TOKENS, ZT_RR_MS, ZT_RR_TOK_S,
  ZT_RR_MFU, ZT_RR_STATE, ZT_RR_BUFFER, ZT_RR_ACT, ZT_RR_SCRATCH, ZT_RR_DP, ZT_RR_TP,
  ZT_RR_BUBBLE, ZT_RR_BUBBLE_SIM, ZT_RR_LOSS_SCALE,
  ZT_RR_MEM_TOTAL, /* computed: state + buffer + act + scratch */
  ZT_RR_NCOL
};

typedef struct zt_runreport {
  char *path;                  /* the file read: the metrics, or RUN_DIR/metrics.jsonl */
  size_t n, cap;               /* step lines */
  double *col[ZT_RR_NCOL];     /* n values each */
  size_t present[ZT_RR_NCOL];  /* lines that had the key (null included) */
  double *skipped_step;        /* the steps marked "skipped": true */
  size_t nskipped;
  double *val_step, *val_loss; /* evaluation lines */
  size_t nval, val_cap;
  int tok_s_derived;           /* tokens/s is tokens / ms (older metrics) */
  size_t lines, ignored;       /* lines read; of those, objects with no "step" */
  int truncated;               /* the last line was cut short and left out */
} zt_runreport;

/* Reads metrics from path: a metrics.jsonl or a run directory holding one.
 * Bad input (no such file, a line that is not a JSON object, a value that
 * is not a number, no step lines) is ZT_EINPUT with the file and line
 * named. Empty lines are skipped, and so is a last line that was cut short
 * (the run still writing, or killed while it wrote), with r->truncated set. */
int zt_runreport_read(const char *path, zt_runreport *r, zt_err *e);
void zt_runreport_free(zt_runreport *r);

/* Writes the page to out (through a temporary file renamed into place, so
 * that a failure leaves no partial page). Returns ZT_OK, or ZT_EINPUT where
 * out cannot be created, ZT_ERUNTIME where writing fails; *nplots gets the
 * plots drawn. */
int zt_runreport_write(const zt_runreport *r, const char *out, int log_loss, int *nplots,
                       zt_err *e);

/* `ztrain report ...`: argv[0] is "report". Returns the exit code. */
int zt_runreport_main(int argc, char **argv);

#endif
