/* offload_plan (config): see offload_plan.h. */
#include "src/config/offload_plan.h"

#include <ctype.h>
#include <lauxlib.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/config/pipeline.h"

static const char *dtype_name(zt_dtype t) {
  return t == ZT_BF16 ? "bf16" : t == ZT_F16 ? "fp16" : "fp32";
}

/* A unit's name as the group and the messages give it. */
static void unit_name(int u, int layers, char *out, size_t n) {
  if (u == 0) snprintf(out, n, "embedding");
  else if (u == layers + 1) snprintf(out, n, "head");
  else snprintf(out, n, "block %d", u - 1);
}

/* Whether ZeRO `stage` shards kind k over dp. */
static int sharded(zt_offload_kind k, int stage) {
  return k == ZT_OFF_PARAMS ? stage >= 3 : k == ZT_OFF_GRADS ? stage >= 2 : stage >= 1;
}

/* Bytes of kind k of a unit of `numel` elements on one rank of its stage. */
static int64_t group_bytes(const zt_plan *p, zt_offload_kind k, int64_t numel) {
  int64_t n = sharded(k, p->parallel.zero.stage) ? (numel + p->parallel.dp - 1) / p->parallel.dp
                                                  : numel;
  size_t x = k == ZT_OFF_PARAMS ? zt_dtype_size(p->train.precision)
             : k == ZT_OFF_MOMENTS ? 2 * sizeof(float) : sizeof(float);
  return n * (int64_t)x;
}

/* Pipeline stage and chunk of unit u. */
static void unit_stage(const zt_plan *p, int u, int *stage, int *chunk) {
  int pp = p->parallel.pp, nv = p->pipeline.n_virtual, v = 0;
  if (u == p->model.layers + 1) v = nv - 1;
  else if (u > 0)
    while (v + 1 < nv && p->pipeline.first[v + 1] <= u - 1) v++;
  *stage = v % pp;
  *chunk = v / pp;
}

int zt_config_offload(lua_State *L, zt_plan *p, int check_dir, zt_err *e) {
  if (lua_getfield(L, -1, "offload") == LUA_TNIL) {
    lua_pop(L, 1);
    return ZT_OK;
  }
  zt_offload_cfg *oc = &p->parallel.zero.offload;
  int L_ = p->model.layers, nu = L_ + 2;
  lua_getfield(L, -1, "dir");
  if (lua_isstring(L, -1)) oc->dir = strdup(lua_tostring(L, -1));
  lua_pop(L, 1);
  /* this rank's tensor-parallel slice of each unit (TP rank 0's: the others
   * differ at most by a replicated kv head) */
  zt_model layout;
  int rc = zt_model_layout(&layout, &p->model, p->parallel.tp, 0, e);
  if (rc) {
    lua_pop(L, 1);
    return rc;
  }
  int64_t *numel = calloc((size_t)nu, sizeof *numel);
  for (int k = 0; k < ZT_OFF_KINDS; k++) oc->place[k] = calloc((size_t)nu, 1);
  oc->n_units = nu;
  json_t *groups = json_array();
  for (int i = 0; numel && i < layout.n_params; i++) numel[layout.param_unit[i]] += layout.params[i].t.numel;
  zt_model_free(&layout);
  for (int k = 0; k < ZT_OFF_KINDS; k++)
    if (!oc->place[k]) numel = (free(numel), NULL);
  if (!numel) {
    lua_pop(L, 1);
    json_decref(groups);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  const char *nvme_group = NULL;
  char nvme_name[48] = "";
  for (int k = 0; k < ZT_OFF_KINDS && !rc; k++)
    for (int u = 0; u < nu && !rc; u++) {
      if (!numel[u]) continue;
      int stage, chunk;
      unit_stage(p, u, &stage, &chunk);
      char name[32];
      unit_name(u, L_, name, sizeof name);
      int64_t bytes = group_bytes(p, (zt_offload_kind)k, numel[u]);
      const char *kind = zt_offload_kind_name((zt_offload_kind)k);
      const char *dt = k == ZT_OFF_PARAMS ? dtype_name(p->train.precision) : "fp32";
      lua_getfield(L, -1, "place");
      lua_createtable(L, 0, 7);
      lua_pushstring(L, kind), lua_setfield(L, -2, "kind");
      lua_pushinteger(L, stage), lua_setfield(L, -2, "stage");
      lua_pushinteger(L, chunk), lua_setfield(L, -2, "chunk");
      lua_pushinteger(L, u == 0 || u == L_ + 1 ? -1 : u - 1), lua_setfield(L, -2, "block");
      lua_pushstring(L, name), lua_setfield(L, -2, "name");
      lua_pushinteger(L, bytes), lua_setfield(L, -2, "bytes");
      lua_pushstring(L, dt), lua_setfield(L, -2, "dtype");
      rc = zt_config_call(L, 1, 1, "the offload policy", e);
      if (rc) break;
      const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
      int place = -1;
      for (int q = 0; v && q < ZT_PLACES; q++)
        if (!strcmp(v, zt_place_name((zt_place)q))) place = q;
      if (place < 0) {
        rc = zt_err_set(e, ZT_EINPUT,
                        "offload: the policy returned %s%s%s for the %s of %s (stage %d, chunk %d, "
                        "%lld bytes); it must return \"device\", \"cpu\" or \"nvme\"",
                        v ? "\"" : "a ", v ? v : luaL_typename(L, -1), v ? "\"" : " value", kind,
                        name, stage, chunk, (long long)bytes);
      } else if (place != ZT_PLACE_DEVICE && k == ZT_OFF_PARAMS && p->parallel.zero.stage < 3) {
        rc = zt_err_set(e, ZT_EINPUT,
                        "offload: the policy placed the params of %s on %s at ZeRO stage %d; "
                        "params can be offloaded at ZeRO stage 3 only (each rank holds its "
                        "shard, gathered per unit; below 3 they are whole): set parallel.zero = 3 "
                        "or keep them on the device", name, v, p->parallel.zero.stage);
      } else if (place != ZT_PLACE_DEVICE && k == ZT_OFF_GRADS) {
        rc = zt_err_set(e, ZT_EINPUT,
                        "offload: the policy placed the grads of %s on %s; grads stay on the "
                        "device (\"master\", \"moments\" and, at ZeRO stage 3, \"params\" "
                        "can be offloaded)", name, v);
      } else if (place == ZT_PLACE_NVME && !nvme_group) {
        nvme_group = kind;
        snprintf(nvme_name, sizeof nvme_name, "%s", name);
      }
      lua_pop(L, 1);
      if (rc) break;
      oc->place[k][u] = (unsigned char)place;
      p->parallel.offload_bytes[k][place] += bytes;
      json_array_append_new(groups, json_pack("{s:s, s:s, s:i, s:i, s:I, s:s}", "kind", kind,
                                              "unit", name, "stage", stage, "chunk", chunk,
                                              "bytes", (json_int_t)bytes, "place", v));
    }
  lua_pop(L, 1);
  free(numel);
  if (!rc && nvme_group && !oc->dir)
    rc = zt_err_set(e, ZT_EINPUT,
                    "offload: the policy placed the %s of %s on nvme but gives no directory; write "
                    "offload = { dir = \"/path/on/nvme\", ... }", nvme_group, nvme_name);
  struct stat st;
  if (!rc && nvme_group && check_dir &&
      (stat(oc->dir, &st) || !S_ISDIR(st.st_mode) || access(oc->dir, W_OK | X_OK)))
    rc = zt_err_set(e, ZT_EINPUT,
                    "offload.dir %s %s; the policy places the %s of %s on nvme there: give a "
                    "writable directory on a fast local disk", oc->dir,
                    stat(oc->dir, &st) ? "does not exist"
                    : !S_ISDIR(st.st_mode) ? "is not a directory" : "is not writable",
                    nvme_group, nvme_name);
  if (!rc && nvme_group) { /* names the files: this script's, rank by rank */
    const char *base = strrchr(p->script_path, '/');
    base = base ? base + 1 : p->script_path;
    oc->job = strdup(base);
    char *dot = strrchr(oc->job, '.');
    if (dot && dot != oc->job) *dot = 0;
    for (char *c = oc->job; *c; c++)
      if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_') *c = '_';
  }
  if (!rc) {
    json_t *rec = json_pack("{s:o}", "groups", groups);
    if (oc->dir) json_object_set_new(rec, "dir", json_string(oc->dir));
    p->parallel.offload_json = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
  } else {
    json_decref(groups);
  }
  return rc;
}

json_t *zt_config_offload_json(const zt_plan *p) {
  return p->parallel.offload_json ? json_loads(p->parallel.offload_json, 0, NULL) : NULL;
}

void zt_config_offload_free(zt_plan *p) {
  zt_offload_cfg *oc = &p->parallel.zero.offload;
  for (int k = 0; k < ZT_OFF_KINDS; k++) free(oc->place[k]);
  free(oc->dir);
  free(oc->job);
  free(p->parallel.offload_json);
  memset(oc, 0, sizeof *oc);
  p->parallel.offload_json = NULL;
}
