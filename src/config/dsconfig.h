/* dsconfig: `--ds-config ds_config.json`, a DeepSpeed JSON config read as
 * Lua statements on the run's tables. The statements run after the script
 * and before the -e statements (so -e still wins), and go through the same
 * checks as the script's own; the plan records them, so a checkpoint says
 * how the run was configured. Keys ztrain cannot honour are refused (exit
 * 2), keys without a ztrain meaning are listed as ignored with the reason:
 * nothing is silently dropped or approximated. See docs/script.md,
 * "DeepSpeed configs". */
#ifndef ZT_DSCONFIG_H
#define ZT_DSCONFIG_H

#include <stdint.h>

#include "src/core/err.h"

typedef struct lua_State lua_State;

/* One of train_batch_size, train_micro_batch_size_per_gpu,
 * gradient_accumulation_steps: absent, "auto", or a number. */
typedef struct zt_ds_count {
  int given; /* 1: a number in `n` */
  int automatic;
  int64_t n;
} zt_ds_count;

typedef struct zt_dsconfig {
  char *path;
  char *stmts;  /* Lua statements from everything but the batch (read) */
  char *lua;    /* all the statements run, batch included (apply) */
  char *report; /* lines for rank 0: each key -> its statement, ignored keys, warnings */
  zt_ds_count batch, micro, accum;
} zt_dsconfig;

/* Reads and checks the JSON file (types, refused keys); ZT_EINPUT with the
 * key path, the value and what would work. */
int zt_dsconfig_read(zt_dsconfig *ds, const char *path, zt_err *e);
/* Runs in the script's Lua state after the script: resolves the batch
 * triple against dp = world / (tp * pp) of the script's parallel table
 * (world 0: dp 1 when "auto") and runs the statements. */
int zt_dsconfig_apply(zt_dsconfig *ds, lua_State *L, int world, zt_err *e);
void zt_dsconfig_free(zt_dsconfig *ds);

#endif
