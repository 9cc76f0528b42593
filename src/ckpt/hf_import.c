/* hf_import: a Hugging Face model folder as a ztrain checkpoint
 * (zt_hf_import in hf.h). The config gives the model; the model's tensor
 * table (tp = 1) gives the names to look for, through the name map of
 * hf.c; every safetensors header is checked against its file before a
 * byte of data is read, and every tensor of the folder must be one the
 * model has (or a buffer HF saves that carries no weights). The output is
 * written by format.c's functions, as zreshard convert writes, to
 * OUT.tmp.PID, then renamed. */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/ckpt/ckpt_file.h"
#include "src/ckpt/format.h"
#include "src/ckpt/h5util.h"
#include "src/ckpt/hf.h"
#include "src/core/half.h"

#define ST_MAX_HEADER (100 << 20) /* bytes of a safetensors JSON header */
#define ST_MAX_FILES 1024

typedef struct {
  char name[256];
  int file, dtype; /* 4: F32, 2: BF16, 1: F16 (the code is the byte size, F16 apart) */
  int ndim;
  int64_t shape[ZT_MAX_DIMS], numel;
  long long off; /* from the start of the file */
  int used;
} st_entry;

typedef struct {
  char *files[ST_MAX_FILES];
  int nfiles;
  st_entry *t;
  int n, cap;
} st_set;

static void st_free(st_set *s) {
  for (int i = 0; i < s->nfiles; i++) free(s->files[i]);
  free(s->t);
}

static char *slurp(const char *path, size_t max, zt_err *e) {
  FILE *f = fopen(path, "rb");
  if (!f) return zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", path, strerror(errno)), NULL;
  char *buf = malloc(max + 1);
  size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
  fclose(f);
  if (!buf) return zt_err_set(e, ZT_ERUNTIME, "out of memory"), NULL;
  if (n > max) {
    free(buf);
    return zt_err_set(e, ZT_EINPUT, "%s is larger than %zu bytes", path, max), NULL;
  }
  buf[n] = 0;
  return buf;
}

/* Adds the tensors of one safetensors file, its header checked. */
static int st_add_file(st_set *s, const char *path, zt_err *e) {
  if (s->nfiles >= ST_MAX_FILES)
    return zt_err_set(e, ZT_EINPUT, "%s: more than %d safetensors files", path, ST_MAX_FILES);
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    if (fd >= 0) close(fd);
    return zt_err_set(e, ZT_EINPUT, "cannot read %s: %s", path, strerror(errno));
  }
  uint64_t hlen = 0;
  char *h = NULL;
  int rc = ZT_OK;
  if (zt_fs_pread(fd, &hlen, 8, 0) || hlen < 2 || hlen > ST_MAX_HEADER ||
      hlen + 8 > (uint64_t)st.st_size)
    rc = zt_err_set(e, ZT_EINPUT, "%s is not a safetensors file (its header length is wrong)",
                    path);
  else if (!(h = malloc(hlen + 1)))
    rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  else if (zt_fs_pread(fd, h, hlen, 8))
    rc = zt_err_set(e, ZT_EINPUT, "cannot read %s", path);
  close(fd);
  if (rc) return free(h), rc;
  h[hlen] = 0;
  json_error_t je;
  json_t *o = json_loads(h, 0, &je);
  free(h);
  if (!json_is_object(o)) {
    json_decref(o);
    return zt_err_set(e, ZT_EINPUT, "%s: its safetensors header is not a JSON object", path);
  }
  int file = s->nfiles;
  if (!(s->files[file] = strdup(path))) {
    json_decref(o);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  s->nfiles++;
  long long data = 8 + (long long)hlen, size = (long long)st.st_size - data;
  const char *key;
  json_t *v;
  json_object_foreach(o, key, v) {
    if (!strcmp(key, "__metadata__")) continue;
    if (s->n == s->cap) {
      int cap = s->cap ? 2 * s->cap : 64;
      st_entry *t = realloc(s->t, (size_t)cap * sizeof *t);
      if (!t) {
        rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
        break;
      }
      s->t = t, s->cap = cap;
    }
    st_entry *t = &s->t[s->n];
    memset(t, 0, sizeof *t);
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    json_t *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
    if (strlen(key) >= sizeof t->name) {
      rc = zt_err_set(e, ZT_EINPUT, "%s: tensor name longer than %zu bytes", path, sizeof t->name - 1);
      break;
    }
    snprintf(t->name, sizeof t->name, "%s", key);
    t->dtype = !dt ? 0 : !strcmp(dt, "F32") ? 4 : !strcmp(dt, "BF16") ? 2 : !strcmp(dt, "F16") ? 1 : 0;
    if (!t->dtype) {
      rc = zt_err_set(e, ZT_EINPUT, "%s: tensor %s has dtype %.16s; ztrain imports F32, BF16 and "
                      "F16", path, key, dt ? dt : "(none)");
      break;
    }
    t->ndim = json_is_array(shape) ? (int)json_array_size(shape) : -1;
    t->numel = 1;
    int ok = t->ndim >= 1 && t->ndim <= ZT_MAX_DIMS && json_is_array(offs) &&
             json_array_size(offs) == 2;
    for (int d = 0; ok && d < t->ndim; d++) {
      json_t *x = json_array_get(shape, (size_t)d);
      ok = json_is_integer(x) && json_integer_value(x) >= 1 && json_integer_value(x) <= (1LL << 40);
      t->shape[d] = ok ? (int64_t)json_integer_value(x) : 0;
      ok = ok && t->numel <= (1LL << 40) / t->shape[d];
      t->numel *= t->shape[d];
    }
    json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
    long long esize = t->dtype == 4 ? 4 : 2;
    ok = ok && json_is_integer(b) && json_is_integer(en) && json_integer_value(b) >= 0 &&
         json_integer_value(en) <= size &&
         json_integer_value(en) - json_integer_value(b) == t->numel * esize;
    if (!ok) {
      rc = zt_err_set(e, ZT_EINPUT, "%s: tensor %s has a shape or data_offsets that do not fit "
                      "the file", path, key);
      break;
    }
    t->off = data + (long long)json_integer_value(b);
    t->file = file;
    s->n++;
  }
  json_decref(o);
  return rc;
}

/* model.safetensors, or the files model.safetensors.index.json maps to. */
static int st_open(st_set *s, const char *dir, zt_err *e) {
  char p[4300];
  struct stat st;
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (!stat(p, &st)) return st_add_file(s, p, e);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  if (stat(p, &st))
    return zt_err_set(e, ZT_EINPUT, "%s holds neither model.safetensors nor "
                      "model.safetensors.index.json (ztrain imports safetensors weights only)", dir);
  char *txt = slurp(p, ST_MAX_HEADER, e);
  if (!txt) return e->code;
  json_t *o = json_loads(txt, 0, NULL), *map = json_object_get(o, "weight_map");
  free(txt);
  int rc = json_is_object(map) ? ZT_OK
                               : zt_err_set(e, ZT_EINPUT, "%s: weight_map is missing", p);
  const char *key;
  json_t *v;
  /* each shard once, in the order first named */
  json_object_foreach(map, key, v) {
    const char *f = json_string_value(v);
    if (rc) break;
    if (!f || !*f || strchr(f, '/') || !strcmp(f, "..")) {
      rc = zt_err_set(e, ZT_EINPUT, "%s: weight_map names a file outside the folder for %s", p, key);
      break;
    }
    char fp[4400];
    snprintf(fp, sizeof fp, "%s/%s", dir, f);
    int seen = 0;
    for (int i = 0; i < s->nfiles; i++) seen |= !strcmp(s->files[i], fp);
    if (!seen) rc = st_add_file(s, fp, e);
  }
  json_decref(o);
  return rc;
}

static st_entry *st_find(st_set *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->t[i].name, name)) return &s->t[i];
  return NULL;
}

/* Tensor t as float32 into x (t->numel values), transposed ([a, b] read,
 * [b, a] written) when asked. */
static int st_read(const st_set *s, const st_entry *t, int transpose, float *x, zt_err *e) {
  size_t esize = t->dtype == 4 ? 4 : 2, n = (size_t)t->numel;
  void *raw = t->dtype == 4 && !transpose ? (void *)x : malloc(n * esize);
  if (!raw) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  int fd = open(s->files[t->file], O_RDONLY), err = fd < 0 ? errno : 0;
  if (!err) err = zt_fs_pread(fd, raw, n * esize, t->off);
  if (fd >= 0) close(fd);
  if (err) {
    if (raw != x) free(raw);
    return zt_err_set(e, ZT_EINPUT, "reading tensor %s from %s failed: %s", t->name,
                      s->files[t->file], strerror(err));
  }
  float *f = raw;
  if (t->dtype != 4) {
    float *w = transpose ? malloc(n * sizeof *w) : x;
    if (!w) return free(raw), zt_err_set(e, ZT_ERUNTIME, "out of memory");
    if (t->dtype == 2) zt_bf16_to_f32_n(w, raw, n);
    else zt_f16_to_f32_n(w, raw, n);
    free(raw);
    raw = f = w;
  }
  if (transpose) {
    int64_t a = t->shape[0], b = t->shape[1];
    for (int64_t i = 0; i < a; i++)
      for (int64_t j = 0; j < b; j++) x[j * a + i] = f[i * b + j];
  }
  if (raw != x) free(raw);
  return ZT_OK;
}

/* Tensors HF saves that hold no weights: GPT-2's causal-mask buffers and
 * LLaMA's rotary frequencies (recomputed from the config). */
static int ignorable(const char *name) {
  size_t n = strlen(name);
  const char *tails[] = {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"};
  for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
    size_t k = strlen(tails[i]);
    if (n > k && !strcmp(name + n - k, tails[i])) return 1;
  }
  return 0;
}

/* The checkpoint's record: the model as a plan's model section, written
 * by one process. */
static char *plan_json(const zt_model_cfg *c, const char *dir) {
  json_t *m = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b}", "kind",
                        c->arch == ZT_ARCH_GPT ? "gpt" : "llama", "vocab", c->vocab, "seq", c->seq,
                        "dim", c->dim, "layers", c->layers, "heads", c->heads, "kv_heads",
                        c->kv_heads, "ffn_dim", c->ffn_dim, "norm_eps", (double)c->norm_eps,
                        "rope_theta", (double)c->rope_theta, "tied", c->tied);
  json_t *o = json_pack("{s:o, s:{s:s, s:s}}", "model", m, "imported", "from", "huggingface",
                        "path", dir);
  char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  return s;
}

/* Every model tensor from the folder into the open file f. */
static int import_tensors(st_set *s, const zt_model_cfg *cfg, const zt_model *m, hid_t f,
                          const char *dir, zt_err *e) {
  int rc = ZT_OK;
  for (int i = 0; i < m->n_params && !rc; i++) {
    const zt_tensor_desc *p = &m->params[i].t;
    char hf[300];
    int tr = 0;
    if (zt_hf_name(cfg, p->name, hf, sizeof hf, &tr))
      return zt_err_set(e, ZT_ERUNTIME, "no Hugging Face name for %s", p->name);
    st_entry *t = st_find(s, hf);
    /* GPT-2 files from the hub name GPT2Model's tensors, without "transformer." */
    if (!t && !strncmp(hf, "transformer.", 12)) t = st_find(s, hf + 12);
    if (!t)
      return zt_err_set(e, ZT_EINPUT, "%s: tensor %s (ztrain's %s) is missing from the weights",
                        dir, hf, p->name);
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++)
      same = t->shape[d] == p->shape[tr ? p->ndim - 1 - d : d];
    if (!same) {
      char have[96], want[96];
      int64_t ws[ZT_MAX_DIMS];
      for (int d = 0; d < p->ndim; d++) ws[d] = p->shape[tr ? p->ndim - 1 - d : d];
      zt_ckpt_shape_str(have, sizeof have, t->ndim, t->shape);
      zt_ckpt_shape_str(want, sizeof want, p->ndim, ws);
      return zt_err_set(e, ZT_EINPUT, "%s: tensor %s has shape %s; config.json makes it %s", dir,
                        hf, have, want);
    }
    t->used = 1;
    float *x = malloc((size_t)t->numel * sizeof *x);
    if (!x) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
    rc = st_read(s, t, tr, x, e);
    if (!rc && zt_ckpt_format_write_tensor(f, ZT_CKPT_MODEL, p->name, p->ndim, p->shape, x))
      rc = zt_err_set(e, ZT_ERUNTIME, "writing tensor %s failed", p->name);
    free(x);
  }
  /* a tied head may be saved as well as the embedding it is */
  if (!rc && cfg->tied) {
    st_entry *h = st_find(s, "lm_head.weight");
    if (h) h->used = 1;
  }
  for (int i = 0; i < s->n && !rc; i++)
    if (!s->t[i].used && !ignorable(s->t[i].name))
      rc = zt_err_set(e, ZT_EINPUT, "%s: tensor %s is not part of ztrain's %s model (config.json "
                      "and the weights disagree?)", dir, s->t[i].name,
                      cfg->arch == ZT_ARCH_GPT ? "gpt" : "llama");
  return rc;
}

int zt_hf_import(const char *dir, const char *out, zt_model_cfg *cfg_out, zt_err *e) {
  char p[4300];
  snprintf(p, sizeof p, "%s/config.json", dir);
  char *text = slurp(p, 1 << 20, e);
  if (!text) return e->code;
  zt_model_cfg cfg;
  int rc = zt_hf_config_parse(text, p, &cfg, e);
  free(text);
  st_set s = {0};
  zt_model m = {0};
  int have_m = 0;
  if (!rc) rc = st_open(&s, dir, e);
  if (!rc) rc = zt_model_layout(&m, &cfg, 1, 0, e);
  have_m = !rc;
  char *plan = rc ? NULL : plan_json(&cfg, dir);
  const char *topo = "{\"world\":1,\"dp\":1,\"tp\":1,\"pp\":1,\"zero\":0,\"sequence_parallel\":false}";
  char tmp[4400];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
  hid_t f = -1;
  if (!rc && !plan) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (!rc) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    zt_h5_checked_metadata(fapl);
    f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) rc = zt_err_set(e, ZT_ERUNTIME, "cannot create %s", tmp);
  }
  if (!rc && (zt_ckpt_format_write_header(f, 0, plan, topo, NULL) ||
              zt_ckpt_format_create_groups(f, 0)))
    rc = zt_err_set(e, ZT_ERUNTIME, "writing the header of %s failed", tmp);
  if (!rc) rc = import_tensors(&s, &cfg, &m, f, dir, e);
  if (f >= 0 && H5Fclose(f) < 0 && !rc) rc = zt_err_set(e, ZT_ERUNTIME, "writing %s failed", tmp);
  if (!rc) rc = zt_fs_publish(tmp, out, e);
  if (rc && f >= 0) unlink(tmp);
  if (!rc && cfg_out) *cfg_out = cfg;
  free(plan);
  if (have_m) zt_model_free(&m);
  st_free(&s);
  return rc;
}
