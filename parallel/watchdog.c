/* watchdog: see watchdog.h. The state is process-wide by nature (one
 * watchdog thread per process, one slot per waiting thread), so it lives
 * in this file's single static struct and nowhere else. */
#include "parallel/watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/oob.h"

#define SLOTS 2
#define MAX_GROUPS 64
#define REPLY_WAIT_S 2.0
#define WHAT_MAX 80

/* Where one thread of a rank waits, as another rank learns it. */
typedef struct {
  int32_t group, op; /* group id, zt_comm_op; group -1: not waiting */
  int64_t seq;
  double waited; /* seconds so far */
  char what[WHAT_MAX];
} slot_view;

enum { ASK_STATE = 0, ASK_CLAIM = 1 };

typedef struct {
  int32_t kind;  /* ASK_STATE: where are you on `group`; ASK_CLAIM: may I report? */
  int32_t group; /* the group asked about */
  int32_t asker;
  char pad[ZT_OOB_QUESTION - 12];
} question_t;

/* What a rank tells another about a group: how many collectives it has
 * started there, where each of its threads waits now, and whether it was
 * itself not running a moment ago (stopped and continued); to a claim,
 * whether the asker may report (one report per job). */
typedef struct {
  int64_t seq; /* -1: not a member */
  double stalled; /* seconds it did not run, if that ended in the last 30 s */
  int32_t granted, holder; /* ASK_CLAIM: the rank that reports (-1: unsure) */
  slot_view slot[SLOTS];
} reply_t;

_Static_assert(sizeof(question_t) == ZT_OOB_QUESTION, "question size");
_Static_assert(sizeof(reply_t) <= ZT_OOB_ANSWER, "reply size");

static struct {
  int on, rank;
  pthread_t thread;
  _Atomic int running;
  int claim_holder; /* who reports for the whole job, as this rank granted; -1 none */
  pthread_mutex_t lock; /* guards everything below */
  double timeout;
  /* per slot a wait and one nested in it (a collective inside a phase) */
  struct {
    int depth;
    struct {
      int group, op;
      long long seq, since_ns;
      char what[WHAT_MAX];
    } at[2];
  } slot[SLOTS];
  struct {
    int id;
    zt_comm *c;
  } groups[MAX_GROUPS];
  /* test hooks */
  int skip_rank;
  char skip_group[16];
  long long skip_seq, sends_seen;
  int stop_rank;
  char stop_where[64];
} wd = {.lock = PTHREAD_MUTEX_INITIALIZER, .skip_rank = -1, .stop_rank = -1, .claim_holder = -1};

static _Thread_local int tl_slot;

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- groups --------------------------------------------------------------- */

void zt_watchdog_register(zt_comm *c) {
  pthread_mutex_lock(&wd.lock);
  for (int i = 0; i < MAX_GROUPS; i++)
    if (!wd.groups[i].c) {
      wd.groups[i].id = c->id;
      wd.groups[i].c = c;
      break;
    }
  pthread_mutex_unlock(&wd.lock);
}

void zt_watchdog_unregister(zt_comm *c) {
  pthread_mutex_lock(&wd.lock);
  for (int i = 0; i < MAX_GROUPS; i++)
    if (wd.groups[i].c == c) wd.groups[i].c = NULL;
  pthread_mutex_unlock(&wd.lock);
}

/* Call with wd.lock held. */
static zt_comm *find_group(int id) {
  for (int i = 0; i < MAX_GROUPS; i++)
    if (wd.groups[i].c && wd.groups[i].id == id) return wd.groups[i].c;
  return NULL;
}

static void group_name(int id, char *buf, size_t n) {
  pthread_mutex_lock(&wd.lock);
  zt_comm *c = find_group(id);
  snprintf(buf, n, "%s", c ? c->name : "?");
  pthread_mutex_unlock(&wd.lock);
}

/* ---- slots ---------------------------------------------------------------- */

void zt_watchdog_thread_slot(int slot) { tl_slot = slot >= 0 && slot < SLOTS ? slot : 0; }

void zt_watchdog_enter(zt_comm *c, zt_comm_op op, uint64_t seq, const char *what) {
  pthread_mutex_lock(&wd.lock);
  int d = wd.slot[tl_slot].depth < 2 ? wd.slot[tl_slot].depth++ : 1;
  wd.slot[tl_slot].at[d].group = c->id;
  wd.slot[tl_slot].at[d].op = (int)op;
  wd.slot[tl_slot].at[d].seq = (long long)seq;
  snprintf(wd.slot[tl_slot].at[d].what, WHAT_MAX, "%s", what ? what : "");
  wd.slot[tl_slot].at[d].since_ns = now_ns();
  pthread_mutex_unlock(&wd.lock);
}

void zt_watchdog_leave(void) {
  pthread_mutex_lock(&wd.lock);
  if (wd.slot[tl_slot].depth > 0) wd.slot[tl_slot].depth--;
  pthread_mutex_unlock(&wd.lock);
}

/* The innermost wait of slot s; call with wd.lock held. */
static long long since_of(int s) {
  int d = wd.slot[s].depth;
  return d ? wd.slot[s].at[d - 1].since_ns : 0;
}

static void view(slot_view *v, int s, long long now) {
  int d = wd.slot[s].depth;
  if (!d) {
    v->group = -1;
    return;
  }
  v->group = wd.slot[s].at[d - 1].group;
  v->op = wd.slot[s].at[d - 1].op;
  v->seq = wd.slot[s].at[d - 1].seq;
  v->waited = (now - wd.slot[s].at[d - 1].since_ns) * 1e-9;
  memcpy(v->what, wd.slot[s].at[d - 1].what, WHAT_MAX);
}

/* Grants the first claim to report; a rank that was itself stopped a
 * moment ago cannot know whether another granted one meanwhile, so it
 * grants nothing. Call with wd.lock held. */
static void claim(int asker, double stalled, reply_t *r) {
  if (stalled > 0) {
    r->granted = 0, r->holder = -1;
    return;
  }
  if (wd.claim_holder < 0) wd.claim_holder = asker;
  r->granted = wd.claim_holder == asker;
  r->holder = wd.claim_holder;
}

static void answer(const void *question, void *out) {
  question_t q;
  reply_t r;
  memcpy(&q, question, sizeof q);
  memset(&r, 0, sizeof r);
  long long now = now_ns();
  r.stalled = zt_oob_stalled(30.0);
  pthread_mutex_lock(&wd.lock);
  zt_comm *c = find_group(q.group);
  r.seq = c ? (int64_t)atomic_load(&c->seq) : -1;
  for (int s = 0; s < SLOTS; s++) view(&r.slot[s], s, now);
  if (q.kind == ASK_CLAIM) claim(q.asker, r.stalled, &r);
  pthread_mutex_unlock(&wd.lock);
  memcpy(out, &r, sizeof r);
}

/* ---- test hooks ------------------------------------------------------------ */

/* Whether this rank is the one the test hook names, on group c. */
static int skip_here(const zt_comm *c) {
  return wd.skip_rank >= 0 && c->world_ranks && wd.rank == wd.skip_rank &&
         !strcmp(c->name, wd.skip_group);
}

int zt_watchdog_should_skip_send(const zt_comm *c) {
  if (!skip_here(c) || ++wd.sends_seen != wd.skip_seq) return 0;
  fprintf(stderr, "ztrain: test: rank %d skips send #%lld on group %s\n", wd.rank,
          wd.sends_seen, c->name);
  return 1;
}

int zt_watchdog_should_skip(const zt_comm *c, uint64_t seq) {
  if (!skip_here(c) || (long long)seq != wd.skip_seq) return 0;
  /* the skipped collective was never joined: do not count it */
  atomic_fetch_sub(&((zt_comm *)c)->seq, 1);
  fprintf(stderr, "ztrain: test: rank %d skips collective #%llu of group %s\n", wd.rank,
          (unsigned long long)seq, c->name);
  return 1;
}

void zt_watchdog_test_stop(const char *where) {
  if (wd.stop_rank != wd.rank || strcmp(where, wd.stop_where)) return;
  fprintf(stderr, "ztrain: test: rank %d stops itself at %s\n", wd.rank, where);
  fflush(stderr);
  raise(SIGSTOP);
}

/* ---- the report ------------------------------------------------------------- */

typedef struct {
  char buf[8192];
  int k;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...) {
  if (t->k >= (int)sizeof t->buf - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(t->buf + t->k, sizeof t->buf - (size_t)t->k, fmt, ap);
  va_end(ap);
  if (k > 0) t->k += k;
  if (t->k > (int)sizeof t->buf - 1) t->k = (int)sizeof t->buf - 1;
}

static const char *op_name(int op) {
  return op >= 0 && op < ZT_OP_COUNT ? zt_comm_op_names[op] : "?";
}

/* ", waiting in OP #SEQ on group G" for the first slot of r that waits. */
static void add_where(text *t, const reply_t *r) {
  for (int s = 0; s < SLOTS; s++) {
    const slot_view *v = &r->slot[s];
    if (v->group < 0) continue;
    char g[16];
    group_name(v->group, g, sizeof g);
    if (v->op == ZT_OP_PHASE)
      add(t, ", in %.*s (phase #%lld on group %s) for %.1f s", WHAT_MAX, v->what,
          (long long)v->seq, g, v->waited);
    else
      add(t, ", waiting in %s #%lld on group %s", op_name(v->op), (long long)v->seq, g);
    return;
  }
  add(t, ", not waiting on another rank (computing, reading data, or stuck in local I/O)");
}

static int waits(const reply_t *r) {
  for (int s = 0; s < SLOTS; s++)
    if (r->slot[s].group >= 0) return 1;
  return 0;
}

static void serve_for(double seconds) {
  for (long long until = now_ns() + (long long)(seconds * 1e9); now_ns() < until;)
    zt_oob_serve(20);
}

/* One report per job: the first rank to claim it from the coordinator
 * reports, the others keep quiet. The coordinator is the lowest world
 * rank that answers and was not itself stopped a moment ago (a stalled
 * rank 0 is skipped). Returns 1 when this rank reports, 0 when another
 * does, -1 when a coordinator has exited: the job is being ended (or a
 * rank died, which the launcher sees), so there is nothing to add. */
static int claim_report(int world) {
  question_t q = {.kind = ASK_CLAIM, .asker = wd.rank};
  for (int c = 0; c < world && c < 8; c++) {
    reply_t r;
    memset(&r, 0, sizeof r);
    if (c == wd.rank) {
      pthread_mutex_lock(&wd.lock);
      claim(wd.rank, zt_oob_stalled(30.0), &r);
      pthread_mutex_unlock(&wd.lock);
    } else {
      char a[ZT_OOB_ANSWER];
      zt_oob_status st;
      zt_oob_ask(&c, 1, &q, a, &st, REPLY_WAIT_S);
      if (st == ZT_OOB_GONE) return -1;
      if (st != ZT_OOB_ANSWERED) continue;
      memcpy(&r, a, sizeof r);
    }
    if (r.granted) return 1;
    if (r.holder >= 0) return 0;
  }
  return 1; /* nobody to coordinate: better two reports than none */
}

/* The ranks of the whole world that do not answer, when the group at
 * hand only shows members waiting on others: the cause is further along
 * the chain (a TP partner of a DP partner, say). Asked in batches, so
 * that a large world does not run out of sockets. Adds a line for each. */
static int sweep_world(text *t) {
  int world = zt_oob_size(), found = 0, batch = 256;
  int *ranks = malloc((size_t)batch * sizeof *ranks);
  char *raw = malloc((size_t)batch * ZT_OOB_ANSWER);
  zt_oob_status *st = malloc((size_t)batch * sizeof *st);
  question_t q = {.kind = ASK_STATE, .group = -1, .asker = wd.rank};
  for (int from = 0; ranks && raw && st && from < world; from += batch) {
    int n = 0;
    for (int r = from; r < world && r < from + batch; r++)
      if (r != wd.rank) ranks[n++] = r;
    zt_oob_ask(ranks, n, &q, raw, st, REPLY_WAIT_S);
    for (int i = 0; i < n; i++) {
      reply_t rep;
      memcpy(&rep, raw + (size_t)i * ZT_OOB_ANSWER, sizeof rep);
      int r = ranks[i];
      if (st[i] == ZT_OOB_SILENT)
        add(t, "ztrain: watchdog:   rank %d (pid %d on %s) does not answer: it is stopped or "
            "hung (SIGSTOP, a debugger, a frozen node)\n", r, zt_oob_pid(r), zt_oob_host(r));
      else if (st[i] == ZT_OOB_GONE)
        add(t, "ztrain: watchdog:   rank %d (pid %d on %s) has exited\n", r, zt_oob_pid(r),
            zt_oob_host(r));
      else if (rep.stalled > 0)
        add(t, "ztrain: watchdog:   rank %d (pid %d on %s) was not running for %.1f s until a "
            "moment ago (stopped and continued?)\n", r, zt_oob_pid(r), zt_oob_host(r),
            rep.stalled);
      else
        continue;
      add(t, "ztrain: watchdog: cause: rank %d (the ranks above wait for it, directly or in "
          "turn)\n", r);
      found++;
    }
  }
  free(ranks);
  free(raw);
  free(st);
  return found;
}

/* A slot's wait `me` has lasted longer than the timeout: ask the group's members how
 * far each got, and report. Returns only when the wait is a slow phase
 * that every member is in (a warning, then another timeout to go). */
static void examine(const slot_view *me, double timeout) {
  pthread_mutex_lock(&wd.lock);
  zt_comm *c = find_group(me->group);
  int n = c ? c->size : 0;
  int *ranks = c ? malloc((size_t)n * sizeof *ranks) : NULL;
  if (ranks) memcpy(ranks, c->world_ranks, (size_t)n * sizeof *ranks);
  char gname[16];
  snprintf(gname, sizeof gname, "%s", c ? c->name : "?");
  pthread_mutex_unlock(&wd.lock);
  if (!ranks) n = 0;

  reply_t *rep = calloc((size_t)n + 1, sizeof *rep);
  char *raw = calloc((size_t)n + 1, ZT_OOB_ANSWER);
  zt_oob_status *st = calloc((size_t)n + 1, sizeof *st);
  int *ask = calloc((size_t)n + 1, sizeof *ask), na = 0;
  for (int i = 0; rep && raw && st && ask && i < n; i++)
    if (ranks[i] != wd.rank) ask[na++] = ranks[i];
  question_t q = {.group = me->group, .asker = wd.rank};
  zt_oob_status *ast = calloc((size_t)na + 1, sizeof *ast);
  if (ast) zt_oob_ask(ask, na, &q, raw, ast, REPLY_WAIT_S);
  /* members in group order, this rank included; a member that was not
   * running a moment ago (stopped, then continued) counts as silent */
  int silent = 0, gone = 0, behind = 0, inside = 0;
  for (int i = 0, j = 0; ast && i < n; i++) {
    if (ranks[i] == wd.rank) {
      char a[ZT_OOB_ANSWER];
      answer(&q, a);
      memcpy(&rep[i], a, sizeof *rep);
      st[i] = ZT_OOB_ANSWERED;
      continue;
    }
    st[i] = ast[j];
    memcpy(&rep[i], raw + (size_t)j * ZT_OOB_ANSWER, sizeof *rep);
    j++;
    if (st[i] != ZT_OOB_ANSWERED || rep[i].stalled > 0) silent++, gone += st[i] == ZT_OOB_GONE;
    else if (rep[i].seq < me->seq) behind++;
    else {
      for (int t = 0; t < SLOTS; t++)
        if (rep[i].slot[t].group == me->group && rep[i].slot[t].seq == me->seq) inside++;
    }
  }
  int phase = me->op == ZT_OP_PHASE;
  if (phase && !silent && !behind && inside == n - 1) {
    /* every member is in the phase and answers: slow, not stuck; the
     * member that comes first in the group says so */
    if (ranks[0] == wd.rank)
      fprintf(stderr,
              "ztrain: watchdog: warning: %.*s (phase #%lld on group %s, %d ranks) has taken "
              "%.0f s (timeout %.0f s); every rank is in it and answers: slow I/O? still "
              "waiting\n", WHAT_MAX, me->what, (long long)me->seq, gname, n, me->waited, timeout);
    free(rep), free(raw), free(st), free(ask), free(ast), free(ranks);
    return;
  }
  /* A rank that has exited is being (or has been) seen by the launcher,
   * which ends the job itself, or it exited because a report ended the
   * job: either way, give that time to happen first. */
  if (gone) serve_for(2 * REPLY_WAIT_S + 1);
  int mine = claim_report(zt_oob_size());
  if (mine <= 0) {
    /* another rank reports and ends the job, or the job is ending */
    serve_for(30);
    fprintf(stderr, "ztrain: watchdog: rank %d: %s #%lld on group %s has waited %.0f s; %s; "
            "ending the job\n", wd.rank, phase ? me->what : op_name(me->op), (long long)me->seq,
            gname, me->waited + 30, mine ? "a rank has exited" : "another rank reported why");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  text *t = calloc(1, sizeof *t);
  if (!t) MPI_Abort(MPI_COMM_WORLD, 1);
  if (phase)
    add(t, "ztrain: watchdog: rank %d: %.*s (phase #%lld on group %s, %d ranks) has waited "
        "%.1f s (timeout %.1f s)\n", wd.rank, WHAT_MAX, me->what, (long long)me->seq, gname, n,
        me->waited, timeout);
  else
    add(t, "ztrain: watchdog: rank %d: %s #%lld on group %s (%d ranks) has waited %.1f s "
        "(timeout %.1f s)\n", wd.rank, op_name(me->op), (long long)me->seq, gname, n,
        me->waited, timeout);
  int p2p = me->op == ZT_OP_SEND || me->op == ZT_OP_RECV;
  for (int i = 0; i < n; i++) {
    int r = ranks[i];
    if (r == wd.rank) continue;
    if (st[i] == ZT_OOB_SILENT)
      add(t, "ztrain: watchdog:   rank %d (pid %d on %s) does not answer: it is stopped or hung, "
          "or its node is down or cut off (SIGSTOP, a debugger, a frozen node, the network)\n", r, zt_oob_pid(r), zt_oob_host(r));
    else if (st[i] == ZT_OOB_ANSWERED && rep[i].stalled > 0)
      add(t, "ztrain: watchdog:   rank %d (pid %d on %s) was not running for %.1f s until a "
          "moment ago (stopped and continued?)\n", r, zt_oob_pid(r), zt_oob_host(r),
          rep[i].stalled);
    else if (st[i] == ZT_OOB_GONE)
      add(t, "ztrain: watchdog:   rank %d (pid %d on %s) has exited\n", r, zt_oob_pid(r),
          zt_oob_host(r));
    else if (p2p) {
      /* a transfer waits on one peer: say where every member is */
      add(t, "ztrain: watchdog:   rank %d is", r);
      if (waits(&rep[i])) {
        text w = {.k = 0};
        add_where(&w, &rep[i]);
        add(t, "%s\n", w.buf + 1); /* drop the comma */
      } else {
        add(t, " not waiting on any transfer\n");
      }
    } else if (rep[i].seq < me->seq) {
      add(t, "ztrain: watchdog:   rank %d has not arrived: it is at #%lld on %s", r,
          (long long)rep[i].seq, gname);
      add_where(t, &rep[i]);
      add(t, "\n");
    }
  }
  if (silent) {
    add(t, "ztrain: watchdog: cause:");
    for (int i = 0; i < n; i++)
      if (st[i] != ZT_OOB_ANSWERED || rep[i].stalled > 0) add(t, " rank %d", ranks[i]);
    add(t, " (the other ranks wait for %s)\n", silent > 1 ? "them" : "it");
  } else if (!sweep_world(t) && !behind && !p2p) {
    add(t, "ztrain: watchdog: every rank has arrived and answers: the operation itself does "
        "not complete (network or MPI failure?)\n");
  }
  add(t, "ztrain: watchdog: ending the job (exit 1); to go on, start it again with "
      "--resume auto: it loads the newest good checkpoint in checkpoint.dir\n");
  fputs(t->buf, stderr);
  fflush(stderr);
  /* the launcher forwards stderr asynchronously; let it arrive before the
   * abort tears the job down */
  for (long long until = now_ns() + 500000000LL; now_ns() < until;) zt_oob_serve(20);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static void *run(void *arg) {
  (void)arg;
  long long last_since[SLOTS] = {0}, next_ns[SLOTS] = {0};
  while (atomic_load(&wd.running)) {
    zt_oob_serve(20);
    for (int s = 0; s < SLOTS; s++) {
      long long now = now_ns();
      slot_view v;
      pthread_mutex_lock(&wd.lock);
      double timeout = wd.timeout;
      long long since = since_of(s);
      view(&v, s, now);
      pthread_mutex_unlock(&wd.lock);
      if (since != last_since[s]) { /* a new wait */
        last_since[s] = since;
        next_ns[s] = 0;
      }
      if (timeout <= 0 || !since || v.waited <= timeout || now < next_ns[s]) continue;
      /* this rank was itself not running a moment ago: its own waits look
       * long but say nothing about the others; look again later */
      if (zt_oob_stalled(30.0) == 0) examine(&v, timeout);
      next_ns[s] = now_ns() + (long long)(timeout * 1e9);
    }
  }
  return NULL;
}

int zt_watchdog_start(const zt_comm *world, double timeout_s, char *why) {
  int level;
  MPI_Query_thread(&level);
  wd.rank = world->rank;
  const char *skip = getenv("ZT_TEST_SKIP_COLLECTIVE");
  if (skip && sscanf(skip, "%d:%15[^:]:%lld", &wd.skip_rank, wd.skip_group, &wd.skip_seq) != 3)
    wd.skip_rank = -1;
  const char *stop = getenv("ZT_TEST_STOP");
  if (stop && sscanf(stop, "%d:%63s", &wd.stop_rank, wd.stop_where) != 2) wd.stop_rank = -1;
  if (level < MPI_THREAD_MULTIPLE) {
    snprintf(why, 256, "MPI without thread support");
    return -1;
  }
  wd.timeout = timeout_s;
  /* the first exchange waits for every rank to have started */
  if (zt_oob_start(world->mpi, answer, timeout_s > 0 ? timeout_s : 1800, why)) return -2;
  atomic_store(&wd.running, 1);
  if (pthread_create(&wd.thread, NULL, run, NULL)) {
    zt_oob_stop();
    snprintf(why, 256, "cannot start a thread");
    return -1;
  }
  wd.on = 1;
  return 0;
}

void zt_watchdog_set_timeout(double timeout_s) {
  pthread_mutex_lock(&wd.lock);
  wd.timeout = timeout_s;
  pthread_mutex_unlock(&wd.lock);
}

void zt_watchdog_stop(void) {
  if (!wd.on) return;
  atomic_store(&wd.running, 0);
  pthread_join(wd.thread, NULL);
  zt_oob_stop();
  wd.on = 0;
}
