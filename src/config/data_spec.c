/* data_spec (config): see data_spec.h. */
#include "src/config/data_spec.h"

#include <glob.h>
#include <jansson.h>
#include <lauxlib.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* realpath of `path`, or for a Megatron prefix ("corpus" beside
 * corpus.bin/.idx: no file of its own) that of corpus.idx less ".idx";
 * the path as given when neither resolves (the loader reports it in the
 * user's words). */
static char *absolute_any(const char *path) {
  char buf[PATH_MAX], idx[PATH_MAX];
  if (realpath(path, buf)) return strdup(buf);
  if ((size_t)snprintf(idx, sizeof idx, "%s.idx", path) < sizeof idx && realpath(idx, buf)) {
    buf[strlen(buf) - 4] = 0;
    return strdup(buf);
  }
  return strdup(path);
}

static int push_path(zt_data_part *p, const char *path) {
  char **grown = realloc(p->paths, (size_t)(p->n + 1) * sizeof *grown);
  if (!grown) return -1;
  p->paths = grown;
  if (!(p->paths[p->n] = absolute_any(path))) return -1;
  p->n++;
  return 0;
}

/* X.bin and X.idx are one Megatron dataset: a glob that matches both
 * names it once (as X.bin); other matches stay as they are. */
static int megatron_twin(const char *path, char *const *kept, int n) {
  size_t len = strlen(path);
  if (len < 4 || (strcmp(path + len - 4, ".bin") && strcmp(path + len - 4, ".idx"))) return 0;
  char other[PATH_MAX];
  snprintf(other, sizeof other, "%.*s.%s", (int)(len - 4), path,
           strcmp(path + len - 4, ".bin") ? "bin" : "idx");
  struct stat st;
  if (stat(other, &st)) return 0;
  for (int i = 0; i < n; i++) /* the twin taken already, under either name */
    if (!strncmp(kept[i], path, len - 4) && strlen(kept[i]) == len) return 1;
  return 0;
}

static int add_entry(zt_data_part *p, const char *key, const char *entry, zt_err *e) {
  if (!strpbrk(entry, "*?[")) {
    if (push_path(p, entry)) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
    return ZT_OK;
  }
  glob_t g;
  int r = glob(entry, 0, NULL, &g);
  if (r == GLOB_NOMATCH || (r == 0 && g.gl_pathc == 0)) {
    globfree(&g);
    return zt_err_set(e, ZT_EINPUT, "%s: the pattern '%s' matches no file; check the folder "
                      "and the pattern (globs are expanded by ztrain, relative to the working "
                      "folder)", key, entry);
  }
  if (r) {
    globfree(&g);
    return zt_err_set(e, ZT_EINPUT, "%s: cannot expand the pattern '%s'", key, entry);
  }
  int first = p->n, rc = ZT_OK;
  char **mine = malloc(g.gl_pathc * sizeof *mine); /* matches kept, as given */
  int nmine = 0;
  for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
    const char *m = g.gl_pathv[i];
    struct stat st;
    if (!stat(m, &st) && S_ISDIR(st.st_mode)) continue; /* a folder is no data */
    if (megatron_twin(m, mine, nmine)) continue;
    if (!mine || push_path(p, m)) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
    else mine[nmine++] = g.gl_pathv[i];
  }
  free(mine);
  globfree(&g);
  if (!rc && p->n == first)
    rc = zt_err_set(e, ZT_EINPUT, "%s: the pattern '%s' matches only folders", key, entry);
  return rc;
}

int zt_config_data_spec(lua_State *L, const char *key, zt_data_spec *s, zt_err *e) {
  memset(s, 0, sizeof *s);
  lua_getfield(L, -1, "blend");
  s->blend = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, -1, "parts");
  int n = (int)luaL_len(L, -1), rc = ZT_OK;
  s->parts = calloc((size_t)n, sizeof *s->parts);
  if (!s->parts) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int i = 0; i < n && !rc; i++, s->n++) {
    zt_data_part *p = &s->parts[i];
    lua_geti(L, -1, i + 1);
    lua_getfield(L, -1, "weight");
    p->weight = lua_tonumber(L, -1);
    lua_getfield(L, -2, "paths");
    int k = (int)luaL_len(L, -1);
    for (int j = 0; j < k && !rc; j++) {
      lua_geti(L, -1, j + 1);
      rc = add_entry(p, key, lua_tostring(L, -1), e);
      lua_pop(L, 1);
    }
    lua_pop(L, 3);
  }
  lua_pop(L, 1);
  if (rc) zt_data_spec_free(s);
  return rc;
}

void zt_data_spec_free(zt_data_spec *s) {
  for (int i = 0; i < s->n; i++) {
    for (int j = 0; j < s->parts[i].n; j++) free(s->parts[i].paths[j]);
    free(s->parts[i].paths);
  }
  free(s->parts);
  memset(s, 0, sizeof *s);
}

/* One opened source: its file(s) with size, modification time and tokens,
 * so that a checkpoint tells which data, in which state, a run read. */
static void describe_file(json_t *files, const zt_tokens *t) {
  if (t->nfiles) {
    for (int i = 0; i < t->nfiles; i++) describe_file(files, &t->files[i]);
    return;
  }
  struct stat st = {0};
  stat(t->path, &st);
  json_t *f = json_pack("{s:s, s:s, s:I, s:I, s:I}", "path", t->path, "format",
                        t->megatron ? "megatron" : "tokens", "bytes", (json_int_t)st.st_size,
                        "mtime", (json_int_t)st.st_mtime, "tokens", (json_int_t)t->count);
  if (f) json_array_append_new(files, f);
}

static json_t *describe_data(const zt_data *d) {
  json_t *parts = json_array();
  for (int c = 0; c < d->n; c++) {
    json_t *files = json_array();
    describe_file(files, &d->parts[c]);
    json_array_append_new(parts, json_pack("{s:f, s:I, s:I, s:o}", "weight", d->weights[c],
                                           "tokens", (json_int_t)d->parts[c].count, "samples",
                                           (json_int_t)d->parts[c].samples, "files", files));
  }
  return json_pack("{s:b, s:o}", "blend", d->blend, "parts", parts);
}

void zt_plan_record_data(zt_plan *p, const zt_data *train, const zt_data *val) {
  json_t *root = p->json ? json_loads(p->json, 0, NULL) : NULL;
  json_t *data = root ? json_object_get(root, "data") : NULL;
  if (!data) {
    json_decref(root);
    return;
  }
  json_t *src = json_object();
  json_object_set_new(src, "train", describe_data(train));
  if (val && val->n) json_object_set_new(src, "val", describe_data(val));
  json_object_set_new(data, "sources", src);
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!text) return; /* the plan as it was: the record is a courtesy */
  free(p->json);
  p->json = text;
}

/* data.sources.train of a plan's JSON (new reference), or NULL. */
static json_t *train_sources(const char *plan) {
  json_t *root = plan ? json_loads(plan, 0, NULL) : NULL;
  json_t *t = json_object_get(json_object_get(json_object_get(root, "data"), "sources"), "train");
  json_incref(t);
  json_decref(root);
  return t;
}

int zt_plan_data_changed(const char *ckpt_plan, const char *plan, char *why, size_t size) {
  json_t *was = train_sources(ckpt_plan), *now = train_sources(plan);
  int changed = 0;
  json_t *pw = json_object_get(was, "parts"), *pn = json_object_get(now, "parts");
  if (!pw || !pn) goto out; /* a checkpoint from before the record: nothing to say */
  changed = 1;
  if (json_array_size(pw) != json_array_size(pn)) {
    snprintf(why, size, "%zu data parts then, %zu now", json_array_size(pw), json_array_size(pn));
    goto out;
  }
  for (size_t i = 0; i < json_array_size(pw); i++) {
    json_t *a = json_array_get(pw, i), *b = json_array_get(pn, i);
    double wa = json_real_value(json_object_get(a, "weight"));
    double wb = json_real_value(json_object_get(b, "weight"));
    if (wa != wb) {
      snprintf(why, size, "part %zu had weight %g, now %g", i + 1, wa, wb);
      goto out;
    }
    json_t *fa = json_object_get(a, "files"), *fb = json_object_get(b, "files");
    if (json_array_size(fa) != json_array_size(fb)) {
      snprintf(why, size, "part %zu had %zu files, now %zu", i + 1, json_array_size(fa),
               json_array_size(fb));
      goto out;
    }
    for (size_t j = 0; j < json_array_size(fa); j++) {
      json_t *x = json_array_get(fa, j), *y = json_array_get(fb, j);
      const char *px = json_string_value(json_object_get(x, "path"));
      const char *py = json_string_value(json_object_get(y, "path"));
      json_int_t tx = json_integer_value(json_object_get(x, "tokens"));
      json_int_t ty = json_integer_value(json_object_get(y, "tokens"));
      if (!px || !py || strcmp(px, py) || tx != ty) {
        snprintf(why, size, "%s (%lld tokens) then, %s (%lld tokens) now", px ? px : "?",
                 (long long)tx, py ? py : "?", (long long)ty);
        goto out;
      }
    }
  }
  changed = 0;
out:
  json_decref(was);
  json_decref(now);
  return changed;
}
