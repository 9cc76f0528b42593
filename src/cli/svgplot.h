/* svgplot: plots of series over training steps as inline SVG, for the page
 * `ztrain report` writes. Lines, points and tick marks on one pair of axes
 * with ticks, grid, labels and a legend. No script, no external font or
 * stylesheet (generic font families only): the page renders offline. */
#ifndef ZT_SVGPLOT_H
#define ZT_SVGPLOT_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
  ZT_SVGPLOT_LINE,   /* a polyline; a NaN y breaks it (a gap, never a zero) */
  ZT_SVGPLOT_POINTS, /* a circle at each finite point */
  ZT_SVGPLOT_TICKS   /* a mark at each x on the x axis; y is not read */
} zt_svgplot_kind;

typedef enum {
  ZT_SVGPLOT_PLAIN,  /* numbers, large ones as k/M/G */
  ZT_SVGPLOT_BYTES,  /* bytes, labelled in KiB/MiB/GiB/TiB */
  ZT_SVGPLOT_PERCENT /* fractions, labelled as percent */
} zt_svgplot_unit;

typedef struct zt_svgplot_series {
  const char *name;  /* legend text */
  const char *color; /* an SVG color, e.g. "#1f77b4" */
  zt_svgplot_kind kind;
  const double *x, *y;
  size_t n;
} zt_svgplot_series;

typedef struct zt_svgplot {
  const char *id;     /* the <svg> element's id, e.g. "plot-loss" */
  const char *title;
  const char *ylabel; /* with its unit, e.g. "loss (nats/token)" */
  zt_svgplot_unit unit;
  int log_y;          /* a log y axis; values <= 0 are then gaps */
  int y_from_zero;    /* the y axis starts at 0 (throughputs, memory) */
  const zt_svgplot_series *series;
  int nseries;
} zt_svgplot;

/* Writes p as one <svg> element. A series is drawn only where it has
 * finite values; with none anywhere the plot still gets its axes, so the
 * caller leaves such a plot out instead. Errors show in ferror(f). */
void zt_svgplot_write(FILE *f, const zt_svgplot *p);

/* s with &, <, > and " escaped for HTML text and attribute values. */
void zt_svgplot_escape(FILE *f, const char *s);

#endif
