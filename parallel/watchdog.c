/* watchdog: see watchdog.h. The state is process-wide by nature (one main
 * thread waits at a time, one watchdog thread per process), so it lives in
 * this file's single static struct and nowhere else. */
#include "parallel/watchdog.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_GROUPS 64
#define TAG_QUERY 101
#define TAG_REPLY 102
#define REPLY_WAIT_S 5.0

/* What a rank tells another about a group: how many collectives it has
 * joined there, and where its main thread is waiting now (-1: nowhere). */
typedef struct {
  long long seq, wait_group, wait_op, wait_seq;
} reply_t;

static struct {
  int on;
  double timeout;
  MPI_Comm comm; /* private duplicate of the world: queries never mix with work */
  int rank;
  pthread_t thread;
  _Atomic int running;
  _Atomic long long wait_since_ns; /* 0 = main thread not waiting */
  _Atomic int wait_group, wait_op;
  _Atomic long long wait_seq;
  pthread_mutex_t lock;
  zt_comm *groups[MAX_GROUPS]; /* by id */
  int skip_rank;
  char skip_group[16];
  long long skip_seq;
  long long sends_seen; /* sends by this rank on the skip group, for the hook */
} wd = {.lock = PTHREAD_MUTEX_INITIALIZER, .skip_rank = -1};

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void zt_watchdog_register(zt_comm *c) {
  pthread_mutex_lock(&wd.lock);
  if (c->id >= 0 && c->id < MAX_GROUPS) wd.groups[c->id] = c;
  pthread_mutex_unlock(&wd.lock);
}

void zt_watchdog_unregister(zt_comm *c) {
  pthread_mutex_lock(&wd.lock);
  if (c->id >= 0 && c->id < MAX_GROUPS && wd.groups[c->id] == c) wd.groups[c->id] = NULL;
  pthread_mutex_unlock(&wd.lock);
}

void zt_watchdog_enter(zt_comm *c, zt_comm_op op, uint64_t seq) {
  atomic_store(&wd.wait_group, c->id);
  atomic_store(&wd.wait_op, (int)op);
  atomic_store(&wd.wait_seq, (long long)seq);
  atomic_store(&wd.wait_since_ns, now_ns());
}

void zt_watchdog_leave(void) { atomic_store(&wd.wait_since_ns, 0); }

/* Whether this rank is the one the test hook names, on group c. */
static int skip_here(const zt_comm *c, int *me) {
  if (wd.skip_rank < 0 || c->world_ranks == NULL) return 0;
  MPI_Comm_rank(MPI_COMM_WORLD, me);
  return *me == wd.skip_rank && !strcmp(c->name, wd.skip_group);
}

int zt_watchdog_should_skip_send(const zt_comm *c) {
  int me;
  if (!skip_here(c, &me) || ++wd.sends_seen != wd.skip_seq) return 0;
  fprintf(stderr, "ztrain: test: rank %d skips send #%lld on group %s\n", me, wd.sends_seen,
          c->name);
  return 1;
}

int zt_watchdog_should_skip(const zt_comm *c, uint64_t seq) {
  int me;
  if (!skip_here(c, &me) || (long long)seq != wd.skip_seq) return 0;
  /* the skipped collective was never joined: do not count it */
  atomic_fetch_sub(&((zt_comm *)c)->seq, 1);
  fprintf(stderr, "ztrain: test: rank %d skips collective #%llu of group %s\n", me,
          (unsigned long long)seq, c->name);
  return 1;
}

static reply_t my_answer(int group) {
  reply_t r = {-1, -1, -1, -1};
  pthread_mutex_lock(&wd.lock);
  if (group >= 0 && group < MAX_GROUPS && wd.groups[group])
    r.seq = (long long)atomic_load(&wd.groups[group]->seq);
  pthread_mutex_unlock(&wd.lock);
  if (atomic_load(&wd.wait_since_ns)) {
    r.wait_group = atomic_load(&wd.wait_group);
    r.wait_op = atomic_load(&wd.wait_op);
    r.wait_seq = atomic_load(&wd.wait_seq);
  }
  return r;
}

/* Answers every question that has arrived. */
static void serve(void) {
  for (;;) {
    int flag = 0, group;
    MPI_Status st;
    zt_comm_lock();
    MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, wd.comm, &flag, &st);
    if (flag) {
      MPI_Recv(&group, 1, MPI_INT, st.MPI_SOURCE, TAG_QUERY, wd.comm, MPI_STATUS_IGNORE);
      reply_t r = my_answer(group);
      /* 32 bytes go eagerly: returns at once even if the asker is gone */
      MPI_Send(&r, 4, MPI_LONG_LONG, st.MPI_SOURCE, TAG_REPLY, wd.comm);
    }
    zt_comm_unlock();
    if (!flag) return;
  }
}

static const char *group_name(long long id) {
  zt_comm *c = id >= 0 && id < MAX_GROUPS ? wd.groups[id] : NULL;
  return c ? c->name : "?";
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The main thread has waited too long: find out who is missing, say so,
 * end the job. Keeps answering others meanwhile, since they may be asking
 * the same question of this rank. */
static void report(void) {
  int gid = atomic_load(&wd.wait_group), op = atomic_load(&wd.wait_op);
  long long seq = atomic_load(&wd.wait_seq);
  double waited = (now_ns() - atomic_load(&wd.wait_since_ns)) * 1e-9;
  zt_comm *c = gid >= 0 && gid < MAX_GROUPS ? wd.groups[gid] : NULL;
  int n = c ? c->size : 0;
  reply_t *rep = calloc((size_t)n + 1, sizeof *rep);
  int *got = calloc((size_t)n + 1, sizeof *got);
  MPI_Request *sends = calloc((size_t)n + 1, sizeof *sends);
  for (int i = 0; i < n; i++) {
    sends[i] = MPI_REQUEST_NULL;
    if (c->world_ranks[i] == wd.rank) {
      rep[i] = my_answer(gid);
      got[i] = 1;
    } else {
      zt_comm_lock();
      MPI_Isend(&gid, 1, MPI_INT, c->world_ranks[i], TAG_QUERY, wd.comm, &sends[i]);
      zt_comm_unlock();
    }
  }
  long long deadline = now_ns() + (long long)(REPLY_WAIT_S * 1e9);
  int missing = 0;
  for (int i = 0; i < n; i++) missing += !got[i];
  while (missing && now_ns() < deadline) {
    serve();
    int flag = 0;
    MPI_Status st;
    reply_t r;
    zt_comm_lock();
    MPI_Iprobe(MPI_ANY_SOURCE, TAG_REPLY, wd.comm, &flag, &st);
    if (flag) MPI_Recv(&r, 4, MPI_LONG_LONG, st.MPI_SOURCE, TAG_REPLY, wd.comm, MPI_STATUS_IGNORE);
    zt_comm_unlock();
    if (!flag) {
      sleep_ms(5);
      continue;
    }
    for (int i = 0; i < n; i++)
      if (c->world_ranks[i] == st.MPI_SOURCE && !got[i]) {
        rep[i] = r;
        got[i] = 1;
        missing--;
      }
  }
  char buf[4096];
  int k = snprintf(buf, sizeof buf,
                   "ztrain: watchdog: rank %d: %s #%lld on group %s (%d ranks) has "
                   "waited %.1f s (timeout %.1f s)\n",
                   wd.rank, zt_comm_op_names[op], seq, c ? c->name : "?", n, waited,
                   wd.timeout);
  for (int i = 0; i < n && k < (int)sizeof buf - 200; i++) {
    if (!got[i])
      k += snprintf(buf + k, sizeof buf - (size_t)k,
                    "ztrain: watchdog:   rank %d has not arrived and does not answer\n",
                    c->world_ranks[i]);
    else if (op == ZT_OP_SEND || op == ZT_OP_RECV) {
      /* a transfer waits on one peer: say where every member is */
      if (c->world_ranks[i] == wd.rank) continue;
      k += snprintf(buf + k, sizeof buf - (size_t)k, "ztrain: watchdog:   rank %d ",
                    c->world_ranks[i]);
      if (rep[i].wait_group >= 0)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "is waiting in %s #%lld on group %s\n",
                      zt_comm_op_names[rep[i].wait_op], rep[i].wait_seq,
                      group_name(rep[i].wait_group));
      else
        k += snprintf(buf + k, sizeof buf - (size_t)k, "is not waiting on any transfer\n");
    } else if (rep[i].seq < seq) {
      k += snprintf(buf + k, sizeof buf - (size_t)k,
                    "ztrain: watchdog:   rank %d has not arrived: it is at #%lld on %s",
                    c->world_ranks[i], rep[i].seq, c->name);
      if (rep[i].wait_group >= 0)
        k += snprintf(buf + k, sizeof buf - (size_t)k, ", waiting in %s #%lld on group %s",
                      zt_comm_op_names[rep[i].wait_op], rep[i].wait_seq,
                      group_name(rep[i].wait_group));
      k += snprintf(buf + k, sizeof buf - (size_t)k, "\n");
    }
  }
  fputs(buf, stderr);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static void *run(void *arg) {
  (void)arg;
  while (atomic_load(&wd.running)) {
    serve();
    long long since = atomic_load(&wd.wait_since_ns);
    if (wd.timeout > 0 && since && (now_ns() - since) * 1e-9 > wd.timeout) report();
    sleep_ms(20);
  }
  return NULL;
}

int zt_watchdog_start(double timeout_s) {
  int level;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) return -1;
  MPI_Comm_dup(MPI_COMM_WORLD, &wd.comm);
  MPI_Comm_rank(MPI_COMM_WORLD, &wd.rank);
  wd.timeout = timeout_s;
  const char *skip = getenv("ZT_TEST_SKIP_COLLECTIVE");
  if (skip && sscanf(skip, "%d:%15[^:]:%lld", &wd.skip_rank, wd.skip_group, &wd.skip_seq) != 3)
    wd.skip_rank = -1;
  atomic_store(&wd.running, 1);
  if (pthread_create(&wd.thread, NULL, run, NULL)) {
    MPI_Comm_free(&wd.comm);
    return -1;
  }
  wd.on = 1;
  return 0;
}

void zt_watchdog_stop(void) {
  if (!wd.on) return;
  atomic_store(&wd.running, 0);
  pthread_join(wd.thread, NULL);
  MPI_Barrier(wd.comm); /* no question is left in flight (the thread is gone) */
  MPI_Comm_free(&wd.comm);
  wd.on = 0;
}
