/* ckpt: checkpoint files. One HDF5 file holds every parameter under /model/
 * by its logical name and shape (PyTorch layout), the AdamW moments under
 * /optim/exp_avg/ and /optim/exp_avg_sq/, and root attributes: format
 * ("ztrain-checkpoint"), format_version, step and plan (the resolved run
 * description as JSON, for the record; never executed). Files are written
 * under a temporary name, synced, then renamed: a crash leaves either the
 * old file or the new one. See docs/checkpoint-format.md. */
#ifndef ZT_CKPT_H
#define ZT_CKPT_H

#include "parallel/comm.h"
#include "src/core/err.h"
#include "src/model/model.h"
#include "src/train/optim.h"

#define ZT_CKPT_FORMAT "ztrain-checkpoint"
#define ZT_CKPT_VERSION 1

/* Collective over `world`: rank 0 writes (all ranks hold the same full
 * state until sharded layouts arrive); every rank returns the same status. */
int zt_ckpt_save(const char *path, const zt_model *m, const zt_optim *o,
                 const char *plan_json, zt_comm *world, zt_err *e);

/* Loads weights and, when o != NULL and the file has them, optimizer state
 * and step. Refuses a file of another model, naming the tensor and shapes. */
int zt_ckpt_load(const char *path, zt_model *m, zt_optim *o, zt_err *e);

#endif
