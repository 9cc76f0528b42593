/* ztrain_infer: `ztrain eval` and `ztrain sample`, what a trained
 * checkpoint is for. eval sets the run up as training does (any layout,
 * under mpirun), loads the checkpoint and runs the trainer's own
 * evaluation (zt_trainer_eval), so its val_loss is the one training prints
 * at that step. sample runs on one process: the checkpoint's weights
 * (read serially, checked), a KV cache (src/model/decode.h) and the run's
 * tokenizer; it computes in fp32 whatever train.precision says, since the
 * checkpoint holds fp32 weights. */
#include "src/cli/ztrain_infer.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/gemm_path.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "parallel/watchdog.h"
#include "src/ckpt/ckpt.h"
#include "src/ckpt/ckpt_file.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "src/data/tokenizer.h"
#include "src/plan/memory.h"
#include "src/model/decode.h"
#include "src/train/trainer.h"

static const char eval_usage[] =
    "Usage: ztrain eval SCRIPT.lua --load CKPT [-e STMT]... [--json]\n"
    "                   [--script-timeout S] [--script-memory MIB]\n"
    "\n"
    "The loss of checkpoint CKPT on the script's data.val: its first\n"
    "data.val_batches global batches (default 4), as training\n"
    "evaluates every train.eval_every steps, so the val_loss equals the one\n"
    "training printed at that step. Runs as one process or under mpirun with the\n"
    "script's layout (dp, tp, pp: -e 'parallel = {tp = 2}'), which any checkpoint\n"
    "loads. Prints step, val_loss and perplexity = exp(val_loss); --json prints\n"
    "one JSON object instead ({\"step\", \"val_loss\", \"perplexity\", \"tokens\"}).\n"
    "Exit status: 0 success, 1 runtime failure, 2 bad input (no data.val, no\n"
    "--load, a checkpoint of another model).\n";

static const char sample_usage[] =
    "Usage: ztrain sample SCRIPT.lua --load CKPT --prompt TEXT [--tokens N]\n"
    "                     [--temperature T] [--top-k K] [--seed S] [--ids] [-e STMT]...\n"
    "\n"
    "Continues TEXT with the model of checkpoint CKPT (the script's model),\n"
    "one process, one token a forward pass over a KV cache, printing the text as\n"
    "it comes (the prompt first), then a newline; a line of statistics goes to\n"
    "stderr. Text is encoded and decoded with the run's tokenizer.\n"
    "  --prompt TEXT      the start (at least one token, fewer than model.seq)\n"
    "  --tokens N         new tokens at most (default 100); generation also\n"
    "                     stops at the tokenizer's end-of-text token and when the\n"
    "                     model's seq positions are used up\n"
    "  --temperature T    0: greedy (the most likely token); else the logits are\n"
    "                     divided by T before sampling (default 1)\n"
    "  --top-k K          sample among the K most likely tokens only (default: all)\n"
    "  --seed S           the draws' seed (default 1): counter-based, so the same\n"
    "                     seed gives the same draws on any machine\n"
    "  --ids              print the new token ids (one line) instead of text\n"
    "Exit status: 0 success, 1 runtime failure, 2 bad input.\n";

typedef struct {
  int eval; /* else sample */
  char **stmts;
  int nstmts;
  const char *script, *load, *prompt;
  int json, ids;
  long long tokens, top_k; /* top_k 0: all */
  double temperature;
  unsigned long long seed;
  zt_script_limits limits;
} infer_args;

/* A number option: the whole of s, within [lo, hi]. */
static int number(const char *opt, const char *s, double lo, double hi, int integer, double *v,
                  zt_err *e) {
  char *end;
  errno = 0;
  *v = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !(*v >= lo && *v <= hi) ||
      (integer && *v != floor(*v)))
    return zt_err_set(e, ZT_EINPUT, "%s needs %s from %g to %g, got '%s'", opt,
                      integer ? "an integer" : "a number", lo, hi, s);
  return ZT_OK;
}

static int parse(int argc, char **argv, infer_args *a, zt_err *e) {
  static const struct option longopts[] = {
      {"load", required_argument, 0, 'l'},        {"json", no_argument, 0, 'j'},
      {"prompt", required_argument, 0, 'p'},      {"tokens", required_argument, 0, 'n'},
      {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
      {"seed", required_argument, 0, 's'},        {"ids", no_argument, 0, 'i'},
      {"script-timeout", required_argument, 0, 'T'},
      {"script-memory", required_argument, 0, 'M'},
      {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
  const char *cmd = a->eval ? "eval" : "sample";
  a->stmts = calloc((size_t)argc + 1, sizeof *a->stmts);
  a->tokens = 100;
  a->temperature = 1;
  a->seed = 1;
  if (!a->stmts) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  int c, li = -1, rc = ZT_OK;
  double v;
  opterr = 0;
  optind = 1;
  while (!rc && (c = getopt_long(argc, argv, "e:h", longopts, &li)) != -1) {
    /* eval takes none of sample's options, nor sample --json */
    if ((a->eval && strchr("pntksi", c)) || (!a->eval && c == 'j'))
      return zt_err_set(e, ZT_EINPUT, "ztrain %s takes no --%s; see ztrain %s --help", cmd,
                        longopts[li].name, cmd);
    switch (c) {
      case 'e': a->stmts[a->nstmts++] = optarg; break;
      case 'l': a->load = optarg; break;
      case 'j': a->json = 1; break;
      case 'i': a->ids = 1; break;
      case 'p': a->prompt = optarg; break;
      case 'n':
        rc = number("--tokens", optarg, 1, 1e9, 1, &v, e);
        a->tokens = (long long)v;
        break;
      case 't': rc = number("--temperature", optarg, 0, 1e6, 0, &a->temperature, e); break;
      case 'k':
        rc = number("--top-k", optarg, 1, 1e9, 1, &v, e);
        a->top_k = (long long)v;
        break;
      case 's':
        rc = number("--seed", optarg, 0, 9007199254740992.0, 1, &v, e);
        a->seed = (unsigned long long)v;
        break;
      case 'T':
      case 'M':
        rc = number(c == 'T' ? "--script-timeout" : "--script-memory", optarg,
                    c == 'T' ? 1e-3 : 4, 1e12, 0, c == 'T' ? &a->limits.seconds : &a->limits.mib,
                    e);
        break;
      case 'h': return 'h';
      default:
        return zt_err_set(e, ZT_EINPUT, "%s '%s'; see ztrain %s --help",
                          optopt ? "missing value or unknown option" : "unknown option",
                          argv[optind - 1], cmd);
    }
  }
  if (rc) return rc;
  if (optind != argc - 1)
    return zt_err_set(e, ZT_EINPUT, "ztrain %s needs one script, got %d arguments; see "
                      "ztrain %s --help", cmd, argc - optind, cmd);
  a->script = argv[optind];
  if (!a->load)
    return zt_err_set(e, ZT_EINPUT, "ztrain %s needs --load CKPT: the checkpoint whose model "
                      "to %s", cmd, a->eval ? "evaluate" : "sample from");
  if (!a->eval && !a->prompt)
    return zt_err_set(e, ZT_EINPUT, "ztrain sample needs --prompt TEXT: the text to continue");
  return ZT_OK;
}

/* ---- eval ----------------------------------------------------------------- */

/* Training's set-up (train_main) for the evaluation data only: the
 * trainer reads data.val for both of its loaders, so data.train need not
 * exist where a checkpoint is evaluated. */
static int eval_run(const infer_args *a, zt_comm *world, zt_err *e) {
  const zt_backend *be = zt_backend_cpu();
  zt_plan plan = {0};
  zt_grid grid = {0};
  zt_data val = {0};
  zt_model model = {0};
  zt_trainer tr = {0};
  zt_stage_cfg stage = {0};
  int grid_up = 0;
  zt_script_limits lim = a->limits;
  lim.quiet = world->rank != 0;
  int rc = zt_config_load(&plan, a->script, a->stmts, a->nstmts, world->size, &lim, e);
  if (!rc) zt_watchdog_set_timeout(plan.parallel.timeout);
  if (!rc && !plan.data.val)
    rc = zt_err_set(e, ZT_EINPUT, "%s has no data.val: eval measures the loss on validation "
                    "data; name a token file (data.val = \"data/val.bin\", or -e 'data.val = "
                    "\"PATH\"')", a->script);
  if (!rc) rc = zt_cli_pick_backend(plan.parallel.device, &be, e);
  if (!rc) zt_comm_set_device(be);
  if (!rc && !be->has_dtype(plan.train.precision))
    rc = zt_err_set(e, ZT_EINPUT, "train.precision: the %s backend cannot compute in %s", be->name,
                    zt_dtype_name(plan.train.precision));
  if (!rc) rc = zt_data_open(&val, &plan.data.val_spec, plan.data.token_bytes, plan.model.seq,
                             plan.model.vocab, e);
  rc = zt_comm_agree(world, rc, e);
  if (!rc) {
    rc = zt_grid_init(&grid, plan.parallel.dp, plan.parallel.tp, plan.parallel.pp, e);
    grid_up = !rc;
  }
  int piped = !rc && plan.parallel.pp > 1;
  if (piped)
    rc = zt_pipe_stage(&plan.pipeline.schedule, plan.pipeline.first, plan.pipeline.last,
                       grid.pp_rank, &stage, e);
  /* eval builds training's states: the planner's figure for this rank */
  if (!rc) rc = zt_memplan_check(&plan, world->rank, omp_get_max_threads(), be->host_visible, e);
  if (!rc) rc = zt_model_init(&model, &plan.model, be, plan.train.micro_batch, &grid.tp_comm,
                              piped ? &stage : NULL, e);
  zt_pipe_stage_free(&stage);
  rc = zt_comm_agree(world, rc, e);
  if (!rc)
    rc = zt_trainer_init(&tr, &plan.train, &model, &grid, &plan.parallel.zero,
                         &plan.pipeline.schedule, &val, &val, 0, e);
  rc = zt_comm_agree(world, rc, e);
  zt_ckpt_state cs = {.m = &model, .z = tr.zero, .grid = &grid, .step = &tr.t,
                      .skipped = &tr.skipped, .scaler = &tr.scaler,
                      .global_batch = plan.train.global_batch, .seed = plan.train.seed};
  if (!rc) rc = zt_ckpt_load(a->load, &cs, e);
  if (!rc) {
    double t0 = zt_timer_now();
    double loss = zt_trainer_eval(&tr, plan.data.val_batches);
    double dt = zt_timer_now() - t0;
    long long tokens = (long long)plan.data.val_batches * plan.train.global_batch * plan.model.seq;
    if (world->rank == 0 && a->json)
      printf("{\"step\": %lld, \"val_loss\": %.17g, \"perplexity\": %.17g, \"tokens\": %lld}\n",
             (long long)tr.t, loss, exp(loss), tokens);
    else if (world->rank == 0)
      printf("step %lld | val_loss %.6f | perplexity %.4f | %d batches x %d samples x %d tokens "
             "of %s in %.2f s\n", (long long)tr.t, loss, exp(loss), plan.data.val_batches,
             plan.train.global_batch, plan.model.seq, plan.data.val, dt);
  }
  zt_trainer_free(&tr);
  if (model.params) zt_model_free(&model);
  if (grid_up) zt_grid_free(&grid);
  zt_data_close(&val);
  zt_plan_free(&plan);
  return rc;
}

/* ---- sample --------------------------------------------------------------- */

typedef struct {
  float *host; /* the flat weights being filled */
  int64_t at;  /* next element */
  zt_ckpt_tally tally;
} load_ctx;

static int load_block(void *ctx, const zt_ckpt_tensor *t, const int64_t *start,
                      const int64_t *count, const float *x, int64_t n) {
  load_ctx *c = ctx;
  zt_ckpt_tally_box(&c->tally, t, start, count, x, n);
  memcpy(c->host + c->at, x, (size_t)n * sizeof *x); /* blocks come in row-major order */
  c->at += n;
  return ZT_OK;
}

/* The model's fp32 weights from /model of the checkpoint into host memory
 * (m->numel floats at the table's offsets, tp = 1), each tensor checked
 * against its checksum and for non-finite values. */
static int load_weights(const char *path, const zt_model *m, float *host, zt_err *e) {
  zt_ckpt_file cf;
  int rc = zt_ckpt_file_open(&cf, path, e);
  if (rc) return rc;
  rc = zt_ckpt_file_check_model(&cf, ZT_CKPT_MODEL, m, e);
  for (int i = 0; !rc && i < m->n_params; i++) {
    const zt_param *p = &m->params[i];
    const zt_ckpt_tensor *t = zt_ckpt_file_find(&cf, ZT_CKPT_MODEL, p->t.name);
    load_ctx c = {.host = host, .at = p->t.offset};
    if (!t) rc = zt_err_set(e, ZT_EINPUT, "%s: no tensor %s", path, p->t.name);
    if (!rc) rc = zt_ckpt_file_each_block(&cf, t, load_block, &c, e);
    if (!rc && t->has_checksum && c.tally.sum != t->checksum)
      rc = zt_err_set(e, ZT_EINPUT, "%s: tensor %s does not match its checksum: the file is "
                      "damaged", path, p->t.name);
    if (!rc && c.tally.nonfinite)
      rc = zt_err_set(e, ZT_EINPUT, "%s: tensor %s holds %lld non-finite values", path,
                      p->t.name, (long long)c.tally.nonfinite);
  }
  zt_ckpt_file_close(&cf);
  return rc;
}

typedef struct { float v; int id; } scored;

/* larger logit first, then the lower id */
static int by_logit(const void *x, const void *y) {
  const scored *a = x, *b = y;
  return a->v > b->v ? -1 : a->v < b->v ? 1 : a->id - b->id;
}

/* The next token from logits[n]: greedy at temperature 0 (ties go to the
 * lower id), else draw number k of the seeded stream from
 * softmax(logits / T) over the top_k largest (0: all). `order` is scratch
 * of n. */
static int pick_token(const float *logits, int n, double temperature, long long top_k,
                      uint64_t key, uint64_t k, scored *order) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (logits[i] > logits[best]) best = i;
  if (temperature == 0) return best;
  int keep = top_k > 0 && top_k < n ? (int)top_k : n;
  for (int i = 0; i < n; i++) order[i] = (scored){logits[i], i};
  if (keep < n) qsort(order, (size_t)n, sizeof *order, by_logit);
  double sum = 0, top = logits[best];
  for (int i = 0; i < keep; i++) sum += exp((order[i].v - top) / temperature);
  uint32_t r[4];
  zt_rng_philox(key, k, r);
  /* 53 random bits: u uniform in [0, sum) */
  double u = (double)(((uint64_t)r[0] << 21) ^ (r[1] >> 11)) / 9007199254740992.0 * sum;
  for (int i = 0; i < keep; i++) {
    u -= exp((order[i].v - top) / temperature);
    if (u < 0) return order[i].id;
  }
  return order[keep - 1].id; /* rounding left u at the very end */
}

/* What sample holds, freed in one place. */
typedef struct {
  zt_plan plan;
  zt_model m;
  zt_decode d;
  zt_tok *tok;
  const zt_backend *be;
  float *host_w, *logits;
  void *w;
  uint32_t *prompt, *ids; /* the prompt's tokens; the new ones */
  int32_t *feed;
  scored *order;
  char *text;
} sampler;

static void sampler_free(sampler *s) {
  zt_decode_free(&s->d);
  if (s->w) s->be->free(ZT_MEM_DEVICE, s->w);
  if (s->m.params) zt_model_free(&s->m);
  if (s->tok) zt_tok_free(s->tok);
  free(s->host_w);
  free(s->logits);
  free(s->prompt);
  free(s->ids);
  free(s->feed);
  free(s->order);
  free(s->text);
  zt_plan_free(&s->plan);
}

/* Prints the decoded text of the new tokens past the `*shown` bytes
 * already printed: a tokenizer may need the following tokens to finish a
 * character or a word's leading space, so the whole continuation is
 * decoded again each time (its length is at most seq). */
static int show(sampler *s, int64_t n, size_t *shown, zt_err *e) {
  size_t len;
  free(s->text);
  s->text = NULL;
  int rc = zt_tok_decode(s->tok, s->ids, n, &s->text, &len, e);
  if (!rc && len > *shown) {
    fwrite(s->text + *shown, 1, len - *shown, stdout);
    *shown = len;
  }
  fflush(stdout);
  return rc;
}

static int sample_run(const infer_args *a, zt_comm *world, zt_err *e) {
  if (world->size > 1)
    return zt_err_set(e, ZT_EINPUT, "ztrain sample runs as one process, not %d ranks: start it "
                      "without mpirun (the script's parallel layout does not matter to it)",
                      world->size);
  sampler s = {0};
  zt_script_limits lim = a->limits;
  /* world 0: the script's layout is not this run's, only its model is */
  int rc = zt_config_load(&s.plan, a->script, a->stmts, a->nstmts, 0, &lim, e);
  zt_model_cfg cfg = s.plan.model;
  cfg.precision = ZT_F32; /* the checkpoint's weights, as they are */
  cfg.sequence_parallel = 0;
  cfg.recompute = NULL;
  /* the run's tokenizer (data.tokenizer: "byte" or a file the config checked) */
  const char *tok_spec = rc ? NULL : s.plan.data.tokenizer;
  if (!rc) rc = zt_tok_open(&s.tok, tok_spec, e);
  int64_t np = 0;
  if (!rc) rc = zt_tok_encode(s.tok, a->prompt, strlen(a->prompt), &s.prompt, &np, e);
  if (!rc && np == 0)
    rc = zt_err_set(e, ZT_EINPUT, "--prompt is empty: give at least one token of text");
  if (!rc && np >= cfg.seq)
    rc = zt_err_set(e, ZT_EINPUT, "--prompt is %lld tokens but the model sees %d positions "
                    "(model.seq): at most %d leave room for a new token", (long long)np, cfg.seq,
                    cfg.seq - 1);
  for (int64_t i = 0; !rc && i < np; i++)
    if (s.prompt[i] >= (uint32_t)cfg.vocab)
      rc = zt_err_set(e, ZT_EINPUT, "--prompt token %lld is id %u, not below the model's vocab "
                      "%d: the tokenizer (%s, vocab %d) does not fit this model", (long long)i,
                      s.prompt[i], cfg.vocab, zt_tok_kind(s.tok), zt_tok_vocab(s.tok));
  if (!rc) rc = zt_model_layout(&s.m, &cfg, 1, 0, e);
  if (!rc) rc = zt_cli_pick_backend(s.plan.parallel.device, &s.be, e);
  size_t wbytes = (size_t)s.m.numel * sizeof(float);
  if (!rc && !(s.host_w = malloc(wbytes ? wbytes : 1)))
    rc = zt_err_set(e, ZT_ERUNTIME, "out of memory for the weights (%.1f MiB)", wbytes / 1048576.0);
  if (!rc) rc = load_weights(a->load, &s.m, s.host_w, e);
  if (!rc && !(s.w = s.be->alloc(ZT_MEM_DEVICE, wbytes)))
    rc = zt_err_set(e, ZT_ERUNTIME, "out of memory on %s for the weights", s.be->name);
  int cap = cfg.seq < 128 ? cfg.seq : 128; /* the prompt goes in pieces of this many */
  if (!rc) rc = zt_decode_init(&s.d, &s.m, s.be, s.w, cap, e);
  if (!rc) {
    s.be->copy(s.d.stream, s.w, s.host_w, wbytes);
    s.be->stream_sync(s.d.stream);
    free(s.host_w); /* the device holds them now */
    s.host_w = NULL;
  }
  s.logits = malloc((size_t)cfg.vocab * sizeof *s.logits);
  s.feed = malloc((size_t)cap * sizeof *s.feed);
  s.order = malloc((size_t)cfg.vocab * sizeof *s.order);
  s.ids = malloc((size_t)(a->tokens < cfg.seq ? a->tokens : cfg.seq) * sizeof *s.ids);
  if (!rc && (!s.logits || !s.feed || !s.order || !s.ids))
    rc = zt_err_set(e, ZT_ERUNTIME, "out of memory");
  if (rc) {
    sampler_free(&s);
    return rc;
  }
  /* only ids the tokenizer can decode are drawn */
  int V = cfg.vocab < zt_tok_vocab(s.tok) ? cfg.vocab : zt_tok_vocab(s.tok);
  if (!a->ids) {
    fputs(a->prompt, stdout);
    fflush(stdout);
  }
  double t0 = zt_timer_now();
  for (int64_t i = 0; !rc && i < np; i += cap) { /* the prompt: logits of its last token */
    int n = np - i < cap ? (int)(np - i) : cap;
    for (int j = 0; j < n; j++) s.feed[j] = (int32_t)s.prompt[i + j];
    rc = zt_decode_step(&s.d, s.feed, n, 1, s.logits, e);
  }
  double t1 = zt_timer_now();
  uint64_t key = zt_rng_key(a->seed, "sample");
  int eos = zt_tok_eos(s.tok);
  int64_t n = 0;
  size_t shown = 0;
  const char *why = "--tokens";
  while (!rc) {
    int next = pick_token(s.logits, V, a->temperature, a->top_k, key, (uint64_t)n, s.order);
    if (next == eos) {
      why = "the tokenizer's end-of-text token";
      break;
    }
    s.ids[n++] = (uint32_t)next;
    if (a->ids) {
      printf("%s%d", n > 1 ? " " : "", next);
      fflush(stdout);
    } else {
      rc = show(&s, n, &shown, e);
    }
    if (rc || n == a->tokens) break;
    if (s.d.pos == cfg.seq) {
      why = "the model's last position (model.seq)";
      break;
    }
    int32_t t = next;
    rc = zt_decode_step(&s.d, &t, 1, 1, s.logits, e);
  }
  double t2 = zt_timer_now();
  printf("\n");
  if (!rc)
    fprintf(stderr, "sample: %lld new tokens in %.2f s (%.1f tokens/s; prompt %lld tokens in "
            "%.2f s), %s, stopped at %s\n", (long long)n, t2 - t1, n / (t2 > t1 ? t2 - t1 : 1e-9),
            (long long)np, t1 - t0, a->temperature == 0 ? "greedy" : "sampled", why);
  sampler_free(&s);
  return rc;
}

/* ---- the program ---------------------------------------------------------- */

int zt_infer_main(int argc, char **argv) {
  infer_args a = {.eval = !strcmp(argv[1], "eval")};
  const char *cmd = argv[1];
  zt_err e = {0};
  /* getopt reorders argv; a restart with other GEMM kernels gets it as given */
  char **given = malloc(((size_t)argc + 1) * sizeof *given);
  if (given) memcpy(given, argv, ((size_t)argc + 1) * sizeof *given);
  int rc = parse(argc - 1, argv + 1, &a, &e);
  if (rc == 'h') {
    fputs(a.eval ? eval_usage : sample_usage, stdout);
    free(given);
    free(a.stmts);
    return 0;
  }
  char why[512] = "";
  if (zt_cpu_gemm_select(given ? given : argv, why, sizeof why)) {
    fprintf(stderr, "ztrain %s: error: %s\n", cmd, why);
    return ZT_ERUNTIME;
  }
  free(given);
  zt_comm world;
  int wrc = zt_comm_init(&argc, &argv, &world, "cli", ZT_WATCHDOG_DEFAULT_S, why);
  if (wrc && world.rank == 0)
    fprintf(stderr, "ztrain %s: %s: %s\n", cmd, wrc == -2 ? "error" : "warning: no hang watchdog",
            why);
  if (wrc == -2) rc = ZT_ERUNTIME, e.msg[0] = 0;
  if (!rc) {
    char threads_why[256];
    zt_cli_set_threads(threads_why, sizeof threads_why);
    rc = a.eval ? eval_run(&a, &world, &e) : sample_run(&a, &world, &e);
  }
  if (rc && world.rank == 0 && e.msg[0]) fprintf(stderr, "ztrain %s: error: %s\n", cmd, e.msg);
  free(a.stmts);
  if (wrc == -2) zt_comm_abort(1);
  zt_comm_finalize(&world);
  return rc;
}
