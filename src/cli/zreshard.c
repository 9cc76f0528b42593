/* zreshard: offline tool for ztrain checkpoints, on one process (no MPI).
 * info and verify describe and check a file, export writes the weights as
 * safetensors (zreshard_export.c), convert writes a copy laid out for
 * another topology (zreshard_convert.c). Every command opens a file the
 * same way: its structure (src/ckpt/ckpt_file), then its record (plan,
 * topology, state, tensor names; zt_ckpt_file_check_record), so all of
 * them refuse the same files with the same message. Tensors are then
 * verified as they are read (checksum, finite values); what does not
 * verify fails the command unless --force. Output is written under a
 * temporary name, then renamed. Exit codes: 0 success, 1 a check failed
 * (info, verify) or writing failed, 2 bad input (arguments, a file that
 * cannot be read as a checkpoint, a tensor export or convert will not
 * copy, a layout the model cannot take). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/ckpt/ckpt_file.h"
#include "src/core/err.h"
#include "src/model/model.h"
#include "src/cli/zreshard.h"

#ifndef ZT_VERSION
#define ZT_VERSION "dev"
#endif


static const char usage[] =
    "Usage: zreshard info CKPT [--no-verify] [--force]\n"
    "       zreshard verify CKPT\n"
    "       zreshard export CKPT [--format safetensors|hf] -o PATH [--dtype fp32|bf16]\n"
    "                       [--force]\n"
    "       zreshard import DIR -o CKPT\n"
    "       zreshard convert CKPT -o OUT [--tp T] [--pp P] [--dp D] [--zero Z]\n"
    "                        [--dtype fp32|bf16] [--weights-only] [--force]\n"
    "\n"
    "Reads and rewrites ztrain checkpoints (docs/checkpoint-format.md) on one\n"
    "process; no mpirun needed.\n"
    "\n"
    "info     the format version, step, model, the topology that wrote the file,\n"
    "         every tensor with its shape, dtype and chunks, and whether each\n"
    "         verifies (--no-verify: do not read the data).\n"
    "verify   reads every tensor and names each whose checksum does not match\n"
    "         or that holds NaN or infinite values.\n"
    "export   the weights (/model) as one safetensors file, float32 or bfloat16\n"
    "         (round to nearest even), under ztrain's logical tensor names (a\n"
    "         tied gpt head is embed.tokens: metadata ztrain_tied says so).\n"
    "         --format hf: a Hugging Face folder PATH (config.json,\n"
    "         model.safetensors, the run's tokenizer file) that transformers'\n"
    "         GPT2LMHeadModel / LlamaForCausalLM.from_pretrained loads.\n"
    "import   a Hugging Face GPT-2 or LLaMA folder (config.json and\n"
    "         model.safetensors or its index) as a checkpoint: step 0, weights\n"
    "         only (a run loading it starts AdamW from zero).\n"
    "convert  a copy for another layout: checks that the model runs under it\n"
    "         (tp divides heads, kv heads, ffn_dim and vocab; pp <= layers),\n"
    "         stores every tensor in chunks that tile the target's TP shards,\n"
    "         records the target topology and recomputes the checksums.\n"
    "         --dtype bf16 stores HDF5 16-bit floats (ztrain cannot load\n"
    "         them yet); --weights-only leaves out /optim. Unset --tp, --pp,\n"
    "         --dp, --zero keep the source's values.\n"
    "\n"
    "Every command first checks the file's record: the plan is a model ztrain\n"
    "can build, each tensor group holds exactly that model's tensors with its\n"
    "shapes, the topology is consistent and fits the model. A file that fails\n"
    "is refused by all commands alike. A tensor verifies when it has a\n"
    "checksum, its data match it and all its values are finite; version 1\n"
    "files store no checksums, so none of theirs does. info, export and\n"
    "convert check every tensor they read and fail on one that does not\n"
    "verify (export and convert write nothing); --force names each such\n"
    "tensor in a warning and goes on (export and convert write it as it is).\n"
    "--force never accepts a file whose structure or record is refused, nor\n"
    "data that cannot be read. export and convert still take --no-verify,\n"
    "the old spelling of --force.\n"
    "\n"
    "Options:\n"
    "  -o, --output PATH   file to write (export, convert)\n"
    "  -f, --force         accept tensors that do not verify (info, export, convert)\n"
    "  -h, --help          show this help and exit\n"
    "  -V, --version       show the version and exit\n"
    "\n"
    "Exit status: 0 success (with --force: also when tensors did not verify);\n"
    "1 a check failed: a tensor that does not verify in info or verify, a\n"
    "version 1 file given to verify (or to info without --force), or writing\n"
    "failed; 2 bad input: an argument, a file that is missing, not HDF5,\n"
    "truncated, not a ztrain checkpoint, malformed or with a record that does\n"
    "not check, a tensor that export or convert refuses to copy, or a layout\n"
    "the model cannot take.\n";


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
      {"force", no_argument, 0, 'f'},
      {"weights-only", no_argument, 0, WEIGHTS_ONLY}, {"format", required_argument, 0, FORMAT},
      {"dtype", required_argument, 0, DTYPE},   {"tp", required_argument, 0, TP},
      {"pp", required_argument, 0, PP},         {"dp", required_argument, 0, DP},
      {"zero", required_argument, 0, ZERO},     {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  memset(a, 0, sizeof *a);
  a->cmd = argv[0];
  a->verify = 1;
  a->tp = a->pp = a->dp = a->zero = -1;
  int c, rc = ZT_OK, no_verify = 0;
  const char *dtype = NULL;
  opterr = 0;
  while (!rc && (c = getopt_long(argc, argv, "o:fh", longopts, NULL)) != -1) {
    switch (c) {
      case 'o': a->out = optarg; break;
      case 'f': a->force = 1; break;
      case NO_VERIFY: no_verify = 1; break;
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
  int is_verify = !strcmp(a->cmd, "verify"), is_import = !strcmp(a->cmd, "import");
  /* options only the commands that use them accept */
  const char *stray = is_import && dtype                              ? "--dtype"
                      : !is_export && !is_convert && !is_import && (a->out || dtype) ? "-o/--dtype"
                      : !is_export && a->format                      ? "--format"
                      : !is_convert && (a->weights_only || a->tp >= 0 || a->pp >= 0 ||
                                        a->dp >= 0 || a->zero >= 0)
                          ? "--tp/--pp/--dp/--zero/--weights-only"
                      : is_verify && no_verify ? "--no-verify"
                      : is_verify && a->force  ? "--force (verify only reports)"
                                               : NULL;
  if (stray) return zt_err_set(e, ZT_EINPUT, "%s does not apply to zreshard %s", stray, a->cmd);
  /* info's --no-verify lists without reading data; export and convert
   * read all data anyway, so there it was always "write it regardless" */
  if (no_verify && (is_export || is_convert)) a->force = 1;
  else if (no_verify) a->verify = 0;
  if (is_export && a->format && strcmp(a->format, "safetensors") && strcmp(a->format, "hf"))
    return zt_err_set(e, ZT_EINPUT, "--format takes safetensors or hf, got '%s'", a->format);
  if ((is_export || is_convert || is_import) && !a->out)
    return zt_err_set(e, ZT_EINPUT, "zreshard %s needs -o PATH", a->cmd);
  return ZT_OK;
}

/* ---- what every command shares ------------------------------------------- */

static const char *dtype_name(zt_ckpt_dtype d) { return d == ZT_CKPT_BF16 ? "bf16" : "f32"; }

void zt_zreshard_warn(const args *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fflush(stdout); /* keep the warning where it belongs among stdout's lines */
  fprintf(stderr, "zreshard %s: warning: ", a->cmd);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int zt_zreshard_open(const char *path, zt_ckpt_file *cf, zt_ckpt_record *rec, zt_err *e) {
  memset(rec, 0, sizeof *rec);
  int rc = zt_ckpt_file_open(cf, path, e);
  if (!rc) rc = zt_ckpt_file_check_record(cf, rec, e);
  if (rc) zt_ckpt_file_close(cf);
  return rc;
}

void zt_zreshard_close(zt_ckpt_file *cf, zt_ckpt_record *rec) {
  zt_ckpt_record_free(rec);
  zt_ckpt_file_close(cf);
}

int zt_zreshard_group_order(const zt_ckpt_file *cf, zt_ckpt_group g, const zt_model *m,
                            const zt_ckpt_tensor ***out) {
  int n = 0;
  *out = malloc(((size_t)cf->n[g] + 1) * sizeof **out);
  if (!*out) return -1;
  for (int i = 0; i < m->n_params; i++) {
    const zt_ckpt_tensor *t = zt_ckpt_file_find(cf, g, m->params[i].t.name);
    if (t && !t->link && n < cf->n[g]) (*out)[n++] = t;
  }
  return n;
}

int zt_zreshard_verdict(const zt_ckpt_tensor *t, const zt_ckpt_tally *ty, char *why, size_t n) {
  int bits = 0;
  size_t k = 0;
  why[0] = 0;
  if (!t->has_checksum) {
    bits |= ZR_NO_SUM;
    k += (size_t)snprintf(why, n, "has no checksum");
  } else if (ty->sum != t->checksum) {
    bits |= ZR_MISMATCH;
    k += (size_t)snprintf(why, n, "fails its checksum (stored %016llx, data gives %016llx)",
                          (unsigned long long)t->checksum, (unsigned long long)ty->sum);
  }
  if (ty->nonfinite && k < n) {
    bits |= ZR_NONFINITE;
    snprintf(why + k, n - k, "%sholds %lld non-finite values (NaN or infinity)", k ? " and " : "",
             (long long)ty->nonfinite);
  }
  return bits;
}

int zt_zreshard_need_checksums(const args *a, const zt_ckpt_file *cf, int ngroups, zt_err *e) {
  int missing = 0, total = 0;
  const zt_ckpt_tensor *first = NULL;
  for (int g = 0; g < ngroups; g++)
    for (int i = 0; i < cf->n[g]; i++) {
      const zt_ckpt_tensor *t = &cf->tensors[g][i];
      if (t->link) continue;
      total++;
      if (!t->has_checksum && !missing++) first = t;
    }
  if (!missing) return ZT_OK;
  char what[ZT_NAME_MAX + 200];
  if (cf->version < 2)
    snprintf(what, sizeof what, "%s is format version %lld, which stores no checksums: its "
             "%d tensors cannot be verified", cf->path, (long long)cf->version, total);
  else
    snprintf(what, sizeof what, "%s: %d of %d tensors have no checksum (%s/%s first) and cannot "
             "be verified", cf->path, missing, total, zt_ckpt_group_path[first->group] + 1,
             first->name);
  if (!a->force)
    return zt_err_set(e, ZT_EINPUT, "%s; nothing written (--force writes them unverified)", what);
  zt_zreshard_warn(a, "%s; written unverified (--force)", what);
  return ZT_OK;
}

int zt_zreshard_accept(const args *a, const zt_ckpt_file *cf, const zt_ckpt_tensor *t,
                       const zt_ckpt_tally *ty, zt_err *e) {
  char why[256];
  int bits = zt_zreshard_verdict(t, ty, why, sizeof why);
  /* a missing checksum was dealt with once, by zt_zreshard_need_checksums */
  if (!(bits & ~ZR_NO_SUM)) return ZT_OK;
  const char *g = zt_ckpt_group_path[t->group] + 1;
  if (!a->force)
    return zt_err_set(e, ZT_EINPUT, "%s: tensor %s/%s %s%s; nothing written (--force writes it "
                      "as it is)", cf->path, g, t->name, why,
                      bits & ZR_MISMATCH ? ": the checkpoint is corrupt" : "");
  zt_zreshard_warn(a, "tensor %s/%s %s; written as it is (--force)", g, t->name, why);
  return ZT_OK;
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
    k += (size_t)snprintf(line + k, sizeof line - k, ", loss scale %g", json_number_value(ls));
  json_t *sc = json_object_get(s, "loss_scaler"), *it = json_object_get(sc, "iter");
  json_t *lo = json_object_get(sc, "last_overflow_iter"), *hy = json_object_get(sc, "hysteresis");
  if (json_is_integer(it) && json_is_integer(lo) && json_is_integer(hy) && k < sizeof line)
    snprintf(line + k, sizeof line - k, " (dynamic: %lld updates, last overflow at %lld, hysteresis %lld)",
             (long long)json_integer_value(it), (long long)json_integer_value(lo),
             (long long)json_integer_value(hy));
  printf("state: %s\n", line[0] ? line + 2 : "(no known fields)");
  json_decref(s);
}

/* The precision the run trained in, from the plan: only the values ztrain
 * writes are printed (the file is not trusted to hold printable text). */
static void print_precision(const char *plan) {
  json_t *p = plan ? json_loads(plan, 0, NULL) : NULL;
  const char *v = json_string_value(json_object_get(json_object_get(p, "train"), "precision"));
  if (v && (!strcmp(v, "bf16") || !strcmp(v, "fp16")))
    printf("precision: trained in %s; the tensors are its fp32 weights and moments\n", v);
  else if (v && !strcmp(v, "fp32"))
    printf("precision: trained in fp32\n");
  json_decref(p);
}

static void print_header(const zt_ckpt_file *cf, const zt_ckpt_record *rec) {
  const zt_model_cfg *cfg = &rec->cfg;
  printf("checkpoint %s: ztrain-checkpoint format version %lld, step %lld\n", cf->path,
         (long long)cf->version, (long long)cf->step);
  double params = 0;
  for (int i = 0; i < cf->n[ZT_CKPT_MODEL]; i++) params += (double)cf->tensors[ZT_CKPT_MODEL][i].numel;
  printf("model: %s, vocab %d, seq %d, dim %d, layers %d, heads %d, kv_heads %d, ffn_dim %d, "
         "norm_eps %g, rope_theta %g, %s head; %.4gM parameters\n",
         cfg->arch == ZT_ARCH_GPT ? "gpt" : "llama", cfg->vocab, cfg->seq, cfg->dim, cfg->layers,
         cfg->heads, cfg->kv_heads, cfg->ffn_dim, (double)cfg->norm_eps, (double)cfg->rope_theta,
         cfg->tied ? "tied" : "untied", params / 1e6);
  const zt_ckpt_topology *tp = &rec->topo;
  if (!rec->have_topo)
    printf("written by: unknown (version 1 records no topology, and the plan has no parallel "
           "section)\n");
  else
    printf("written by: world %d = dp %d x tp %d x pp %d, zero %d%s\n", tp->world, tp->dp, tp->tp,
           tp->pp, tp->zero, tp->from_plan ? " (the plan's; version 1 records no topology)" : "");
  print_precision(cf->plan);
  print_state(cf->state);
  if (cf->script) printf("script: %zu bytes recorded\n", strlen(cf->script));
}

/* A tensor's verdict as info and verify print it. */
static void status_text(const zt_ckpt_tensor *t, const zt_ckpt_tally *ty, int bits, char *buf,
                        size_t n) {
  size_t k = 0;
  buf[0] = 0;
  if (bits & ZR_MISMATCH)
    k += (size_t)snprintf(buf, n, "MISMATCH (stored checksum %016llx, data gives %016llx)",
                          (unsigned long long)t->checksum, (unsigned long long)ty->sum);
  if (bits & ZR_NO_SUM) k += (size_t)snprintf(buf + k, n - k, "NO CHECKSUM (attribute missing)");
  if ((bits & ZR_NONFINITE) && k < n)
    snprintf(buf + k, n - k, "%sNON-FINITE (%lld values are NaN or infinite)", k ? "; " : "",
             (long long)ty->nonfinite);
}

/* info (listing) and verify share the walk over all tensors. Every tensor
 * is read once: its checksum and its count of non-finite values come from
 * the same pass. */
static int inspect(const args *a, int listing, zt_err *e) {
  zt_ckpt_file cf;
  zt_ckpt_record rec;
  int rc = zt_zreshard_open(a->ckpt, &cf, &rec, e);
  if (rc) return rc;
  if (listing) {
    print_header(&cf, &rec);
    printf("tensors:\n");
  }
  /* version 1 stores no checksums at all: said once, not per tensor */
  int v1 = cf.version < 2, total = 0, failed = 0, unreadable = 0;
  char failures[1024] = "";
  size_t flen = 0;
  for (int g = 0; g < ZT_CKPT_NGROUPS && !rc; g++) {
    const zt_ckpt_tensor **ts;
    int n = zt_zreshard_group_order(&cf, (zt_ckpt_group)g, &rec.model, &ts);
    if (n < 0) {
      rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
      break;
    }
    for (int i = 0; i < n; i++) {
      const zt_ckpt_tensor *t = ts[i];
      zt_ckpt_tally ty = {0};
      zt_err te = {0};
      char why[2200] = "", unused[256];
      int bits = 0, bad = a->verify && zt_ckpt_file_tensor_tally(&cf, t, &ty, &te);
      if (bad) {
        snprintf(why, sizeof why, "UNREADABLE: %s", te.msg);
        unreadable++;
      } else if (a->verify) {
        bits = zt_zreshard_verdict(t, &ty, unused, sizeof unused) & ~(v1 ? ZR_NO_SUM : 0);
        status_text(t, &ty, bits, why, sizeof why);
      }
      total++;
      if (bad || bits) {
        failed++;
        if (flen < sizeof failures - 80)
          flen += (size_t)snprintf(failures + flen, sizeof failures - flen, "%s%s/%s",
                                   flen ? ", " : "", zt_ckpt_group_path[g] + 1, t->name);
      }
      if (listing) {
        char name[ZT_NAME_MAX + 24], shape[96], chunks[112] = "";
        snprintf(name, sizeof name, "%s/%s", zt_ckpt_group_path[g] + 1, t->name);
        zt_ckpt_shape_str(shape, sizeof shape, t->ndim, t->shape);
        if (t->chunked) {
          strcpy(chunks, "chunks ");
          zt_ckpt_shape_str(chunks + 7, sizeof chunks - 7, t->ndim, t->chunk);
        }
        printf("  %-40s %-12s %-4s %-18s %s\n", name, shape, dtype_name(t->dtype), chunks,
               !a->verify ? "" : why[0] ? why : v1 ? "finite" : "ok");
      } else if (why[0]) {
        printf("FAIL %s/%s: %s\n", zt_ckpt_group_path[g] + 1, t->name, why);
      }
    }
    free(ts);
  }
  int links = n_links(&cf);
  if (listing && links) printf("  optim/master: %d hard links to /model (fp32 master weights)\n", links);
  char verdict[sizeof failures + 4400] = "";
  if (!rc && !a->verify) {
    printf("checksums not verified (--no-verify)\n");
  } else if (!rc) {
    if (failed) printf("%d of %d tensors fail verification\n", failed, total);
    if (v1) printf("no checksums: format version %lld does not store them\n", (long long)cf.version);
    else if (!failed) printf("all %d checksums verify; no NaN or infinite values\n", total);
    if (failed)
      snprintf(verdict, sizeof verdict, "%s: %d of %d tensors fail verification: %s%s", cf.path,
               failed, total, failures, flen >= sizeof failures - 80 ? ", ..." : "");
    else if (v1)
      snprintf(verdict, sizeof verdict, "%s has no checksums (format version %lld): %s", cf.path,
               (long long)cf.version, listing ? "its tensors cannot be verified"
                                              : "nothing to verify");
  }
  if (verdict[0]) {
    /* --force excuses tensors that do not verify, never data that cannot
     * be read */
    if (listing && a->force && !unreadable)
      zt_zreshard_warn(a, "%s (--force)", verdict);
    else
      rc = zt_err_set(e, ZT_ERUNTIME, "%s", verdict);
  }
  zt_zreshard_close(&cf, &rec);
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
  const char *cmds[] = {"info", "verify", "export", "convert", "import"};
  int which = -1;
  for (int i = 0; i < 5; i++)
    if (!strcmp(argv[1], cmds[i])) which = i;
  if (which < 0) {
    fprintf(stderr, "zreshard: error: unknown command '%s'; commands: info, verify, export, "
            "convert, import (see zreshard --help)\n", argv[1]);
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
      case 2:
        rc = a.format && !strcmp(a.format, "hf") ? zt_zreshard_export_hf(&a, &e)
                                                 : zt_zreshard_export(&a, &e);
        break;
      case 3: rc = zt_zreshard_convert(&a, &e); break;
      default: rc = zt_zreshard_import(&a, &e); break;
    }
  }
  fflush(stdout);
  if (rc) fprintf(stderr, "zreshard %s: error: %s\n", cmds[which], e.msg);
  return rc;
}
