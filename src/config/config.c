/* config: see config.h. The Lua side (lua/ztrain.lua) checks keys and
 * types; this file checks what needs numbers from elsewhere (world size,
 * batch arithmetic) and converts the checked table into C structs. */
#include "src/config/config.h"
#include "src/config/pipeline.h"

#include <jansson.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zt_lua_module { const char *name; const char *src; size_t len; };
extern const struct zt_lua_module zt_lua_modules[];

/* package.searchers entry: modules of lua/ from ZTRAIN_LUA_PATH when set
 * (a source tree during development), else from the copy in the binary. */
static int search_embedded(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const char *dir = getenv("ZTRAIN_LUA_PATH");
  if (dir && *dir) {
    lua_pushfstring(L, "%s/%s.lua", dir, name);
    const char *path = lua_tostring(L, -1);
    if (luaL_loadfile(L, path) == LUA_OK) {
      lua_pushstring(L, path);
      return 2;
    }
    if (!strstr(lua_tostring(L, -1), "cannot open")) return lua_error(L);
    lua_pop(L, 2);
  }
  for (const struct zt_lua_module *m = zt_lua_modules; m->name; m++)
    if (!strcmp(m->name, name)) {
      lua_pushfstring(L, "=[ztrain]/%s.lua", name);
      if (luaL_loadbuffer(L, m->src, m->len, lua_tostring(L, -1)) != LUA_OK)
        return lua_error(L);
      lua_pushstring(L, "(embedded)");
      return 2;
    }
  lua_pushfstring(L, "no ztrain module '%s'", name);
  return 1;
}

static void install_searcher(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "searchers");
  lua_Integer n = luaL_len(L, -1);
  for (lua_Integer i = n; i >= 2; i--) { /* insert at 2, after preload */
    lua_geti(L, -1, i);
    lua_seti(L, -2, i + 1);
  }
  lua_pushcfunction(L, search_embedded);
  lua_seti(L, -2, 2);
  lua_pop(L, 2);
}

/* Field readers for the checked plan table (at the top of the stack). */
static double num(lua_State *L, const char *k) {
  lua_getfield(L, -1, k);
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}
static int has(lua_State *L, const char *k) {
  int t = lua_getfield(L, -1, k);
  lua_pop(L, 1);
  return t != LUA_TNIL;
}
static char *dupstr(lua_State *L, const char *k) {
  lua_getfield(L, -1, k);
  const char *s = lua_tostring(L, -1);
  char *v = s ? strdup(s) : NULL;
  lua_pop(L, 1);
  return v;
}
static int boolean(lua_State *L, const char *k) {
  lua_getfield(L, -1, k);
  int v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

static void read_model(lua_State *L, zt_model_cfg *m) {
  char *kind = dupstr(L, "kind");
  m->arch = !strcmp(kind, "gpt") ? ZT_ARCH_GPT : ZT_ARCH_LLAMA;
  free(kind);
  m->vocab = (int)num(L, "vocab");
  m->seq = (int)num(L, "seq");
  m->dim = (int)num(L, "dim");
  m->layers = (int)num(L, "layers");
  m->heads = (int)num(L, "heads");
  m->kv_heads = (int)num(L, "kv_heads");
  m->ffn_dim = (int)num(L, "ffn_dim");
  m->norm_eps = (float)num(L, "norm_eps");
  m->rope_theta = (float)num(L, "rope_theta");
  m->tied = boolean(L, "tied");
}

static void read_train(lua_State *L, zt_train_cfg *t) {
  t->micro_batch = (int)num(L, "micro_batch");
  t->global_batch = has(L, "global_batch") ? (int)num(L, "global_batch") : 0;
  t->steps = (int64_t)num(L, "steps");
  zt_optim_cfg *o = &t->optim;
  o->weight_decay = num(L, "weight_decay");
  o->eps = num(L, "eps");
  o->clip = num(L, "clip");
  lua_getfield(L, -1, "betas");
  lua_geti(L, -1, 1);
  lua_geti(L, -2, 2);
  o->beta1 = lua_tonumber(L, -2);
  o->beta2 = lua_tonumber(L, -1);
  lua_pop(L, 3);
  lua_getfield(L, -1, "lr");
  char *kind = dupstr(L, "kind");
  if (!strcmp(kind, "cosine")) {
    o->lr.kind = ZT_LR_COSINE;
    o->lr.peak = num(L, "peak");
    o->lr.final = num(L, "final");
    o->lr.warmup = (int64_t)num(L, "warmup");
    o->lr.decay_steps = (int64_t)num(L, "decay_steps");
  } else {
    o->lr.kind = ZT_LR_CONSTANT;
    o->lr.value = num(L, "value");
  }
  free(kind);
  lua_pop(L, 1);
  t->seed = (uint64_t)num(L, "seed");
  t->log_every = (int)num(L, "log_every");
  t->eval_every = (int)num(L, "eval_every");
  t->peak_gflops = num(L, "peak_gflops");
}

static char *absolute(char *path) {
  if (!path) return NULL;
  char buf[PATH_MAX];
  if (!realpath(path, buf)) return path; /* the loader reports it */
  free(path);
  return strdup(buf);
}

static void read_data(lua_State *L, zt_data_cfg *d) {
  d->train = absolute(dupstr(L, "train"));
  d->val = absolute(dupstr(L, "val"));
  char *dtype = dupstr(L, "dtype");
  d->token_bytes = !strcmp(dtype, "u32") ? 4 : 2;
  free(dtype);
  d->shuffle = boolean(L, "shuffle");
  d->val_batches = (int)num(L, "val_batches");
}

static int read_parallel(lua_State *L, zt_parallel_cfg *p, int world, zt_err *e) {
  p->tp = (int)num(L, "tp");
  p->pp = (int)num(L, "pp");
  p->timeout = num(L, "timeout");
  p->sequence_parallel = boolean(L, "sequence_parallel");
  lua_getfield(L, -1, "zero");
  p->zero.stage = (int)num(L, "stage");
  p->zero.bucket_bytes = (int64_t)num(L, "bucket_bytes");
  p->zero.overlap = boolean(L, "overlap");
  lua_pop(L, 1);
  lua_getfield(L, -1, "dp");
  int automatic = lua_type(L, -1) == LUA_TSTRING;
  p->dp = automatic ? 0 : (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  if (p->zero.stage > 3)
    return zt_err_set(e, ZT_EINPUT, "parallel.zero must be 0, 1, 2 or 3, got %d", p->zero.stage);
  if (!world) { /* inspecting a plan, not running it */
    if (automatic) p->dp = 1;
    return ZT_OK;
  }
  if (automatic) {
    if (world % (p->tp * p->pp))
      return zt_err_set(e, ZT_EINPUT,
                        "parallel: world size %d is not divisible by tp*pp = %d*%d = %d; "
                        "run on a multiple of %d ranks", world, p->tp, p->pp,
                        p->tp * p->pp, p->tp * p->pp);
    p->dp = world / (p->tp * p->pp);
  }
  if (p->dp * p->tp * p->pp != world)
    return zt_err_set(e, ZT_EINPUT,
                      "parallel: dp*tp*pp = %d*%d*%d = %d but the world has %d "
                      "ranks; run with -np %d or set dp = \"auto\"",
                      p->dp, p->tp, p->pp, p->dp * p->tp * p->pp, world,
                      p->dp * p->tp * p->pp);
  return ZT_OK;
}

static int check_batch(zt_train_cfg *t, int dp, zt_err *e) {
  if (!t->global_batch) t->global_batch = t->micro_batch * dp;
  int per = t->micro_batch * dp;
  if (t->global_batch % per) {
    int below = t->global_batch / per * per, above = below + per;
    if (below)
      return zt_err_set(e, ZT_EINPUT,
                        "train: global_batch %d is not divisible by micro_batch*dp = %d*%d = %d; "
                        "use a multiple of %d, e.g. %d or %d", t->global_batch, t->micro_batch,
                        dp, per, per, below, above);
    return zt_err_set(e, ZT_EINPUT,
                      "train: global_batch %d is not divisible by micro_batch*dp = %d*%d = %d; "
                      "use a multiple of %d, e.g. %d, or a smaller micro_batch", t->global_batch,
                      t->micro_batch, dp, per, per, above);
  }
  t->accum = t->global_batch / per;
  return ZT_OK;
}

static char *plan_json(const zt_plan *p) {
  const zt_model_cfg *m = &p->model;
  const zt_train_cfg *t = &p->train;
  const zt_lr *lr = &t->optim.lr;
  json_t *jlr = lr->kind == ZT_LR_COSINE
                    ? json_pack("{s:s, s:f, s:I, s:f, s:I}", "kind", "cosine", "peak",
                                lr->peak, "warmup", (json_int_t)lr->warmup, "final",
                                lr->final, "decay_steps", (json_int_t)lr->decay_steps)
                    : json_pack("{s:s, s:f}", "kind", "constant", "value", lr->value);
  json_t *root = json_pack(
      "{s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b},"
      " s:{s:i, s:i, s:i, s:I, s:o, s:f, s:[f,f], s:f, s:f, s:I},"
      " s:{s:s, s:s?, s:s, s:b},"
      " s:{s:i, s:i, s:i, s:i, s:b}}",
      "model", "kind", m->arch == ZT_ARCH_GPT ? "gpt" : "llama", "vocab", m->vocab,
      "seq", m->seq, "dim", m->dim, "layers", m->layers, "heads", m->heads,
      "kv_heads", m->kv_heads, "ffn_dim", m->ffn_dim, "norm_eps", (double)m->norm_eps,
      "rope_theta", (double)m->rope_theta, "tied", m->tied,
      "train", "micro_batch", t->micro_batch, "global_batch", t->global_batch,
      "accum", t->accum, "steps", (json_int_t)t->steps, "lr", jlr,
      "weight_decay", t->optim.weight_decay, "betas", t->optim.beta1, t->optim.beta2,
      "eps", t->optim.eps, "clip", t->optim.clip, "seed", (json_int_t)t->seed,
      "data", "train", p->data.train, "val", p->data.val, "dtype",
      p->data.token_bytes == 4 ? "u32" : "u16", "shuffle", p->data.shuffle,
      "parallel", "dp", p->parallel.dp, "tp", p->parallel.tp, "pp", p->parallel.pp,
      "zero", p->parallel.zero.stage, "sequence_parallel", p->parallel.sequence_parallel);
  /* the pipeline as it ran: blocks of each virtual stage, the schedule */
  json_t *stages = json_array(), *par = json_object_get(root, "parallel");
  for (int v = 0; v < p->pipeline.n_virtual; v++)
    json_array_append_new(stages, json_pack("[i, i]", p->pipeline.first[v], p->pipeline.last[v]));
  json_object_set_new(par, "stages", stages);
  json_object_set_new(par, "schedule", json_pack("{s:s, s:i}", "name", p->pipeline.schedule.name,
                                                 "chunks", p->pipeline.schedule.chunks));
  char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(root);
  return s;
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0, got;
  char *buf = malloc(cap + 1);
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *bigger = realloc(buf, (cap *= 2) + 1);
      if (!bigger) free(buf);
      buf = bigger;
    }
  }
  fclose(f);
  if (buf) buf[n] = 0;
  return buf;
}

static int run_chunk(lua_State *L, int load_rc, zt_err *e) {
  if (load_rc == LUA_OK) load_rc = lua_pcall(L, 0, 0, 0);
  if (load_rc != LUA_OK) {
    zt_err_set(e, ZT_EINPUT, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return ZT_EINPUT;
  }
  return ZT_OK;
}

int zt_config_load(zt_plan *p, const char *script, char **stmts, int nstmts,
                   int world_size, zt_err *e) {
  memset(p, 0, sizeof *p);
  p->script_path = strdup(script);
  lua_State *L = luaL_newstate();
  if (!L) return zt_err_set(e, ZT_ERUNTIME, "cannot create a Lua state");
  luaL_openlibs(L);
  install_searcher(L);
  /* The optional tables exist empty, so that -e 'parallel.zero = 2' works
   * on a script that never mentions them; `zt` is there for -e too. */
  const char *pre = "parallel = {} checkpoint = {} zt = require 'ztrain'";
  int rc = run_chunk(L, luaL_loadbuffer(L, pre, strlen(pre), "=(ztrain)"), e);
  if (!rc) rc = run_chunk(L, luaL_loadfile(L, script), e);
  for (int i = 0; i < nstmts && !rc; i++)
    rc = run_chunk(L, luaL_loadbuffer(L, stmts[i], strlen(stmts[i]), "=(-e)"), e);
  if (!rc) {
    lua_getglobal(L, "require");
    lua_pushstring(L, "ztrain");
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
      rc = zt_err_set(e, ZT_EINPUT, "%s", lua_tostring(L, -1));
    } else {
      lua_getfield(L, -1, "_plan");
      lua_pushstring(L, script);
      if (lua_pcall(L, 1, 1, 0) != LUA_OK)
        rc = zt_err_set(e, ZT_EINPUT, "%s", lua_tostring(L, -1));
    }
  }
  if (!rc) {
    lua_getfield(L, -1, "model");
    read_model(L, &p->model);
    lua_getfield(L, -2, "train");
    read_train(L, &p->train);
    lua_getfield(L, -3, "data");
    read_data(L, &p->data);
    lua_getfield(L, -4, "checkpoint");
    p->ckpt.dir = dupstr(L, "dir");
    p->ckpt.every = (int)num(L, "every");
    p->ckpt.keep = (int)num(L, "keep");
    p->ckpt.async = boolean(L, "async");
    lua_getfield(L, -5, "parallel");
    rc = read_parallel(L, &p->parallel, world_size, e);
    lua_pop(L, 5);
  }
  if (!rc) rc = zt_model_cfg_check(&p->model, e);
  if (!rc) rc = zt_model_tp_check(&p->model, p->parallel.tp, e);
  if (!rc) rc = check_batch(&p->train, p->parallel.dp, e);
  p->model.sequence_parallel = p->parallel.sequence_parallel;
  if (!rc) rc = zt_model_sp_check(&p->model, p->train.micro_batch, p->parallel.tp, e);
  if (!rc) rc = zt_config_pipeline(L, p, e);
  lua_close(L);
  if (!rc) p->json = plan_json(p);
  if (!rc) p->script_text = read_text(script);
  return rc;
}

void zt_plan_free(zt_plan *p) {
  free(p->script_text);
  zt_schedule_report_free(&p->pipeline.report);
  zt_schedule_free(&p->pipeline.schedule);
  free(p->pipeline.first);
  free(p->pipeline.last);
  free(p->script_path);
  free(p->json);
  free(p->data.train);
  free(p->data.val);
  free(p->ckpt.dir);
  memset(p, 0, sizeof *p);
}
