/* ckpt: checkpoint files (format version 2, docs/checkpoint-format.md).
 * One HDF5 file holds every parameter under /model/ by its logical name and
 * shape (PyTorch layout), the AdamW moments under /optim/exp_avg/ and
 * /optim/exp_avg_sq/, the fp32 master weights as /optim/master/ (hard links
 * to /model: in fp32 they are the parameters), a checksum per tensor, and
 * the run's record: step, plan, script text, topology, data position.
 * All ranks write collectively through MPI-IO, each the hyperslabs of the
 * logical tensors that its ZeRO range of its TP piece covers (a piece held
 * by several ranks is written by one); each rank reads exactly what it
 * holds, whatever topology wrote the file. Files are written under a
 * temporary name, synced, then renamed: a crash leaves the old file or the
 * new one, never half of one. */
#ifndef ZT_CKPT_H
#define ZT_CKPT_H

#include <pthread.h>
#include <stdint.h>

#include "parallel/grid.h"
#include "parallel/zero.h"
#include "src/ckpt/format.h"
#include "src/core/err.h"
#include "src/model/model.h"
#include "src/train/scaler.h"


/* What a checkpoint reads and writes, and the record that goes with it. */
typedef struct zt_ckpt_state {
  zt_model *m;
  zt_zero *z;
  zt_grid *grid;
  int64_t *step;           /* steps taken (the data position is step * global_batch) */
  int64_t *skipped;        /* of which skipped for non-finite values (may be NULL:
                              none); the optimizer's clock is step - skipped */
  zt_scaler *scaler;       /* loss scaling (may be NULL: none); a dynamic
                              scaler's state is saved and, into a dynamic
                              one, loaded */
  const char *plan_json;   /* the resolved plan */
  const char *script_text; /* the Lua script, for the record */
  int64_t global_batch;    /* samples per step: the data position is step * this */
  int64_t samples;         /* samples in one epoch of the training data */
  uint64_t seed;
  /* set by the checkpoint code itself: where the backend's device memory
   * is not host memory, host copies of the states it reads and writes
   * (weights, exp_avg, exp_avg_sq); NULL otherwise */
  float *host[3];
} zt_ckpt_state;

/* Collective over the world. */
int zt_ckpt_save(const char *path, const zt_ckpt_state *s, zt_err *e);

/* An asynchronous save: the state is copied to host memory at the step
 * boundary and written by a background thread over its own communicator
 * while training goes on. One at a time: starting a save waits for the
 * previous one. */
typedef struct zt_ckpt_async {
  int active;
  pthread_t thread;
  pthread_mutex_t gate_lock;
  pthread_cond_t gate;
  int go;               /* 1: every rank's thread started, write; -1: give up */
  zt_comm comm;         /* the background save's own: its collectives never
                           meet the training's */
  zt_ckpt_state s;
  int64_t step, skipped;
  zt_scaler scaler;
  char path[4096];
  float *snap, **pieces; /* host copy of this rank's pieces */
  void (*done)(struct zt_ckpt_async *a); /* after a successful write, on the thread */
  void *ctx;             /* for done */
  int rc;
  zt_err err;
} zt_ckpt_async;

/* Collective. Waits for the previous save, snapshots, starts the thread. */
int zt_ckpt_async_start(zt_ckpt_async *a, const char *path, const zt_ckpt_state *s,
                        void (*done)(zt_ckpt_async *), zt_err *e);
/* Collective. Waits for the save in flight, if any; returns its status. */
int zt_ckpt_async_wait(zt_ckpt_async *a, zt_err *e);

/* Collective over the world. Checks the file (format, every tensor's name
 * and logical shape, naming the first mismatch; then every checksum) and
 * leaves each rank with its own pieces. Optimizer state and step are loaded
 * when the file has them. On any error nothing is to be trusted: the caller
 * stops or tries another file. */
int zt_ckpt_load(const char *path, const zt_ckpt_state *s, zt_err *e);

/* The sum over elements i of XXH3_64bits_withSeed(&x[i], 4, first + i):
 * a per-tensor checksum that ranks holding different pieces can add up. */
uint64_t zt_ckpt_checksum(const float *x, int64_t n, int64_t first);
/* The same, adding the count of non-finite elements (NaN, inf) to
 * *nonfinite in the same pass. */
uint64_t zt_ckpt_checksum_count(const float *x, int64_t n, int64_t first, uint64_t *nonfinite);

#endif
