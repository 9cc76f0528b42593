/* schedule: see schedule.h. */
#include "parallel/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char op_char[3] = {'F', 'B', 'W'};

int zt_schedule_alloc(zt_schedule *s, const char *name, int stages, int microbatches,
                      int chunks, zt_err *e) {
  memset(s, 0, sizeof *s);
  snprintf(s->name, sizeof s->name, "%s", name);
  s->stages = stages;
  s->microbatches = microbatches;
  s->chunks = chunks;
  s->cost[0] = s->cost[1] = s->cost[2] = 1;
  s->n = calloc((size_t)stages, sizeof *s->n);
  s->list = calloc((size_t)stages, sizeof *s->list);
  if (!s->n || !s->list) return zt_err_set(e, ZT_ERUNTIME, "out of memory for a schedule");
  return ZT_OK;
}

void zt_schedule_free(zt_schedule *s) {
  for (int i = 0; s->list && i < s->stages; i++) free(s->list[i]);
  free(s->list);
  free(s->n);
  memset(s, 0, sizeof *s);
}

void zt_schedule_report_free(zt_schedule_report *r) {
  free(r->peak);
  free(r->start);
  memset(r, 0, sizeof *r);
}

/* Index of (op, mb, virtual stage) in the done-time table. */
static size_t key(const zt_schedule *s, int op, int mb, int vs) {
  return ((size_t)op * s->microbatches + (size_t)mb) * (size_t)(s->stages * s->chunks) + (size_t)vs;
}

static void describe(char *buf, size_t n, const zt_action *a) {
  snprintf(buf, n, "%c(mb %d, chunk %d)", op_char[a->op], a->mb, a->chunk);
}

/* Each stage's list holds every F and B (and W, if any) of each of its
 * chunks once, B after its F, W after its B. */
static int check_lists(zt_schedule *s, zt_err *e) {
  int m = s->microbatches, v = s->chunks;
  int *seen = malloc((size_t)3 * m * v * sizeof *seen);
  if (!seen) return zt_err_set(e, ZT_ERUNTIME, "out of memory checking a schedule");
  s->split = 0;
  for (int st = 0; st < s->stages; st++)
    for (int i = 0; i < s->n[st]; i++) s->split |= s->list[st][i].op == ZT_ACT_W;
  int rc = ZT_OK;
  for (int st = 0; st < s->stages && !rc; st++) {
    memset(seen, 0, (size_t)3 * m * v * sizeof *seen);
    for (int i = 0; i < s->n[st] && !rc; i++) {
      const zt_action *a = &s->list[st][i];
      char d[64];
      describe(d, sizeof d, a);
      if (a->mb < 0 || a->mb >= m || a->chunk < 0 || a->chunk >= v) {
        rc = zt_err_set(e, ZT_EINPUT,
                        "schedule %s: stage %d, step %d: %s is out of range (micro-batches "
                        "0..%d, chunks 0..%d)", s->name, st, i, d, m - 1, v - 1);
        break;
      }
      int *me = &seen[(a->op * m + a->mb) * v + a->chunk];
      int f = seen[(ZT_ACT_F * m + a->mb) * v + a->chunk];
      int b = seen[(ZT_ACT_B * m + a->mb) * v + a->chunk];
      if (*me)
        rc = zt_err_set(e, ZT_EINPUT, "schedule %s: stage %d, step %d: %s is repeated",
                        s->name, st, i, d);
      else if (a->op == ZT_ACT_B && !f)
        rc = zt_err_set(e, ZT_EINPUT,
                        "schedule %s: stage %d, step %d: %s comes before F of the same "
                        "micro-batch and chunk", s->name, st, i, d);
      else if (a->op == ZT_ACT_W && !b)
        rc = zt_err_set(e, ZT_EINPUT,
                        "schedule %s: stage %d, step %d: %s comes before B of the same "
                        "micro-batch and chunk", s->name, st, i, d);
      *me = 1;
    }
    for (int op = 0; op < (s->split ? 3 : 2) && !rc; op++)
      for (int mb = 0; mb < m && !rc; mb++)
        for (int c = 0; c < v && !rc; c++)
          if (!seen[(op * m + mb) * v + c])
            rc = zt_err_set(e, ZT_EINPUT,
                            "schedule %s: stage %d misses %c(mb %d, chunk %d) (its list has "
                            "%d actions)", s->name, st, op_char[op], mb, c, s->n[st]);
  }
  free(seen);
  return rc;
}

/* What action a needs before it can start: its key, or -1 for nothing. */
static long long needs(const zt_schedule *s, int st, const zt_action *a) {
  int vs = a->chunk * s->stages + st, last = s->stages * s->chunks - 1;
  switch (a->op) {
    case ZT_ACT_F: return vs ? (long long)key(s, ZT_ACT_F, a->mb, vs - 1) : -1;
    case ZT_ACT_B:
      return vs < last ? (long long)key(s, ZT_ACT_B, a->mb, vs + 1)
                       : (long long)key(s, ZT_ACT_F, a->mb, vs);
    default: return (long long)key(s, ZT_ACT_B, a->mb, vs);
  }
}

static double cost(const zt_schedule *s, int st, const zt_action *a) {
  if (s->stage_cost) { /* measured: per action, per stage */
    const double *c = s->stage_cost + 3 * st;
    return c[a->op] + (a->op == ZT_ACT_B && !s->split ? c[ZT_ACT_W] : 0);
  }
  double c = s->cost[a->op];
  if (a->op == ZT_ACT_B && !s->split) c += s->cost[ZT_ACT_W]; /* B does both */
  return c / s->chunks; /* a chunk is 1/chunks of the stage's layers */
}

int zt_schedule_check(zt_schedule *s, zt_schedule_report *r, zt_err *e) {
  memset(r, 0, sizeof *r);
  int rc = check_lists(s, e);
  if (rc) return rc;
  int P = s->stages, total = 0;
  size_t np = (size_t)(unsigned)P, nkeys = key(s, 3, 0, 0);
  double *done = malloc(nkeys * sizeof *done);
  int *pos = calloc(np, sizeof *pos);
  double *clock = calloc(np, sizeof *clock), busy = 0;
  r->peak = calloc(np, sizeof *r->peak);
  for (int st = 0; st < P; st++) total += s->n[st];
  r->start = malloc((size_t)(total ? total : 1) * sizeof *r->start);
  if (!done || !pos || !clock || !r->peak || !r->start) {
    free(done); free(pos); free(clock);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory simulating a schedule");
  }
  for (size_t i = 0; i < nkeys; i++) done[i] = -1;
  /* run every stage as far as its inputs allow, until nothing moves */
  for (int moved = 1; moved;) {
    moved = 0;
    for (int st = 0, base = 0; st < P; base += s->n[st], st++)
      while (pos[st] < s->n[st]) {
        const zt_action *a = &s->list[st][pos[st]];
        long long need = needs(s, st, a);
        if (need >= 0 && done[need] < 0) break;
        double t0 = fmax(clock[st], need >= 0 ? done[need] : 0), c = cost(s, st, a);
        r->start[base + pos[st]] = t0;
        clock[st] = t0 + c;
        busy += c;
        done[key(s, a->op, a->mb, a->chunk * P + st)] = clock[st];
        pos[st]++;
        moved = 1;
      }
  }
  for (int st = 0; st < P && !rc; st++) {
    if (pos[st] == s->n[st]) continue;
    /* stuck: name the first stage that waits, what it waits for, and whose */
    const zt_action *a = &s->list[st][pos[st]];
    long long need = needs(s, st, a);
    int vs = a->chunk * P + st;
    int from = a->op == ZT_ACT_F ? vs - 1 : a->op == ZT_ACT_B && vs < P * s->chunks - 1 ? vs + 1 : vs;
    char d[64];
    describe(d, sizeof d, a);
    rc = zt_err_set(e, ZT_EINPUT,
                    "schedule %s deadlocks: stage %d stalls at step %d, %s, waiting for "
                    "%c(mb %d) of stage %d, which never runs before it (the stages wait "
                    "on each other)", s->name, st, pos[st], d,
                    need >= 0 ? op_char[(int)(need / ((long long)s->microbatches * P * s->chunks))] : '?',
                    a->mb, from % P);
  }
  for (int st = 0; st < P; st++) r->makespan = fmax(r->makespan, clock[st]);
  r->bubble = r->makespan > 0 ? 1 - busy / (P * r->makespan) : 0;
  for (int st = 0; st < P && !rc; st++) { /* activations: from F to the last backward */
    int held = 0;
    for (int i = 0; i < s->n[st]; i++) {
      zt_act_op op = s->list[st][i].op;
      held += op == ZT_ACT_F ? 1 : (op == (s->split ? ZT_ACT_W : ZT_ACT_B) ? -1 : 0);
      if (held > r->peak[st]) r->peak[st] = held;
    }
  }
  free(done);
  free(pos);
  free(clock);
  if (rc) zt_schedule_report_free(r);
  return rc;
}

void zt_schedule_print(const zt_schedule *s, const zt_schedule_report *r, FILE *f) {
  /* two characters per smallest action cost: a letter, then the
   * micro-batch's last digit for the rest of the action's length */
  double unit = INFINITY;
  for (int op = 0; op < 3; op++)
    if (s->cost[op] > 0) unit = fmin(unit, s->cost[op] / s->chunks);
  unit /= 2;
  int width = (int)ceil(r->makespan / unit - 1e-9);
  char *row = malloc((size_t)width + 1);
  for (int st = 0, base = 0; st < s->stages; base += s->n[st], st++) {
    memset(row, '.', (size_t)width);
    row[width] = 0;
    for (int i = 0; i < s->n[st]; i++) {
      const zt_action *a = &s->list[st][i];
      int c0 = (int)floor(r->start[base + i] / unit + 1e-9);
      int c1 = (int)floor((r->start[base + i] + cost(s, st, a)) / unit + 1e-9);
      for (int c = c0; c < c1 && c < width; c++)
        row[c] = c == c0 ? op_char[a->op] : (char)('0' + a->mb % 10);
    }
    fprintf(f, "stage %2d |%s|\n", st, row);
  }
  free(row);
}
