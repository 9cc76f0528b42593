/* pipeline (config): see pipeline.h. */
#include "src/config/pipeline.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int read_stages(lua_State *L, zt_pipeline_cfg *pc, zt_err *e) {
  lua_getfield(L, -1, "parallel");
  lua_getfield(L, -1, "stages");
  int n = (int)luaL_len(L, -1);
  pc->n_virtual = n;
  pc->first = malloc((size_t)n * sizeof *pc->first);
  pc->last = malloc((size_t)n * sizeof *pc->last);
  if (!pc->first || !pc->last) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int i = 0; i < n; i++) {
    lua_geti(L, -1, i + 1);
    lua_geti(L, -1, 1);
    lua_geti(L, -2, 2);
    pc->first[i] = (int)lua_tointeger(L, -2);
    pc->last[i] = (int)lua_tointeger(L, -1);
    lua_pop(L, 3);
  }
  lua_pop(L, 2);
  return ZT_OK;
}

static double cost_of(lua_State *L, const char *op, double dflt) {
  lua_getfield(L, -1, op);
  double v = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : dflt;
  lua_pop(L, 1);
  return v;
}

static int read_lists(lua_State *L, zt_schedule *s, zt_err *e) {
  for (int st = 0; st < s->stages; st++) {
    lua_geti(L, -1, st + 1);
    int n = (int)luaL_len(L, -1);
    s->n[st] = n;
    s->list[st] = malloc((size_t)(n ? n : 1) * sizeof *s->list[st]);
    if (!s->list[st]) return zt_err_set(e, ZT_ERUNTIME, "out of memory for a schedule");
    for (int i = 0; i < n; i++) {
      lua_geti(L, -1, i + 1);
      lua_getfield(L, -1, "op");
      const char *op = lua_tostring(L, -1);
      lua_getfield(L, -2, "mb");
      lua_getfield(L, -3, "chunk");
      zt_action *a = &s->list[st][i];
      a->op = op[0] == 'F' ? ZT_ACT_F : op[0] == 'B' ? ZT_ACT_B : ZT_ACT_W;
      a->mb = (int)lua_tointeger(L, -2);
      a->chunk = (int)lua_tointeger(L, -1); /* nil reads as 0 */
      lua_pop(L, 4);
    }
    lua_pop(L, 1);
  }
  return ZT_OK;
}

int zt_config_pipeline(lua_State *L, zt_plan *p, zt_err *e) {
  zt_pipeline_cfg *pc = &p->pipeline;
  int rc = read_stages(L, pc, e);
  if (rc) return rc;
  int pp = p->parallel.pp, m = p->train.accum;
  lua_getfield(L, -1, "schedule");
  lua_getfield(L, -1, "name");
  const char *name = lua_tostring(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, -1, "chunks");
  int chunks = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, -1, "min_multiple");
  int multiple = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (multiple && (m % pp || m < pp)) {
    lua_pop(L, 1);
    return zt_err_set(e, ZT_EINPUT,
                      "schedule %s needs the micro-batches per step to be a multiple of pp = %d "
                      "(at least %d); this run has %d (global_batch / (micro_batch * dp) = "
                      "%d / (%d * %d))", name, pp, pp, m, p->train.global_batch,
                      p->train.micro_batch, p->parallel.dp);
  }
  rc = zt_schedule_alloc(&pc->schedule, name, pp, m, chunks, e);
  if (!rc) {
    zt_schedule *s = &pc->schedule;
    if (lua_getfield(L, -1, "costs") == LUA_TTABLE) {
      s->cost[ZT_ACT_F] = cost_of(L, "F", 1);
      s->cost[ZT_ACT_B] = cost_of(L, "B", 1);
      s->cost[ZT_ACT_W] = cost_of(L, "W", 1);
    }
    lua_pop(L, 1);
    char doing[160];
    snprintf(doing, sizeof doing, "building the action lists of schedule %s (%d stages, %d micro-batches "
             "per step)", s->name, pp, m);
    lua_getfield(L, LUA_REGISTRYINDEX, "ztrain._schedule_lists"); /* config.c put it there */
    lua_pushvalue(L, -2); /* the schedule table */
    lua_pushinteger(L, pp);
    lua_pushinteger(L, m);
    rc = zt_config_call(L, 3, 1, doing, e);
    if (!rc) {
      rc = read_lists(L, s, e);
      lua_pop(L, 1);
    }
    if (!rc) rc = zt_schedule_check(s, &pc->report, e);
  }
  lua_pop(L, 1); /* schedule */
  return rc;
}
