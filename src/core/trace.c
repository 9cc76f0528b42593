/* trace: see trace.h. Events are kept in memory as plain records and
 * turned into JSON (jansson) only when written. */
#include "src/core/trace.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  const char *cat, *name, *a_name, *b_name;
  char group[16];
  double t0, t1;
  long long a, b;
} event;

/* one per process: see the header */
static struct {
  int on, pid;
  char label[128];
  event *ev;
  size_t n, cap;
} tr;

int zt_trace_start(int pid, const char *label, zt_err *e) {
  free(tr.ev);
  memset(&tr, 0, sizeof tr);
  tr.pid = pid;
  snprintf(tr.label, sizeof tr.label, "%s", label);
  tr.cap = 4096;
  tr.ev = malloc(tr.cap * sizeof *tr.ev);
  if (!tr.ev) return zt_err_set(e, ZT_ERUNTIME, "out of memory for the trace");
  tr.on = 1;
  return ZT_OK;
}

int zt_trace_on(void) { return tr.on; }

void zt_trace_slice(const char *cat, const char *name, const char *group, double t0, double t1,
                    const char *a_name, long long a, const char *b_name, long long b) {
  if (!tr.on) return;
  if (tr.n == tr.cap) {
    event *more = realloc(tr.ev, 2 * tr.cap * sizeof *more);
    if (!more) return; /* a trace is best effort: the run goes on */
    tr.ev = more;
    tr.cap *= 2;
  }
  event *v = &tr.ev[tr.n++];
  *v = (event){.cat = cat, .name = name, .a_name = a_name, .b_name = b_name,
               .t0 = t0, .t1 = t1, .a = a, .b = b};
  snprintf(v->group, sizeof v->group, "%s", group ? group : "");
}

/* One event as a line of JSON, "X" (complete) slices in microseconds. */
static int put_event(FILE *f, const event *v, double origin) {
  json_t *args = json_object();
  if (*v->group) json_object_set_new(args, "group", json_string(v->group));
  if (v->a_name) json_object_set_new(args, v->a_name, json_integer(v->a));
  if (v->b_name) json_object_set_new(args, v->b_name, json_integer(v->b));
  char name[64];
  snprintf(name, sizeof name, *v->group ? "%s %s" : "%s", v->name, v->group);
  json_t *o = json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", name, "cat", v->cat,
                        "ph", "X", "ts", (v->t0 - origin) * 1e6, "dur", (v->t1 - v->t0) * 1e6,
                        "pid", tr.pid, "tid", 0, "args", args);
  int rc = !o || json_dumpf(o, f, JSON_COMPACT) < 0 || fputs(",\n", f) < 0;
  json_decref(o);
  return rc;
}

int zt_trace_write_part(const char *path, double origin, zt_err *e) {
  FILE *f = fopen(path, "w");
  int bad = !f;
  if (f) {
    json_t *meta = json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "process_name", "ph", "M",
                             "pid", tr.pid, "tid", 0, "args", "name", tr.label);
    bad = !meta || json_dumpf(meta, f, JSON_COMPACT) < 0 || fputs(",\n", f) < 0;
    json_decref(meta);
    for (size_t i = 0; i < tr.n && !bad; i++) bad = put_event(f, &tr.ev[i], origin);
    bad |= fclose(f) != 0;
  }
  free(tr.ev);
  memset(&tr, 0, sizeof tr);
  if (bad) return zt_err_set(e, ZT_ERUNTIME, "cannot write trace part %s: %s", path, strerror(errno));
  return ZT_OK;
}

int zt_trace_merge(const char *path, char *const *parts, int n, zt_err *e) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = fopen(tmp, "w");
  if (!out) return zt_err_set(e, ZT_ERUNTIME, "cannot write trace %s: %s", tmp, strerror(errno));
  int bad = fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", out) < 0;
  char line[4096];
  for (int i = 0; i < n && !bad; i++) {
    FILE *in = fopen(parts[i], "r");
    if (!in) {
      bad = 1;
      break;
    }
    while (!bad && fgets(line, sizeof line, in)) bad = fputs(line, out) < 0;
    fclose(in);
  }
  /* every event line ends with a comma: close the array with an empty
   * metadata event rather than rewriting the last line */
  bad |= fputs("{\"name\": \"trace_end\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {}}\n]}\n",
               out) < 0;
  bad |= fclose(out) != 0;
  if (bad || rename(tmp, path)) {
    unlink(tmp);
    return zt_err_set(e, ZT_ERUNTIME, "cannot write trace %s: %s", path, strerror(errno));
  }
  for (int i = 0; i < n; i++) remove(parts[i]);
  return ZT_OK;
}
