/* config: runs the user's Lua script once, with the lua/ library preloaded
 * (compiled into the binary; ZTRAIN_LUA_PATH may point at a source tree for
 * development), applies -e statements, and hands C a plain zt_plan. Nothing
 * reads Lua after this. */
#ifndef ZT_CONFIG_H
#define ZT_CONFIG_H

#include "src/core/err.h"
#include "src/data/data.h"
#include "src/model/model.h"
#include "parallel/schedule.h"
#include "parallel/zero.h"
#include "src/train/trainer.h"

/* Where a rank computes: auto = on its node's GPU where one is usable. */
typedef enum { ZT_DEVICE_AUTO = 0, ZT_DEVICE_CPU, ZT_DEVICE_CUDA } zt_device_kind;

typedef struct zt_parallel_cfg {
  int dp, tp, pp;
  zt_device_kind device;
  zt_zero_cfg zero;
  double timeout; /* watchdog, seconds */
  int strict;     /* refuse a layout whose TP groups cross nodes (else a warning) */
  int sequence_parallel; /* copied to model.sequence_parallel */
  /* offload (the policy's placements are in zero.offload): the groups'
   * bytes per kind and placement on one rank of their stage, for the
   * banner, and the record of every group's placement for the plan JSON */
  int64_t offload_bytes[ZT_OFF_KINDS][ZT_PLACES];
  char *offload_json;
} zt_parallel_cfg;

/* The pipeline: blocks of each virtual stage (pp * chunks, in pipeline
 * order; virtual stage c*pp + s is chunk c of stage s), and the checked
 * schedule with its simulation. */
typedef struct zt_pipeline_cfg {
  int n_virtual;
  int *first, *last;
  zt_schedule schedule;
  zt_schedule_report report;
} zt_pipeline_cfg;

typedef struct zt_ckpt_cfg {
  char *dir;
  int every, keep, async;
} zt_ckpt_cfg;

typedef struct zt_plan {
  zt_model_cfg model;
  zt_train_cfg train;
  zt_data_cfg data;
  zt_parallel_cfg parallel;
  zt_pipeline_cfg pipeline;
  zt_ckpt_cfg ckpt;
  char *script_path;
  char *script_text; /* kept for the record in checkpoints; never run again */
  char *json; /* the resolved plan as JSON, stored in checkpoints */
} zt_plan;

/* The budget of the Lua that runs at plan time: the script, the -e
 * statements, the library's checks and the schedule functions, together.
 * 0 means the default. A script is the user's own program, with Lua's
 * standard library; the budget only turns an endless loop or an unbounded
 * allocation into a message instead of a job that never starts. */
#define ZT_SCRIPT_SECONDS 30.0
#define ZT_SCRIPT_MIB 1024.0
typedef struct zt_script_limits {
  double seconds; /* wall-clock (--script-timeout) */
  double mib;     /* memory of the Lua state (--script-memory) */
  int quiet;      /* not the rank that prints (the backstop's message) */
  /* --ds-config, read: its statements run between the script and the -e
   * statements, and the plan records them (NULL: none) */
  struct zt_dsconfig *ds;
} zt_script_limits;

/* Runs `script` then each of `stmts` (Lua statements) in one state under
 * `lim` (NULL: the defaults), checks the result against the world size and
 * fills *p. Errors are ZT_EINPUT with file:line where Lua knows it.
 * world_size 0: no world to fit (dp = "auto" means 1) and no memory to
 * check, for tools that only inspect a plan. */
int zt_config_load(zt_plan *p, const char *script, char **stmts, int nstmts,
                   int world_size, const zt_script_limits *lim, zt_err *e);
void zt_plan_free(zt_plan *p);
/* Adds to p->json what the run opened (data.sources: each part's weight,
 * files with size, mtime and tokens), for checkpoints to keep. */
void zt_plan_record_data(zt_plan *p, const zt_data *train, const zt_data *val);
/* Whether the training data a checkpoint's plan records differs from this
 * plan's (parts, weights, files and their tokens); `why` then says where.
 * 0 when the checkpoint has no record. */
int zt_plan_data_changed(const char *ckpt_plan, const char *plan, char *why, size_t size);

#endif
