/* zreshard_hf: `zreshard export --format hf` and `zreshard import`, a
 * checkpoint as a Hugging Face model folder and back (the name map and
 * configs are src/ckpt/hf.c's). The export writes config.json,
 * model.safetensors under HF's names and layouts, and the run's tokenizer
 * file when its plan names one, into DIR.tmp.PID, renamed to DIR only when
 * complete: a failure leaves no folder. Each tensor is verified (checksum,
 * finite values) as it is copied, as safetensors export does. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/ckpt/ckpt_file.h"
#include "src/ckpt/h5util.h"
#include "src/ckpt/hf.h"
#include "src/cli/zreshard.h"

/* Removes the files of a folder this process made, then the folder. */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  char p[4400];
  while (d && (de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

/* -o DIR must be new or an empty folder (rename replaces only that). */
static int check_out_dir(const char *out, zt_err *e) {
  struct stat st;
  if (stat(out, &st)) return ZT_OK;
  DIR *d = S_ISDIR(st.st_mode) ? opendir(out) : NULL;
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d))) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  if (d) closedir(d);
  if (!S_ISDIR(st.st_mode) || n)
    return zt_err_set(e, ZT_EINPUT, "-o %s exists%s; give a new folder", out,
                      S_ISDIR(st.st_mode) ? " and is not empty" : " and is not a folder");
  return ZT_OK;
}

static int write_text(const char *path, const char *text, zt_err *e) {
  FILE *f = fopen(path, "wb");
  int bad = !f || fputs(text, f) < 0 || fputc('\n', f) < 0;
  if (f && fclose(f)) bad = 1;
  return bad ? zt_err_set(e, ZT_ERUNTIME, "writing %s failed: %s", path, strerror(errno)) : ZT_OK;
}

/* The plan's data.tokenizer (another part of the run may set it), copied
 * as tokenizer.json or tokenizer.model; no key: nothing to copy. */
static int copy_tokenizer(const args *a, const zt_ckpt_file *cf, const char *dir, zt_err *e) {
  json_t *plan = cf->plan ? json_loads(cf->plan, 0, NULL) : NULL;
  const char *tok = json_string_value(json_object_get(json_object_get(plan, "data"), "tokenizer"));
  int rc = ZT_OK;
  size_t n = tok ? strlen(tok) : 0;
  const char *as = n > 5 && !strcmp(tok + n - 5, ".json")    ? "tokenizer.json"
                   : n > 6 && !strcmp(tok + n - 6, ".model") ? "tokenizer.model"
                                                             : NULL;
  FILE *in = tok && as ? fopen(tok, "rb") : NULL;
  if (tok && !in)
    zt_zreshard_warn(a, "the run's tokenizer %.200s is %s; the folder has none", tok,
                     as ? "not readable here" : "neither a .json nor a .model file");
  if (in) {
    char p[4400], buf[1 << 16];
    snprintf(p, sizeof p, "%s/%s", dir, as);
    FILE *out = fopen(p, "wb");
    size_t k;
    int bad = !out;
    while (!bad && (k = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, k, out) != k;
    if (ferror(in)) bad = 1;
    if (out && fclose(out)) bad = 1;
    fclose(in);
    if (bad) rc = zt_err_set(e, ZT_ERUNTIME, "copying the tokenizer %s failed", tok);
  }
  json_decref(plan);
  return rc;
}

/* model.safetensors under HF's names and layouts (safetensors export's
 * writer: each tensor verified as it is copied). */
static int write_weights(const args *a, const zt_ckpt_file *cf, const zt_ckpt_record *rec,
                         const char *path, zt_err *e) {
  const zt_ckpt_tensor **ts = NULL;
  int n = zt_zreshard_group_order(cf, ZT_CKPT_MODEL, &rec->model, &ts);
  zt_zreshard_st_name *names = n < 0 ? NULL : calloc((size_t)n + 1, sizeof *names);
  json_t *meta = json_pack("{s:s}", "format", "pt");
  int rc = names && meta ? ZT_OK : zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int i = 0; i < n && !rc; i++)
    if (zt_hf_name(&rec->cfg, ts[i]->name, names[i].name, sizeof names[i].name,
                   &names[i].transpose))
      rc = zt_err_set(e, ZT_ERUNTIME, "no Hugging Face name for %s", ts[i]->name);
  int64_t bytes;
  if (!rc) rc = zt_zreshard_write_safetensors(a, cf, ts, n, names, meta, path, &bytes, e);
  json_decref(meta);
  free(names);
  free(ts);
  return rc;
}

int zt_zreshard_export_hf(const args *given, zt_err *e) {
  /* "-o out/" names the folder out: its temporary is out.tmp.PID beside
   * it, not inside */
  args a_ = *given, *a = &a_;
  char out[4096];
  snprintf(out, sizeof out, "%s", given->out);
  for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0;
  a->out = out;
  zt_ckpt_file cf;
  zt_ckpt_record rec;
  int rc = zt_fs_check_writable("-o", a->out, e);
  if (!rc) rc = check_out_dir(a->out, e);
  if (!rc) rc = zt_zreshard_open(a->ckpt, &cf, &rec, e);
  if (rc) return rc;
  rc = zt_zreshard_need_checksums(a, &cf, 1, e);
  char *tmp = rc ? NULL : zt_zreshard_temp_name(a->out);
  if (!rc && !tmp) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  int made = 0;
  if (!rc) {
    made = !mkdir(tmp, 0777);
    if (!made) rc = zt_err_set(e, ZT_ERUNTIME, "cannot create %s: %s", tmp, strerror(errno));
  }
  char p[4400];
  char *config = rc ? NULL : zt_hf_config_json(&rec.cfg);
  if (!rc && !config) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (!rc) {
    snprintf(p, sizeof p, "%s/config.json", tmp);
    rc = write_text(p, config, e);
  }
  if (!rc) {
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    rc = write_weights(a, &cf, &rec, p, e);
  }
  if (!rc) rc = copy_tokenizer(a, &cf, tmp, e);
  if (!rc && rename(tmp, a->out))
    rc = zt_err_set(e, ZT_ERUNTIME, "cannot rename %s to %s: %s", tmp, a->out, strerror(errno));
  if (rc && made) remove_dir(tmp);
  if (!rc)
    printf("wrote %s: config.json (%s) and model.safetensors (%s, step %lld)\n", a->out,
           rec.cfg.arch == ZT_ARCH_GPT ? "GPT2LMHeadModel" : "LlamaForCausalLM",
           a->bf16 ? "bf16" : "f32", (long long)cf.step);
  free(config);
  free(tmp);
  zt_zreshard_close(&cf, &rec);
  return rc;
}

int zt_zreshard_import(const args *a, zt_err *e) {
  zt_model_cfg cfg;
  int rc = zt_fs_check_writable("-o", a->out, e);
  struct stat st;
  if (!rc && (stat(a->ckpt, &st) || !S_ISDIR(st.st_mode)))
    rc = zt_err_set(e, ZT_EINPUT, "%s is not a folder (zreshard import reads a Hugging Face "
                    "model folder: config.json and model.safetensors)", a->ckpt);
  if (!rc) rc = zt_hf_import(a->ckpt, a->out, &cfg, e);
  if (!rc)
    printf("wrote %s: %s, vocab %d, seq %d, dim %d, layers %d, heads %d, kv_heads %d, ffn_dim %d; "
           "step 0, weights only\n", a->out, cfg.arch == ZT_ARCH_GPT ? "gpt" : "llama", cfg.vocab,
           cfg.seq, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn_dim);
  return rc;
}
