/* svgplot: see svgplot.h. */
#include "src/cli/svgplot.h"

#include <math.h>
#include <string.h>

/* The plot's box and its margins, in SVG user units (CSS pixels). */
enum { W = 900, H = 280, ML = 78, MR = 16, MT = 40, MB = 44 };
#define PW ((double)(W - ML - MR))
#define PH ((double)(H - MT - MB))

void zt_svgplot_escape(FILE *f, const char *s) {
  for (; *s; s++) switch (*s) {
      case '&': fputs("&amp;", f); break;
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '"': fputs("&quot;", f); break;
      default: fputc(*s, f);
    }
}

typedef struct axis {
  double lo, hi;  /* the axis' ends, in data units */
  int log;
  double scale;   /* labels show value / scale ... */
  const char *suffix; /* ... followed by this */
  double ticks[64];
  int nticks;
} axis;

static double axis_f(const axis *a, double v) { return a->log ? log10(v) : v; }

/* 1, 2 or 5 times a power of ten, the nearest above r. */
static double nice_step(double r) {
  double p = pow(10, floor(log10(r))), m = r / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* Labels in a unit that keeps them short: bytes in powers of 1024, other
 * numbers from 10^4 up in powers of 1000, fractions as percent. */
static void axis_unit(axis *a, zt_svgplot_unit u) {
  double m = fmax(fabs(a->lo), fabs(a->hi));
  static const char *const bytes[] = {" B", " KiB", " MiB", " GiB", " TiB"};
  static const char *const si[] = {"", "k", "M", "G", "T"};
  a->scale = 1, a->suffix = "";
  if (u == ZT_SVGPLOT_PERCENT) {
    a->scale = 0.01, a->suffix = "%";
    return;
  }
  double base = u == ZT_SVGPLOT_BYTES ? 1024 : 1000;
  int k = 0;
  while (k < 4 && m / a->scale >= (u == ZT_SVGPLOT_BYTES ? 1024 : 1e4)) a->scale *= base, k++;
  a->suffix = u == ZT_SVGPLOT_BYTES ? bytes[k] : si[k];
}

/* The axis' ends from the data's (lo <= hi, both finite) and its ticks: on
 * a linear axis multiples of a 1-2-5 step, ends rounded out to them and
 * given a margin; on a
 * log axis the ends padded a little and ticks at 1..9, 1-2-5 or 1 times the
 * powers of ten, whichever gives a few between them. */
static void axis_make(axis *a, double lo, double hi, int log_axis, zt_svgplot_unit u) {
  a->log = log_axis;
  a->nticks = 0;
  if (log_axis) {
    if (hi <= lo) lo /= 2, hi *= 2;
    double pad = pow(hi / lo, 0.04);
    a->lo = lo / pad, a->hi = hi * pad;
    axis_unit(a, u);
    static const double sets[3][9] = {{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 2, 5}, {1}};
    static const int set_n[3] = {9, 3, 1};
    for (int s = 0; s < 3; s++) {
      a->nticks = 0;
      for (double p = pow(10, floor(log10(a->lo))); p <= a->hi && a->nticks < 64; p *= 10)
        for (int i = 0; i < set_n[s] && a->nticks < 64; i++) {
          double t = sets[s][i] * p;
          if (t >= a->lo && t <= a->hi) a->ticks[a->nticks++] = t;
        }
      if (a->nticks <= 10) break;
    }
    return;
  }
  if (hi <= lo) {
    double d = lo == 0 ? 1 : fabs(lo) * 0.1;
    lo -= d, hi += d;
  }
  a->lo = lo, a->hi = hi;
  axis_unit(a, u);
  double step = nice_step((hi - lo) / a->scale / 5) * a->scale;
  a->lo = floor(lo / step) * step, a->hi = ceil(hi / step) * step;
  for (double t = a->lo; t <= a->hi + step * 1e-6 && a->nticks < 64; t += step)
    a->ticks[a->nticks++] = fabs(t) < step * 1e-9 ? 0 : t;
  /* a margin where the data reach an end, so that no curve (memory that
   * stays 0, the first step) hides in the frame */
  double pad = 0.03 * (a->hi - a->lo);
  if (lo - a->lo < pad) a->lo -= pad;
  if (a->hi - hi < pad) a->hi += pad;
}

static void fmt_tick(char *buf, size_t n, const axis *a, double v) {
  /* "0k" or "0 KiB" reads oddly; 0% does not */
  snprintf(buf, n, "%.4g%s", v / a->scale, v || a->scale < 1 ? a->suffix : "");
}

static double px(const axis *x, double v) { return ML + (v - x->lo) / (x->hi - x->lo) * PW; }

static double py(const axis *y, double v) {
  return MT + PH - (axis_f(y, v) - axis_f(y, y->lo)) / (axis_f(y, y->hi) - axis_f(y, y->lo)) * PH;
}

static int usable(const zt_svgplot *p, double v) { return isfinite(v) && (!p->log_y || v > 0); }

/* The path of a line series. Where several points fall in one pixel
 * column only their lowest and highest are kept, in their order: a
 * million-step run draws as fast as a short one and its spikes stay. */
typedef struct bucket {
  int col, n;
  double xmin, ymin, xmax, ymax; /* the lowest and highest point */
  int min_first;
  int drawn; /* points of the current piece of line written so far */
} bucket;

static void flush(FILE *f, bucket *b) {
  if (!b->n) return;
  double x1 = b->min_first ? b->xmin : b->xmax, y1 = b->min_first ? b->ymin : b->ymax;
  double x2 = b->min_first ? b->xmax : b->xmin, y2 = b->min_first ? b->ymax : b->ymin;
  fprintf(f, "%s%.1f,%.1f", b->drawn ? "L" : "M", x1, y1);
  b->drawn++;
  if (y2 != y1) fprintf(f, "L%.1f,%.1f", x2, y2), b->drawn++;
  b->n = 0;
}

/* Ends a piece of line; one of a single point gets a zero-length segment,
 * which its round cap draws as a dot. */
static void end_piece(FILE *f, bucket *b) {
  flush(f, b);
  if (b->drawn == 1) fputs("l0,0", f);
  b->drawn = 0;
}

static void write_line(FILE *f, const zt_svgplot *p, const zt_svgplot_series *s, const axis *x,
                       const axis *y) {
  fprintf(f, "<path class=\"line\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" "
             "stroke-linejoin=\"round\" stroke-linecap=\"round\" d=\"", s->color);
  bucket b = {0};
  for (size_t i = 0; i < s->n; i++) {
    /* a gap stops the line; so does a step back (metrics of a resumed run
     * appended to its first run's), which would otherwise draw a zigzag */
    if (!usable(p, s->y[i]) || !isfinite(s->x[i]) || (i && s->x[i] < s->x[i - 1])) {
      end_piece(f, &b);
      if (!usable(p, s->y[i]) || !isfinite(s->x[i])) continue;
    }
    double X = px(x, s->x[i]), Y = py(y, s->y[i]);
    int col = (int)floor(X);
    if (b.n && col != b.col) flush(f, &b);
    if (!b.n) {
      b = (bucket){col, 1, X, Y, X, Y, 1, b.drawn};
      continue;
    }
    b.n++;
    /* SVG's y grows downwards: the lowest value has the largest Y */
    if (Y > b.ymin) b.xmin = X, b.ymin = Y, b.min_first = 0;
    if (Y < b.ymax) b.xmax = X, b.ymax = Y, b.min_first = 1;
  }
  end_piece(f, &b);
  fputs("\"/>\n", f);
}

static void write_series(FILE *f, const zt_svgplot *p, const zt_svgplot_series *s,
                         const axis *x, const axis *y) {
  fputs("<g class=\"series\" data-name=\"", f);
  zt_svgplot_escape(f, s->name);
  fputs("\">\n", f);
  if (s->kind == ZT_SVGPLOT_LINE) write_line(f, p, s, x, y);
  /* many points would bury the line under them: smaller, no outline */
  int many = s->n > 40;
  if (s->kind == ZT_SVGPLOT_POINTS)
    for (size_t i = 0; i < s->n; i++)
      if (usable(p, s->y[i]) && isfinite(s->x[i]))
        fprintf(f, "<circle class=\"point\" cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\"%s/>\n",
                px(x, s->x[i]), py(y, s->y[i]), many ? "2" : "3.5", s->color,
                many ? "" : " stroke=\"#fff\"");
  if (s->kind == ZT_SVGPLOT_TICKS) {
    fprintf(f, "<path class=\"ticks\" stroke=\"%s\" stroke-width=\"2\" d=\"", s->color);
    for (size_t i = 0; i < s->n; i++)
      if (isfinite(s->x[i])) fprintf(f, "M%.1f,%d v-9", px(x, s->x[i]), MT + (int)PH);
    fputs("\"/>\n", f);
  }
  fputs("</g>\n", f);
}

/* The legend, right-aligned in the title's row; widths are estimated (no
 * script measures text), generously, so that entries do not overlap. */
static void write_legend(FILE *f, const zt_svgplot *p) {
  double w = 0;
  for (int i = 0; i < p->nseries; i++) w += 22 + 7.0 * (double)strlen(p->series[i].name) + 14;
  double at = W - MR - w;
  for (int i = 0; i < p->nseries; i++) {
    const zt_svgplot_series *s = &p->series[i];
    if (s->kind == ZT_SVGPLOT_POINTS)
      fprintf(f, "<circle cx=\"%.1f\" cy=\"14\" r=\"3.5\" fill=\"%s\"/>", at + 8, s->color);
    else
      fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"16\" height=\"%d\" fill=\"%s\"/>", at,
              s->kind == ZT_SVGPLOT_TICKS ? 8 : 12, s->kind == ZT_SVGPLOT_TICKS ? 12 : 3, s->color);
    fprintf(f, "<text x=\"%.1f\" y=\"18\">", at + 22);
    zt_svgplot_escape(f, s->name);
    fputs("</text>\n", f);
    at += 22 + 7.0 * (double)strlen(s->name) + 14;
  }
}

void zt_svgplot_write(FILE *f, const zt_svgplot *p) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (int k = 0; k < p->nseries; k++) {
    const zt_svgplot_series *s = &p->series[k];
    for (size_t i = 0; i < s->n; i++) {
      if (!isfinite(s->x[i])) continue;
      x0 = fmin(x0, s->x[i]), x1 = fmax(x1, s->x[i]);
      if (s->kind != ZT_SVGPLOT_TICKS && usable(p, s->y[i]))
        y0 = fmin(y0, s->y[i]), y1 = fmax(y1, s->y[i]);
    }
  }
  if (x0 > x1) x0 = 0, x1 = 1;
  if (y0 > y1) y0 = p->log_y ? 1 : 0, y1 = p->log_y ? 10 : 1;
  if (x0 == x1) x0 -= 1, x1 += 1; /* one step: it sits in the middle */
  if (p->y_from_zero && !p->log_y && y0 > 0) y0 = 0;
  axis x, y;
  axis_make(&x, x0, x1, 0, ZT_SVGPLOT_PLAIN);
  axis_make(&y, y0, y1, p->log_y, p->unit);

  fprintf(f, "<svg id=\"%s\" class=\"plot\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
             "role=\"img\" aria-label=\"", p->id, W, H, W, H);
  zt_svgplot_escape(f, p->title);
  fputs("\" font-family=\"sans-serif\" font-size=\"12\">\n", f);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", W, H);
  fprintf(f, "<text x=\"%d\" y=\"18\" font-size=\"14\" font-weight=\"bold\">", ML);
  zt_svgplot_escape(f, p->title);
  fputs("</text>\n", f);
  write_legend(f, p);

  char lab[48];
  fputs("<g class=\"grid\" stroke=\"#e3e3e3\">\n", f);
  for (int i = 0; i < y.nticks; i++)
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"/>\n", ML, W - MR,
            py(&y, y.ticks[i]), py(&y, y.ticks[i]));
  for (int i = 0; i < x.nticks; i++)
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>\n", px(&x, x.ticks[i]),
            px(&x, x.ticks[i]), MT, H - MB);
  fputs("</g>\n<g class=\"ylabels\" text-anchor=\"end\">\n", f);
  for (int i = 0; i < y.nticks; i++) {
    fmt_tick(lab, sizeof lab, &y, y.ticks[i]);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\">%s</text>\n", ML - 6, py(&y, y.ticks[i]) + 4, lab);
  }
  fputs("</g>\n<g class=\"xlabels\" text-anchor=\"middle\">\n", f);
  for (int i = 0; i < x.nticks; i++) {
    fmt_tick(lab, sizeof lab, &x, x.ticks[i]);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\">%s</text>\n", px(&x, x.ticks[i]), H - MB + 16, lab);
  }
  fputs("</g>\n", f);
  fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
             "stroke=\"#444\"/>\n", ML, MT, W - ML - MR, H - MT - MB);
  fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">step</text>\n", ML + PW / 2, H - 8);
  fprintf(f, "<text transform=\"translate(16,%.1f) rotate(-90)\" text-anchor=\"middle\">",
          MT + PH / 2);
  zt_svgplot_escape(f, p->ylabel);
  if (p->log_y) fputs(" (log scale)", f);
  fputs("</text>\n", f);
  for (int k = 0; k < p->nseries; k++) write_series(f, p, &p->series[k], &x, &y);
  fputs("</svg>\n", f);
}
