/* pipeline (config): turns the checked plan's pipeline part — the blocks of
 * each virtual stage and the schedule — into C data, running the schedule's
 * Lua function once per stage and checking the lists together
 * (parallel/schedule.h). Internal to src/config. */
#ifndef ZT_CONFIG_PIPELINE_H
#define ZT_CONFIG_PIPELINE_H

#include <lua.h>

#include "src/config/config.h"

/* With the checked plan table on top of L's stack and p's batch arithmetic
 * done: fills p->pipeline. */
int zt_config_pipeline(lua_State *L, zt_plan *p, zt_err *e);

/* lua_pcall of the function below nargs arguments, under the script's
 * budget (config.c); a failure becomes *e (ZT_EINPUT) in the user's terms,
 * `doing` naming what ran when it is not the script itself. */
int zt_config_call(lua_State *L, int nargs, int nresults, const char *doing, zt_err *e);

#endif
