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

/* The GEMM rate against what the CPU's vector units allow: the banner's
 * GEMM line and MFU's denominator. */
#define ZT_PEAK_TIMINGS 5 /* SGEMMs the start-up probe times */

typedef struct zt_peak {
  double measured;    /* GFLOP/s of the start-up SGEMM probe, its best
                       * timing; 0 = not run */
  double median, slowest; /* and its other timings: their spread */
  int timings;
  double cpu;         /* threads x clock x FLOPs per cycle; 0 = unknown */
  int threads, cores; /* the probe's threads; cores this rank may count as its
                       * own (zt_report_rank_cores) */
  double ghz;         /* the clock in cpu, and where it came from */
  const char *clock_from;
  int flops_per_cycle;
  double cpu_share;   /* CPU time the probe got / (wall time x threads) */
  char warning[640];  /* "" or: the rate is far below cpu, and why */
} zt_peak;

typedef struct zt_report {
  int active;         /* this rank prints */
  FILE *metrics;      /* JSON Lines, or NULL */
  int tty;            /* stderr is a terminal: draw the progress line */
  int log_every;
  int64_t total_steps, first_step;
  double flops_per_token, peak_flops;
  double t_start, tokens_done;
  zt_peak gemm;       /* set by the caller after zt_report_open */
  int64_t scratch_bytes; /* backend scratch the passes keep (zt_backend.gemm_scratch),
                          * set by the caller after zt_report_open; every step
                          * reports it beside the step's own memory figures */
} zt_report;

int zt_report_open(zt_report *r, int active, const char *metrics_path,
                   int log_every, int64_t first_step, int64_t total_steps,
                   double flops_per_token, double peak_gflops, zt_err *e);
void zt_report_step(zt_report *r, const zt_step_stats *st);
void zt_report_eval(zt_report *r, int64_t step, double val_loss);
/* Each of n ranks' peak memory against its plan, m[3*rank ..]: the empty
 * process's resident set, the resident high-water mark (both bytes, < 0:
 * not measured) and the planned peak: one line per rank on stdout (the
 * metrics file stays one record per step: its readers count on it). */
void zt_report_memory(zt_report *r, int n, const double *m);
void zt_report_close(zt_report *r);

/* Times n_rates large SGEMMs on the backend (after one to warm up):
 * rates[] gets their GFLOP/s, slowest first; returns how many ran. */
int zt_report_measure_peak_gflops(const zt_backend *be, double *rates, int n_rates);

/* The cores this rank may count as its own: its CPU affinity divided
 * among the node's ranks that share it (at least 1). */
int zt_report_rank_cores(void);

/* The CPU's theoretical peak for this process's threads and, with
 * measure, the probe's rate and a warning when it is far below the peak. */
void zt_report_peak(const zt_backend *be, int measure, zt_peak *pk);

/* MFU's denominator: the theoretical peak, never below the measured rate
 * (so MFU cannot exceed 100%); the measured rate where the clock is
 * unknown. */
double zt_report_peak_gflops(const zt_peak *pk);

/* "GEMM: <path>, N GFLOP/s per rank measured, CPU peak P (...)" on out,
 * and the path's and the rate's warnings on stderr. */
void zt_report_print_gemm(const zt_peak *pk, FILE *out);

#endif
