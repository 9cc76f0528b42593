/* ztrain report's page: a summary table and one SVG plot per series group
 * (see ztrain_report.h), written to a temporary file and renamed into
 * place. A plot with no values is left out with a line that says why; it
 * is never drawn empty. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/cli/svgplot.h"
#include "src/cli/ztrain_report.h"

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#444444"};

/* A plot of step-line columns, and what to say where it has no values. */
typedef struct plot_spec {
  const char *id, *title, *ylabel;
  zt_svgplot_unit unit;
  int log_y, from_zero;
  int zero_is_none; /* all-zero columns have no data: no traffic is 0 bytes */
  int cols[5];      /* -1 ends the list */
  const char *names[5];
  const char *absent;
} plot_spec;

static const plot_spec specs[] = {
    {"plot-lr", "Learning rate", "learning rate", ZT_SVGPLOT_PLAIN, 0, 1, 0, {ZT_RR_LR, -1},
     {"lr"}, "No learning rate in the metrics."},
    {"plot-grad-norm", "Gradient norm", "global L2 norm (before clipping)", ZT_SVGPLOT_PLAIN, 0,
     1, 0, {ZT_RR_GRAD_NORM, -1}, {"grad norm"}, "No gradient norm in the metrics."},
    {"plot-tok-s", "Throughput", "tokens/s (all ranks)", ZT_SVGPLOT_PLAIN, 0, 1, 0,
     {ZT_RR_TOK_S, -1}, {"tokens/s"}, "No step times in the metrics."},
    {"plot-mfu", "Model FLOPs utilization", "MFU (% of peak)", ZT_SVGPLOT_PERCENT, 0, 1, 0,
     {ZT_RR_MFU, -1}, {"MFU"},
     "No MFU in the metrics: the run knew no peak FLOP rate, or a ztrain older than the "
     "\"mfu\" field wrote them."},
    {"plot-memory", "Memory held by rank 0", "bytes", ZT_SVGPLOT_BYTES, 0, 1, 0,
     {ZT_RR_STATE, ZT_RR_BUFFER, ZT_RR_ACT, ZT_RR_SCRATCH, ZT_RR_MEM_TOTAL},
     {"model states", "ZeRO buffers", "activations", "backend scratch", "total"},
     "No memory figures in the metrics."},
    {"plot-bubble", "Pipeline bubble", "idle share of the step", ZT_SVGPLOT_PERCENT, 0, 1, 0,
     {ZT_RR_BUBBLE, ZT_RR_BUBBLE_SIM, -1}, {"measured", "simulated"},
     "No pipeline bubble: the run has no pipeline (parallel.pp = 1)."},
    {"plot-traffic", "Traffic of rank 0 per step", "bytes moved", ZT_SVGPLOT_BYTES, 0, 1, 1,
     {ZT_RR_DP, ZT_RR_TP, -1}, {"data-parallel group", "tensor-parallel group"},
     "No traffic: one rank in each data- and tensor-parallel group."},
    {"plot-loss-scale", "Loss scale", "loss scale", ZT_SVGPLOT_PLAIN, 1, 0, 0,
     {ZT_RR_LOSS_SCALE, -1}, {"loss scale"},
     "No loss scale: the run does no loss scaling (train.loss_scale)."},
};

static int has_data(const double *v, size_t n, int zero_is_none) {
  for (size_t i = 0; i < n; i++)
    if (isfinite(v[i]) && (!zero_is_none || v[i] != 0)) return 1;
  return 0;
}

static void note(FILE *f, const char *id, const char *text) {
  fprintf(f, "<p class=\"note\" id=\"note-%s\">", id);
  zt_svgplot_escape(f, text);
  fputs("</p>\n", f);
}

/* One plot from a spec; returns 1 if drawn, 0 if noted as absent. */
static int write_spec(FILE *f, const zt_runreport *r, const plot_spec *s) {
  zt_svgplot_series ser[5];
  int n = 0;
  char missing[256] = "";
  for (int k = 0; k < 5 && s->cols[k] >= 0; k++) {
    const double *y = r->col[s->cols[k]];
    if (!has_data(y, r->n, s->zero_is_none)) {
      size_t len = strlen(missing);
      snprintf(missing + len, sizeof missing - len, "%s%s", len ? ", " : "", s->names[k]);
      continue;
    }
    ser[n] = (zt_svgplot_series){s->names[k], palette[k], ZT_SVGPLOT_LINE,
                                 r->col[ZT_RR_STEP], y, r->n};
    n++;
  }
  if (!n) {
    note(f, s->id, s->absent);
    return 0;
  }
  zt_svgplot p = {s->id, s->title, s->ylabel, s->unit, s->log_y, s->from_zero, ser, n};
  zt_svgplot_write(f, &p);
  if (missing[0]) {
    char text[320];
    snprintf(text, sizeof text, "Not drawn, no values: %s.", missing);
    note(f, s->id, text);
  }
  return 1;
}

/* An exponential moving average of y over about `window` values,
 * debiased at the start (as TensorBoard's smoothing), NaN where y is. */
static void smooth(const double *y, size_t n, double window, double *out) {
  double beta = 1 - 1 / window, s = 0, c = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(y[i])) {
      out[i] = NAN;
      continue;
    }
    s = beta * s + (1 - beta) * y[i], c = beta * c + (1 - beta);
    out[i] = s / c;
  }
}

/* The loss plot: training loss as a line, validation loss as points,
 * skipped updates as marks on the step axis. From 50 steps on the loss is
 * noisy enough to bury its trend: a smoothed line goes over a paler raw one. */
static int write_loss(FILE *f, const zt_runreport *r, int log_loss) {
  zt_svgplot_series ser[4];
  int n = 0;
  double window = r->n / 50 > 10 ? (double)(r->n / 50) : 10;
  double *ema = r->n >= 50 ? malloc(r->n * sizeof *ema) : NULL; /* without memory: no EMA */
  char ema_name[64];
  if (has_data(r->col[ZT_RR_LOSS], r->n, 0)) {
    ser[n++] = (zt_svgplot_series){"training loss", ema ? "#a6c8e4" : palette[0], ZT_SVGPLOT_LINE,
                                   r->col[ZT_RR_STEP], r->col[ZT_RR_LOSS], r->n};
    if (ema) {
      smooth(r->col[ZT_RR_LOSS], r->n, window, ema);
      snprintf(ema_name, sizeof ema_name, "smoothed (EMA, %.0f steps)", window);
      ser[n++] = (zt_svgplot_series){ema_name, palette[0], ZT_SVGPLOT_LINE, r->col[ZT_RR_STEP],
                                     ema, r->n};
    }
  }
  if (has_data(r->val_loss, r->nval, 0))
    ser[n++] = (zt_svgplot_series){"validation loss", palette[1], ZT_SVGPLOT_POINTS,
                                   r->val_step, r->val_loss, r->nval};
  int curves = n;
  if (r->nskipped)
    ser[n++] = (zt_svgplot_series){"skipped update", "#e377c2", ZT_SVGPLOT_TICKS,
                                   r->skipped_step, r->skipped_step, r->nskipped};
  if (!curves) {
    note(f, "plot-loss", "No loss: every loss in the metrics is null (not finite).");
    free(ema);
    return 0;
  }
  zt_svgplot p = {"plot-loss", "Loss", "loss (nats/token)", ZT_SVGPLOT_PLAIN, log_loss, 0, ser, n};
  zt_svgplot_write(f, &p);
  free(ema);
  if (!r->nval)
    note(f, "plot-loss",
         "No validation loss: the run did not evaluate (train.eval_every, data.val).");
  return 1;
}

/* The table's figures. */
static void row(FILE *f, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row(FILE *f, const char *label, const char *fmt, ...) {
  char v[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  fprintf(f, "<tr><th>%s</th><td>", label);
  zt_svgplot_escape(f, v);
  fputs("</td></tr>\n", f);
}

static const char *bytes_str(char *buf, size_t n, double b) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (k < 4 && b >= 1024) b /= 1024, k++;
  snprintf(buf, n, k ? "%.2f %s" : "%.0f %s", b, u[k]);
  return buf;
}

static const char *count_str(char *buf, size_t n, double v) {
  if (v >= 1e9) snprintf(buf, n, "%.2fG", v / 1e9);
  else if (v >= 1e6) snprintf(buf, n, "%.2fM", v / 1e6);
  else if (v >= 1e4) snprintf(buf, n, "%.1fk", v / 1e3);
  else snprintf(buf, n, "%.0f", v);
  return buf;
}

/* The index of the last finite value (how 0), or of the first lowest
 * (how < 0) or highest (how > 0); -1 where there is none. */
static long pick(const double *v, size_t n, int how) {
  long at = -1;
  for (size_t i = 0; i < n; i++)
    if (isfinite(v[i]) && (at < 0 || !how || (how < 0 ? v[i] < v[at] : v[i] > v[at]))) at = (long)i;
  return at;
}

/* The time-weighted mean of column c over the steps where both it and the
 * step time are known; NaN where none. */
static double time_mean(const zt_runreport *r, int c) {
  double s = 0, t = 0;
  for (size_t i = 0; i < r->n; i++)
    if (isfinite(r->col[c][i]) && isfinite(r->col[ZT_RR_MS][i]) && r->col[ZT_RR_MS][i] > 0)
      s += r->col[c][i] * r->col[ZT_RR_MS][i], t += r->col[ZT_RR_MS][i];
  return t > 0 ? s / t : NAN;
}

static void write_summary(FILE *f, const zt_runreport *r) {
  const double *step = r->col[ZT_RR_STEP];
  char a[64], b[64], c[64], d[64], sc[64];
  fputs("<table id=\"summary\">\n", f);
  row(f, "metrics", "%s", r->path);
  row(f, "steps", "%zu (step %.0f to %.0f)%s", r->n, step[0], step[r->n - 1],
      r->truncated ? "; the last line was cut short and is left out" : "");
  if (r->nskipped)
    row(f, "skipped updates", "%zu (non-finite loss or gradients; loss-scale overflows)",
        r->nskipped);
  double tokens = 0, ms = 0;
  for (size_t i = 0; i < r->n; i++) {
    if (isfinite(r->col[ZT_RR_TOKENS][i])) tokens += r->col[ZT_RR_TOKENS][i];
    if (isfinite(r->col[ZT_RR_MS][i])) ms += r->col[ZT_RR_MS][i];
  }
  row(f, "tokens", "%s in %.1f s of steps", count_str(a, sizeof a, tokens), ms / 1e3);
  long i = pick(r->col[ZT_RR_LOSS], r->n, 0);
  if (i >= 0) row(f, "final loss", "%.4f (step %.0f)", r->col[ZT_RR_LOSS][i], step[i]);
  long best = pick(r->val_loss, r->nval, -1), last = pick(r->val_loss, r->nval, 0);
  if (best >= 0 && best == last)
    row(f, "best validation loss", "%.4f (step %.0f, the last evaluation)", r->val_loss[best],
        r->val_step[best]);
  else if (best >= 0)
    row(f, "best validation loss", "%.4f (step %.0f); last %.4f (step %.0f)", r->val_loss[best],
        r->val_step[best], r->val_loss[last], r->val_step[last]);
  if (ms > 0 && tokens > 0)
    row(f, "mean tokens/s", "%s", count_str(a, sizeof a, tokens / (ms / 1e3)));
  double mfu = time_mean(r, ZT_RR_MFU);
  if (isfinite(mfu)) row(f, "mean MFU", "%.1f%%", 100 * mfu);
  i = pick(r->col[ZT_RR_MEM_TOTAL], r->n, 1);
  if (i >= 0)
    row(f, "peak memory (rank 0)", "%s at step %.0f: states %s, buffers %s, activations %s, "
        "scratch %s", bytes_str(a, sizeof a, r->col[ZT_RR_MEM_TOTAL][i]), step[i],
        bytes_str(b, sizeof b, r->col[ZT_RR_STATE][i]),
        bytes_str(c, sizeof c, r->col[ZT_RR_BUFFER][i]),
        bytes_str(d, sizeof d, r->col[ZT_RR_ACT][i]),
        bytes_str(sc, sizeof sc, r->col[ZT_RR_SCRATCH][i]));
  double bub = time_mean(r, ZT_RR_BUBBLE), sim = time_mean(r, ZT_RR_BUBBLE_SIM);
  if (isfinite(bub)) row(f, "mean pipeline bubble", "%.1f%% measured, %.1f%% simulated",
                         100 * bub, 100 * sim);
  i = pick(r->col[ZT_RR_LOSS_SCALE], r->n, 0);
  if (i >= 0) row(f, "final loss scale", "%.9g", r->col[ZT_RR_LOSS_SCALE][i]);
  if (r->tok_s_derived)
    row(f, "tokens/s", "%s", "tokens / ms of each step (no tok_s in these metrics)");
  if (r->ignored) row(f, "other lines", "%zu without a step, left out", r->ignored);
  fputs("</table>\n", f);
}

static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<meta name=\"generator\" content=\"ztrain report\">\n<title>ztrain report: ";
static const char page_style[] =
    "</title>\n<style>\n"
    "body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }\n"
    "table { border-collapse: collapse; margin-bottom: 16px; }\n"
    "th, td { text-align: left; padding: 3px 16px 3px 0; vertical-align: top; }\n"
    "th { font-weight: 600; color: #555; white-space: nowrap; }\n"
    "svg.plot { display: block; margin: 16px 0 4px 0; }\n"
    ".note { color: #777; font-style: italic; margin: 4px 0 12px 0; }\n"
    "</style>\n</head>\n<body>\n<h1>ztrain run report</h1>\n";

static int write_page(FILE *f, const zt_runreport *r, int log_loss) {
  fputs(page_head, f);
  zt_svgplot_escape(f, r->path);
  fputs(page_style, f);
  write_summary(f, r);
  int n = write_loss(f, r, log_loss);
  for (size_t k = 0; k < sizeof specs / sizeof *specs; k++) n += write_spec(f, r, &specs[k]);
  fputs("</body>\n</html>\n", f);
  return n;
}

int zt_runreport_write(const zt_runreport *r0, const char *out, int log_loss, int *nplots,
                       zt_err *e) {
  zt_runreport r = *r0;
  /* tokens/s from tokens and step time where the metrics predate tok_s */
  double *derived = NULL;
  if (!r.present[ZT_RR_TOK_S] && r.present[ZT_RR_MS]) {
    if (!(derived = malloc(r.n * sizeof *derived)))
      return zt_err_set(e, ZT_ERUNTIME, "out of memory");
    for (size_t i = 0; i < r.n; i++)
      derived[i] = r.col[ZT_RR_TOKENS][i] / (r.col[ZT_RR_MS][i] * 1e-3);
    r.col[ZT_RR_TOK_S] = derived;
    r.tok_s_derived = 1;
  }
  size_t n = strlen(out) + sizeof ".XXXXXX";
  char *tmp = malloc(n);
  if (!tmp) {
    free(derived);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  snprintf(tmp, n, "%s.XXXXXX", out);
  int rc = ZT_OK, fd = mkstemp(tmp);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    rc = zt_err_set(e, ZT_EINPUT, "cannot write %s: %s", out, strerror(errno));
    if (fd >= 0) close(fd), unlink(tmp);
  } else {
    mode_t mask = umask(0); /* mkstemp's 0600 is for secrets; a page is not one */
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    *nplots = write_page(f, &r, log_loss);
    int bad = ferror(f);
    if (fclose(f) || bad || rename(tmp, out)) {
      rc = zt_err_set(e, ZT_ERUNTIME, "cannot write %s: %s", out, strerror(errno));
      unlink(tmp);
    }
  }
  free(tmp);
  free(derived);
  return rc;
}
