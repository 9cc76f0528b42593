/* ztrain_plan_search: see ztrain_plan_search.h. The script is loaded once
 * for the model and the batch; each distinct pipeline a candidate needs
 * is the same script loaded again with the candidate's layout as -e
 * statements, so its action lists come from the schedule's own Lua and
 * its checks are the ones a run would meet. */
#include "src/cli/ztrain_plan_search.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/plan/memory.h"

typedef struct lists_ctx {
  const char *script;
  char **stmts;
  int nstmts;
  zt_plan **plans; /* loaded, kept until the search is done (the search holds
                      pointers into them) */
  int n, cap;
} lists_ctx;

static int pipeline_cb(const zt_candidate *c, void *ctx, zt_pipeline_cfg **out, zt_err *e) {
  lists_ctx *lc = ctx;
  if (lc->n == lc->cap) {
    int cap = lc->cap ? 2 * lc->cap : 16;
    zt_plan **p = realloc(lc->plans, (size_t)cap * sizeof *p);
    if (!p) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
    lc->plans = p, lc->cap = cap;
  }
  char layout[512];
  const zt_layout *l = &c->layout;
  snprintf(layout, sizeof layout,
           "parallel = parallel or {}; parallel.tp = %d; parallel.pp = %d; parallel.dp = %d; "
           "parallel.stages = nil; train.micro_batch = %d; train.global_batch = %d; "
           "schedule = require('ztrain').schedule.%s",
           l->tp, l->pp, l->dp, l->micro_batch, l->global_batch,
           c->schedule == ZT_SCHED_INTERLEAVED ? "interleaved { chunks = 2 }" : "one_f_one_b {}");
  char **stmts = malloc((size_t)(lc->nstmts + 1) * sizeof *stmts);
  if (!stmts) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  for (int i = 0; i < lc->nstmts; i++) stmts[i] = lc->stmts[i];
  stmts[lc->nstmts] = layout;
  zt_plan *p = calloc(1, sizeof *p);
  int rc = p ? zt_config_load(p, lc->script, stmts, lc->nstmts + 1, 0, NULL, e)
             : zt_err_set(e, ZT_ERUNTIME, "out of memory");
  free(stmts);
  if (rc) {
    if (p) zt_plan_free(p);
    free(p);
    return rc;
  }
  lc->plans[lc->n++] = p;
  *out = &p->pipeline;
  return ZT_OK;
}

/* The loaded plan whose pipeline pipeline_cb handed out as c->pipeline. */
static const zt_plan *plan_of(const lists_ctx *lc, const zt_candidate *c) {
  for (int i = 0; i < lc->n; i++)
    if (&lc->plans[i]->pipeline == c->pipeline) return lc->plans[i];
  return NULL;
}

/* The memory planner's peak (src/plan/memory.h) of candidate c: its loaded
 * plan (layout, micro-batch, schedule: pipeline_cb's -e statements) with
 * c's ZeRO stage, recomputation and placement of the masters and moments,
 * over the ranks that can differ (each stage; the first and last dp and tp
 * ranks, whose ZeRO shards and vocab slices are the uneven ones). What
 * --mem-per-rank bounds is the device column: the accelerator's memory,
 * which offload relieves (host memory, the MPI library's temporaries and
 * nvme files are not in it). Sizes are the CPU backend's, one thread per
 * rank. */
static int memplan_peak(const zt_candidate *c, void *ctx, int64_t *bytes, zt_err *e) {
  const zt_plan *base = plan_of(ctx, c);
  if (!base) return zt_err_set(e, ZT_ERUNTIME, "plan search: a candidate without its plan");
  zt_plan q = *base; /* shallow: what changes below is this copy's own */
  const zt_layout *l = &c->layout;
  q.parallel.zero.stage = l->zero;
  q.model.sequence_parallel = l->sp;
  q.parallel.sequence_parallel = l->sp;
  unsigned char *all = c->recompute ? malloc((size_t)q.model.layers) : NULL;
  zt_offload_cfg *oc = &q.parallel.zero.offload;
  unsigned char *place = l->moments != ZT_PLACE_DEVICE ? malloc((size_t)q.model.layers + 2) : NULL;
  if ((c->recompute && !all) || (l->moments != ZT_PLACE_DEVICE && !place)) {
    free(all);
    free(place);
    return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  }
  if (all) memset(all, 1, (size_t)q.model.layers);
  q.model.recompute = all;
  memset(oc, 0, sizeof *oc);
  if (place) { /* the search's "moments on cpu": the optimizer's states, as DeepSpeed offloads them */
    memset(place, l->moments, (size_t)q.model.layers + 2);
    oc->n_units = q.model.layers + 2;
    oc->place[ZT_OFF_MASTER] = oc->place[ZT_OFF_MOMENTS] = place;
  }
  int rc = ZT_OK, tps[2] = {0, l->tp - 1}, dps[2] = {0, l->dp - 1};
  *bytes = 0;
  for (int s = 0; !rc && s < l->pp; s++)
    for (int i = 0; !rc && i < 2; i++)
      for (int j = 0; !rc && j < 2; j++) {
        zt_memplan mp;
        rc = zt_memplan_rank(&q, tps[i] + l->tp * (dps[j] + l->dp * s), 1, &mp, e);
        if (!rc && mp.peak[ZT_PLACE_DEVICE] > *bytes) *bytes = mp.peak[ZT_PLACE_DEVICE];
      }
  free(all);
  free(place);
  return rc;
}

/* "intra=300,inter=25" in GB/s */
static int parse_link(const char *s, double *intra, double *inter, zt_err *e) {
  char *copy = strdup(s), *save = NULL;
  int rc = ZT_OK;
  for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
    char *end;
    double v;
    if (!strncmp(tok, "intra=", 6)) v = strtod(tok + 6, &end), *intra = v * 1e9;
    else if (!strncmp(tok, "inter=", 6)) v = strtod(tok + 6, &end), *inter = v * 1e9;
    else { rc = zt_err_set(e, ZT_EINPUT, "--link: '%s' is not intra=GB/s or inter=GB/s", tok); break; }
    if (*end || !(v > 0)) rc = zt_err_set(e, ZT_EINPUT, "--link: '%s' needs a number > 0 (GB/s)", tok);
  }
  free(copy);
  return rc;
}

static int positive(const char *opt, const char *s, double *v, zt_err *e) {
  char *end;
  *v = strtod(s, &end);
  if (*end || !(*v > 0)) return zt_err_set(e, ZT_EINPUT, "%s: '%s' is not a number > 0", opt, s);
  return ZT_OK;
}

static int whole(const char *opt, const char *s, int *n, zt_err *e) {
  double v;
  int rc = positive(opt, s, &v, e);
  if (!rc && (v != (int)v || v > 1 << 30))
    rc = zt_err_set(e, ZT_EINPUT, "%s: '%s' is not a whole number >= 1", opt, s);
  if (!rc) *n = (int)v;
  return rc;
}

static const char usage[] =
    "usage: ztrain plan SCRIPT.lua --world N --mem-per-rank GiB [--ranks-per-node R] "
    "[--link intra=GB/s,inter=GB/s] [--peak TFLOP/s] [--gemm-eff F] [--mem-bw GB/s] [--top K] "
    "[-e STMT]...";

int zt_cli_plan_search(int argc, char **argv, zt_peak_fn peak, void *peak_ctx) {
  zt_err e = {0};
  /* defaults: an A100 80GB node (docs/plan.md) */
  zt_hw hw = {.peak_flops = 312e12, .gemm_eff = 0.75, .mem_bw = 2039e9, .attn_matrix_bytes = 0,
              .ranks_per_node = 8, .intra_bw = 300e9, .intra_lat = 5e-6, .inter_bw = 25e9,
              .inter_lat = 10e-6, .host_bw = 25e9, .host_mem_bw = 20e9, .nvme_bw = 0.8e9};
  double mem = 0, v;
  int world = 0, top = 10, rc = ZT_OK;
  lists_ctx lc = {0};
  lc.stmts = calloc((size_t)argc + 1, sizeof *lc.stmts);
  static const struct option opts[] = {
      {"world", required_argument, 0, 'w'}, {"mem-per-rank", required_argument, 0, 'm'},
      {"ranks-per-node", required_argument, 0, 'r'}, {"link", required_argument, 0, 'l'},
      {"peak", required_argument, 0, 'p'}, {"gemm-eff", required_argument, 0, 'g'},
      {"mem-bw", required_argument, 0, 'b'}, {"top", required_argument, 0, 't'},
      {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  optind = 1;
  int o;
  while (!rc && (o = getopt_long(argc, argv, "e:h", opts, NULL)) != -1) {
    switch (o) {
    case 'e': lc.stmts[lc.nstmts++] = optarg; break;
    case 'w': rc = whole("--world", optarg, &world, &e); break;
    case 'm': rc = positive("--mem-per-rank", optarg, &mem, &e); break;
    case 'r': rc = whole("--ranks-per-node", optarg, &hw.ranks_per_node, &e); break;
    case 'l': rc = parse_link(optarg, &hw.intra_bw, &hw.inter_bw, &e); break;
    case 'p': rc = positive("--peak", optarg, &v, &e), hw.peak_flops = v * 1e12; break;
    case 'g': rc = positive("--gemm-eff", optarg, &hw.gemm_eff, &e); break;
    case 'b': rc = positive("--mem-bw", optarg, &v, &e), hw.mem_bw = v * 1e9; break;
    case 't': rc = whole("--top", optarg, &top, &e); break;
    case 'h': printf("%s\n", usage); free(lc.stmts); return 0;
    default: rc = zt_err_set(&e, ZT_EINPUT, "%s", usage);
    }
  }
  if (!rc && optind != argc - 1) rc = zt_err_set(&e, ZT_EINPUT, "one script expected; %s", usage);
  if (!rc && world < 1) rc = zt_err_set(&e, ZT_EINPUT, "--world N (ranks) is required; %s", usage);
  if (!rc && mem <= 0) rc = zt_err_set(&e, ZT_EINPUT, "--mem-per-rank GiB is required; %s", usage);
  if (!rc && hw.gemm_eff > 1)
    rc = zt_err_set(&e, ZT_EINPUT, "--gemm-eff %g: a fraction of the peak, at most 1", hw.gemm_eff);
  zt_plan base = {0};
  zt_search_result res = {0};
  if (!rc) {
    lc.script = argv[optind];
    rc = zt_config_load(&base, lc.script, lc.stmts, lc.nstmts, 0, NULL, &e);
  }
  if (!rc) {
    zt_layout bl;
    zt_layout_from_plan(&base, &bl);
    zt_search_cfg cfg = {.model = &base.model, .world = world,
                         .mem_per_rank = (int64_t)(mem * 1073741824.0),
                         .global_batch = base.train.global_batch, .sp = bl.sp,
                         .act_bytes = bl.act_bytes, .grad_bytes = bl.grad_bytes,
                         .zero_overlap = bl.zero_overlap, .hw = hw,
                         .peak_bytes = peak ? peak : memplan_peak, .peak_ctx = peak ? peak_ctx : &lc,
                         .pipeline = pipeline_cb, .pipeline_ctx = &lc};
    rc = zt_search_run(&cfg, &res, &e);
  }
  if (!rc && res.n == 0)
    rc = zt_err_set(&e, ZT_EINPUT, "no layout of %d ranks fits %.3g GiB per rank: %d layouts tried, "
                    "the smallest peaks at %.3g GiB per rank; give more memory per rank or more ranks",
                    world, mem, res.tried, res.least_peak / 1073741824.0);
  if (!rc) {
    printf("ztrain plan: %d ranks, %.2f GiB per rank; %d layouts, %d over memory, %d fit\n"
           "hardware: %.0f TFLOP/s peak x %.2f GEMM efficiency, %.0f GB/s memory, %d ranks per node, "
           "links %.0f GB/s intra, %.0f GB/s inter (per rank)\n",
           world, mem, res.tried, res.too_big, res.n, hw.peak_flops / 1e12, hw.gemm_eff,
           hw.mem_bw / 1e9, hw.ranks_per_node, hw.intra_bw / 1e9, hw.inter_bw / 1e9);
    printf("%4s  %-62s %8s %9s %8s %6s %7s %8s %8s\n", "rank", "layout", "peak GiB", "step s",
           "TFLOP/s", "MFU", "bubble", "dp s", "optim s");
    for (int i = 0; i < res.n && i < top; i++) {
      const zt_candidate *c = &res.c[i];
      char d[160];
      zt_candidate_describe(c, d, sizeof d);
      printf("%4d  %-62s %8.2f %9.4g %8.1f %5.1f%% %6.1f%% %8.3g %8.3g\n", i + 1, d,
             c->peak_bytes / 1073741824.0, c->cost.step_s, c->cost.tflops_gpu, 100 * c->cost.mfu,
             100 * c->cost.bubble, c->cost.dp_exposed_s, c->cost.optim_s + c->cost.offload_s);
    }
  }
  if (rc) fprintf(stderr, "ztrain plan: error: %s\n", e.msg);
  zt_search_result_free(&res);
  for (int i = 0; i < lc.n; i++) zt_plan_free(lc.plans[i]), free(lc.plans[i]);
  free(lc.plans);
  zt_plan_free(&base);
  free(lc.stmts);
  return rc ? 2 : 0;
}
