/* ztrain report: see ztrain_report.h. This file reads the metrics and runs
 * the command; ztrain_report_html.c writes the page. */
#include "src/cli/ztrain_report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The key of each column read from a step line; "a.b" is key b of the
 * object under key a. The order is the enum's. */
static const char *const col_key[ZT_RR_MEM_TOTAL] = {
    "step", "loss", "lr", "grad_norm", "tokens", "ms", "tok_s", "mfu", "state_bytes",
    "buffer_bytes", "act_bytes", "scratch_bytes", "bytes.dp", "bytes.tp", "bubble.measured",
    "bubble.simulated", "loss_scale"};

void zt_runreport_free(zt_runreport *r) {
  free(r->path);
  for (int c = 0; c < ZT_RR_NCOL; c++) free(r->col[c]);
  free(r->skipped_step);
  free(r->val_step);
  free(r->val_loss);
  memset(r, 0, sizeof *r);
}

/* Makes room for one more element in arrays of *cap doubles holding n. */
static int grow(double **arrays[], int narrays, size_t n, size_t *cap) {
  if (n < *cap) return 0;
  size_t c = *cap ? 2 * *cap : 256;
  for (int i = 0; i < narrays; i++) {
    double *p = realloc(*arrays[i], c * sizeof *p);
    if (!p) return -1;
    *arrays[i] = p;
  }
  *cap = c;
  return 0;
}

/* The value of key (a.b: nested) in o: NULL when absent. */
static json_t *lookup(json_t *o, const char *key) {
  const char *dot = strchr(key, '.');
  if (!dot) return json_object_get(o, key);
  char head[32];
  snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
  json_t *sub = json_object_get(o, head);
  if (!sub || json_is_null(sub)) return sub;
  /* anything else where the object belongs: its keys are "not a number"
   * (json_true is a value number() refuses) */
  return json_is_object(sub) ? json_object_get(sub, dot + 1) : json_true();
}

/* *out: v's number, NaN for null; -1 when v is something else. */
static int number(json_t *v, double *out) {
  if (json_is_number(v)) *out = json_number_value(v);
  else if (json_is_null(v)) *out = NAN;
  else return -1;
  return 0;
}

static int read_line(zt_runreport *r, json_t *o, const char *path, size_t line, zt_err *e) {
  json_t *step = json_object_get(o, "step"), *val = json_object_get(o, "val_loss");
  if (!step) { /* a kind of line this reader does not know: left for newer readers */
    r->ignored++;
    return ZT_OK;
  }
  if (!json_is_number(step))
    return zt_err_set(e, ZT_EINPUT, "%s line %zu: \"step\" is not a number", path, line);
  if (val) {
    if (grow((double **[]){&r->val_step, &r->val_loss}, 2, r->nval, &r->val_cap))
      return zt_err_set(e, ZT_ERUNTIME, "out of memory");
    r->val_step[r->nval] = json_number_value(step);
    if (number(val, &r->val_loss[r->nval]))
      return zt_err_set(e, ZT_EINPUT, "%s line %zu: \"val_loss\" is not a number", path, line);
    r->nval++;
    return ZT_OK;
  }
  double **cols[ZT_RR_NCOL + 1];
  for (int c = 0; c < ZT_RR_NCOL; c++) cols[c] = &r->col[c];
  cols[ZT_RR_NCOL] = &r->skipped_step;
  if (grow(cols, ZT_RR_NCOL + 1, r->n, &r->cap)) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int c = 0; c < ZT_RR_MEM_TOTAL; c++) {
    json_t *v = lookup(o, col_key[c]);
    r->col[c][r->n] = NAN;
    if (!v) continue;
    if (number(v, &r->col[c][r->n]))
      return zt_err_set(e, ZT_EINPUT, "%s line %zu: \"%s\" is not a number", path, line,
                        col_key[c]);
    r->present[c]++;
  }
  double *total = &r->col[ZT_RR_MEM_TOTAL][r->n];
  *total = NAN; /* no figure at all is no total, not a total of 0 */
  for (int c = ZT_RR_STATE; c <= ZT_RR_SCRATCH; c++)
    if (isfinite(r->col[c][r->n])) *total = (isfinite(*total) ? *total : 0) + r->col[c][r->n];
  if (json_is_true(json_object_get(o, "skipped")))
    r->skipped_step[r->nskipped++] = r->col[ZT_RR_STEP][r->n];
  r->n++;
  return ZT_OK;
}

/* path itself, or path/metrics.jsonl where path is a directory. */
static int metrics_path(const char *path, char **out, zt_err *e) {
  struct stat st;
  if (stat(path, &st))
    return zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", path, strerror(errno));
  size_t n = strlen(path) + sizeof "/metrics.jsonl";
  if (!(*out = malloc(n))) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (!S_ISDIR(st.st_mode)) {
    memcpy(*out, path, strlen(path) + 1);
    return ZT_OK;
  }
  snprintf(*out, n, "%s/metrics.jsonl", path);
  if (!stat(*out, &st)) return ZT_OK;
  free(*out);
  *out = NULL;
  return zt_err_set(e, ZT_EINPUT, "%s is a directory without metrics.jsonl: a run directory is "
                    "the one a run's --metrics DIR/metrics.jsonl wrote into", path);
}

int zt_runreport_read(const char *path, zt_runreport *r, zt_err *e) {
  memset(r, 0, sizeof *r);
  char *mp = NULL, *buf = NULL;
  size_t bufcap = 0;
  int rc = metrics_path(path, &mp, e);
  if (rc) return rc;
  FILE *f = fopen(mp, "r");
  if (!f) {
    rc = zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", mp, strerror(errno));
    free(mp);
    return rc;
  }
  ssize_t len;
  while (!rc && (len = getline(&buf, &bufcap, f)) >= 0) {
    r->lines++;
    int complete = len > 0 && buf[len - 1] == '\n';
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
    if (!len) continue; /* an old writer left empty lines for non-finite values */
    json_error_t jerr;
    json_t *o = json_loadb(buf, (size_t)len, 0, &jerr);
    if (!o && !complete) { /* the last line, cut short: the run is writing or died writing */
      r->truncated = 1;
      break;
    }
    if (!o)
      rc = zt_err_set(e, ZT_EINPUT, "%s line %zu: not JSON (%s): metrics are JSON Lines, one "
                      "object a line, as --metrics writes them", mp, r->lines, jerr.text);
    else if (!json_is_object(o))
      rc = zt_err_set(e, ZT_EINPUT, "%s line %zu: not a JSON object", mp, r->lines);
    else
      rc = read_line(r, o, mp, r->lines, e);
    json_decref(o);
  }
  if (!rc && ferror(f)) rc = zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", mp, strerror(errno));
  if (!rc && !r->n)
    rc = zt_err_set(e, ZT_EINPUT, "%s has no step lines (%zu line%s read): nothing to draw", mp,
                    r->lines, r->lines == 1 ? "" : "s");
  fclose(f);
  free(buf);
  r->path = mp;
  if (rc) zt_runreport_free(r);
  return rc;
}

static const char report_usage[] =
    "Usage: ztrain report RUN_DIR|METRICS.jsonl [-o REPORT.html] [--log-loss]\n"
    "\n"
    "Draws a run's metrics (ztrain --metrics) as one HTML page of SVG plots: loss\n"
    "and validation loss, learning rate, gradient norm, tokens/s, MFU, memory,\n"
    "pipeline bubble, traffic and loss scale over steps, under a summary table.\n"
    "The page needs no network, script or font download. RUN_DIR is a directory\n"
    "holding metrics.jsonl (--metrics RUN_DIR/metrics.jsonl).\n"
    "\n"
    "  -o PATH      the page (default: report.html beside the metrics)\n"
    "  --log-loss   the loss on a log scale\n";

/* out: report.html in the directory of the metrics or the run directory. */
static char *default_out(const char *in) {
  struct stat st;
  int dir = !stat(in, &st) && S_ISDIR(st.st_mode);
  const char *slash = strrchr(in, '/');
  size_t keep = dir ? strlen(in) : slash ? (size_t)(slash - in) : 0;
  char *out = malloc(keep + sizeof "/report.html");
  if (out) snprintf(out, keep + sizeof "/report.html", "%.*s%sreport.html", (int)keep, in,
                    dir || slash ? "/" : "");
  return out;
}

int zt_runreport_main(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  int log_loss = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      fputs(report_usage, stdout);
      return 0;
    } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
      out = argv[++i];
    } else if (!strcmp(argv[i], "--log-loss")) {
      log_loss = 1;
    } else if (argv[i][0] == '-' || in) {
      fprintf(stderr, "ztrain report: error: unexpected argument '%s'\n%s", argv[i], report_usage);
      return ZT_EINPUT;
    } else {
      in = argv[i];
    }
  }
  if (!in) {
    fprintf(stderr, "ztrain report: error: no metrics given\n%s", report_usage);
    return ZT_EINPUT;
  }
  zt_err e = {0};
  zt_runreport r;
  char *def = out ? NULL : default_out(in);
  if (!out && !(out = def)) {
    fprintf(stderr, "ztrain report: error: out of memory\n");
    return ZT_ERUNTIME;
  }
  int rc = zt_runreport_read(in, &r, &e), nplots = 0;
  struct stat si, so;
  if (!rc && !stat(out, &so) && S_ISDIR(so.st_mode))
    rc = zt_err_set(&e, ZT_EINPUT, "-o %s is a directory; give the page's file name", out);
  if (!rc && !stat(out, &so) && !stat(r.path, &si) && si.st_dev == so.st_dev &&
      si.st_ino == so.st_ino)
    rc = zt_err_set(&e, ZT_EINPUT, "-o %s is the metrics file itself", out);
  if (!rc) rc = zt_runreport_write(&r, out, log_loss, &nplots, &e);
  if (!rc) {
    if (r.truncated)
      fprintf(stderr, "ztrain report: warning: the last line of %s was cut short (a run still "
              "writing, or one that died while writing): left out\n", in);
    printf("ztrain report: wrote %s: %zu steps, %zu evaluations, %d plots\n", out, r.n, r.nval,
           nplots);
  } else {
    fprintf(stderr, "ztrain report: error: %s\n", e.msg);
  }
  zt_runreport_free(&r);
  free(def);
  return rc;
}
