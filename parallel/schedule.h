/* schedule: pipeline schedules as data, and their check before anything
 * runs. A schedule is one list of actions per stage (F: forward of a
 * micro-batch through one of the stage's chunks, B: its backward — only the
 * input gradient when the schedule has W actions —, W: the weight-gradient
 * part). Chunk c of stage s is virtual stage c*stages + s. The check
 * simulates all stages together with per-action costs: each stage runs its
 * list in order, an action starts when the stage is free and its inputs
 * exist (F needs the previous virtual stage's F of the same micro-batch, B
 * the next one's B, or this stage's F on the last virtual stage, W this
 * stage's B). It rejects lists that miss, repeat or misorder an action and
 * schedules that deadlock, naming the stage, the action and the step; it
 * reports the bubble fraction and the peak number of micro-batches whose
 * activations a stage holds (from its F to its last backward action). */
#ifndef ZT_SCHEDULE_H
#define ZT_SCHEDULE_H

#include <stdio.h>

#include "src/core/err.h"

typedef enum { ZT_ACT_F = 0, ZT_ACT_B = 1, ZT_ACT_W = 2 } zt_act_op;

typedef struct zt_action {
  zt_act_op op;
  int mb, chunk;
} zt_action;

typedef struct zt_schedule {
  char name[32];
  int stages, microbatches, chunks;
  double cost[3];   /* F, B (input gradient only), W; a B without W costs B+W */
  const double *stage_cost; /* optional [stages][3]: cost of one action (one
                               chunk) of each kind on each stage, e.g.
                               measured; NULL: cost[] / chunks everywhere */
  int *n;           /* actions per stage */
  zt_action **list; /* per stage */
  int split;        /* the lists contain W actions */
} zt_schedule;

typedef struct zt_schedule_report {
  double makespan; /* in cost units */
  double bubble;   /* 1 - busy / (stages * makespan) */
  int *peak;       /* per stage: micro-batch chunks held at once */
  double *start;   /* per stage, per list position: start time (for the timeline) */
} zt_schedule_report;

/* Allocates an empty schedule of `stages` lists. */
int zt_schedule_alloc(zt_schedule *s, const char *name, int stages, int microbatches,
                      int chunks, zt_err *e);
void zt_schedule_free(zt_schedule *s);

/* Checks and simulates; fills *r (free with zt_schedule_report_free).
 * Returns ZT_EINPUT with the reason when the schedule is wrong. */
int zt_schedule_check(zt_schedule *s, zt_schedule_report *r, zt_err *e);
void zt_schedule_report_free(zt_schedule_report *r);

/* ASCII timeline of all stages, one character per `unit` of cost. */
void zt_schedule_print(const zt_schedule *s, const zt_schedule_report *r, FILE *f);

#endif
