/* config: see config.h. The Lua side (lua/ztrain.lua) checks keys and
 * types; this file checks what needs numbers from elsewhere (world size,
 * batch arithmetic) and converts the checked table into C structs. */
#include "src/config/config.h"
#include "src/config/data_spec.h"
#include "src/config/dsconfig.h"
#include "src/config/pipeline.h"
#include "src/config/offload_plan.h"
#include "src/config/plan_json.h"

#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm.h"
#include "src/core/timer.h"
#include "src/data/tokenizer.h"

struct zt_lua_module { const char *name; const char *src; size_t len; };
static char *read_text(const char *path);
extern const struct zt_lua_module zt_lua_modules[];

/* package.searchers entry: modules of lua/ from ZTRAIN_LUA_PATH when set
 * (a source tree during development), else from the copy in the binary. */
static int search_embedded(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const char *dir = getenv("ZTRAIN_LUA_PATH");
  if (dir && *dir) {
    /* named as the embedded copy is: the library's frames are told from
     * the user's by that name ("[ztrain]/...") */
    lua_pushfstring(L, "%s/%s.lua", dir, name);
    const char *path = lua_tostring(L, -1);
    char *text = read_text(path);
    if (text) {
      lua_pushfstring(L, "=[ztrain]/%s.lua", name);
      int st = luaL_loadbuffer(L, text, strlen(text), lua_tostring(L, -1));
      free(text);
      if (st != LUA_OK) return lua_error(L);
      lua_pushstring(L, path);
      return 2;
    }
    lua_pop(L, 1);
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

/* The budget the Lua state runs under (zt_script_limits): memory through
 * the state's allocator, time through a count hook. `where` is the last
 * position in the user's code (the script, -e, a schedule function) that
 * the hook saw, for the message. */
typedef struct script_budget {
  size_t used, limit; /* limit: cap while Lua runs, else none (C reading the plan must not fail) */
  size_t cap;
  int refused; /* an allocation was refused */
  double start, seconds;
  int timed_out;
  const char *script;
  char where[LUA_IDSIZE + 24];
} script_budget;

static void *budget_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  script_budget *b = ud;
  size_t old = ptr ? osize : 0; /* without ptr, osize is a type tag */
  if (nsize == 0) {
    free(ptr);
    b->used -= old;
    return NULL;
  }
  /* only growth is refused: Lua counts on a shrink to succeed */
  if (nsize > old && b->used - old + nsize > b->limit) {
    b->refused = 1;
    return NULL;
  }
  void *q = realloc(ptr, nsize);
  if (q) b->used = b->used - old + nsize;
  return q;
}

/* Instructions between looks at the clock: a few microseconds of Lua. */
#define HOOK_COUNT 1000

static void budget_hook(lua_State *L, lua_Debug *ar) {
  void *ud;
  lua_getallocf(L, &ud);
  script_budget *b = ud;
  /* the library's own code ("[ztrain]/...", "(ztrain)") is not where the user looks */
  if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0 && ar->short_src[0] != '[' &&
      strcmp(ar->short_src, "(ztrain)"))
    snprintf(b->where, sizeof b->where, "%s:%d", ar->short_src, ar->currentline);
  if (b->timed_out || zt_timer_now() - b->start > b->seconds) {
    b->timed_out = 1;
    /* from now on every instruction fails, so a pcall in the script
     * cannot swallow the end of its time */
    lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1);
    luaL_error(L, "out of time");
  }
}

/* The hook cannot reach Lua that runs with hooks off (a __gc finalizer)
 * nor one long call into C (a pathological pattern match). A thread ends
 * the process a little past the budget rather than let the job hang: it
 * prints the message where the CLI would (the first rank) and exits with
 * the bad-input status. */
typedef struct backstop {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int done, running, quiet;
  struct timespec deadline; /* CLOCK_MONOTONIC */
  char msg[512];
} backstop;


static void *backstop_main(void *arg) {
  backstop *bs = arg;
  int rc = 0;
  pthread_mutex_lock(&bs->lock);
  while (!bs->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&bs->cv, &bs->lock, &bs->deadline);
  int fire = !bs->done;
  pthread_mutex_unlock(&bs->lock);
  if (fire) {
    if (!bs->quiet) {
      ssize_t w = write(STDERR_FILENO, bs->msg, strlen(bs->msg));
      (void)w;
    }
    _exit(ZT_EINPUT);
  }
  return NULL;
}

static void backstop_start(backstop *bs, const char *script, double seconds, int quiet) {
  bs->quiet = quiet;
  double grace = seconds < 5 ? seconds : 5, at;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  at = (double)now.tv_sec + 1e-9 * now.tv_nsec + seconds + grace;
  bs->deadline.tv_sec = (time_t)at;
  bs->deadline.tv_nsec = (long)((at - (double)bs->deadline.tv_sec) * 1e9);
  snprintf(bs->msg, sizeof bs->msg,
           "ztrain: error: %s: the script ran for more than %g s (--script-timeout) in code that "
           "cannot be stopped in between (a __gc finalizer or one long library call); ended\n",
           script, seconds);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&bs->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&bs->lock, NULL);
  bs->done = 0;
  bs->running = pthread_create(&bs->thread, NULL, backstop_main, bs) == 0;
}

static void backstop_stop(backstop *bs) {
  if (bs->running) {
    pthread_mutex_lock(&bs->lock);
    bs->done = 1;
    pthread_cond_signal(&bs->cv);
    pthread_mutex_unlock(&bs->lock);
    pthread_join(bs->thread, NULL);
  }
  pthread_cond_destroy(&bs->cv);
  pthread_mutex_destroy(&bs->lock);
}

/* The innermost of the user's functions on the stack (not the library's
 * "[ztrain]/..." chunks, not C): pushes "file:line" and returns 1, or 0. */
static int push_user_where(lua_State *L) {
  lua_Debug ar;
  for (int level = 1; lua_getstack(L, level, &ar); level++)
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0 && ar.short_src[0] != '[') {
      lua_pushfstring(L, "%s:%d", ar.short_src, ar.currentline);
      return 1;
    }
  return 0;
}

/* Message handler: an error raised at one of the library's own lines
 * (a check the library makes without naming the user's line, or a fault
 * in it) is put at the user's line that called into the library, the
 * library's position kept at the end; an error value that is not a
 * string still says what it is, and where the script was, as near as the
 * hook knows. */
static int error_text(lua_State *L) {
  if (lua_type(L, 1) == LUA_TSTRING) {
    const char *msg = lua_tostring(L, 1), *colon;
    size_t n;
    if (!strncmp(msg, "[ztrain]/", 9) && (colon = strchr(msg + 9, ':')) &&
        (n = strspn(colon + 1, "0123456789")) > 0 && colon[1 + n] == ':' &&
        push_user_where(L)) {
      const char *user = lua_tostring(L, -1);
      const char *lib = lua_pushlstring(L, msg, (size_t)(colon + 1 + n - msg));
      lua_pushfstring(L, "%s:%s (at %s)", user, colon + 2 + n, lib);
    }
    return 1;
  }
  if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
  void *ud;
  lua_getallocf(L, &ud);
  const script_budget *b = ud;
  const char *at = b->where[0] ? b->where : b->script;
  /* the innermost of the user's functions on the stack raised it */
  if (push_user_where(L)) at = lua_tostring(L, -1);
  lua_pushfstring(L, "%s: error(...) with a %s value, not a message", at, luaL_typename(L, 1));
  return 1;
}

/* After a failed load or call (status, the error value on top): *e in the
 * user's terms, the error value popped. `doing` names what ran when it is
 * not the script itself (the plan's checks, a schedule's function). */
static int lua_failure(lua_State *L, int status, const char *doing, zt_err *e) {
  void *ud;
  lua_getallocf(L, &ud);
  const script_budget *b = ud;
  const char *at = b->where[0] ? b->where : b->script;
  const char *msg = lua_tostring(L, -1);
  if (b->timed_out) {
    if (doing)
      zt_err_set(e, ZT_EINPUT, "%s: %s took more than %g s (--script-timeout)", at, doing, b->seconds);
    else
      zt_err_set(e, ZT_EINPUT, "%s: the script ran for more than %g s (--script-timeout): an endless loop?",
                 at, b->seconds);
  } else if (status == LUA_ERRMEM || (b->refused && msg && !strcmp(msg, "not enough memory"))) {
    zt_err_set(e, ZT_EINPUT, "%s: %s needed more than %g MiB of memory (--script-memory)", at,
               doing ? doing : "the script", (double)b->cap / (1024.0 * 1024.0));
  } else {
    zt_err_set(e, ZT_EINPUT, "%s", msg ? msg : "(error object is not a string)");
  }
  lua_pop(L, 1);
  return ZT_EINPUT;
}

int zt_config_call(lua_State *L, int nargs, int nresults, const char *doing, zt_err *e) {
  int handler = lua_gettop(L) - nargs;
  lua_pushcfunction(L, error_text);
  lua_insert(L, handler);
  void *ud;
  lua_getallocf(L, &ud);
  script_budget *b = ud;
  b->where[0] = 0; /* a position from an earlier part would mislead */
  b->limit = b->cap;
  int status = lua_pcall(L, nargs, nresults, handler);
  lua_remove(L, handler);
  int rc = status == LUA_OK ? ZT_OK : lua_failure(L, status, doing, e);
  b->limit = SIZE_MAX;
  return rc;
}

/* Field readers for the checked plan table (at the top of the stack); the
 * Lua side has checked each value against the C type it goes into. */
static double num(lua_State *L, const char *k) {
  lua_getfield(L, -1, k);
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}
static lua_Integer integer(lua_State *L, const char *k) {
  lua_getfield(L, -1, k);
  lua_Integer v = lua_tointeger(L, -1);
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
  m->vocab = (int)integer(L, "vocab");
  m->seq = (int)integer(L, "seq");
  m->dim = (int)integer(L, "dim");
  m->layers = (int)integer(L, "layers");
  m->heads = (int)integer(L, "heads");
  m->kv_heads = (int)integer(L, "kv_heads");
  m->ffn_dim = (int)integer(L, "ffn_dim");
  m->norm_eps = (float)num(L, "norm_eps");
  m->rope_theta = (float)num(L, "rope_theta");
  m->tied = boolean(L, "tied");
}

static void read_train(lua_State *L, zt_train_cfg *t) {
  t->micro_batch = (int)integer(L, "micro_batch");
  t->global_batch = has(L, "global_batch") ? (int)integer(L, "global_batch") : 0;
  t->steps = (int64_t)integer(L, "steps");
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
    o->lr.warmup = (int64_t)integer(L, "warmup");
    o->lr.decay_steps = (int64_t)integer(L, "decay_steps");
  } else if (!strcmp(kind, "deepspeed")) {
    o->lr.kind = ZT_LR_DEEPSPEED;
    char *type = dupstr(L, "type"), *wt = dupstr(L, "warmup_type");
    o->lr.ds.type = !strcmp(type, "WarmupLR") ? ZT_DS_WARMUP
                    : !strcmp(type, "WarmupDecayLR") ? ZT_DS_WARMUP_DECAY : ZT_DS_WARMUP_COSINE;
    o->lr.ds.log = !strcmp(wt, "log");
    free(type), free(wt);
    o->lr.ds.warmup_num_steps = (int64_t)integer(L, "warmup_num_steps");
    if (o->lr.ds.type != ZT_DS_WARMUP) o->lr.ds.total_num_steps = (int64_t)integer(L, "total_num_steps");
    if (o->lr.ds.type == ZT_DS_WARMUP_COSINE) {
      o->lr.ds.lr = num(L, "lr");
      o->lr.ds.warmup_min_ratio = num(L, "warmup_min_ratio");
      o->lr.ds.cos_min_ratio = num(L, "cos_min_ratio");
    } else {
      o->lr.ds.warmup_min_lr = num(L, "warmup_min_lr");
      o->lr.ds.warmup_max_lr = num(L, "warmup_max_lr");
    }
  } else {
    o->lr.kind = ZT_LR_CONSTANT;
    o->lr.value = num(L, "value");
  }
  free(kind);
  lua_pop(L, 1);
  t->seed = (uint64_t)integer(L, "seed"); /* >= 0, and not through a double: every bit counts */
  t->log_every = (int)integer(L, "log_every");
  t->eval_every = (int)integer(L, "eval_every");
  t->peak_gflops = num(L, "peak_gflops");
  t->max_bad_steps = (int)integer(L, "max_bad_steps");
  char *prec = dupstr(L, "precision");
  t->precision = !strcmp(prec, "bf16") ? ZT_BF16 : !strcmp(prec, "fp16") ? ZT_F16 : ZT_F32;
  free(prec);
  prec = dupstr(L, "grad_reduce_dtype");
  t->grad_reduce = !strcmp(prec, "bf16") ? ZT_BF16 : !strcmp(prec, "fp16") ? ZT_F16 : ZT_F32;
  free(prec);
  lua_getfield(L, -1, "loss_scale");
  zt_scaler_cfg *ls = &t->loss_scale;
  ls->dynamic = boolean(L, "dynamic");
  if (ls->dynamic) {
    ls->initial_scale_power = (int)integer(L, "initial_scale_power");
    ls->loss_scale_window = (int64_t)integer(L, "loss_scale_window");
    ls->hysteresis = (int)integer(L, "hysteresis");
    ls->min_loss_scale = num(L, "min_loss_scale");
    ls->consecutive_hysteresis = boolean(L, "consecutive_hysteresis");
  } else {
    ls->scale = num(L, "scale");
  }
  lua_pop(L, 1);
}

/* plan.train.recompute: one boolean per block (the Lua side resolved it);
 * NULL when no block recomputes. */
static unsigned char *read_recompute(lua_State *L, int layers) {
  lua_getfield(L, -1, "recompute");
  unsigned char *r = calloc((size_t)layers, 1);
  int any = 0;
  for (int l = 0; r && l < layers; l++) {
    lua_geti(L, -1, l + 1);
    any |= r[l] = (unsigned char)lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (!any) {
    free(r);
    return NULL;
  }
  return r;
}

static int read_data(lua_State *L, zt_data_cfg *d, zt_err *e) {
  lua_getfield(L, -1, "train");
  int rc = zt_config_data_spec(L, "data.train", &d->train_spec, e);
  lua_pop(L, 1);
  if (rc) return rc;
  if (lua_getfield(L, -1, "val") != LUA_TNIL)
    rc = zt_config_data_spec(L, "data.val", &d->val_spec, e);
  lua_pop(L, 1);
  if (rc) return rc;
  d->train = strdup(d->train_spec.parts[0].paths[0]);
  if (d->val_spec.n) d->val = strdup(d->val_spec.parts[0].paths[0]);
  char *dtype = dupstr(L, "dtype");
  d->token_bytes = !strcmp(dtype, "u32") ? 4 : 2;
  free(dtype);
  d->shuffle = boolean(L, "shuffle");
  d->val_batches = (int)integer(L, "val_batches");
  /* a path as sample and the HF export will find it from anywhere; one
   * that does not resolve stays as written, for the load's message */
  d->tokenizer = dupstr(L, "tokenizer");
  char abs[PATH_MAX];
  if (strcmp(d->tokenizer, "byte") && realpath(d->tokenizer, abs)) {
    free(d->tokenizer);
    d->tokenizer = strdup(abs);
  }
  return ZT_OK;
}

/* data.tokenizer must load and fit the model: sample decodes with it. */
static int check_tokenizer(const zt_plan *p, zt_err *e) {
  zt_tok *t;
  int rc = zt_tok_open(&t, p->data.tokenizer, e);
  if (!rc && zt_tok_vocab(t) > p->model.vocab)
    rc = zt_err_set(e, ZT_EINPUT, "data.tokenizer %s has vocab %d, more than model.vocab %d",
                    p->data.tokenizer, zt_tok_vocab(t), p->model.vocab);
  zt_tok_free(t);
  return rc;
}

static int read_parallel(lua_State *L, zt_parallel_cfg *p, int world, zt_err *e) {
  p->tp = (int)integer(L, "tp");
  p->pp = (int)integer(L, "pp");
  p->timeout = num(L, "timeout");
  p->strict = boolean(L, "strict");
  p->sequence_parallel = boolean(L, "sequence_parallel");
  char *device = dupstr(L, "device");
  p->device = !strcmp(device, "cpu") ? ZT_DEVICE_CPU : !strcmp(device, "cuda") ? ZT_DEVICE_CUDA
                                                                                : ZT_DEVICE_AUTO;
  free(device);
  lua_getfield(L, -1, "zero");
  p->zero.stage = (int)integer(L, "stage");
  p->zero.bucket_bytes = (int64_t)integer(L, "bucket_bytes");
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
  /* each is a C int, their products need not be */
  long long tpp = (long long)p->tp * p->pp;
  if (automatic) {
    if (world % tpp)
      return zt_err_set(e, ZT_EINPUT,
                        "parallel: world size %d is not divisible by tp*pp = %d*%d = %lld; "
                        "run on a multiple of %lld ranks", world, p->tp, p->pp, tpp, tpp);
    p->dp = (int)(world / tpp);
  }
  long long all = p->dp * tpp;
  if (all != world)
    return zt_err_set(e, ZT_EINPUT,
                      "parallel: dp*tp*pp = %d*%d*%d = %lld but the world has %d "
                      "ranks; run with -np %lld or set dp = \"auto\"",
                      p->dp, p->tp, p->pp, all, world, all);
  return ZT_OK;
}

static int check_batch(zt_train_cfg *t, int dp, int seq, zt_err *e) {
  long long per = (long long)t->micro_batch * dp, rows = (long long)t->micro_batch * seq;
  /* the kernels count the rows of a micro-batch in a C int */
  if (rows > INT_MAX)
    return zt_err_set(e, ZT_EINPUT,
                      "train: micro_batch*seq = %d*%d = %lld rows per micro-batch, more than %d; "
                      "use micro_batch <= %d", t->micro_batch, seq, rows, INT_MAX, INT_MAX / seq);
  if (!t->global_batch && per > INT_MAX)
    return zt_err_set(e, ZT_EINPUT,
                      "train: global_batch defaults to micro_batch*dp = %d*%d = %lld, more than %d; "
                      "use a smaller micro_batch", t->micro_batch, dp, per, INT_MAX);
  if (!t->global_batch) t->global_batch = (int)per;
  if (t->global_batch % per) {
    long long below = t->global_batch / per * per, above = below + per;
    if (below)
      return zt_err_set(e, ZT_EINPUT,
                        "train: global_batch %d is not divisible by micro_batch*dp = %d*%d = %lld; "
                        "use a multiple of %lld, e.g. %lld or %lld", t->global_batch, t->micro_batch,
                        dp, per, per, below, above);
    return zt_err_set(e, ZT_EINPUT,
                      "train: global_batch %d is not divisible by micro_batch*dp = %d*%d = %lld; "
                      "use a multiple of %lld, e.g. %lld, or a smaller micro_batch", t->global_batch,
                      t->micro_batch, dp, per, per, above);
  }
  t->accum = (int)(t->global_batch / per);
  return ZT_OK;
}

/* A number from a file like /proc/meminfo's "MemAvailable:" line (key
 * given) or a cgroup file holding one number; -1 when absent or "max". */
static double read_number(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  double v = -1;
  while (fgets(line, sizeof line, f)) {
    if (key && strncmp(line, key, strlen(key))) continue;
    char *end, *at = key ? line + strlen(key) : line;
    double x = strtod(at, &end);
    if (end != at) v = key && strstr(end, "kB") ? x * 1024 : x;
    break;
  }
  fclose(f);
  return v;
}

/* The memory this rank may count on: what the kernel calls available, or
 * less under a cgroup limit (a Slurm job, a container), shared by the
 * ranks of this node. How many that is comes from the launcher's
 * environment: the grid does not exist yet, and MPI stays in parallel/.
 * Unknown, it counts as one (as before this check: never a false refusal
 * for a count it cannot know). */
static void memory_budget(zt_mem_budget *mb, int dp, int zero) {
  char what[96];
  double avail = read_number("/proc/meminfo", "MemAvailable:");
  snprintf(what, sizeof what, "MemAvailable");
  if (avail < 0) {
    struct sysinfo si;
    if (sysinfo(&si)) return;
    avail = ((double)si.freeram + (double)si.bufferram) * si.mem_unit;
    snprintf(what, sizeof what, "free memory");
  }
  /* cgroup v2 at the namespace's root, then v1's memory controller */
  static const char *const limits[][2] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (int i = 0; i < 2; i++) {
    double limit = read_number(limits[i][0], NULL), used = read_number(limits[i][1], NULL);
    if (limit > 0 && limit < 0x1p60 && used >= 0 && limit - used < avail) {
      avail = limit > used ? limit - used : 0;
      snprintf(what, sizeof what, "the cgroup limit %.2f GiB less %.2f GiB used", limit / 0x1p30,
               used / 0x1p30);
    }
  }
  int ranks = zt_comm_node_size(); /* the ranks sharing this node's memory */
  mb->avail = avail > 0 ? avail / ranks : 1; /* 0 would mean no check */
  if (ranks > 1)
    snprintf(mb->source, sizeof mb->source, "%s %.2f GiB shared by %d ranks on this node",
             what, avail / 0x1p30, ranks);
  else
    snprintf(mb->source, sizeof mb->source, "%s", what);
  mb->dp = dp;
  mb->zero = zero;
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

/* Loads (load_rc: the loader's status) and runs one chunk of the user's. */
static int run_chunk(lua_State *L, int load_rc, zt_err *e) {
  if (load_rc != LUA_OK) return lua_failure(L, load_rc, NULL, e);
  return zt_config_call(L, 0, 0, NULL, e);
}

int zt_config_load(zt_plan *p, const char *script, char **stmts, int nstmts,
                   int world_size, const zt_script_limits *lim, zt_err *e) {
  memset(p, 0, sizeof *p);
  p->script_path = strdup(script);
  double seconds = lim && lim->seconds > 0 ? lim->seconds : ZT_SCRIPT_SECONDS;
  double mib = lim && lim->mib > 0 ? lim->mib : ZT_SCRIPT_MIB;
  script_budget budget = {.limit = SIZE_MAX,
                          .cap = mib * 1024 * 1024 < (double)SIZE_MAX ? (size_t)(mib * 1024 * 1024)
                                                                      : SIZE_MAX,
                          .start = zt_timer_now(), .seconds = seconds, .script = script};
  lua_State *L = lua_newstate(budget_alloc, &budget);
  if (!L) return zt_err_set(e, ZT_ERUNTIME, "cannot create a Lua state");
  backstop bs;
  backstop_start(&bs, script, seconds, lim && lim->quiet);
  lua_sethook(L, budget_hook, LUA_MASKCOUNT, HOOK_COUNT);
  luaL_openlibs(L);
  install_searcher(L);
  /* The optional tables exist empty, so that -e 'parallel.zero = 2' works
   * on a script that never mentions them; `zt` is there for -e too. */
  const char *pre = "parallel = {} checkpoint = {} zt = require 'ztrain'";
  int rc = run_chunk(L, luaL_loadbuffer(L, pre, strlen(pre), "=(ztrain)"), e);
  if (!rc) { /* the library's entry points, out of the script's reach */
    lua_getglobal(L, "zt");
    lua_getfield(L, -1, "_plan");
    lua_setfield(L, LUA_REGISTRYINDEX, "ztrain._plan");
    lua_getfield(L, -1, "_schedule_lists");
    lua_setfield(L, LUA_REGISTRYINDEX, "ztrain._schedule_lists");
    lua_pop(L, 1);
  }
  char model_at[LUA_IDSIZE + 24] = "";
  if (!rc) rc = run_chunk(L, luaL_loadfile(L, script), e);
  zt_dsconfig *ds = lim ? lim->ds : NULL;
  if (!rc && ds && !(rc = zt_dsconfig_apply(ds, L, world_size, e)))
    rc = run_chunk(L, luaL_loadbuffer(L, ds->lua, strlen(ds->lua), "=(ds-config)"), e);
  for (int i = 0; i < nstmts && !rc; i++)
    rc = run_chunk(L, luaL_loadbuffer(L, stmts[i], strlen(stmts[i]), "=(-e)"), e);
  if (!rc) {
    lua_getfield(L, LUA_REGISTRYINDEX, "ztrain._plan");
    lua_pushstring(L, script);
    rc = zt_config_call(L, 1, 1, "checking the script's tables", e);
  }
  if (!rc) {
    lua_getfield(L, -1, "model");
    read_model(L, &p->model);
    lua_getfield(L, -1, "at"); /* "file:line: " */
    snprintf(model_at, sizeof model_at, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "");
    lua_pop(L, 1);
    size_t k = strlen(model_at);
    while (k && (model_at[k - 1] == ' ' || model_at[k - 1] == ':')) model_at[--k] = 0;
    lua_getfield(L, -2, "train");
    read_train(L, &p->train);
    p->model.recompute = read_recompute(L, p->model.layers);
    p->model.precision = p->train.precision;
    lua_getfield(L, -3, "data");
    rc = read_data(L, &p->data, e);
    lua_getfield(L, -4, "checkpoint");
    p->ckpt.dir = dupstr(L, "dir");
    p->ckpt.every = (int)integer(L, "every");
    p->ckpt.keep = (int)integer(L, "keep");
    p->ckpt.async = boolean(L, "async");
    lua_getfield(L, -5, "parallel");
    if (!rc) rc = read_parallel(L, &p->parallel, world_size, e);
    p->parallel.zero.reduce_dtype = p->train.grad_reduce;
    lua_pop(L, 5);
  }
  if (!rc && (rc = zt_model_cfg_check(&p->model, e)) && model_at[0]) {
    char msg[sizeof e->msg];
    snprintf(msg, sizeof msg, "%s", e->msg);
    zt_err_set(e, rc, "%s: %s", model_at, msg); /* the user's line that set the shape */
  }
  if (!rc) rc = check_tokenizer(p, e);
  if (!rc) rc = zt_model_tp_check(&p->model, p->parallel.tp, e);
  if (!rc) rc = check_batch(&p->train, p->parallel.dp, p->model.seq, e);
  p->model.sequence_parallel = p->parallel.sequence_parallel;
  if (!rc) rc = zt_model_sp_check(&p->model, p->train.micro_batch, p->parallel.tp, e);
  if (!rc && !(rc = zt_config_pipeline(L, p, e))) rc = zt_config_offload(L, p, world_size > 0, e);
  if (!rc && world_size)
    memory_budget(&p->model.mem, p->parallel.dp, p->parallel.zero.stage);
  lua_close(L); /* runs the script's finalizers: the backstop still watches */
  backstop_stop(&bs);
  if (!rc) p->json = zt_config_plan_json(p, ds);
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
  free(p->data.tokenizer);
  zt_data_spec_free(&p->data.train_spec);
  zt_data_spec_free(&p->data.val_spec);
  free(p->ckpt.dir);
  zt_config_offload_free(p);
  free((void *)p->model.recompute);
  memset(p, 0, sizeof *p);
}
