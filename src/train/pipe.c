/* pipe: see pipe.h. */
#include "src/train/pipe.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/timer.h"
#include "src/core/trace.h"

#define RECV_WINDOW 4 /* receives posted ahead of the action that needs them */
/* Sends in flight at once: a fixed pool, allocated at init, so that what
 * the executor holds is known before it runs (zt_pipe_plan_bytes); a send
 * finding all busy waits for the oldest, whose receiver has it posted or
 * will post it (the lists do not deadlock). */
#define SEND_BUFFERS 4

static const char *const op_names[3] = {"F", "B", "W"};

static int grow_sends(zt_pipe *p);

void zt_pipe_slots(const zt_schedule *s, int stage, int *slots) {
  int *held = calloc((size_t)s->chunks, sizeof *held);
  for (int c = 0; c < s->chunks; c++) slots[c] = 0;
  for (int i = 0; held && i < s->n[stage]; i++) {
    const zt_action *a = &s->list[stage][i];
    if (a->op == ZT_ACT_F) {
      if (++held[a->chunk] > slots[a->chunk]) slots[a->chunk] = held[a->chunk];
    } else if (a->op == ZT_ACT_W || !s->split) {
      held[a->chunk]--;
    }
  }
  for (int c = 0; c < s->chunks; c++)
    if (slots[c] < 1) slots[c] = 1;
  free(held);
}

int zt_pipe_stage(const zt_schedule *s, const int *first, const int *last, int stage,
                  zt_stage_cfg *st, zt_err *e) {
  int v = s->chunks;
  int *f = malloc((size_t)v * sizeof *f), *l = malloc((size_t)v * sizeof *l),
      *n = malloc((size_t)v * sizeof *n);
  *st = (zt_stage_cfg){.n_chunks = v, .first = f, .last = l, .slots = n, .embed = stage == 0,
                       .head = stage == s->stages - 1, .split = s->split};
  if (!f || !l || !n) {
    zt_pipe_stage_free(st);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  for (int c = 0; c < v; c++) {
    f[c] = first[c * s->stages + stage];
    l[c] = last[c * s->stages + stage];
  }
  zt_pipe_slots(s, stage, n);
  return ZT_OK;
}

int64_t zt_pipe_plan_bytes(const zt_model *m) {
  int64_t msg = (int64_t)m->Ns * m->cfg.dim * (int64_t)zt_dtype_size(m->dt);
  return (RECV_WINDOW + SEND_BUFFERS) * msg +
         2 * (int64_t)m->B * m->cfg.seq * (int64_t)sizeof(int32_t);
}

void zt_pipe_stage_free(zt_stage_cfg *st) {
  free((void *)st->first);
  free((void *)st->last);
  free((void *)st->slots);
  memset(st, 0, sizeof *st);
}

int zt_pipe_init(zt_pipe *p, zt_model *m, zt_comm *pp, const zt_schedule *s, zt_err *e) {
  memset(p, 0, sizeof *p);
  p->m = m;
  p->pp = pp;
  p->sched = s;
  p->stage = pp->rank;
  p->stages = s->stages;
  p->chunks = s->chunks;
  p->mbs = s->microbatches;
  p->virt = s->stages * s->chunks;
  p->msg = (size_t)m->Ns * m->cfg.dim;
  int ub = zt_comm_tag_ub(pp);
  long long tags = 2LL * p->virt * p->mbs;
  if (tags > ub)
    return zt_err_set(e, ZT_EINPUT,
                      "pipeline: %lld message tags needed (2 * %d virtual stages * %d "
                      "micro-batches) but this MPI allows %d; use fewer micro-batches per step",
                      tags, p->virt, p->mbs, ub);
  size_t N = (size_t)m->B * m->cfg.seq;
  p->slot_of = malloc((size_t)p->mbs * p->chunks * sizeof *p->slot_of);
  p->free_slot = calloc((size_t)p->chunks, sizeof *p->free_slot);
  p->n_free = calloc((size_t)p->chunks, sizeof *p->n_free);
  p->window = RECV_WINDOW;
  p->rbuf = calloc((size_t)p->window, sizeof *p->rbuf);
  p->rreq = calloc((size_t)p->window, sizeof *p->rreq);
  p->rbusy = calloc((size_t)p->window, sizeof *p->rbusy);
  int longest = s->n[p->stage] > p->mbs * p->chunks ? s->n[p->stage] : p->mbs * p->chunks;
  p->recv_of = malloc((size_t)longest * sizeof *p->recv_of);
  /* evaluation: each micro-batch through each chunk in turn */
  p->fwd_list = malloc((size_t)p->mbs * p->chunks * sizeof *p->fwd_list);
  for (int i = 0; p->fwd_list && i < p->mbs * p->chunks; i++)
    p->fwd_list[i] = (zt_action){.op = ZT_ACT_F, .mb = i / p->chunks, .chunk = i % p->chunks};
  p->inputs = malloc(N * sizeof *p->inputs);
  p->targets = malloc(N * sizeof *p->targets);
  int ok = p->slot_of && p->free_slot && p->n_free && p->rbuf && p->rreq && p->rbusy &&
           p->recv_of && p->fwd_list && p->inputs && p->targets;
  for (int c = 0; ok && c < p->chunks; c++) {
    p->free_slot[c] = malloc((size_t)m->chunks[c].n_slots * sizeof(int));
    ok = p->free_slot[c] != NULL;
  }
  for (int i = 0; ok && i < p->window; i++)
    ok = (p->rbuf[i] = m->be->alloc(ZT_MEM_DEVICE, p->msg * zt_dtype_size(m->dt))) != NULL;
  for (int i = 0; ok && i < SEND_BUFFERS; i++) ok = grow_sends(p) == 0;
  if (!ok) {
    zt_pipe_free(p);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory for the pipeline executor");
  }
  return ZT_OK;
}

void zt_pipe_free(zt_pipe *p) {
  if (!p->m) return;
  for (int i = 0; p->rbuf && i < p->window; i++) p->m->be->free(ZT_MEM_DEVICE, p->rbuf[i]);
  for (int i = 0; i < p->n_sends; i++) p->m->be->free(ZT_MEM_DEVICE, p->sends[i].buf);
  for (int c = 0; p->free_slot && c < p->chunks; c++) free(p->free_slot[c]);
  free(p->free_slot);
  free(p->n_free);
  free(p->slot_of);
  free(p->rbuf);
  free(p->rreq);
  free(p->rbusy);
  free(p->recv_of);
  free(p->sends);
  free(p->fwd_list);
  free(p->inputs);
  free(p->targets);
  memset(p, 0, sizeof *p);
}

/* ---- transfers ------------------------------------------------------------ */

/* Virtual stage of chunk c here; the message tag of a transfer into
 * virtual stage v (dir 0: activations, 1: gradients) of micro-batch mb. */
static int vstage(const zt_pipe *p, int c) { return c * p->stages + p->stage; }
static int tag(const zt_pipe *p, int dir, int v, int mb) { return (dir * p->virt + v) * p->mbs + mb; }
static int next_rank(const zt_pipe *p) { return (p->stage + 1) % p->stages; }
static int prev_rank(const zt_pipe *p) { return (p->stage + p->stages - 1) % p->stages; }

/* Whether action a receives something: F its input unless on virtual
 * stage 0, B its output gradient unless on the last virtual stage. */
static int needs_recv(const zt_pipe *p, const zt_action *a) {
  int v = vstage(p, a->chunk);
  return (a->op == ZT_ACT_F && v > 0) || (a->op == ZT_ACT_B && v < p->virt - 1);
}

static void post_recv(zt_pipe *p, const zt_action *a, int i) {
  int k = 0;
  while (p->rbusy[k]) k++; /* the window never overfills: see post_ahead */
  p->rbusy[k] = 1;
  p->recv_of[i] = k;
  int f = a->op == ZT_ACT_F, v = vstage(p, a->chunk);
  zt_comm_irecv(p->pp, p->rbuf[k], p->msg, p->m->dt, f ? prev_rank(p) : next_rank(p),
                tag(p, !f, v, a->mb), &p->rreq[k]);
}

/* Posts the receives of the actions from *next on while buffers last. */
static void post_ahead(zt_pipe *p, const zt_action *list, int n, int *next) {
  int used = 0;
  for (int k = 0; k < p->window; k++) used += p->rbusy[k];
  for (; *next < n && used < p->window; (*next)++)
    if (needs_recv(p, &list[*next])) {
      post_recv(p, &list[*next], *next);
      used++;
    }
}

/* Waits for action i's receive and copies it to dst. */
static void take_recv(zt_pipe *p, int i, float *dst) {
  int k = p->recv_of[i];
  zt_comm_wait(&p->rreq[k]);
  p->m->be->copy(p->m->stream, dst, p->rbuf[k], p->msg * zt_dtype_size(p->m->dt));
  p->rbusy[k] = 0;
}

/* Frees send buffers whose transfers are done. */
static void reap_sends(zt_pipe *p) {
  for (int i = 0; i < p->n_sends; i++)
    if (p->sends[i].busy && zt_comm_test(&p->sends[i].req)) p->sends[i].busy = 0;
}

/* One more send buffer; nonzero when there is no memory for it. */
static int grow_sends(zt_pipe *p) {
  zt_pipe_send *more = realloc(p->sends, (size_t)(p->n_sends + 1) * sizeof *more);
  if (more) p->sends = more;
  void *buf = more ? p->m->be->alloc(ZT_MEM_DEVICE, p->msg * zt_dtype_size(p->m->dt)) : NULL;
  if (!buf) return 1;
  p->sends[p->n_sends++] = (zt_pipe_send){.buf = buf};
  return 0;
}

static void send(zt_pipe *p, const float *x, int peer, int t) {
  reap_sends(p);
  int k = 0;
  while (k < p->n_sends && p->sends[k].busy) k++;
  if (k == p->n_sends) { /* all in flight: wait for the oldest */
    k = 0;
    for (int i = 1; i < p->n_sends; i++)
      if (p->sends[i].req.seq < p->sends[k].req.seq) k = i;
    zt_comm_wait(&p->sends[k].req);
  }
  p->m->be->copy(p->m->stream, p->sends[k].buf, x, p->msg * zt_dtype_size(p->m->dt));
  p->m->be->stream_sync(p->m->stream); /* MPI reads it from here on */
  p->sends[k].busy = 1;
  zt_comm_isend(p->pp, p->sends[k].buf, p->msg, p->m->dt, peer, t, &p->sends[k].req);
}

/* ---- actions --------------------------------------------------------------- */

static int take_slot(zt_pipe *p, int mb, int c) {
  int s = p->free_slot[c][--p->n_free[c]]; /* zt_pipe_slots sized the pool */
  p->slot_of[mb * p->chunks + c] = s;
  return s;
}

static void release_slot(zt_pipe *p, int mb, int c) {
  int *s = &p->slot_of[mb * p->chunks + c];
  p->free_slot[c][p->n_free[c]++] = *s;
  *s = -1;
}

/* Runs list[i]; returns its loss sum (F on the last virtual stage). */
static double run_action(zt_pipe *p, const zt_action *list, int i, int forward_only,
                         float dscale, zt_pipe_fill fill, zt_pipe_before before, void *ctx) {
  const zt_action *a = &list[i];
  zt_model *m = p->m;
  int v = vstage(p, a->chunk), split = p->sched->split && !forward_only;
  double loss = 0;
  if (a->op == ZT_ACT_F) {
    int s = take_slot(p, a->mb, a->chunk);
    if (v == 0 || v == p->virt - 1) fill(ctx, a->mb, p->inputs, p->targets);
    if (v > 0) take_recv(p, i, zt_model_input(m, a->chunk, s));
  } else if (a->op == ZT_ACT_B && v < p->virt - 1) {
    take_recv(p, i, m->dres);
  }
  int s = p->slot_of[a->mb * p->chunks + a->chunk];
  if (before) before(ctx);
  double t0 = zt_timer_now();
  switch (a->op) {
    case ZT_ACT_F:
      loss = zt_model_fwd(m, a->chunk, s, p->inputs, p->targets, forward_only ? 0 : dscale);
      break;
    case ZT_ACT_B: zt_model_bwd(m, a->chunk, s, split); break;
    case ZT_ACT_W: zt_model_wgrad(m, a->chunk, s); break;
  }
  double t1 = zt_timer_now();
  p->st.busy += t1 - t0;
  p->st.cost[a->op] += t1 - t0;
  p->st.count[a->op]++;
  if (zt_trace_on())
    zt_trace_slice("compute", op_names[a->op], NULL, t0, t1, "mb", a->mb, "chunk", a->chunk);
  if (a->op == ZT_ACT_F && v < p->virt - 1)
    send(p, zt_model_output(m, a->chunk, s), next_rank(p), tag(p, 0, v + 1, a->mb));
  if (a->op == ZT_ACT_B && v > 0) send(p, m->dres, prev_rank(p), tag(p, 1, v - 1, a->mb));
  if (forward_only || a->op == ZT_ACT_W || (a->op == ZT_ACT_B && !split))
    release_slot(p, a->mb, a->chunk);
  return loss;
}

double zt_pipe_run(zt_pipe *p, int forward_only, float dscale, zt_pipe_fill fill,
                   zt_pipe_before before, void *ctx) {
  const zt_action *list = forward_only ? p->fwd_list : p->sched->list[p->stage];
  int n = forward_only ? p->mbs * p->chunks : p->sched->n[p->stage];
  for (int c = 0; c < p->chunks; c++) {
    p->n_free[c] = p->m->chunks[c].n_slots;
    for (int s = 0; s < p->n_free[c]; s++) p->free_slot[c][s] = p->n_free[c] - 1 - s;
  }
  for (int i = 0; i < p->mbs * p->chunks; i++) p->slot_of[i] = -1;
  memset(&p->st, 0, sizeof p->st);
  /* the stages start together, so that their windows measure one makespan */
  double sync = 0;
  zt_comm_allreduce(p->pp, &sync, 1, ZT_F64, ZT_SUM);
  double start = zt_timer_now(), loss = 0;
  int next = 0;
  for (int i = 0; i < n; i++) {
    post_ahead(p, list, n, &next);
    loss += run_action(p, list, i, forward_only, dscale, fill, before, ctx);
  }
  for (int i = 0; i < p->n_sends; i++)
    if (p->sends[i].busy) {
      zt_comm_wait(&p->sends[i].req);
      p->sends[i].busy = 0;
    }
  p->st.window = zt_timer_now() - start;
  return loss;
}
