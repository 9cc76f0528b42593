/* dsconfig: see dsconfig.h. Each DeepSpeed key is either mapped (a Lua
 * statement, shown with the key it came from), ignored with a one-line
 * reason (it tunes something ztrain does not have or does its own way), or
 * refused (ztrain cannot do what it asks, and training anyway would be a
 * different run than the user's). Unknown keys warn, except a near miss of
 * a known key in the same place, which is refused: a typo of "stage" would
 * otherwise train at another ZeRO stage without a word. */
#include "src/config/dsconfig.h"

#include <jansson.h>
#include <lua.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A growing string. */
typedef struct { char *s; size_t n, cap; } sbuf;

static void sb_vprintf(sbuf *b, const char *fmt, va_list ap) {
  va_list again;
  va_copy(again, ap);
  int need = vsnprintf(NULL, 0, fmt, ap);
  if (need >= 0 && b->n + (size_t)need + 1 > b->cap) {
    size_t cap = (b->n + (size_t)need + 1) * 2;
    char *s = realloc(b->s, cap);
    if (s) b->s = s, b->cap = cap;
  }
  if (need >= 0 && b->n + (size_t)need + 1 <= b->cap) {
    vsnprintf(b->s + b->n, b->cap - b->n, fmt, again);
    b->n += (size_t)need;
  }
  va_end(again);
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(b, fmt, ap);
  va_end(ap);
}

/* The shortest decimal that reads back as d (Lua reads it as the same
 * double: the statements mean exactly the JSON's number). Four rotating
 * buffers, for a few in one printf. */
static const char *num(double d) {
  static char bufs[4][32];
  static int next;
  char *b = bufs[next++ & 3];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(b, 32, "%.*g", prec, d);
    if (strtod(b, NULL) == d) break;
  }
  return b;
}

typedef struct {
  const char *file;
  sbuf stmts, report;
  zt_err *e;
} ctx;

/* The JSON value as the file spells it, for messages. */
static const char *shown(const json_t *v, char *buf, size_t n) {
  char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  snprintf(buf, n, "%s", s ? s : "?");
  if (s && strlen(s) >= n && n > 4) strcpy(buf + n - 4, "...");
  free(s);
  return buf;
}

static int bad(ctx *c, const char *path, const json_t *v, const char *want) {
  char buf[128];
  return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: %s must be %s, got %s", c->file, path, want,
                    shown(v, buf, sizeof buf));
}

static int is_auto(const json_t *v) { return json_is_string(v) && !strcmp(json_string_value(v), "auto"); }

/* An integer in [lo, hi] (a whole JSON real too: 5e8 is common). */
static int get_int(ctx *c, const char *path, const json_t *v, int64_t lo, int64_t hi, int64_t *out) {
  double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : NAN;
  if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) {
    char want[96];
    snprintf(want, sizeof want, "an integer from %lld to %lld", (long long)lo, (long long)hi);
    return bad(c, path, v, want);
  }
  *out = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)d;
  return ZT_OK;
}

static int get_num(ctx *c, const char *path, const json_t *v, double lo, int open, double *out) {
  double d = json_is_number(v) ? json_number_value(v) : NAN;
  if (!(open ? d > lo : d >= lo) || !isfinite(d))
    return bad(c, path, v, open ? (lo == 0 ? "a number > 0" : "a larger number") : "a number >= 0");
  *out = d;
  return ZT_OK;
}

static int get_bool(ctx *c, const char *path, const json_t *v, int *out) {
  if (!json_is_boolean(v)) return bad(c, path, v, "true or false");
  *out = json_is_true(v);
  return ZT_OK;
}

/* Edit distance (for "did you mean"), on short keys. */
static int distance(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  if (na > 63 || nb > 63) return 99;
  int d[64][64];
  for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= na; i++)
    for (size_t j = 1; j <= nb; j++) {
      int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
      d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
  return d[na][nb];
}

/* A section's keys: mapped ones (why NULL) and ignored ones with why. */
typedef struct { const char *key, *why; } known;

static const known *find(const known *k, const char *key) {
  for (; k->key; k++)
    if (!strcmp(k->key, key)) return k;
  return NULL;
}

/* Lists the section's ignored keys, and warns about (or, for a near miss
 * of a known key, refuses) the unknown ones. */
static int sweep(ctx *c, const char *where, const json_t *obj, const known *keys) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    char path[256];
    snprintf(path, sizeof path, "%s%s%s", where, *where ? "." : "", key);
    const known *k = find(keys, key);
    if (k && k->why) sb_printf(&c->report, "  %s: ignored: %s\n", path, k->why);
    if (k) continue;
    const known *near = NULL;
    int best = 3;
    for (const known *q = keys; q->key; q++) {
      int d = distance(key, q->key);
      if (d < best) best = d, near = q;
    }
    if (near && strlen(key) > 3)
      return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: unknown key %s (did you mean '%s%s%s'?)",
                        c->file, path, where, *where ? "." : "", near->key);
    sb_printf(&c->report, "  %s: warning: unknown key, not used\n", path);
  }
  return ZT_OK;
}

static void map(ctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void map(ctx *c, const char *path, const char *fmt, ...) {
  sbuf stmt = {0}; /* as long as it needs: an nvme_path may be any length */
  va_list ap;
  va_start(ap, fmt);
  sb_vprintf(&stmt, fmt, ap);
  va_end(ap);
  if (!stmt.s) return;
  sb_printf(&c->stmts, "%s\n", stmt.s);
  sb_printf(&c->report, "  %s -> %s\n", path, stmt.s);
  free(stmt.s);
}

static void kept(ctx *c, const char *path) {
  sb_printf(&c->report, "  %s: \"auto\": the script's value is kept\n", path);
}

static int get_object(ctx *c, const char *path, const json_t *v) {
  return json_is_object(v) ? ZT_OK : bad(c, path, v, "an object {...}");
}

static const known fp16_keys[] = {
    {"enabled", NULL}, {"loss_scale", NULL}, {"initial_scale_power", NULL},
    {"loss_scale_window", NULL}, {"hysteresis", NULL}, {"min_loss_scale", NULL},
    {"consecutive_hysteresis", NULL},
    {"auto_cast", "ztrain's passes compute in train.precision whatever the inputs' dtype"},
    {"fp16_master_weights_and_grads", "ztrain always keeps fp32 master weights and gradients"},
    {0, 0}};
static const known bf16_keys[] = {
    {"enabled", NULL},
    {"immediate_grad_update", "ztrain accumulates gradients in fp32 and applies them once per step"},
    {"check_grad_overflow", "ztrain checks every step's gradient norm and skips non-finite steps"},
    {0, 0}};

/* fp16 and bf16: train.precision, and fp16's loss scaler. */
static int precision(ctx *c, const json_t *fp16, const json_t *bf16) {
  int on16 = 0, onbf = 0, rc;
  if (fp16 && ((rc = get_object(c, "fp16", fp16)) || (rc = sweep(c, "fp16", fp16, fp16_keys)))) return rc;
  if (bf16 && ((rc = get_object(c, "bf16", bf16)) || (rc = sweep(c, "bf16", bf16, bf16_keys)))) return rc;
  const json_t *en16 = fp16 ? json_object_get(fp16, "enabled") : NULL;
  const json_t *enbf = bf16 ? json_object_get(bf16, "enabled") : NULL;
  if (en16 && !is_auto(en16) && (rc = get_bool(c, "fp16.enabled", en16, &on16))) return rc;
  if (enbf && !is_auto(enbf) && (rc = get_bool(c, "bf16.enabled", enbf, &onbf))) return rc;
  if (on16 && onbf)
    return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: fp16.enabled and bf16.enabled are both true; "
                      "enable one (DeepSpeed refuses both too)", c->file);
  if ((en16 && is_auto(en16)) || (enbf && is_auto(enbf))) {
    if (en16 && is_auto(en16)) kept(c, "fp16.enabled");
    if (enbf && is_auto(enbf)) kept(c, "bf16.enabled");
  } else if (on16) {
    map(c, "fp16.enabled", "train.precision = \"fp16\"");
  } else if (onbf) {
    map(c, "bf16.enabled", "train.precision = \"bf16\"");
  } else if (en16 || enbf) {
    map(c, en16 ? "fp16.enabled" : "bf16.enabled", "train.precision = \"fp32\"");
  }
  if (!on16) {
    if (fp16 && json_object_size(fp16) > (en16 ? 1u : 0u))
      sb_printf(&c->report, "  fp16.*: ignored: %s\n", en16 && is_auto(en16)
                ? "fp16.enabled is \"auto\": the script's precision and loss_scale are kept"
                : "fp16 is not enabled (the loss scaler is fp16's)");
    return ZT_OK;
  }
  /* fp16.loss_scale: 0 (DeepSpeed's default) = dynamic, > 0 = static */
  const json_t *ls = json_object_get(fp16, "loss_scale");
  double scale = 0;
  if (ls && !is_auto(ls) && (rc = get_num(c, "fp16.loss_scale", ls, 0, 0, &scale))) return rc;
  static const char *const knobs[] = {"initial_scale_power", "loss_scale_window", "hysteresis",
                                      "min_loss_scale", "consecutive_hysteresis"};
  if (scale > 0) {
    map(c, "fp16.loss_scale", "train.loss_scale = %s", num(scale));
    for (int i = 0; i < 5; i++)
      if (json_object_get(fp16, knobs[i]))
        sb_printf(&c->report, "  fp16.%s: ignored: fp16.loss_scale %g is static\n", knobs[i], scale);
    return ZT_OK;
  }
  sbuf t = {0};
  sb_printf(&t, "{");
  for (int i = 0; i < 5; i++) {
    const json_t *v = json_object_get(fp16, knobs[i]);
    char path[64];
    snprintf(path, sizeof path, "fp16.%s", knobs[i]);
    if (!v || is_auto(v)) {
      if (v) kept(c, path);
      continue;
    }
    int64_t n = 0;
    double d = 0;
    int b = 0;
    rc = i == 0 ? get_int(c, path, v, 0, 100, &n)
         : i == 3 ? get_num(c, path, v, 0, 1, &d)
         : i == 4 ? get_bool(c, path, v, &b)
                  : get_int(c, path, v, 1, 2147483647, &n);
    if (rc) {
      free(t.s);
      return rc;
    }
    if (i == 3) sb_printf(&t, "%s%s = %s", t.n > 1 ? ", " : "", knobs[i], num(d));
    else if (i == 4) sb_printf(&t, "%s%s = %s", t.n > 1 ? ", " : "", knobs[i], b ? "true" : "false");
    else sb_printf(&t, "%s%s = %lld", t.n > 1 ? ", " : "", knobs[i], (long long)n);
  }
  sb_printf(&t, "}");
  map(c, ls ? "fp16.loss_scale 0" : "fp16 (loss_scale 0: dynamic)", "train.loss_scale = %s",
      t.n > 2 ? t.s : "\"dynamic\"");
  free(t.s);
  return ZT_OK;
}

static const known offload_keys[] = {
    {"device", NULL}, {"nvme_path", NULL}, {"ratio", NULL},
    {"pin_memory", "ztrain's host tier is always pinned memory"},
    {"buffer_count", "ztrain's NVMe engine double-buffers one state group at a time"},
    {"buffer_size", "ztrain's NVMe engine double-buffers one state group at a time"},
    {"max_in_cpu", "ztrain places each state group whole"},
    {"fast_init", "ztrain initialises offloaded states in place"},
    {"pipeline_read", "ztrain's NVMe reads always overlap the update"},
    {"pipeline_write", "ztrain's NVMe writes always overlap the update"},
    {0, 0}};
static const known zero_keys[] = {
    {"stage", NULL}, {"overlap_comm", NULL}, {"reduce_bucket_size", NULL},
    {"offload_optimizer", NULL}, {"offload_param", NULL}, {"cpu_offload", NULL},
    {"nvme_path", "the offload sections' nvme_path is the one read"},
    {"allgather_partitions", "ztrain's ZeRO gathers parameters with all-gathers always"},
    {"allgather_bucket_size", "ztrain's ZeRO-3 gathers one block's parameters at a time"},
    {"reduce_scatter", "ztrain's ZeRO stages 2-3 always reduce-scatter gradients"},
    {"contiguous_gradients", "ztrain's gradient buckets are contiguous already"},
    {"round_robin_gradients", "a DeepSpeed CPU-offload copy order; ztrain copies each gradient shard "
                              "as its reduction ends"},
    {"stage3_prefetch_bucket_size", "ztrain's ZeRO-3 prefetches the next block, not a byte budget"},
    {"stage3_param_persistence_threshold", "ztrain's ZeRO-3 partitions every parameter"},
    {"stage3_max_live_parameters", "ztrain's ZeRO-3 keeps at most two blocks gathered"},
    {"stage3_max_reuse_distance", "ztrain's ZeRO-3 keeps at most two blocks gathered"},
    {"stage3_gather_16bit_weights_on_model_save", "ztrain's checkpoints hold the fp32 masters"},
    {"stage3_gather_fp16_weights_on_model_save", "ztrain's checkpoints hold the fp32 masters"},
    {"sub_group_size", "ztrain's optimizer steps each rank's shard at once"},
    {"elastic_checkpoint", "ztrain's checkpoints are logical tensors any layout loads"},
    {"ignore_unused_parameters", "every ztrain parameter is used"},
    {"load_from_fp32_weights", "ztrain always loads the fp32 masters"},
    {"memory_efficient_linear", "ztrain's linear layers keep their own activations"},
    {"use_multi_rank_bucket_allreduce", "ztrain reduces each bucket with one collective"},
    {0, 0}};

/* s as a Lua string literal (a path may hold quotes or control bytes). */
static void lua_string(sbuf *b, const char *s) {
  sb_printf(b, "\"");
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') sb_printf(b, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f) sb_printf(b, "\\%03u", ch);
    else sb_printf(b, "%c", ch);
  }
  sb_printf(b, "\"");
}

/* An offload section: *device becomes "cpu", "nvme" or NULL ("none"), and
 * for nvme *dir its nvme_path. */
static int offload(ctx *c, const char *path, const json_t *o, const char **device, const char **dir) {
  int rc;
  *device = NULL;
  if ((rc = get_object(c, path, o)) || (rc = sweep(c, path, o, offload_keys))) return rc;
  const json_t *d = json_object_get(o, "device"), *v;
  char kpath[128];
  snprintf(kpath, sizeof kpath, "%s.device", path);
  if (d && !json_is_string(d)) return bad(c, kpath, d, "\"none\", \"cpu\" or \"nvme\"");
  const char *dev = d ? json_string_value(d) : "none";
  if (strcmp(dev, "none") && strcmp(dev, "cpu") && strcmp(dev, "nvme"))
    return bad(c, kpath, d, "\"none\", \"cpu\" or \"nvme\"");
  if (!strcmp(dev, "none")) {
    sb_printf(&c->report, "  %s: \"none\": nothing to do\n", kpath);
    return ZT_OK;
  }
  *device = !strcmp(dev, "cpu") ? "cpu" : "nvme";
  snprintf(kpath, sizeof kpath, "%s.ratio", path);
  double ratio = 1;
  if ((v = json_object_get(o, "ratio")) && (rc = get_num(c, kpath, v, 0, 1, &ratio))) return rc;
  if (ratio != 1)
    return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: %s %s is refused: ztrain places whole state "
                      "groups, not a fraction of the optimizer; use 1, or place some blocks on "
                      "\"%s\" with an offload function in the script (docs/script.md, Offload)",
                      c->file, kpath, num(ratio), *device);
  snprintf(kpath, sizeof kpath, "%s.nvme_path", path);
  v = json_object_get(o, "nvme_path");
  if (!strcmp(*device, "cpu")) {
    if (v) sb_printf(&c->report, "  %s: ignored: device is \"cpu\"\n", kpath);
    return ZT_OK;
  }
  if (!v || !json_is_string(v) || !*json_string_value(v))
    return v ? bad(c, kpath, v, "a directory path") :
           zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: %s.device \"nvme\" needs %s, the directory "
                      "the offloaded states are written to", c->file, path, kpath);
  if (*dir && strcmp(*dir, json_string_value(v)))
    return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: the offload sections name two nvme_path "
                      "directories, \"%s\" and \"%s\"; ztrain keeps a run's NVMe state in one",
                      c->file, *dir, json_string_value(v));
  *dir = json_string_value(v);
  return ZT_OK;
}

/* The offload sections as one `offload = {...}` statement: the optimizer's
 * states are its fp32 masters and moments; DeepSpeed's offload_param (the
 * ZeRO-3 parameters) is the policy's params, on the host or in the file
 * (its checks refuse them below stage 3). */
static int offloads(ctx *c, const json_t *z) {
  const char *opt = NULL, *par = NULL, *dir = NULL;
  const json_t *v;
  int rc;
  if ((v = json_object_get(z, "offload_optimizer")) &&
      (rc = offload(c, "zero_optimization.offload_optimizer", v, &opt, &dir)))
    return rc;
  if ((v = json_object_get(z, "offload_param")) &&
      (rc = offload(c, "zero_optimization.offload_param", v, &par, &dir)))
    return rc;
  if ((v = json_object_get(z, "cpu_offload"))) { /* the old spelling of offload_optimizer cpu */
    int on = 0;
    if ((rc = get_bool(c, "zero_optimization.cpu_offload", v, &on))) return rc;
    if (on && opt && strcmp(opt, "cpu"))
      return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: zero_optimization.cpu_offload true and "
                        "offload_optimizer.device \"%s\" disagree; keep one", c->file, opt);
    if (on) opt = "cpu";
  }
  if (!opt && !par) return ZT_OK;
  sbuf t = {0};
  sb_printf(&t, "offload = {");
  if (dir && ((opt && !strcmp(opt, "nvme")) || (par && !strcmp(par, "nvme")))) {
    sb_printf(&t, "dir = ");
    lua_string(&t, dir);
    sb_printf(&t, ", ");
  }
  if (opt) sb_printf(&t, "master = \"%s\", moments = \"%s\"%s", opt, opt, par ? ", " : "");
  if (par) sb_printf(&t, "params = \"%s\"", par);
  sb_printf(&t, "}");
  const char *from = opt && par ? "zero_optimization.offload_optimizer, offload_param"
                     : opt ? "zero_optimization.offload_optimizer" : "zero_optimization.offload_param";
  map(c, from, "%s", t.s ? t.s : "");
  free(t.s);
  return ZT_OK;
}

static int zero(ctx *c, const json_t *z) {
  int rc;
  if ((rc = get_object(c, "zero_optimization", z)) || (rc = sweep(c, "zero_optimization", z, zero_keys)))
    return rc;
  const json_t *v;
  if ((rc = offloads(c, z))) return rc;
  sbuf t = {0};
  int64_t stage = 0, bucket = 0;
  int overlap = 0;
  sb_printf(&t, "{");
  if ((v = json_object_get(z, "stage")) && !is_auto(v)) {
    if ((rc = get_int(c, "zero_optimization.stage", v, 0, 3, &stage))) goto out;
    sb_printf(&t, "stage = %lld", (long long)stage);
  } else if (v) kept(c, "zero_optimization.stage");
  if ((v = json_object_get(z, "reduce_bucket_size")) && !is_auto(v)) {
    /* DeepSpeed counts elements; ztrain's buckets hold fp32 gradients */
    if ((rc = get_int(c, "zero_optimization.reduce_bucket_size", v, 1, INT64_MAX / 8, &bucket))) goto out;
    sb_printf(&t, "%sbucket_bytes = %lld", t.n > 1 ? ", " : "", (long long)bucket * 4);
    sb_printf(&c->report, "  zero_optimization.reduce_bucket_size %lld elements = %lld bytes of fp32 "
              "gradients\n", (long long)bucket, (long long)bucket * 4);
  } else if (v) kept(c, "zero_optimization.reduce_bucket_size");
  if ((v = json_object_get(z, "overlap_comm")) && !is_auto(v)) {
    if ((rc = get_bool(c, "zero_optimization.overlap_comm", v, &overlap))) goto out;
    sb_printf(&t, "%soverlap = %s", t.n > 1 ? ", " : "", overlap ? "true" : "false");
  } else if (v) kept(c, "zero_optimization.overlap_comm");
  sb_printf(&t, "}");
  if (t.n > 2) map(c, "zero_optimization", "parallel.zero = %s", t.s);
out:
  free(t.s);
  return rc;
}

static const known opt_keys[] = {{"type", NULL}, {"params", NULL}, {0, 0}};
static const known adam_keys[] = {
    {"lr", NULL}, {"betas", NULL}, {"eps", NULL}, {"weight_decay", NULL}, {"adam_w_mode", NULL},
    {"bias_correction", NULL}, {"amsgrad", NULL},
    {"torch_adam", NULL}, /* picks the weight decay's default */
    {"fused", "an implementation choice; ztrain has one AdamW"},
    {0, 0}};

static int optimizer_params(ctx *c, int adamw, const json_t *p);

/* optimizer: AdamW (or DeepSpeed's Adam, which is AdamW unless adam_w_mode
 * is false). */
static int optimizer(ctx *c, const json_t *o) {
  int rc;
  if ((rc = get_object(c, "optimizer", o)) || (rc = sweep(c, "optimizer", o, opt_keys))) return rc;
  const json_t *type = json_object_get(o, "type"), *p = json_object_get(o, "params");
  if (!json_is_string(type) || (strcasecmp(json_string_value(type), "AdamW") &&
                                strcasecmp(json_string_value(type), "Adam")))
    return bad(c, "optimizer.type", type ? type : json_null(),
               "\"AdamW\" or \"Adam\" (ztrain's optimizer is AdamW; others are not built)");
  int adamw = !strcasecmp(json_string_value(type), "AdamW");
  if (p) return optimizer_params(c, adamw, p);
  json_t *none = json_object(); /* no params: every one is the default */
  rc = optimizer_params(c, adamw, none);
  json_decref(none);
  return rc;
}

static int optimizer_params(ctx *c, int adamw, const json_t *p) {
  int rc;
  if ((rc = get_object(c, "optimizer.params", p)) || (rc = sweep(c, "optimizer.params", p, adam_keys)))
    return rc;
  const json_t *v;
  int flag = 0;
  if ((v = json_object_get(p, "adam_w_mode"))) {
    if ((rc = get_bool(c, "optimizer.params.adam_w_mode", v, &flag))) return rc;
    if (!flag && !adamw)
      return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: optimizer.params.adam_w_mode false (Adam with "
                        "L2 weight decay in the gradient) is refused: ztrain's AdamW decays weights "
                        "decoupled; use true (DeepSpeed's default)", c->file);
  }
  if ((v = json_object_get(p, "bias_correction"))) {
    if ((rc = get_bool(c, "optimizer.params.bias_correction", v, &flag))) return rc;
    if (!flag)
      return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: optimizer.params.bias_correction false is "
                        "refused: ztrain's AdamW always corrects the bias; use true", c->file);
  }
  if ((v = json_object_get(p, "amsgrad"))) {
    if ((rc = get_bool(c, "optimizer.params.amsgrad", v, &flag))) return rc;
    if (flag)
      return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: optimizer.params.amsgrad true is refused: "
                        "ztrain's AdamW has no AMSGrad; use false", c->file);
  }
  /* A key not given is the DeepSpeed optimizer's default, not the
   * script's: DeepSpeed builds FusedAdam (torch's AdamW with torch_adam,
   * whose weight decay defaults to 0.01) from exactly these params. */
  int torch_adam = 0;
  if ((v = json_object_get(p, "torch_adam")) && (rc = get_bool(c, "optimizer.params.torch_adam", v, &torch_adam)))
    return rc;
  static const char *const names[] = {"lr", "eps", "weight_decay"};
  const double dflt[] = {1e-3, 1e-8, torch_adam ? 0.01 : 0.0};
  const char *whose = torch_adam ? "torch.optim.AdamW's default" : "DeepSpeed's FusedAdam default";
  for (int i = 0; i < 3; i++) {
    char path[112];
    snprintf(path, sizeof path, "optimizer.params.%s", names[i]);
    double d = dflt[i];
    v = json_object_get(p, names[i]);
    if (v && is_auto(v)) {
      kept(c, path);
      continue;
    }
    if (v && (rc = get_num(c, path, v, 0, i < 2, &d))) return rc;
    if (!v) snprintf(path + strlen(path), sizeof path - strlen(path), " (not given: %s)", whose);
    map(c, path, "train.%s = %s", names[i], num(d));
  }
  sb_printf(&c->report, "  note: ztrain decays matrices only, not biases and norm weights (as "
            "Hugging Face's Trainer groups them for DeepSpeed)\n");
  if ((v = json_object_get(p, "betas")) && !is_auto(v)) {
    const json_t *b1 = json_array_get(v, 0), *b2 = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(b1) || !json_is_number(b2) ||
        !(json_number_value(b1) >= 0 && json_number_value(b1) < 1) ||
        !(json_number_value(b2) >= 0 && json_number_value(b2) < 1))
      return bad(c, "optimizer.params.betas", v, "a pair [beta1, beta2] with both in [0, 1)");
    map(c, "optimizer.params.betas", "train.betas = {%s, %s}", num(json_number_value(b1)),
        num(json_number_value(b2)));
  } else if (v) {
    kept(c, "optimizer.params.betas");
  } else {
    char path[96];
    snprintf(path, sizeof path, "optimizer.params.betas (not given: %s)", whose);
    map(c, path, "train.betas = {0.9, 0.999}");
  }
  return ZT_OK;
}

/* scheduler: DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR are
 * zt.lr.deepspeed{...}, the same schedule step for step (optim.c says how
 * the steps line up). DeepSpeed passes params to the class as keywords, so
 * a key the class lacks is an error there, and here. "auto" is what
 * Hugging Face's integration puts there: warmup_min_lr 0, warmup_max_lr
 * the optimizer's lr, total_num_steps the run's steps. */
static const char *const ds_params[] = {"warmup_num_steps", "warmup_type", "warmup_min_lr",
                                        "warmup_max_lr", "total_num_steps", "warmup_min_ratio",
                                        "cos_min_ratio", "last_batch_iteration"};
static int scheduler(ctx *c, const json_t *s) {
  static const known keys[] = {{"type", NULL}, {"params", NULL}, {0, 0}};
  int rc;
  if ((rc = get_object(c, "scheduler", s)) || (rc = sweep(c, "scheduler", s, keys))) return rc;
  const json_t *type = json_object_get(s, "type"), *p = json_object_get(s, "params"), *v;
  const char *t = json_is_string(type) ? json_string_value(type) : "";
  int ty = !strcmp(t, "WarmupLR") ? 0 : !strcmp(t, "WarmupDecayLR") ? 1 : !strcmp(t, "WarmupCosineLR") ? 2 : -1;
  if (ty < 0 && (!strcmp(t, "OneCycle") || !strcmp(t, "LRRangeTest")))
    return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: scheduler.type \"%s\" is refused: ztrain has no "
                      "such LR schedule; use WarmupLR, WarmupDecayLR or WarmupCosineLR, or remove "
                      "\"scheduler\" and set train.lr in the script", c->file, t);
  if (ty < 0)
    return bad(c, "scheduler.type", type ? type : json_null(),
               "one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\"");
  if (p && (rc = get_object(c, "scheduler.params", p))) return rc;
  /* the keys each class takes: WarmupLR the first four, WarmupDecayLR
   * total_num_steps too, WarmupCosineLR ratios instead of LRs */
  static const unsigned takes[3] = {0x8f, 0x9f, 0xf3};
  const char *key;
  if (p) json_object_foreach((json_t *)p, key, v) {
    int i = 0;
    while (i < 8 && strcmp(key, ds_params[i])) i++;
    if (i == 8 || !(takes[ty] >> i & 1))
      return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: scheduler.params.%s is not a parameter of "
                        "DeepSpeed's %s (it would refuse it too)", c->file, key, t);
  }
  if (ty && (!p || !json_object_get(p, "total_num_steps")))
    return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: scheduler.params.total_num_steps is missing: "
                      "DeepSpeed's %s requires it; give a number, or \"auto\" for train.steps", c->file, t);
  sbuf b = {0};
  sb_printf(&b, "train.lr = zt.lr.deepspeed{type = \"%s\"", t);
  if (ty == 2) sb_printf(&b, ", lr = zt.lr._auto(train.lr)"); /* its ratios scale the optimizer's lr */
  for (int i = 0; i < 8 && p && !rc; i++) {
    char path[96];
    snprintf(path, sizeof path, "scheduler.params.%s", ds_params[i]);
    if (!(v = json_object_get(p, ds_params[i]))) continue;
    int64_t n = 0;
    double d = 0;
    if (is_auto(v) && (i == 2 || i == 3 || i == 4)) {
      if (i == 2) sb_printf(&b, ", warmup_min_lr = 0");
      if (i == 3) sb_printf(&b, ", warmup_max_lr = zt.lr._auto(train.lr)");
      sb_printf(&c->report, "  %s: \"auto\" -> %s\n", path,
                i == 2 ? "0" : i == 3 ? "the optimizer's lr (train.lr)" : "train.steps");
    } else if (i == 0 || i == 4) {
      if (!(rc = get_int(c, path, v, i ? 1 : 0, 2147483647, &n))) sb_printf(&b, ", %s = %lld", ds_params[i], (long long)n);
    } else if (i == 1) {
      const char *w = json_is_string(v) ? json_string_value(v) : "";
      if (strcmp(w, "log") && strcmp(w, "linear")) rc = bad(c, path, v, "\"log\" or \"linear\"");
      else sb_printf(&b, ", warmup_type = \"%s\"", w);
    } else if (i == 7) {
      if ((rc = get_int(c, path, v, -1, -1, &n)))
        zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: %s must be -1 (a fresh schedule): a resumed run "
                   "continues its schedule from the checkpoint's step", c->file, path);
    } else if (!(rc = get_num(c, path, v, 0, 0, &d))) {
      sb_printf(&b, ", %s = %s", ds_params[i], num(d));
    }
  }
  if (!rc) {
    sb_printf(&b, "}");
    map(c, "scheduler", "%s", b.s);
    sb_printf(&c->report, "  scheduler.params: the keys not given are DeepSpeed's defaults\n");
  }
  free(b.s);
  return rc;
}

static const known ac_keys[] = {
    {"cpu_checkpointing", NULL},
    {"partition_activations", "ztrain keeps a recomputed block's input whole on each TP rank "
                              "(parallel.sequence_parallel splits it)"},
    {"contiguous_memory_optimization", "ztrain's recomputed blocks share one set of buffers already"},
    {"number_checkpoints", "ztrain recomputes per block (train.recompute)"},
    {"synchronize_checkpoint_boundary", "a CUDA timing aid"},
    {"profile", "ztrain's --trace times every block"},
    {0, 0}};

static int checkpointing(ctx *c, const json_t *a) {
  int rc, on = 0;
  if ((rc = get_object(c, "activation_checkpointing", a)) ||
      (rc = sweep(c, "activation_checkpointing", a, ac_keys)))
    return rc;
  const json_t *v = json_object_get(a, "cpu_checkpointing");
  if (v && (rc = get_bool(c, "activation_checkpointing.cpu_checkpointing", v, &on))) return rc;
  if (on)
    return zt_err_set(c->e, ZT_EINPUT, "--ds-config %s: activation_checkpointing.cpu_checkpointing true "
                      "is refused: ztrain keeps activations on the device (recomputation is its way to save "
                      "their memory); use false", c->file);
  map(c, "activation_checkpointing", "train.recompute = \"full\"");
  return ZT_OK;
}

static const known top_keys[] = {
    {"train_batch_size", NULL}, {"train_micro_batch_size_per_gpu", NULL},
    {"gradient_accumulation_steps", NULL}, {"gradient_clipping", NULL}, {"fp16", NULL},
    {"bf16", NULL}, {"zero_optimization", NULL}, {"optimizer", NULL}, {"scheduler", NULL},
    {"activation_checkpointing", NULL}, {"communication_data_type", NULL},
    {"steps_per_print", "ztrain logs every train.log_every steps"},
    {"wall_clock_breakdown", "ztrain's metrics lines and --trace time every step"},
    {"zero_allow_untested_optimizer", "ztrain has one optimizer, AdamW, tested with every ZeRO stage"},
    {"prescale_gradients", "ztrain averages gradients once, in fp32 unless train.grad_reduce_dtype"},
    {"gradient_predivide_factor", "ztrain averages gradients once, in fp32 unless train.grad_reduce_dtype"},
    {"memory_breakdown", "ztrain's banner and metrics lines give the memory"},
    {"flops_profiler", "ztrain's metrics lines give MFU"},
    {"tensorboard", "ztrain writes --metrics JSONL (ztrain report plots it)"},
    {"wandb", "ztrain writes --metrics JSONL (ztrain report plots it)"},
    {"csv_monitor", "ztrain writes --metrics JSONL (ztrain report plots it)"},
    {"comms_logger", "ztrain's --trace shows every collective"},
    {"dump_state", "ztrain's banner shows the plan"},
    {"sparse_gradients", "ztrain's embedding gradients are dense"},
    {"zero_force_ds_cpu_optimizer", "ztrain's host AdamW is its one CPU optimizer"},
    {"seed", "set train.seed in the script (DeepSpeed itself does not read it)"},
    {0, 0}};

static int count(ctx *c, const char *key, const json_t *root, zt_ds_count *n) {
  const json_t *v = json_object_get(root, key);
  memset(n, 0, sizeof *n);
  if (!v) return ZT_OK;
  if (is_auto(v)) return n->automatic = 1, ZT_OK;
  n->given = 1;
  return get_int(c, key, v, 1, 2147483647, &n->n);
}

int zt_dsconfig_read(zt_dsconfig *ds, const char *path, zt_err *e) {
  memset(ds, 0, sizeof *ds);
  ds->path = strdup(path);
  ctx c = {.file = path, .e = e};
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (je.line <= 0)
      return zt_err_set(e, ZT_EINPUT, "--ds-config %s: %s", path, je.text);
    return zt_err_set(e, ZT_EINPUT, "--ds-config %s: not valid JSON at line %d, column %d: %s", path,
                      je.line, je.column, je.text);
  }
  int rc = json_is_object(root) ? ZT_OK : bad(&c, "the file", root, "a JSON object {...}");
  const json_t *v;
  if (!rc) rc = sweep(&c, "", root, top_keys);
  if (!rc) rc = count(&c, "train_batch_size", root, &ds->batch);
  if (!rc) rc = count(&c, "train_micro_batch_size_per_gpu", root, &ds->micro);
  if (!rc) rc = count(&c, "gradient_accumulation_steps", root, &ds->accum);
  if (!rc && (v = json_object_get(root, "gradient_clipping"))) {
    double clip;
    if (is_auto(v)) kept(&c, "gradient_clipping");
    else if (!(rc = get_num(&c, "gradient_clipping", v, 0, 0, &clip)))
      map(&c, "gradient_clipping", "train.clip = %s", num(clip));
  }
  if (!rc && (v = json_object_get(root, "communication_data_type")) && !is_auto(v)) {
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    const char *dt = !strcmp(s, "fp32") ? "fp32" : !strcmp(s, "fp16") ? "fp16"
                     : !strcmp(s, "bf16") ? "bf16" : NULL;
    if (!dt) rc = bad(&c, "communication_data_type", v, "\"fp32\", \"fp16\" or \"bf16\"");
    else map(&c, "communication_data_type", "train.grad_reduce_dtype = \"%s\"", dt);
  }
  if (!rc && (json_object_get(root, "fp16") || json_object_get(root, "bf16")))
    rc = precision(&c, json_object_get(root, "fp16"), json_object_get(root, "bf16"));
  if (!rc && (v = json_object_get(root, "zero_optimization"))) rc = zero(&c, v);
  if (!rc && (v = json_object_get(root, "optimizer"))) rc = optimizer(&c, v);
  if (!rc && (v = json_object_get(root, "scheduler"))) rc = scheduler(&c, v);
  if (!rc && (v = json_object_get(root, "activation_checkpointing"))) rc = checkpointing(&c, v);
  json_decref(root);
  ds->stmts = c.stmts.s ? c.stmts.s : strdup("");
  ds->report = c.report.s ? c.report.s : strdup("");
  return rc;
}

/* An integer field of the global table `t`, or `dflt` when it is not one. */
static long long field(lua_State *L, const char *t, const char *k, long long dflt) {
  long long n = dflt;
  if (lua_getglobal(L, t) == LUA_TTABLE) {
    lua_getfield(L, -1, k);
    if (lua_isinteger(L, -1)) n = lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return n;
}

int zt_dsconfig_apply(zt_dsconfig *ds, lua_State *L, int world, zt_err *e) {
  long long tp = field(L, "parallel", "tp", 1), pp = field(L, "parallel", "pp", 1);
  long long dp = field(L, "parallel", "dp", 0);
  if (tp < 1) tp = 1;
  if (pp < 1) pp = 1;
  char how[160];
  if (dp >= 1) snprintf(how, sizeof how, "dp %lld (parallel.dp)", dp);
  else if (!world) dp = 1, snprintf(how, sizeof how, "dp 1 (no world: ztrain schedule)");
  else {
    dp = world / (tp * pp) > 0 ? world / (tp * pp) : 1;
    snprintf(how, sizeof how, "dp %lld = world %d / (tp %lld * pp %lld)", dp, world, tp, pp);
  }
  sbuf b = {0}, rep = {0};
  sb_printf(&b, "%s", ds->stmts);
  sb_printf(&rep, "%s", ds->report);
  zt_ds_count T = ds->batch, M = ds->micro, G = ds->accum;
  int rc = ZT_OK;
  /* DeepSpeed's rule: train_batch_size = micro * accumulation * dp; any
   * two give the third, one alone means accumulation 1 ("auto" = absent) */
  if (T.given && M.given && G.given) {
    if (T.n != M.n * G.n * dp) rc = 1;
  } else if (T.given && M.given) {
    if (T.n % (M.n * dp)) rc = 1;
    else G.n = T.n / (M.n * dp), G.given = 2;
  } else if (T.given && G.given) {
    if (T.n % (G.n * dp)) rc = 1;
    else M.n = T.n / (G.n * dp), M.given = 2;
  } else if (M.given && G.given) {
    T.n = M.n * G.n * dp, T.given = 2;
  } else if (T.given) {
    if (T.n % dp) rc = 1;
    else G.n = 1, G.given = 2, M.n = T.n / dp, M.given = 2;
  } else if (M.given) {
    G.n = 1, G.given = 2, T.n = M.n * dp, T.given = 2;
  } else if (G.given) {
    rc = zt_err_set(e, ZT_EINPUT, "--ds-config %s: gradient_accumulation_steps %lld alone does not "
                    "fix the batch; give train_batch_size or train_micro_batch_size_per_gpu too (as "
                    "DeepSpeed asks)", ds->path, (long long)G.n);
  }
  if (rc == 1) {
    char g[32] = "not given", m[32] = "not given";
    if (G.given) snprintf(g, sizeof g, "%lld", (long long)G.n);
    if (M.given) snprintf(m, sizeof m, "%lld", (long long)M.n);
    rc = zt_err_set(e, ZT_EINPUT, "--ds-config %s: the batch does not add up: train_batch_size %lld "
                    "must equal train_micro_batch_size_per_gpu (%s) * gradient_accumulation_steps (%s) "
                    "* %s; change one of them, or set one to \"auto\"", ds->path, (long long)T.n, m, g,
                    how);
  }
  if (!rc && (T.given || M.given)) {
    sb_printf(&rep, "  batch: train_batch_size %lld = train_micro_batch_size_per_gpu %lld * "
              "gradient_accumulation_steps %lld * %s", (long long)T.n, (long long)M.n,
              (long long)G.n, how);
    const char *names[3] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                            "gradient_accumulation_steps"};
    zt_ds_count *all[3] = {&T, &M, &G};
    for (int i = 0; i < 3; i++)
      if (all[i]->given == 2)
        sb_printf(&rep, "; %s %s -> %lld", names[i],
                  (i == 0 ? ds->batch : i == 1 ? ds->micro : ds->accum).automatic ? "\"auto\""
                                                                                 : "(not given)",
                  (long long)all[i]->n);
    sb_printf(&rep, " -> train.micro_batch = %lld, train.global_batch = %lld\n", (long long)M.n,
              (long long)T.n);
    if (T.n > 2147483647 || M.n > 2147483647)
      rc = zt_err_set(e, ZT_EINPUT, "--ds-config %s: train_batch_size %lld is more than 2147483647",
                      ds->path, (long long)T.n);
    sb_printf(&b, "train.micro_batch = %lld\ntrain.global_batch = %lld\n", (long long)M.n,
              (long long)T.n);
  }
  free(ds->report);
  ds->report = rep.s;
  ds->lua = b.s ? b.s : strdup("");
  return rc;
}

void zt_dsconfig_free(zt_dsconfig *ds) {
  free(ds->path);
  free(ds->stmts);
  free(ds->lua);
  free(ds->report);
  memset(ds, 0, sizeof *ds);
}
