/* ckpt: checkpoint files. One HDF5 file holds every parameter under /model/
 * by its logical name and shape (PyTorch layout), the AdamW moments under
 * /optim/exp_avg/ and /optim/exp_avg_sq/, and root attributes: format
 * ("ztrain-checkpoint"), format_version, step and plan (the resolved run
 * description as JSON, for the record; never executed). Files are written
 * under a temporary name, synced, then renamed: a crash leaves either the
 * old file or the new one. See docs/checkpoint-format.md. */
#ifndef ZT_CKPT_H
#define ZT_CKPT_H

#include "parallel/grid.h"
#include "parallel/zero.h"
#include "src/core/err.h"
#include "src/model/model.h"

#define ZT_CKPT_FORMAT "ztrain-checkpoint"
#define ZT_CKPT_VERSION 1

/* What a checkpoint reads and writes: the model's parameter table, the
 * ZeRO engine holding parameters and AdamW moments, the grid. */
typedef struct zt_ckpt_state {
  zt_model *m;
  zt_zero *z;
  zt_grid *grid;
  int64_t *step; /* optimizer steps taken */
} zt_ckpt_state;

/* Collective over the world. Every logical tensor is assembled from its
 * ZeRO shards (over dp) and TP pieces (over tp) and written by world rank
 * 0; every rank returns the same status. */
int zt_ckpt_save(const char *path, const zt_ckpt_state *s, const char *plan_json,
                 zt_err *e);

/* Collective over the world. World rank 0 checks the file (format, every
 * tensor's name and logical shape, naming the first mismatch) and reads
 * it; every rank keeps its own piece of each tensor. The optimizer state
 * and step are loaded when the file has them. */
int zt_ckpt_load(const char *path, const zt_ckpt_state *s, zt_err *e);

#endif
