/* pipe: the pipeline executor. Runs this stage's action list of a checked
 * schedule (parallel/schedule.h) for one step: F takes a free activation
 * slot of its chunk, gets its input (tokens on virtual stage 0, else the
 * previous virtual stage's output) and sends its output on; B gets the
 * gradient of the chunk's output (from the loss on the last virtual
 * stage), computes the input gradient and sends it back; W computes the
 * weight gradients. A slot is freed after the micro-batch's last backward
 * action there. Receives are posted ahead, up to a window of actions, so
 * that a transfer lands while the stage computes; sends never block (a
 * send buffer is kept until its transfer is done). Time spent in actions
 * is busy, the rest of the stage's window idle: the measured bubble. */
#ifndef ZT_PIPE_H
#define ZT_PIPE_H

#include <stdint.h>

#include "parallel/comm.h"
#include "parallel/schedule.h"
#include "src/model/model.h"

/* Fills per micro-batch the host arrays [micro_batch * seq] of inputs and
 * targets of micro-batch `mb` of the step. */
typedef void (*zt_pipe_fill)(void *ctx, int mb, int32_t *inputs, int32_t *targets);
/* Called before each action (the ZeRO engine resets its per-pass counts). */
typedef void (*zt_pipe_before)(void *ctx);

typedef struct zt_pipe_send {
  void *buf;
  zt_req req;
  int busy;
} zt_pipe_send;

typedef struct zt_pipe_stats {
  double busy, window;       /* seconds: in actions, first start to end (the rest is idle) */
  double cost[3];            /* summed time of F, B, W actions */
  int count[3];
} zt_pipe_stats;

typedef struct zt_pipe {
  zt_model *m;
  zt_comm *pp;
  int stage, stages, chunks, mbs, virt; /* virt = stages * chunks */
  const zt_schedule *sched;
  int *slot_of;     /* [mbs * chunks] slot of (micro-batch, chunk), -1 */
  int **free_slot;  /* per chunk: stack of free slots */
  int *n_free;
  /* receives: window of buffers, one per posted receive */
  int window;
  void **rbuf;
  zt_req *rreq;
  int *rbusy;
  int *recv_of; /* per list position: receive buffer, -1 */
  zt_pipe_send *sends;
  int n_sends;
  size_t msg;   /* floats per transfer: [Ns, C] */
  zt_action *fwd_list; /* evaluation: F of each micro-batch through each chunk */
  int32_t *inputs, *targets;
  zt_pipe_stats st;
} zt_pipe;

/* Slots each chunk of `stage` needs: the most micro-batches the list holds
 * at once per chunk (from F to the last backward action). slots has
 * s->chunks entries. */
void zt_pipe_slots(const zt_schedule *s, int stage, int *slots);

/* What stage `stage` runs: chunk c is virtual stage c*stages + stage, whose
 * blocks are first[v]..last[v] (the partition, in pipeline order); slots
 * from zt_pipe_slots. Allocates the arrays st points to (free with
 * zt_pipe_stage_free). */
int zt_pipe_stage(const zt_schedule *s, const int *first, const int *last, int stage,
                  zt_stage_cfg *st, zt_err *e);
void zt_pipe_stage_free(zt_stage_cfg *st);

/* Bytes zt_pipe_init allocates for model m (from zt_model_plan or
 * zt_model_init): its receive window and send pool of one [Ns, C]
 * activation each, and the batch arrays. */
int64_t zt_pipe_plan_bytes(const zt_model *m);

/* The model must have been made with this stage's chunks (zt_model_init
 * with a zt_stage_cfg whose slots come from zt_pipe_slots). */
int zt_pipe_init(zt_pipe *p, zt_model *m, zt_comm *pp, const zt_schedule *s, zt_err *e);
void zt_pipe_free(zt_pipe *p);

/* Runs one step of this stage's list (forward_only: the forward actions
 * only, in micro-batch order, slots freed at once; dscale then unused).
 * Returns the sum of per-token losses (non-zero on the last stage only)
 * and leaves the step's timings in p->st. */
double zt_pipe_run(zt_pipe *p, int forward_only, float dscale, zt_pipe_fill fill,
                   zt_pipe_before before, void *ctx);

#endif
