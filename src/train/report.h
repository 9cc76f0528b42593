/* report: what a person watches and what a program reads. On a terminal a
 * live progress line (step/total, loss, tokens/s, ETA) on stderr; every
 * log_every steps a plain line on stdout (loss, lr, grad norm, ms/step,
 * tokens/s, MFU); with a metrics path one JSON object per step (JSON Lines).
 * Only the rank that owns the report (rank 0) prints or writes. */
#ifndef ZT_REPORT_H
#define ZT_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/train/trainer.h"

typedef struct zt_report {
  int active;         /* this rank prints */
  FILE *metrics;      /* JSON Lines, or NULL */
  int tty;            /* stderr is a terminal: draw the progress line */
  int log_every;
  int64_t total_steps, first_step;
  double flops_per_token, peak_flops;
  double t_start, tokens_done;
} zt_report;

int zt_report_open(zt_report *r, int active, const char *metrics_path,
                   int log_every, int64_t first_step, int64_t total_steps,
                   double flops_per_token, double peak_gflops, zt_err *e);
void zt_report_step(zt_report *r, const zt_step_stats *st);
void zt_report_eval(zt_report *r, int64_t step, double val_loss);
void zt_report_close(zt_report *r);

/* Best of a few large SGEMMs on the backend, in GFLOP/s: the peak that MFU
 * is measured against when the script does not configure one. */
double zt_report_measure_peak_gflops(const zt_backend *be);

#endif
