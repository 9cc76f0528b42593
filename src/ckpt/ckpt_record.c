/* ckpt_record: the record a checkpoint keeps about itself — the plan
 * (its model section says which tensors the file must hold), the topology
 * that wrote it and the state — and the one check of it that every reader
 * applies (zt_ckpt_file_check_record). These are JSON texts without
 * checksums, so each number is range-checked and each claim is checked
 * against the others and against the tensors the file holds. */
#include "src/ckpt/ckpt_file.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* An integer member of a JSON object within [lo, hi]. */
static int json_int(json_t *o, const char *key, long long lo, long long hi, int *v,
                    const char *where, zt_err *e) {
  json_t *j = json_object_get(o, key);
  if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi)
    return zt_err_set(e, ZT_EINPUT, "%s: %s is missing or not an integer in %lld..%lld", where,
                      key, lo, hi);
  *v = (int)json_integer_value(j);
  return ZT_OK;
}

static json_t *parse_json(const char *text, const char *what, const char *path, zt_err *e) {
  json_error_t je;
  json_t *root = text ? json_loads(text, 0, &je) : NULL;
  if (!json_is_object(root)) {
    if (text)
      zt_err_set(e, ZT_EINPUT, "%s: the %s attribute is not a JSON object", path, what);
    else
      zt_err_set(e, ZT_EINPUT, "%s has no %s attribute", path, what);
    json_decref(root);
    return NULL;
  }
  return root;
}

int zt_ckpt_file_model_cfg(const zt_ckpt_file *cf, zt_model_cfg *cfg, zt_err *e) {
  json_t *root = parse_json(cf->plan, "plan", cf->path, e);
  if (!root) return e->code;
  json_t *m = json_object_get(root, "model");
  char where[4200];
  snprintf(where, sizeof where, "%s: the plan's model", cf->path);
  memset(cfg, 0, sizeof *cfg);
  const char *kind = json_string_value(json_object_get(m, "kind"));
  int rc = ZT_OK;
  if (!json_is_object(m))
    rc = zt_err_set(e, ZT_EINPUT, "%s: the plan has no model section", cf->path);
  else if (!kind || (strcmp(kind, "gpt") && strcmp(kind, "llama")))
    rc = zt_err_set(e, ZT_EINPUT, "%s: the plan's model kind is neither \"gpt\" nor \"llama\"",
                    cf->path);
  else
    cfg->arch = !strcmp(kind, "gpt") ? ZT_ARCH_GPT : ZT_ARCH_LLAMA;
  /* bounds far above any model, low enough that the layout's table stays
   * small and its int arithmetic (3 * dim, ...) cannot overflow */
  struct { const char *k; int *v; long long hi; } ints[] = {
      {"vocab", &cfg->vocab, 1 << 26}, {"seq", &cfg->seq, 1 << 26},
      {"dim", &cfg->dim, 1 << 20},     {"layers", &cfg->layers, 100000},
      {"heads", &cfg->heads, 1 << 16}, {"kv_heads", &cfg->kv_heads, 1 << 16},
      {"ffn_dim", &cfg->ffn_dim, 1 << 24}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !rc; i++)
    rc = json_int(m, ints[i].k, 1, ints[i].hi, ints[i].v, where, e);
  json_t *eps = json_object_get(m, "norm_eps"), *theta = json_object_get(m, "rope_theta"),
         *tied = json_object_get(m, "tied");
  if (!rc && (!json_is_number(eps) || !isfinite(json_number_value(eps)) ||
              !json_is_number(theta) || !isfinite(json_number_value(theta)) ||
              !json_is_boolean(tied)))
    rc = zt_err_set(e, ZT_EINPUT, "%s: norm_eps, rope_theta (numbers) or tied (boolean) "
                    "missing or malformed", where);
  if (!rc) {
    cfg->norm_eps = (float)json_number_value(eps);
    cfg->rope_theta = (float)json_number_value(theta);
    cfg->tied = json_is_true(tied);
  }
  json_decref(root);
  return rc;
}

int zt_ckpt_file_topology(const zt_ckpt_file *cf, zt_ckpt_topology *t, zt_err *e) {
  memset(t, 0, sizeof *t);
  t->from_plan = !cf->topology;
  json_t *root = parse_json(t->from_plan ? cf->plan : cf->topology,
                            t->from_plan ? "plan" : "topology", cf->path, e);
  if (!root) return e->code;
  json_t *o = t->from_plan ? json_object_get(root, "parallel") : root;
  char where[4200];
  snprintf(where, sizeof where, "%s: %s", cf->path,
           t->from_plan ? "the plan's parallel section" : "the topology attribute");
  int rc = json_is_object(o) ? ZT_OK : zt_err_set(e, ZT_EINPUT, "%s is missing", where);
  if (!rc) rc = json_int(o, "dp", 1, 1 << 24, &t->dp, where, e);
  if (!rc) rc = json_int(o, "tp", 1, 1 << 24, &t->tp, where, e);
  if (!rc) rc = json_int(o, "pp", 1, 1 << 24, &t->pp, where, e);
  if (!rc) rc = json_int(o, "zero", 0, 3, &t->zero, where, e);
  if (!rc && !t->from_plan) rc = json_int(o, "world", 1, INT_MAX, &t->world, where, e);
  if (!rc && t->from_plan) {
    long long w = (long long)t->dp * t->tp * t->pp;
    if (w > INT_MAX) rc = zt_err_set(e, ZT_EINPUT, "%s: dp*tp*pp out of range", where);
    t->world = (int)w;
  }
  json_decref(root);
  return rc;
}

int zt_ckpt_file_check_model(const zt_ckpt_file *cf, zt_ckpt_group g, const zt_model *m,
                             zt_err *e) {
  const char *gpath = zt_ckpt_group_path[g];
  for (int i = 0; i < m->n_params; i++) {
    const zt_tensor_desc *p = &m->params[i].t;
    const zt_ckpt_tensor *t = zt_ckpt_file_find(cf, g, p->name);
    if (!t)
      return zt_err_set(e, ZT_EINPUT, "%s: tensor %s/%s is missing (from another model?)",
                        cf->path, gpath, p->name);
    int same = t->ndim == p->ndim;
    for (int d = 0; d < p->ndim && same; d++) same = t->shape[d] == p->shape[d];
    if (!same) {
      char have[96], want[96];
      zt_ckpt_shape_str(have, sizeof have, t->ndim, t->shape);
      zt_ckpt_shape_str(want, sizeof want, p->ndim, p->shape);
      return zt_err_set(e, ZT_EINPUT, "%s: tensor %s/%s has shape %s, the model expects %s",
                        cf->path, gpath, p->name, have, want);
    }
  }
  for (int i = 0; i < cf->n[g]; i++)
    if (zt_model_find(m, cf->tensors[g][i].name) < 0)
      return zt_err_set(e, ZT_EINPUT, "%s: %s/%s is not a tensor of the plan's model (from "
                        "another model?)", cf->path, gpath, cf->tensors[g][i].name);
  return ZT_OK;
}

/* An error of the model's own rules (whose messages begin "zt.gpt: ..."),
 * prefixed with the file and what in it broke them. */
static int prefixed(int rc, const char *path, const char *what, zt_err *e) {
  if (!rc) return rc;
  char msg[sizeof e->msg];
  snprintf(msg, sizeof msg, "%s", e->msg);
  return zt_err_set(e, rc, "%s: %s: %s", path, what, msg);
}

/* The topology record (or, in version 1, the plan's parallel section):
 * well-formed, consistent, and a layout the model can take. */
static int check_topology(const zt_ckpt_file *cf, zt_ckpt_record *r, zt_err *e) {
  json_t *plan = NULL, *par = NULL;
  if (!cf->topology) {
    if (cf->version >= 2)
      return zt_err_set(e, ZT_EINPUT, "%s has no topology attribute (format version 2 records "
                        "one): damaged or not written by ztrain", cf->path);
    plan = json_loads(cf->plan, 0, NULL);
    par = json_object_get(plan, "parallel");
    int absent = !par;
    json_decref(plan);
    if (absent) return ZT_OK; /* version 1 without a layout: unknown, not wrong */
  }
  int rc = zt_ckpt_file_topology(cf, &r->topo, e);
  if (rc) return rc;
  const char *what = cf->topology ? "the topology attribute" : "the plan's parallel section";
  zt_ckpt_topology *t = &r->topo;
  json_t *root = json_loads(cf->topology ? cf->topology : cf->plan, 0, NULL);
  json_t *o = cf->topology ? root : json_object_get(root, "parallel");
  json_t *sp = json_object_get(o, "sequence_parallel");
  int sp_bad = sp && !json_is_boolean(sp);
  json_decref(root);
  if (sp_bad)
    return zt_err_set(e, ZT_EINPUT, "%s: %s: sequence_parallel is not a boolean", cf->path, what);
  if ((long long)t->dp * t->tp * t->pp != t->world)
    return zt_err_set(e, ZT_EINPUT, "%s: %s: world %d is not dp %d x tp %d x pp %d", cf->path,
                      what, t->world, t->dp, t->tp, t->pp);
  char where[128];
  snprintf(where, sizeof where, "%s records a layout the model cannot take", what);
  rc = prefixed(zt_model_tp_check(&r->cfg, t->tp, e), cf->path, where, e);
  if (!rc && t->pp > r->cfg.layers)
    rc = zt_err_set(e, ZT_EINPUT, "%s: %s records pp %d, more stages than the model's %d "
                    "layers", cf->path, what, t->pp, r->cfg.layers);
  r->have_topo = !rc;
  return rc;
}

int zt_ckpt_file_check_record(const zt_ckpt_file *cf, zt_ckpt_record *r, zt_err *e) {
  memset(r, 0, sizeof *r);
  int rc = zt_ckpt_file_model_cfg(cf, &r->cfg, e);
  if (!rc) {
    rc = prefixed(zt_model_layout(&r->model, &r->cfg, 1, 0, e), cf->path, "the plan's model", e);
    if (rc) memset(&r->model, 0, sizeof r->model); /* nothing allocated on failure */
  }
  for (int g = 0; g < ZT_CKPT_NGROUPS && !rc; g++)
    if (cf->present[g]) rc = zt_ckpt_file_check_model(cf, (zt_ckpt_group)g, &r->model, e);
  if (!rc) rc = check_topology(cf, r, e);
  if (!rc && cf->state) {
    json_t *s = json_loads(cf->state, 0, NULL);
    if (!json_is_object(s))
      rc = zt_err_set(e, ZT_EINPUT, "%s: the state attribute is not a JSON object", cf->path);
    json_decref(s);
  }
  if (rc) zt_ckpt_record_free(r);
  return rc;
}

void zt_ckpt_record_free(zt_ckpt_record *r) {
  if (r->model.params) zt_model_free(&r->model);
  memset(r, 0, sizeof *r);
}
