/* ztrain_plan: `ztrain plan SCRIPT.lua`, the memory each rank of the
 * script's layout will hold (src/plan/memory), as tables of the ranks
 * alike or as one JSON object; no MPI, nothing of the model allocated. */
#include "src/cli/ztrain_plan.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_path.h"
#include "src/config/dsconfig.h"
#include "src/cli/ztrain_plan_search.h"
#include "parallel/grid.h"
#include "src/plan/memory.h"

static const char plan_usage[] =
    "Usage: ztrain plan SCRIPT.lua [-e STMT]... [--ds-config JSON] [--ranks-per-node R] [--json]\n"
    "       ztrain plan SCRIPT.lua --world N --mem-per-rank GIB [--ranks-per-node R]\n"
    "                   [--link intra=GB/s,inter=GB/s] [--peak TFLOP/s] [--gemm-eff F]\n"
    "                   [--mem-bw GB/s] [--top K] [-e STMT]...\n"
    "\n"
    "The memory each rank of the script's layout (dp x tp x pp ranks) will\n"
    "hold, by what it is for (params, masters, grads, moments, activations,\n"
    "communication buffers, workspace) and where it lives (device, host,\n"
    "nvme), from the functions that size ztrain's allocations at start-up.\n"
    "No mpirun needed; parallel.dp = \"auto\" plans one data-parallel rank\n"
    "(-e 'parallel.dp = 8' plans eight). One table per set of ranks that\n"
    "hold the same; --json prints one JSON object (layout, ranks[] with\n"
    "rank, peak_bytes and the breakdown). docs/plan.md says more.\n"
    "\n"
    "  -e STMT            a Lua statement after the script (repeatable)\n"
    "      --ds-config JSON  a DeepSpeed config, as ztrain takes it\n"
    "      --json         one JSON object on stdout\n"
    "      --ranks-per-node R  also show the placement with R consecutive ranks\n"
    "                     per node (as srun and mpirun place them): which ranks\n"
    "                     share a node, which groups cross nodes; JSON: placement\n"
    "      --script-timeout S, --script-memory MIB  as ztrain's\n"
    "\n"
    "With --world and --mem-per-rank: the layouts of the script's model on N\n"
    "ranks (tp, pp, dp, ZeRO stage, micro-batch, schedule, recomputation,\n"
    "optimizer offload) whose peak memory, from the same planner, fits GIB\n"
    "per rank, ranked by a cost model's predicted step time on the hardware\n"
    "the options describe (default: A100 80GB nodes of 8; docs/plan.md).\n";

/* Threads a rank of a run of `world` ranks on this node computes with:
 * OMP_NUM_THREADS, else its share of the cores (zt_cli_set_threads's rule
 * for ranks on one node). */
static int plan_threads(int world) {
  const char *env = getenv("OMP_NUM_THREADS");
  if (env && atoi(env) > 0) return atoi(env);
  int n = zt_cpu_cores() / (world > 0 ? world : 1);
  return n > 0 ? n : 1;
}

static json_t *layout_json(const zt_plan *p, int world, int threads) {
  const zt_parallel_cfg *pc = &p->parallel;
  return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:i}", "world", world, "dp",
                   pc->dp, "tp", pc->tp, "pp", pc->pp, "zero", pc->zero.stage, "micro_batch",
                   p->train.micro_batch, "accum", p->train.accum, "precision",
                   zt_dtype_name(p->train.precision), "schedule",
                   pc->pp > 1 ? p->pipeline.schedule.name : "none", "threads", threads);
}

int zt_plan_main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"json", no_argument, 0, 'j'},          {"ds-config", required_argument, 0, 'D'},
      {"script-timeout", required_argument, 0, 'T'},
      {"script-memory", required_argument, 0, 'M'}, {"help", no_argument, 0, 'h'},
      {"ranks-per-node", required_argument, 0, 'r'},
      {0, 0, 0, 0}};
  char **stmts = calloc((size_t)argc + 1, sizeof *stmts);
  int nstmts = 0, json = 0, c, rc = ZT_OK, per_node = 0;
  zt_script_limits lim = {0};
  zt_dsconfig ds = {0};
  const char *ds_path = NULL;
  zt_err e = {0};
  for (int i = 1; i < argc; i++) /* the layout search has options of its own */
    if (!strncmp(argv[i], "--world", 7) || !strncmp(argv[i], "--mem-per-rank", 14)) {
      free(stmts);
      return zt_cli_plan_search(argc, argv, NULL, NULL);
    }
  opterr = 0;
  optind = 1;
  while (!rc && (c = getopt_long(argc, argv, "e:h", longopts, NULL)) != -1) {
    switch (c) {
      case 'e': stmts[nstmts++] = optarg; break;
      case 'j': json = 1; break;
      case 'D': ds_path = optarg; break;
      case 'T':
      case 'M': { /* as ztrain's: finite, > 0, memory above what Lua itself needs */
        char *end;
        double v = strtod(optarg, &end), low = c == 'M' ? 4 : 0;
        if (end == optarg || *end || !(v > low) || v > 1e12)
          rc = zt_err_set(&e, ZT_EINPUT, "--script-%s needs a number above %g (at most 1e12), "
                          "got '%s'", c == 'M' ? "memory" : "timeout", low, optarg);
        *(c == 'M' ? &lim.mib : &lim.seconds) = v;
        break;
      }
      case 'r': {
        char *end;
        long v = strtol(optarg, &end, 10);
        if (end == optarg || *end || v < 1 || v > 1 << 20)
          rc = zt_err_set(&e, ZT_EINPUT, "--ranks-per-node needs a whole number from 1 to %d, "
                          "got '%s'", 1 << 20, optarg);
        per_node = (int)v;
        break;
      }
      case 'h':
        fputs(plan_usage, stdout);
        free(stmts);
        return 0;
      default:
        rc = zt_err_set(&e, ZT_EINPUT, "%s '%s'; see ztrain plan --help",
                        optopt ? "missing value or unknown option" : "unknown option",
                        argv[optind - 1]);
    }
  }
  if (!rc && optind != argc - 1)
    rc = zt_err_set(&e, ZT_EINPUT, "one script expected, got %d arguments; see ztrain plan --help",
                    argc - optind);
  if (!rc && ds_path && !(rc = zt_dsconfig_read(&ds, ds_path, &e))) lim.ds = &ds;
  zt_plan plan;
  int loaded = 0;
  if (!rc) loaded = !(rc = zt_config_load(&plan, argv[optind], stmts, nstmts, 0, &lim, &e));
  const zt_parallel_cfg *pc = &plan.parallel;
  int world = loaded ? pc->dp * pc->tp * pc->pp : 0, threads = plan_threads(world);
  zt_memplan *ranks = loaded ? calloc((size_t)world, sizeof *ranks) : NULL;
  if (loaded && !ranks) rc = zt_err_set(&e, ZT_ERUNTIME, "out of memory");
  for (int r = 0; !rc && r < world; r++) rc = zt_memplan_rank(&plan, r, threads, &ranks[r], &e);
  zt_grid place = {0};
  if (!rc && per_node) rc = zt_grid_plan_placement(&place, pc->dp, pc->tp, pc->pp, per_node, &e);
  if (!rc && per_node && place.tp_nodes > 1 && pc->strict) /* as the run would */
    rc = zt_err_set(&e, ZT_EINPUT, "parallel.strict: tp = %d spans %d nodes at %d ranks per node; "
                    "start at least %d ranks per node, or lower tp", pc->tp, place.tp_nodes,
                    per_node, pc->tp);
  if (!rc && json) {
    json_t *list = json_array();
    for (int r = 0; r < world; r++) json_array_append_new(list, zt_memplan_json(&ranks[r]));
    json_t *o = json_pack("{s:s, s:o, s:o}", "script", argv[optind], "layout",
                          layout_json(&plan, world, threads), "ranks", list);
    if (per_node) {
      json_t *of = json_array();
      for (int r = 0; r < world; r++) json_array_append_new(of, json_integer(place.node_of[r]));
      json_object_set_new(o, "placement",
                          json_pack("{s:i, s:i, s:o, s:i, s:i, s:i}", "ranks_per_node", per_node,
                                    "nodes", place.nodes, "node_of", of, "tp_nodes", place.tp_nodes,
                                    "dp_nodes", place.dp_nodes, "pp_nodes", place.pp_nodes));
    }
    char *s = json_dumps(o, JSON_INDENT(1));
    if (s) puts(s);
    free(s);
    json_decref(o);
  } else if (!rc) {
    if (lim.ds) /* the DeepSpeed keys and the Lua they became, as ztrain schedule shows them */
      printf("ds-config %s (DeepSpeed keys -> the run's Lua, applied after the script, before "
             "-e):\n%sds-config statements:\n%s", ds.path, ds.report, ds.lua ? ds.lua : "");
    printf("memory plan of %s: %d rank%s (dp %d x tp %d x pp %d), ZeRO %d, %s, micro_batch %d, "
           "%d thread%s per rank\n",
           argv[optind], world, world > 1 ? "s" : "", pc->dp, pc->tp, pc->pp, pc->zero.stage,
           zt_dtype_name(plan.train.precision), plan.train.micro_batch, threads,
           threads > 1 ? "s" : "");
    if (per_node) {
      char at[2048];
      zt_grid_describe(&place, at, sizeof at);
      printf("placement with %d ranks per node: %s\n", per_node, at);
      if (place.tp_nodes > 1)
        printf("warning: tp = %d spans %d nodes: its all-reduces would cross the network on every "
               "layer (ztrain warns; parallel.strict = true refuses); keep tp <= ranks per node\n",
               pc->tp, place.tp_nodes);
    }
    if (pc->pp > 1) {
      printf("schedule %s: peak in-flight micro-batches per stage (simulated):",
             plan.pipeline.schedule.name);
      for (int s = 0; s < pc->pp; s++) printf(" %d", plan.pipeline.report.peak[s]);
      printf("\n");
    }
    /* one table per run of ranks that hold the same */
    for (int r = 0; r < world;) {
      int last = r;
      while (last + 1 < world && zt_memplan_same(&ranks[r], &ranks[last + 1])) last++;
      zt_memplan_print(&ranks[r], last, stdout);
      r = last + 1;
    }
    printf("(the process's own memory before the model — MPI, Lua, the BLAS — is not counted: "
           "ztrain reports it as its baseline)\n");
  }
  if (rc) fprintf(stderr, "ztrain plan: error: %s\n", e.msg);
  free(ranks);
  zt_grid_free(&place);
  if (loaded) zt_plan_free(&plan);
  zt_dsconfig_free(&ds);
  free(stmts);
  return rc;
}
