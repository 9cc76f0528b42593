/* zreshard: offline tool for ztrain checkpoints, on one process (no MPI).
 * info and verify describe and check a file, export writes the weights as
 * safetensors, convert writes a copy laid out for another topology. Files
 * are read through src/ckpt/ckpt_file (every claim a file makes is checked
 * before use) and written under a temporary name, then renamed. Exit codes
 * as ztrain: 0 success, 1 a check failed or writing failed, 2 bad input
 * (arguments, a file that cannot be read as a checkpoint, a layout the
 * model cannot take). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <hdf5.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/ckpt/ckpt_file.h"
#include "src/ckpt/h5util.h"
#include "src/core/err.h"
#include "src/model/model.h"
#include "src/cli/zreshard.h"

#ifndef ZT_VERSION
#define ZT_VERSION "dev"
#endif


static const char usage[] =
    "Usage: zreshard info CKPT [--no-verify]\n"
    "       zreshard verify CKPT\n"
    "       zreshard export CKPT [--format safetensors] -o FILE [--dtype fp32|bf16]\n"
    "                       [--no-verify]\n"
    "       zreshard convert CKPT -o OUT [--tp T] [--pp P] [--dp D] [--zero Z]\n"
    "                        [--dtype fp32|bf16] [--weights-only] [--no-verify]\n"
    "\n"
    "Reads and rewrites ztrain checkpoints (docs/checkpoint-format.md) on one\n"
    "process; no mpirun needed.\n"
    "\n"
    "info     the format version, step, model, the topology that wrote the file,\n"
    "         every tensor with its shape, dtype and chunks, and whether each\n"
    "         checksum verifies (--no-verify: do not read the data).\n"
    "verify   recomputes every tensor's checksum and names those that fail.\n"
    "export   the weights (/model) as one safetensors file, float32 or bfloat16\n"
    "         (round to nearest even), under ztrain's logical tensor names (a\n"
    "         tied gpt head is embed.tokens: metadata ztrain_tied says so).\n"
    "convert  a copy for another layout: checks that the model runs under it\n"
    "         (tp divides heads, kv heads, ffn_dim and vocab; pp <= layers),\n"
    "         stores every tensor in chunks that tile the target's TP shards,\n"
    "         records the target topology and recomputes the checksums.\n"
    "         --dtype bf16 stores HDF5 16-bit floats (ztrain cannot load\n"
    "         them yet); --weights-only leaves out /optim. Unset --tp, --pp,\n"
    "         --dp, --zero keep the source's values.\n"
    "\n"
    "export and convert check each source tensor's checksum as they read it\n"
    "and write nothing from a corrupt file (--no-verify skips that).\n"
    "\n"
    "Options:\n"
    "  -o, --output PATH   file to write (export, convert)\n"
    "  -h, --help          show this help and exit\n"
    "  -V, --version       show the version and exit\n"
    "\n"
    "Exit status: 0 success; 1 a checksum does not verify (info, verify), a\n"
    "version 1 file given to verify (it has none), or writing failed; 2 bad\n"
    "input: an argument, a file that is missing, not HDF5, truncated, not a\n"
    "ztrain checkpoint or malformed, a corrupt tensor met by export or\n"
    "convert, or a layout the model cannot take.\n";


/* ---- arguments ---------------------------------------------------------- */

static int parse_int(const char *opt, const char *s, int lo, int hi, int *v, zt_err *e) {
  char *end;
  errno = 0;
  long long n = strtoll(s, &end, 10);
  if (!*s || *end || errno || n < lo || n > hi)
    return zt_err_set(e, ZT_EINPUT, "%s needs an integer from %d to %d, got '%s'", opt, lo, hi, s);
  *v = (int)n;
  return ZT_OK;
}

static int parse_args(int argc, char **argv, args *a, zt_err *e) {
  enum { NO_VERIFY = 256, WEIGHTS_ONLY, FORMAT, DTYPE, TP, PP, DP, ZERO };
  static const struct option longopts[] = {
      {"output", required_argument, 0, 'o'},   {"no-verify", no_argument, 0, NO_VERIFY},
      {"weights-only", no_argument, 0, WEIGHTS_ONLY}, {"format", required_argument, 0, FORMAT},
      {"dtype", required_argument, 0, DTYPE},   {"tp", required_argument, 0, TP},
      {"pp", required_argument, 0, PP},         {"dp", required_argument, 0, DP},
      {"zero", required_argument, 0, ZERO},     {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  memset(a, 0, sizeof *a);
  a->cmd = argv[0];
  a->verify = 1;
  a->tp = a->pp = a->dp = a->zero = -1;
  int c, rc = ZT_OK;
  const char *dtype = NULL;
  opterr = 0;
  while (!rc && (c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
    switch (c) {
      case 'o': a->out = optarg; break;
      case NO_VERIFY: a->verify = 0; break;
      case WEIGHTS_ONLY: a->weights_only = 1; break;
      case FORMAT: a->format = optarg; break;
      case DTYPE: dtype = optarg; break;
      case TP: rc = parse_int("--tp", optarg, 1, 1 << 16, &a->tp, e); break;
      case PP: rc = parse_int("--pp", optarg, 1, 1 << 16, &a->pp, e); break;
      case DP: rc = parse_int("--dp", optarg, 1, 1 << 20, &a->dp, e); break;
      case ZERO: rc = parse_int("--zero", optarg, 0, 3, &a->zero, e); break;
      case 'h': return 'h';
      default:
        return zt_err_set(e, ZT_EINPUT, "%s '%s'; see zreshard --help",
                          optopt ? "missing value or unknown option" : "unknown option",
                          argv[optind - 1]);
    }
  }
  if (rc) return rc;
  if (optind != argc - 1)
    return zt_err_set(e, ZT_EINPUT, optind == argc ? "no checkpoint given; see zreshard --help"
                                                   : "one checkpoint expected, got %d arguments",
                      argc - optind);
  a->ckpt = argv[optind];
  if (dtype && strcmp(dtype, "fp32") && strcmp(dtype, "f32") && strcmp(dtype, "bf16"))
    return zt_err_set(e, ZT_EINPUT, "--dtype takes fp32 or bf16, got '%s'", dtype);
  a->bf16 = dtype && !strcmp(dtype, "bf16");
  int is_export = !strcmp(a->cmd, "export"), is_convert = !strcmp(a->cmd, "convert");
  /* options only the commands that use them accept */
  const char *stray = !is_export && !is_convert && (a->out || dtype) ? "-o/--dtype"
                      : !is_export && a->format                      ? "--format"
                      : !is_convert && (a->weights_only || a->tp >= 0 || a->pp >= 0 ||
                                        a->dp >= 0 || a->zero >= 0)
                          ? "--tp/--pp/--dp/--zero/--weights-only"
                      : !strcmp(a->cmd, "verify") && !a->verify ? "--no-verify"
                                                                : NULL;
  if (stray) return zt_err_set(e, ZT_EINPUT, "%s does not apply to zreshard %s", stray, a->cmd);
  if (is_export && a->format && strcmp(a->format, "safetensors"))
    return zt_err_set(e, ZT_EINPUT, "--format: only safetensors is supported, got '%s'", a->format);
  if ((is_export || is_convert) && !a->out)
    return zt_err_set(e, ZT_EINPUT, "zreshard %s needs -o PATH", a->cmd);
  return ZT_OK;
}

/* ---- shared helpers ----------------------------------------------------- */

static void shape_str(char *buf, size_t n, int ndim, const int64_t *d) {
  int k = snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k > 0 && (size_t)k < n; i++)
    k += snprintf(buf + k, n - (size_t)k, i ? ", %lld" : "%lld", (long long)d[i]);
  if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "]");
}

static const char *dtype_name(zt_ckpt_dtype d) { return d == ZT_CKPT_BF16 ? "bf16" : "f32"; }

/* The model table of the plan at tp = 1 when the file's /model is exactly
 * that model: tools then list tensors in the model's order (embedding,
 * blocks in order, head) rather than HDF5's alphabetical one. */
int zt_zreshard_plan_layout(const zt_ckpt_file *cf, zt_model *m, zt_model_cfg *cfg) {
  zt_err e = {0};
  if (zt_ckpt_file_model_cfg(cf, cfg, &e) || zt_model_layout(m, cfg, 1, 0, &e)) return 0;
  if (zt_ckpt_file_check_model(cf, ZT_CKPT_MODEL, m, &e)) {
    zt_model_free(m);
    return 0;
  }
  return 1;
}

/* Group g's tensors (links to /model left out) in the model's order when
 * m is given and the group matches it, else in the file's. */
int zt_zreshard_group_order(const zt_ckpt_file *cf, zt_ckpt_group g, const zt_model *m,
                       const zt_ckpt_tensor ***out) {
  zt_err e = {0};
  int n = 0;
  *out = malloc(((size_t)cf->n[g] + 1) * sizeof **out);
  if (!*out) return -1;
  if (m && !zt_ckpt_file_check_model(cf, g, m, &e)) {
    for (int i = 0; i < m->n_params; i++) {
      const zt_ckpt_tensor *t = zt_ckpt_file_find(cf, g, m->params[i].t.name);
      if (!t->link) (*out)[n++] = t;
    }
  } else {
    for (int i = 0; i < cf->n[g]; i++)
      if (!cf->tensors[g][i].link) (*out)[n++] = &cf->tensors[g][i];
  }
  return n;
}

static int n_links(const zt_ckpt_file *cf) {
  int n = 0;
  for (int i = 0; i < cf->n[ZT_CKPT_MASTER]; i++) n += cf->tensors[ZT_CKPT_MASTER][i].link;
  return n;
}


char *zt_zreshard_temp_name(const char *path) {
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (tmp) snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid());
  return tmp;
}



/* ---- info and verify ---------------------------------------------------- */

/* The state record's data position, seed and loss scale. */
static void print_state(const char *state) {
  json_t *s = state ? json_loads(state, 0, NULL) : NULL;
  if (!json_is_object(s)) {
    if (state) printf("state: (not a JSON object)\n");
    json_decref(s);
    return;
  }
  json_t *d = json_object_get(s, "data"), *r = json_object_get(s, "rng");
  json_t *ep = json_object_get(d, "epoch"), *ns = json_object_get(d, "next_sample");
  json_t *seed = json_object_get(r, "seed"), *ls = json_object_get(s, "loss_scale");
  /* only numbers from the file are printed */
  char line[256] = "";
  size_t k = 0;
  if (json_is_integer(ep))
    k += (size_t)snprintf(line + k, sizeof line - k, ", data epoch %lld",
                          (long long)json_integer_value(ep));
  if (json_is_integer(ns) && k < sizeof line)
    k += (size_t)snprintf(line + k, sizeof line - k, ", next sample %lld",
                          (long long)json_integer_value(ns));
  if (json_is_integer(seed) && k < sizeof line)
    k += (size_t)snprintf(line + k, sizeof line - k, ", rng seed %lld",
                          (long long)json_integer_value(seed));
  if (json_is_number(ls) && k < sizeof line)
    snprintf(line + k, sizeof line - k, ", loss scale %g", json_number_value(ls));
  printf("state: %s\n", line[0] ? line + 2 : "(no known fields)");
  json_decref(s);
}

static void print_header(const zt_ckpt_file *cf, const zt_model_cfg *cfg, int have_cfg,
                         const zt_err *cfg_err) {
  printf("checkpoint %s: ztrain-checkpoint format version %lld, step %lld\n", cf->path,
         (long long)cf->version, (long long)cf->step);
  double params = 0;
  for (int i = 0; i < cf->n[ZT_CKPT_MODEL]; i++) params += (double)cf->tensors[ZT_CKPT_MODEL][i].numel;
  if (have_cfg)
    printf("model: %s, vocab %d, seq %d, dim %d, layers %d, heads %d, kv_heads %d, ffn_dim %d, "
           "norm_eps %g, rope_theta %g, %s head; %.4gM parameters\n",
           cfg->arch == ZT_ARCH_GPT ? "gpt" : "llama", cfg->vocab, cfg->seq, cfg->dim,
           cfg->layers, cfg->heads, cfg->kv_heads, cfg->ffn_dim, (double)cfg->norm_eps,
           (double)cfg->rope_theta, cfg->tied ? "tied" : "untied", params / 1e6);
  else
    printf("model: unknown (%s); %.4gM parameters\n", cfg_err->msg, params / 1e6);
  zt_ckpt_topology tp;
  zt_err e = {0};
  if (zt_ckpt_file_topology(cf, &tp, &e))
    printf("written by: unknown (%s)\n", e.msg);
  else
    printf("written by: world %d = dp %d x tp %d x pp %d, zero %d%s\n", tp.world, tp.dp, tp.tp,
           tp.pp, tp.zero, tp.from_plan ? " (the plan's; version 1 records no topology)" : "");
  print_state(cf->state);
  if (cf->script) printf("script: %zu bytes recorded\n", strlen(cf->script));
}

typedef enum { ST_NONE, ST_OK, ST_MISMATCH, ST_NO_SUM, ST_UNREADABLE } check_status;

static check_status check_tensor(const zt_ckpt_file *cf, const zt_ckpt_tensor *t, uint64_t *got,
                                 zt_err *e) {
  if (!t->has_checksum) return ST_NO_SUM;
  if (zt_ckpt_file_tensor_checksum(cf, t, got, e)) return ST_UNREADABLE;
  return *got == t->checksum ? ST_OK : ST_MISMATCH;
}

/* info (verify = a->verify) and verify share the walk over all tensors. */
static int inspect(const args *a, int listing, zt_err *e) {
  zt_ckpt_file cf;
  int rc = zt_ckpt_file_open(&cf, a->ckpt, e);
  if (rc) {
    zt_ckpt_file_close(&cf);
    return rc;
  }
  zt_model m;
  zt_model_cfg cfg;
  zt_err cfg_err = {0};
  int have_cfg = !zt_ckpt_file_model_cfg(&cf, &cfg, &cfg_err);
  int ordered = have_cfg && zt_zreshard_plan_layout(&cf, &m, &cfg);
  if (listing) {
    print_header(&cf, &cfg, have_cfg, &cfg_err);
    printf("tensors:\n");
  }
  int any_sum = 0, total = 0, failed = 0;
  for (int g = 0; g < ZT_CKPT_NGROUPS; g++)
    for (int i = 0; i < cf.n[g]; i++) any_sum |= cf.tensors[g][i].has_checksum;
  int verify = a->verify && (any_sum || cf.version >= 2);
  char failures[1024] = "";
  size_t flen = 0;
  for (int g = 0; g < ZT_CKPT_NGROUPS && !rc; g++) {
    const zt_ckpt_tensor **ts;
    int n = zt_zreshard_group_order(&cf, (zt_ckpt_group)g, ordered ? &m : NULL, &ts);
    if (n < 0) {
      rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
      break;
    }
    for (int i = 0; i < n; i++) {
      const zt_ckpt_tensor *t = ts[i];
      uint64_t got = 0;
      zt_err te = {0};
      check_status st = verify ? check_tensor(&cf, t, &got, &te) : ST_NONE;
      total++;
      if (st != ST_NONE && st != ST_OK) {
        failed++;
        if (flen < sizeof failures - 80)
          flen += (size_t)snprintf(failures + flen, sizeof failures - flen, "%s%s/%s",
                                   flen ? ", " : "", zt_ckpt_group_path[g] + 1, t->name);
      }
      char why[2200] = "";
      if (st == ST_MISMATCH)
        snprintf(why, sizeof why, "MISMATCH (stored checksum %016llx, data gives %016llx)",
                 (unsigned long long)t->checksum, (unsigned long long)got);
      else if (st == ST_NO_SUM)
        snprintf(why, sizeof why, "NO CHECKSUM (attribute missing)");
      else if (st == ST_UNREADABLE)
        snprintf(why, sizeof why, "UNREADABLE: %s", te.msg);
      if (listing) {
        char name[ZT_NAME_MAX + 24], shape[96], chunks[112] = "";
        snprintf(name, sizeof name, "%s/%s", zt_ckpt_group_path[g] + 1, t->name);
        shape_str(shape, sizeof shape, t->ndim, t->shape);
        if (t->chunked) {
          strcpy(chunks, "chunks ");
          shape_str(chunks + 7, sizeof chunks - 7, t->ndim, t->chunk);
        }
        printf("  %-40s %-12s %-4s %-18s %s\n", name, shape, dtype_name(t->dtype), chunks,
               st == ST_OK ? "ok" : st == ST_NONE ? "" : why);
      } else if (st != ST_OK) {
        printf("FAIL %s/%s: %s\n", zt_ckpt_group_path[g] + 1, t->name, why);
      }
    }
    free(ts);
  }
  int links = n_links(&cf);
  if (listing && links) printf("  optim/master: %d hard links to /model (fp32 master weights)\n", links);
  if (!rc) {
    if (!a->verify) {
      printf("checksums not verified (--no-verify)\n");
    } else if (!verify) {
      printf("no checksums: format version %lld does not store them\n", (long long)cf.version);
      if (!listing)
        rc = zt_err_set(e, ZT_ERUNTIME, "%s has no checksums (format version %lld): nothing "
                        "to verify", cf.path, (long long)cf.version);
    } else if (!failed) {
      printf("all %d checksums verify\n", total);
    } else {
      printf("%d of %d tensors fail verification\n", failed, total);
      rc = zt_err_set(e, ZT_ERUNTIME, "%s: %d of %d tensors fail verification: %s%s", cf.path,
                      failed, total, failures, flen >= sizeof failures - 80 ? ", ..." : "");
    }
  }
  if (ordered) zt_model_free(&m);
  zt_ckpt_file_close(&cf);
  return rc;
}

/* ---- export ------------------------------------------------------------- */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors and checkpoint checksums are defined on little-endian bytes"
#endif

typedef struct {
  FILE *f;
  int bf16;
  uint16_t *half; /* bf16 staging for one block */
  int64_t half_n;
  uint64_t sum; /* checksum of the values read */
  int write_errno;
} export_ctx;

static int export_block(void *ctx, const zt_ckpt_tensor *t, const int64_t *start,
                        const int64_t *count, const float *x, int64_t n) {
  export_ctx *c = ctx;
  c->sum += zt_ckpt_file_box_checksum(t, start, count, x);
  const void *data = x;
  size_t size = sizeof *x;
  if (c->bf16) {
    if (n > c->half_n) {
      uint16_t *h = realloc(c->half, (size_t)n * sizeof *h);
      if (!h) return c->write_errno = ENOMEM, ZT_ERUNTIME;
      c->half = h;
      c->half_n = n;
    }
    for (int64_t i = 0; i < n; i++) c->half[i] = zt_bf16_from_f32(x[i]);
    data = c->half;
    size = sizeof *c->half;
  }
  if (fwrite(data, size, (size_t)n, c->f) != (size_t)n) {
    c->write_errno = errno ? errno : EIO;
    return ZT_ERUNTIME;
  }
  return ZT_OK;
}

/* The safetensors header: {"__metadata__": {...}, name: {dtype, shape,
 * data_offsets}, ...} with tensors in file order, offsets relative to the
 * data that follows the header. */
static char *safetensors_header(const zt_ckpt_file *cf, const zt_ckpt_tensor **ts, int n,
                                int bf16, int64_t *data_bytes) {
  json_t *h = json_object(), *meta = json_object();
  char num[32];
  json_object_set_new(meta, "format", json_string("pt"));
  snprintf(num, sizeof num, "%lld", (long long)cf->step);
  json_object_set_new(meta, "ztrain_step", json_string(num));
  snprintf(num, sizeof num, "%lld", (long long)cf->version);
  json_object_set_new(meta, "ztrain_format_version", json_string(num));
  json_object_set_new(meta, "ztrain_names", json_string("ztrain logical tensor names "
                                                        "(docs/checkpoint-format.md)"));
  json_t *plan = cf->plan ? json_loads(cf->plan, 0, NULL) : NULL;
  json_t *model = json_object_get(plan, "model");
  if (json_is_object(model)) {
    char *s = json_dumps(model, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s) json_object_set_new(meta, "ztrain_model", json_string(s));
    free(s);
    json_t *tied = json_object_get(model, "tied");
    if (json_is_boolean(tied))
      json_object_set_new(meta, "ztrain_tied", json_string(json_is_true(tied) ? "true" : "false"));
  }
  json_decref(plan);
  json_object_set_new(h, "__metadata__", meta);
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    json_t *shape = json_array();
    for (int d = 0; d < ts[i]->ndim; d++) json_array_append_new(shape, json_integer(ts[i]->shape[d]));
    int64_t bytes = ts[i]->numel * (bf16 ? 2 : 4);
    json_object_set_new(h, ts[i]->name,
                        json_pack("{s:s, s:o, s:[I, I]}", "dtype", bf16 ? "BF16" : "F32", "shape",
                                  shape, "data_offsets", (json_int_t)off,
                                  (json_int_t)(off + bytes)));
    off += bytes;
  }
  *data_bytes = off;
  char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(h);
  return s;
}

static int export_main(const args *a, zt_err *e) {
  int rc = zt_fs_check_writable("-o", a->out, e);
  zt_ckpt_file cf;
  if (!rc) rc = zt_ckpt_file_open(&cf, a->ckpt, e);
  else memset(&cf, 0, sizeof cf), cf.h5 = -1;
  zt_model m;
  zt_model_cfg cfg;
  int ordered = !rc && zt_zreshard_plan_layout(&cf, &m, &cfg);
  const zt_ckpt_tensor **ts = NULL;
  int n = rc ? 0 : zt_zreshard_group_order(&cf, ZT_CKPT_MODEL, ordered ? &m : NULL, &ts);
  if (!rc && n < 0) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int i = 0; i < n && !rc; i++)
    if (!strcmp(ts[i]->name, "__metadata__"))
      rc = zt_err_set(e, ZT_EINPUT, "%s: a tensor named __metadata__ cannot go into safetensors",
                      cf.path);
  if (!rc && n == 0) rc = zt_err_set(e, ZT_EINPUT, "%s: /model holds no tensors", cf.path);
  int64_t data_bytes = 0;
  char *header = rc ? NULL : safetensors_header(&cf, ts, n, a->bf16, &data_bytes);
  if (!rc && !header) rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  char *tmp = rc ? NULL : zt_zreshard_temp_name(a->out);
  export_ctx c = {.bf16 = a->bf16};
  if (!rc && (!tmp || !(c.f = fopen(tmp, "wb"))))
    rc = zt_err_set(e, ZT_ERUNTIME, "cannot create %s: %s", tmp ? tmp : a->out, strerror(errno));
  if (!rc) {
    /* 8-byte little-endian length of the header, which is padded with
     * spaces so that the data starts 8-aligned */
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    if (fwrite(lb, 1, 8, c.f) != 8 || fwrite(header, 1, len, c.f) != len ||
        fwrite("       ", 1, padded - len, c.f) != padded - len)
      c.write_errno = errno ? errno : EIO;
  }
  for (int i = 0; i < n && !rc && !c.write_errno; i++) {
    c.sum = 0;
    rc = zt_ckpt_file_each_block(&cf, ts[i], export_block, &c, e);
    if (rc == ZT_ERUNTIME && c.write_errno) rc = ZT_OK; /* reported below */
    else if (!rc && a->verify && ts[i]->has_checksum && c.sum != ts[i]->checksum)
      rc = zt_err_set(e, ZT_EINPUT, "%s: tensor model/%s fails its checksum (stored %016llx, "
                      "data gives %016llx): the checkpoint is corrupt; nothing written",
                      cf.path, ts[i]->name, (unsigned long long)ts[i]->checksum,
                      (unsigned long long)c.sum);
  }
  if (c.f && (fflush(c.f) || fsync(fileno(c.f))) && !c.write_errno) c.write_errno = errno;
  if (c.f && fclose(c.f) && !c.write_errno) c.write_errno = errno;
  if (!rc && c.write_errno)
    rc = zt_err_set(e, ZT_ERUNTIME, "writing %s failed: %s", a->out, strerror(c.write_errno));
  if (!rc) rc = zt_fs_publish(tmp, a->out, e);
  if (rc && c.f) unlink(tmp);
  if (!rc)
    printf("wrote %s: safetensors, %d tensors of /model as %s, %lld bytes of data, step %lld\n",
           a->out, n, a->bf16 ? "BF16" : "F32", (long long)data_bytes, (long long)cf.step);
  free(c.half);
  free(tmp);
  free(header);
  free(ts);
  if (ordered) zt_model_free(&m);
  zt_ckpt_file_close(&cf);
  return rc;
}

/* ---- main ----------------------------------------------------------------- */

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "zreshard: error: no command given; see zreshard --help\n");
    return ZT_EINPUT;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
    printf("zreshard %s (checkpoint format versions 1 and 2)\n", ZT_VERSION);
    return 0;
  }
  const char *cmds[] = {"info", "verify", "export", "convert"};
  int which = -1;
  for (int i = 0; i < 4; i++)
    if (!strcmp(argv[1], cmds[i])) which = i;
  if (which < 0) {
    fprintf(stderr, "zreshard: error: unknown command '%s'; commands: info, verify, export, "
            "convert (see zreshard --help)\n", argv[1]);
    return ZT_EINPUT;
  }
  /* test hook: tiny blocks cut tiny tensors into many reads */
  const char *block = getenv("ZRESHARD_BLOCK_ELEMS");
  if (block && atoll(block) > 0) zt_ckpt_file_block_elems = atoll(block);
  const char *chunk = getenv("ZRESHARD_CHUNK_BYTES");
  if (chunk && atoll(chunk) > 0) zt_zreshard_chunk_max_bytes = atoll(chunk);
  args a;
  zt_err e = {0};
  int rc = parse_args(argc - 1, argv + 1, &a, &e);
  if (rc == 'h') {
    fputs(usage, stdout);
    return 0;
  }
  if (!rc) {
    switch (which) {
      case 0: rc = inspect(&a, 1, &e); break;
      case 1: rc = inspect(&a, 0, &e); break;
      case 2: rc = export_main(&a, &e); break;
      default: rc = zt_zreshard_convert(&a, &e); break;
    }
  }
  fflush(stdout);
  if (rc) fprintf(stderr, "zreshard %s: error: %s\n", cmds[which], e.msg);
  return rc;
}
