/* offload_plan (config): runs the script's `offload` policy once per state
 * group (kind x unit: the embedding, each block, the final norm and head)
 * at plan time, checks what it returns and records it in
 * p->parallel.zero.offload (the engine's per-unit placements) and
 * p->parallel.offload_bytes (what the banner sums up). Internal to
 * src/config. */
#ifndef ZT_CONFIG_OFFLOAD_PLAN_H
#define ZT_CONFIG_OFFLOAD_PLAN_H

#include <jansson.h>
#include <lua.h>

#include "src/config/config.h"

/* With the checked plan table on top of L's stack, after the pipeline's
 * stages are known; check_dir: offload.dir must be a writable directory
 * here (not when a plan is only inspected). ZT_EINPUT for a policy that fails, returns anything
 * but "device", "cpu" or "nvme", or places a group where it cannot go. */
int zt_config_offload(lua_State *L, zt_plan *p, int check_dir, zt_err *e);

/* The plan's record of the placements (NULL when no policy ran). */
json_t *zt_config_offload_json(const zt_plan *p);

void zt_config_offload_free(zt_plan *p);

#endif
