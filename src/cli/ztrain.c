/* ztrain: the command-line tool. Runs one process without mpirun or many
 * ranks under mpirun/srun; every rank runs the same configuration code, so
 * bad input is found everywhere at once, reported once (rank 0) and every
 * rank exits with the same code: 0 success, 1 runtime failure, 2 bad input. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/cpu/gemm_path.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "parallel/watchdog.h"
#include "src/cli/ztrain_report.h"
#include "src/ckpt/ckpt.h"
#include "src/ckpt/ckpt_file.h"
#include "src/ckpt/h5util.h"
#include "src/ckpt/hf.h"
#include "src/ckpt/policy.h"
#include "src/config/config.h"
#include "src/config/dsconfig.h"
#include "src/core/rss.h"
#include "src/core/timer.h"
#include "src/core/trace.h"
#include "src/data/data.h"
#include "src/data/tokenize.h"
#include "src/train/report.h"
#include "src/train/trainer.h"
#include "src/cli/ztrain_infer.h"
#include "src/cli/ztrain_plan.h"
#include "src/plan/memory.h"

#ifndef ZT_VERSION
#define ZT_VERSION "dev"
#endif

static const char usage[] =
    "Usage: ztrain [OPTIONS] SCRIPT.lua\n"
    "       ztrain tokenize INPUT... OUTPUT.bin [--tokenizer PATH | --train-vocab N\n"
    "                       [--tokenizer-out PATH]] [--val VAL.bin] [--val-fraction F]\n"
    "       ztrain schedule [-e STMT]... [--ds-config JSON] [--script-timeout S]\n"
    "                       [--script-memory MIB] SCRIPT.lua\n"
    "       ztrain eval SCRIPT.lua --load CKPT [-e STMT]... [--json]\n"
    "       ztrain sample SCRIPT.lua --load CKPT --prompt TEXT [--tokens N]\n"
    "                     [--temperature T] [--top-k K] [--seed S] [--ids]\n"
    "       ztrain report RUN_DIR|METRICS.jsonl [-o REPORT.html] [--log-loss]\n"
    "       ztrain plan SCRIPT.lua [-e STMT]... [--ds-config JSON] [--json]\n"
    "\n"
    "Trains the model that SCRIPT.lua describes. Runs as one process, or as\n"
    "many ranks under mpirun/srun (mpirun -np 8 ztrain SCRIPT.lua).\n"
    "\n"
    "Options:\n"
    "  -e STMT          run a Lua statement after the script (repeatable),\n"
    "                   e.g. -e 'train.steps = 10'\n"
    "      --steps N    total optimizer steps (sets train.steps)\n"
    "      --load PATH  start from this checkpoint (weights, optimizer, step), or\n"
    "                   from a Hugging Face GPT-2/LLaMA folder (weights only); it\n"
    "                   trains up to train.steps, counted from step 0 (--steps 0:\n"
    "                   load, and --save, without training)\n"
    "      --resume auto  start from the newest checkpoint in checkpoint.dir that\n"
    "                   loads (skipping damaged ones), or from scratch if none\n"
    "      --save PATH  write a checkpoint when training ends\n"
    "                   (--steps 0 --save init.h5 writes the initial model)\n"
    "      --metrics PATH  write one JSON object per step (JSON Lines)\n"
    "      --trace PATH  write a timeline of every rank (Chrome trace-event JSON,\n"
    "                   opens in Perfetto): pipeline actions, collectives and\n"
    "                   transfers, optimizer, steps; meant for short runs (the\n"
    "                   events stay in memory, ~100 bytes each, until the end)\n"
    "      --script-timeout SECONDS  wall-clock budget of the script and of the Lua\n"
    "                   that plans the run (-e statements, schedule functions;\n"
    "                   default 30); past it the run is refused (exit 2)\n"
    "      --script-memory MIB  memory budget of the same (default 1024)\n"
    "      --ds-config JSON  a DeepSpeed config: its batch, precision, ZeRO,\n"
    "                   optimizer and clipping keys as Lua statements after the\n"
    "                   script, before -e (docs/script.md, DeepSpeed configs)\n"
    "  -h, --help       show this help and exit\n"
    "  -V, --version    show the version and exit\n"
    "\n"
    "eval: val_loss and perplexity of a checkpoint on data.val (data.val_batches\n"
    "batches), under mpirun in any layout, as training evaluates.\n"
    "sample: generates text from a checkpoint on one process (KV cache);\n"
    "ztrain eval --help and ztrain sample --help list their options.\n"
    "\n"
    "schedule: checks the script's pipeline schedule and partition without\n"
    "training (no mpirun needed): simulated bubble, peak in-flight micro-batches\n"
    "per stage and a timeline of all stages.\n"
    "\n"
    "plan: the memory each rank of the script's layout will hold, by purpose\n"
    "and placement, without running it (ztrain plan --help).\n"
    "\n"
    "report: draws a run's --metrics as one HTML page of plots (no network\n"
    "needed to view it); ztrain report --help says more.\n"
    "\n"
    "tokenize: turns text files into a token file (ztrain's format). Without\n"
    "--tokenizer each byte is one token (vocab 256); --tokenizer takes a Hugging\n"
    "Face tokenizer.json (byte-level BPE: GPT-2, LLaMA 3) or a SentencePiece\n"
    ".model (LLaMA 2); --train-vocab N trains a SentencePiece BPE vocabulary of N\n"
    "on the inputs first and writes it to --tokenizer-out (default\n"
    "tokenizer.model beside OUTPUT.bin). Text tokenizers need UTF-8 and put the\n"
    "end-of-text token after each file. --val writes the last --val-fraction\n"
    "(default 0.1) of the tokens to a second file. Name the tokenizer in the\n"
    "script as data.tokenizer.\n"
    "\n"
    "SIGUSR1, SIGUSR2 or SIGTERM writes a checkpoint into checkpoint.dir at\n"
    "the end of the current step, then ends the run (exit 0). Under mpirun send\n"
    "SIGUSR1 to mpirun (it forwards it; it turns SIGTERM into an abort); under\n"
    "Slurm use --signal=USR1@SECONDS (docs/checkpoint-format.md).\n"
    "\n"
    "GEMM kernels: float GEMMs run on oneDNN's sgemm where ztrain is built with\n"
    "it, else on OpenBLAS's kernels for this CPU's vector ISA (cpuid), whatever\n"
    "OpenBLAS detects; both pass a self-check at start-up. OPENBLAS_CORETYPE,\n"
    "when set, keeps them on those OpenBLAS kernels (with a warning if the CPU\n"
    "can do better). The banner's GEMM line\n"
    "names the kernels, their rate measured at start-up and the CPU's peak:\n"
    "threads x clock x FLOPs per cycle. MFU is measured against that peak, or\n"
    "against the measured rate where it is higher, so it never exceeds 100%;\n"
    "train.peak_gflops overrides both. MFU and the peak are per rank.\n"
    "\n"
    "Threads: OMP_NUM_THREADS when set, else this rank's share of the cores in\n"
    "its CPU affinity (divided among the node's ranks on the same cores); the\n"
    "banner says which.\n"
    "\n"
    "Exit status: 0 success (also after a signal's checkpoint), 1 runtime\n"
    "failure (a failed save, a hang reported by the watchdog, too many\n"
    "non-finite steps), 2 bad input.\n"
    "Documentation: docs/ (script keys: docs/script.md).\n";

typedef struct {
  char **stmts;
  int nstmts;
  const char *script, *load, *save, *metrics, *resume, *trace;
  zt_script_limits limits;
  zt_dsconfig ds; /* --ds-config, read; limits.ds points at it */
} cli_args;

/* What --ds-config became, for rank 0 to show; with_lua: the statements too. */
static void print_ds(const cli_args *a, int with_lua) {
  if (!a->limits.ds) return;
  printf("ds-config %s (DeepSpeed keys -> the run's Lua, applied after the script, before -e):\n%s",
         a->ds.path, a->ds.report);
  if (with_lua) printf("ds-config statements:\n%s", a->ds.lua);
}

static int agree(zt_comm *world, int rc, zt_err *e) { return zt_comm_agree(world, rc, e); }

/* --load DIR, a Hugging Face model folder: rank 0 imports it into a
 * temporary checkpoint in $TMPDIR (a folder every rank must see) that all
 * ranks then load; the script's model must be the folder's. */
static int load_hf(const char *dir, const zt_model_cfg *want, zt_comm *world, char *path,
                   size_t n, zt_err *e) {
  int rc = ZT_OK;
  if (world->rank == 0) {
    const char *t = getenv("TMPDIR");
    snprintf(path, n, "%s/ztrain-hf-%d.h5", t && *t ? t : "/tmp", (int)getpid());
    zt_model_cfg have;
    rc = zt_hf_import(dir, path, &have, e);
    if (!rc && (rc = zt_hf_cfg_match(&have, want, dir, e))) unlink(path);
  }
  rc = agree(world, rc, e);
  if (!rc) zt_comm_bcast(world, path, n, ZT_U8, 0);
  return rc;
}

static int parse_args(int argc, char **argv, cli_args *a, zt_err *e) {
  static const struct option longopts[] = {
      {"steps", required_argument, 0, 's'}, {"load", required_argument, 0, 'l'},
      {"save", required_argument, 0, 'o'},  {"metrics", required_argument, 0, 'm'},
      {"resume", required_argument, 0, 'r'}, {"trace", required_argument, 0, 't'},
      {"script-timeout", required_argument, 0, 'T'}, {"script-memory", required_argument, 0, 'M'},
      {"ds-config", required_argument, 0, 'D'},
      {"help", no_argument, 0, 'h'},
      {"version", no_argument, 0, 'V'},     {0, 0, 0, 0}};
  memset(a, 0, sizeof *a);
  a->stmts = calloc((size_t)argc + 1, sizeof *a->stmts);
  const char *steps = NULL, *ds_config = NULL;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "e:hV", longopts, NULL)) != -1) {
    switch (c) {
      case 'e': a->stmts[a->nstmts++] = strdup(optarg); break;
      case 's': steps = optarg; break;
      case 'l': a->load = optarg; break;
      case 'o': a->save = optarg; break;
      case 'm': a->metrics = optarg; break;
      case 'r': a->resume = optarg; break;
      case 't': a->trace = optarg; break;
      case 'D': ds_config = optarg; break;
      case 'T':
      case 'M': {
        /* finite and > 0; memory at least what the library itself needs */
        char *end;
        double v = strtod(optarg, &end), low = c == 'M' ? 4 : 0;
        if (end == optarg || *end || !(v > low) || v > 1e12)
          return zt_err_set(e, ZT_EINPUT, "--script-%s needs %s, got '%s'",
                            c == 'M' ? "memory" : "timeout",
                            c == 'M' ? "a number of MiB above 4 (at most 1e12)"
                                     : "a number of seconds above 0 (at most 1e12)", optarg);
        *(c == 'M' ? &a->limits.mib : &a->limits.seconds) = v;
        break;
      }
      case 'h': return 'h';
      case 'V': return 'V';
      default:
        return zt_err_set(e, ZT_EINPUT, "%s '%s'; see ztrain --help",
                          optopt ? "missing value or unknown option" : "unknown option",
                          argv[optind - 1]);
    }
  }
  if (steps) {
    char *end;
    errno = 0;
    long long n = strtoll(steps, &end, 10);
    if (end == steps || *end || n < 0 || errno == ERANGE)
      return zt_err_set(e, ZT_EINPUT, "--steps needs a non-negative integer, got '%s'", steps);
    char buf[64];
    snprintf(buf, sizeof buf, "train.steps = %lld", n);
    a->stmts[a->nstmts++] = strdup(buf);
  }
  if (a->resume && a->load)
    return zt_err_set(e, ZT_EINPUT, "--resume and --load both name a starting point; use one");
  if (a->resume && strcmp(a->resume, "auto"))
    a->load = a->resume, a->resume = NULL; /* --resume PATH is --load PATH */
  if (optind != argc - 1)
    return zt_err_set(e, ZT_EINPUT, optind == argc ? "no script given; usage: ztrain [OPTIONS] SCRIPT.lua"
                                                   : "one script expected, got %d arguments; see ztrain --help",
                      argc - optind);
  a->script = argv[optind];
  if (ds_config) {
    a->limits.ds = &a->ds;
    return zt_dsconfig_read(&a->ds, ds_config, e);
  }
  return ZT_OK;
}

static int tokenize_main(int argc, char **argv) {
  zt_tokenize_opts o = {.val_fraction = 0.1, .progress = stderr};
  const char **pos = calloc((size_t)argc, sizeof *pos);
  int npos = 0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(usage, stdout);
      free(pos);
      return 0;
    } else if (!strcmp(a, "--val") && v) o.val = v, i++;
    else if (!strcmp(a, "--val-fraction") && v) o.val_fraction = atof(v), i++;
    else if (!strcmp(a, "--tokenizer") && v) o.tokenizer = v, i++;
    else if (!strcmp(a, "--tokenizer-out") && v) o.tokenizer_out = v, i++;
    else if (!strcmp(a, "--train-vocab") && v) {
      char *end;
      long n = strtol(v, &end, 10);
      if (end == v || *end || n < 1 || n > (1L << 24)) {
        fprintf(stderr, "ztrain tokenize: --train-vocab needs a vocabulary size (1 to 2^24), got '%s'\n", v);
        free(pos);
        return ZT_EINPUT;
      }
      o.train_vocab = (int)n, i++;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "ztrain tokenize: unexpected argument '%s'\n%s", a, usage);
      free(pos);
      return ZT_EINPUT;
    } else pos[npos++] = a;
  }
  if (npos < 2) {
    fprintf(stderr, "ztrain tokenize: need INPUT... and OUTPUT.bin\n");
    free(pos);
    return ZT_EINPUT;
  }
  if (o.tokenizer_out && !o.train_vocab) {
    fprintf(stderr, "ztrain tokenize: --tokenizer-out names where --train-vocab's tokenizer goes; "
            "give --train-vocab N\n");
    free(pos);
    return ZT_EINPUT;
  }
  o.inputs = pos, o.ninputs = npos - 1, o.out = pos[npos - 1];
  zt_tokenize_result r;
  zt_err e = {0};
  int rc = zt_tokenize(&o, &r, &e);
  if (rc) fprintf(stderr, "ztrain tokenize: %s\n", e.msg);
  else {
    printf("wrote %lld tokens (vocab %d, tokenizer %s%s%s) to %s\n", (long long)r.tokens, r.vocab,
           r.kind, strcmp(r.kind, "byte") ? " " : "", strcmp(r.kind, "byte") ? r.tokenizer : "", o.out);
    if (o.val) printf("wrote %lld tokens to %s\n", (long long)r.val_tokens, o.val);
  }
  free(pos);
  return rc;
}

/* `ztrain schedule SCRIPT.lua`: the plan's pipeline, checked and shown. */
static int schedule_main(int argc, char **argv) {
  cli_args a;
  zt_err e = {0};
  int rc = parse_args(argc - 1, argv + 1, &a, &e);
  if (rc == 'h' || rc == 'V') rc = zt_err_set(&e, ZT_EINPUT, "usage: ztrain schedule [-e STMT]... SCRIPT.lua");
  zt_plan plan = {0};
  if (!rc) rc = zt_config_load(&plan, a.script, a.stmts, a.nstmts, 0, &a.limits, &e);
  if (!rc) print_ds(&a, 1);
  if (!rc) {
    const zt_pipeline_cfg *pc = &plan.pipeline;
    const zt_schedule *s = &pc->schedule;
    printf("schedule %s: %d stages x %d chunk%s, %d micro-batches per step, costs F=%g B=%g W=%g%s\n",
           s->name, s->stages, s->chunks, s->chunks > 1 ? "s" : "", s->microbatches,
           s->cost[ZT_ACT_F], s->cost[ZT_ACT_B], s->cost[ZT_ACT_W],
           s->split ? "" : " (B does W's work: B+W)");
    printf("partition:");
    for (int v = 0; v < pc->n_virtual; v++)
      printf("%s stage %d%s blocks %d-%d", v ? "," : "", v % s->stages,
             s->chunks > 1 ? (v / s->stages ? "b" : "a") : "", pc->first[v], pc->last[v]);
    printf("\nbubble %.1f%% of the step (simulated)\npeak in-flight micro-batches per stage:",
           100 * pc->report.bubble);
    for (int st = 0; st < s->stages; st++) printf(" %d", pc->report.peak[st]);
    printf("\n");
    zt_schedule_print(s, &pc->report, stdout);
  }
  if (rc) fprintf(stderr, "ztrain schedule: error: %s\n", e.msg);
  for (int i = 0; i < a.nstmts; i++) free(a.stmts[i]);
  free(a.stmts);
  zt_dsconfig_free(&a.ds);
  zt_plan_free(&plan);
  return rc;
}

/* Threads: OMP_NUM_THREADS when set, else the cores of this rank's CPU
 * affinity shared evenly among the node's ranks that run on them (all of
 * the node's under mpirun --bind-to none; none under --bind-to core).
 * *why says which, for the banner. */
void zt_cli_set_threads(char *why, size_t n) {
  const char *env = getenv("OMP_NUM_THREADS");
  if (env && *env) {
    snprintf(why, n, "OMP_NUM_THREADS=%.32s", env);
    return;
  }
  int cores = zt_cpu_cores(), sharing = zt_comm_node_sharing(), nodes = zt_comm_node_size();
  omp_set_num_threads(zt_report_rank_cores());
  char ranks[96];
  if (sharing == nodes)
    snprintf(ranks, sizeof ranks, "%d rank%s on this node", nodes, nodes > 1 ? "s" : "");
  else
    snprintf(ranks, sizeof ranks, "%d rank%s on them; %d on this node, the others bound to other "
             "cores", sharing, sharing > 1 ? "s" : "", nodes);
  snprintf(why, n, "%d core%s in affinity / %s%s", cores, cores > 1 ? "s" : "", ranks,
           cores < sharing ? ": more ranks than cores" : "");
}

/* SIGTERM / SIGUSR1 / SIGUSR2: finish the step, checkpoint, stop. */
static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

/* Whether any rank was signalled: all ranks stop at the same step. A
 * watched collective, like every other one of the step. */
static int any_signal(zt_comm *world) {
  float sig = (float)stop_signal;
  zt_comm_allreduce(world, &sig, 1, ZT_F32, ZT_MAX);
  return (int)sig;
}

/* "checkpoint PATH written: SIZE in TIME" (`at`: what follows, or ""). */
static void say_ckpt(const char *path, const char *verb, double dt, const char *at) {
  struct stat st;
  if (stat(path, &st)) return;
  printf("checkpoint %s %s: %.1f MB in %.2f s (%.2f GB/s)%s\n", path, verb, st.st_size / 1e6, dt,
         dt > 0 ? st.st_size / dt / 1e9 : 0.0, at);
  fflush(stdout);
}

/* Saves or loads `path`, and on rank 0 says how large and how fast. */
static int timed_ckpt(int save, const char *path, const zt_ckpt_state *cs, zt_err *e) {
  double t0 = zt_timer_now();
  int rc = save ? zt_ckpt_save(path, cs, e) : zt_ckpt_load(path, cs, e);
  if (!rc && cs->grid->world.rank == 0)
    say_ckpt(path, save ? "written" : "loaded", zt_timer_now() - t0, "");
  return rc;
}


/* A checkpoint trained on other data than this run's (data.sources in the
 * plans): said once, as a warning (fine-tuning on new data is legitimate),
 * since the data order from here on is not the one it would have read. */
static void warn_data_change(const char *path, const zt_plan *p, long long step) {
  zt_ckpt_file cf;
  zt_err e = {0};
  char why[1024];
  if (zt_ckpt_file_open(&cf, path, &e)) return;
  if (zt_plan_data_changed(cf.plan, p->json, why, sizeof why))
    fprintf(stderr, "ztrain: warning: checkpoint %s was trained on other data (%s); from step "
            "%lld on this run reads its own data's order\n", path, why, step + 1);
  zt_ckpt_file_close(&cf);
}

static double logical_params(const zt_model *m) {
  double n = 0;
  for (int i = 0; i < m->n_params; i++) n += (double)zt_tensor_numel(&m->params[i].t);
  return n;
}

/* Where the ranks run, and under which Slurm job: one line. */
static void print_placement(const zt_grid *g) {
  char at[1024];
  zt_grid_describe(g, at, sizeof at);
  const char *job = getenv("SLURM_JOB_ID"), *restart = getenv("SLURM_RESTART_COUNT");
  char slurm[128] = "";
  if (job && *job)
    snprintf(slurm, sizeof slurm, " | slurm job %s%s%s", job, restart && *restart ? ", restart " : "",
             restart && *restart ? restart : "");
  printf("placement: %s%s\n", at, slurm);
}

static void print_banner(const zt_plan *p, const zt_model *m, const zt_trainer *tr,
                         const zt_report *rep, const char *threads_why) {
  const zt_model_cfg *c = &p->model;
  int64_t states, buffers;
  zt_trainer_bytes(tr, &states, &buffers);
  int nre = 0;
  for (int l = 0; c->recompute && l < c->layers; l++) nre += c->recompute[l] != 0;
  char prec[96] = "";
  if (m->dt != ZT_F32)
    snprintf(prec, sizeof prec, " | precision %s (fp32 master weights, gradients and moments)",
             m->dt == ZT_BF16 ? "bf16" : "fp16");
  char recompute[64] = "";
  if (nre)
    snprintf(recompute, sizeof recompute, " (%d of %d blocks recomputed)", nre, c->layers);
  char scratch[64] = ""; /* only 16-bit runs keep any */
  if (rep->scratch_bytes)
    snprintf(scratch, sizeof scratch, " (+ GEMM scratch %.1f MiB)", rep->scratch_bytes / 1048576.0);
  printf("ztrain %s | %s %d layers dim %d heads %d/%d vocab %d seq %d | %.2fM params\n"
         "grid dp %d x tp %d%s x pp %d, zero %d | batch %d = micro %d x accum %d x dp %d | "
         "backend %s, threads: %d per rank (%s)%s\n"
         "model states %.1f MiB/rank (+ buffers %.1f MiB) | activations %.1f MiB/rank%s%s | "
         "steps %lld..%lld | "
         "MFU against %.0f GFLOP/s per rank (%s)\n",
         ZT_VERSION, c->arch == ZT_ARCH_GPT ? "gpt" : "llama", c->layers, c->dim, c->heads,
         c->kv_heads, c->vocab, c->seq, logical_params(m) / 1e6,
         p->parallel.dp, p->parallel.tp, c->sequence_parallel ? " (sequence parallel)" : "",
         p->parallel.pp, p->parallel.zero.stage,
         p->train.global_batch, p->train.micro_batch, p->train.accum, p->parallel.dp,
         m->be->name, omp_get_max_threads(), threads_why, prec, states / 1048576.0, buffers / 1048576.0,
         m->act_bytes / 1048576.0, recompute, scratch, (long long)tr->t,
         (long long)p->train.steps, rep->peak_flops / 1e9,
         p->train.peak_gflops > 0            ? "train.peak_gflops"
         : rep->gemm.measured > rep->gemm.cpu ? "measured SGEMM, above the CPU peak"
         : rep->gemm.cpu > 0                  ? "the CPU peak below"
                                              : "not measured: log_every = 0");
  zt_report_print_gemm(&rep->gemm, stdout);
  if (p->parallel.zero.offload.n_units) { /* per kind, where its bytes went (one rank of a stage) */
    printf("offload:");
    for (int k = 0; k < ZT_OFF_KINDS; k++) {
      printf("%s %s", k ? " |" : "", zt_offload_kind_name((zt_offload_kind)k));
      for (int q = 0; q < ZT_PLACES; q++)
        if (p->parallel.offload_bytes[k][q])
          printf(" %s %.2f MiB", zt_place_name((zt_place)q), p->parallel.offload_bytes[k][q] / 1048576.0);
    }
    const char *engine = zt_zero_nvme_engine(tr->zero);
    if (engine) printf(" | nvme files in %s: %s", p->parallel.zero.offload.dir, engine);
    printf("\n");
  }
}

/* Each rank's measured peak (its resident high-water mark less the empty
 * process, /proc/self/status) against its plan, reported by rank 0 (one
 * line per rank, a metrics record). Before a final save, whose staging is
 * not training's. Collective over world. */
static void report_memory(zt_comm *world, zt_report *rep, int64_t base_rss,
                          const zt_memplan *mp) {
  int64_t rss, hwm;
  zt_rss_read(&rss, &hwm);
  int n = world->size;
  double *v = calloc((size_t)3 * n, sizeof *v);
  if (!v) return;
  v[3 * world->rank] = (double)base_rss;
  v[3 * world->rank + 1] = (double)hwm;
  v[3 * world->rank + 2] = (double)mp->peak_bytes;
  zt_comm_allreduce(world, v, (size_t)3 * n, ZT_F64, ZT_SUM);
  zt_report_memory(rep, n, v);
  free(v);
}

/* Every rank writes its part of the trace next to PATH; rank 0 joins
 * them into PATH. */
static int write_trace(const char *path, zt_comm *world, double origin, zt_err *e) {
  char part[4096];
  snprintf(part, sizeof part, "%s.part%d", path, world->rank);
  int rc = agree(world, zt_trace_write_part(part, origin, e), e);
  if (!rc && world->rank == 0) {
    char **parts = calloc((size_t)world->size, sizeof *parts);
    size_t n = strlen(path) + 24;
    for (int r = 0; parts && r < world->size; r++)
      if ((parts[r] = malloc(n))) snprintf(parts[r], n, "%s.part%d", path, r);
    rc = parts ? zt_trace_merge(path, parts, world->size, e)
               : zt_err_set(e, ZT_ERUNTIME, "out of memory");
    for (int r = 0; parts && r < world->size; r++) free(parts[r]);
    free(parts);
  }
  rc = agree(world, rc, e);
  if (!rc && world->rank == 0) printf("trace %s written (open it in https://ui.perfetto.dev)\n", path);
  return rc;
}

/* The backend this rank computes on (parallel.device). A rank's GPU is its
 * index among its node's ranks (SLURM_LOCALID where Slurm says it): one
 * rank per GPU, so a node with more ranks than GPUs is refused. "auto"
 * takes the GPU where every rank of the node has one, else the CPU. */
int zt_cli_pick_backend(zt_device_kind want, const zt_backend **be, zt_err *e) {
  const char *tb = getenv("ZT_TEST_BACKEND"); /* test hook: device memory the host */
  if (tb && !strcmp(tb, "remote")) {          /* cannot address, as on a GPU */
    *be = zt_backend_remote();
    return ZT_OK;
  }
  *be = zt_backend_cpu();
  if (want == ZT_DEVICE_CPU) return ZT_OK;
  int gpus = zt_backend_cuda_devices(), per_node = zt_comm_node_size();
  const char *slurm = getenv("SLURM_LOCALID");
  int local = slurm && *slurm ? atoi(slurm) : zt_comm_node_rank();
  if (want == ZT_DEVICE_AUTO && (gpus == 0 || per_node > gpus)) return ZT_OK;
  char why[256] = "";
  if (gpus == 0) {
    if (zt_backend_cuda(0, why, sizeof why) || !why[0]) snprintf(why, sizeof why, "none found");
    return zt_err_set(e, ZT_EINPUT, "parallel.device = \"cuda\": no usable CUDA device on this "
                      "node (%s); set parallel.device = \"cpu\" or \"auto\"", why);
  }
  if (per_node > gpus || local < 0 || local >= gpus)
    return zt_err_set(e, ZT_EINPUT, "parallel.device = \"cuda\": %d ranks on this node but %d "
                      "GPU%s: one rank per GPU; start %d ranks per node (mpirun --map-by "
                      "ppr:%d:node, srun --ntasks-per-node=%d) or set parallel.device = \"cpu\"",
                      per_node, gpus, gpus == 1 ? "" : "s", gpus, gpus, gpus);
  const zt_backend *cuda = zt_backend_cuda(local, why, sizeof why);
  if (!cuda)
    return zt_err_set(e, ZT_ERUNTIME, "GPU %d of this node cannot be used: %s", local, why);
  *be = cuda;
  return ZT_OK;
}

static int train_main(const cli_args *a, zt_comm *world, const char *threads_why, zt_err *e) {
  const zt_backend *be = zt_backend_cpu();
  zt_plan plan;
  zt_grid grid = {0};
  zt_data train_data = {0}, val_data = {0};
  zt_model model = {0};
  zt_trainer tr = {0};
  zt_report rep = {0};
  zt_ckpt_async bg = {0};
  int rank0 = world->rank == 0, grid_up = 0;

  zt_watchdog_test_stop("start");
  zt_script_limits lim = a->limits;
  lim.quiet = world->rank != 0; /* one message, from the first rank */
  int rc = zt_config_load(&plan, a->script, a->stmts, a->nstmts, world->size, &lim, e);
  if (!rc && rank0) print_ds(a, 0);
  /* this rank knows the run's timeout now: the agreement below is watched by it */
  if (!rc) zt_watchdog_set_timeout(plan.parallel.timeout);
  if (!rc) rc = zt_cli_pick_backend(plan.parallel.device, &be, e);
  if (!rc) zt_comm_set_device(be);
  if (!rc && !be->has_dtype(plan.train.precision))
    rc = zt_err_set(e, ZT_EINPUT, "train.precision: the %s backend cannot compute in %s", be->name,
                    zt_dtype_name(plan.train.precision));
  if (!rc && a->save) rc = zt_fs_check_writable("--save", a->save, e);
  /* where periodic and signalled checkpoints go: made before the first
   * step, once everything else has been checked (nothing made for bad input) */
  int ckpt_dir = plan.ckpt.every > 0 || a->resume;
  if (!rc && ckpt_dir) rc = zt_fs_check_dir("checkpoint.dir", plan.ckpt.dir, e);
  if (!rc && a->trace) rc = zt_fs_check_writable("--trace", a->trace, e);
  if (!rc && a->metrics) rc = zt_fs_check_writable("--metrics", a->metrics, e);
  if (!rc) rc = zt_data_open(&train_data, &plan.data.train_spec, plan.data.token_bytes,
                             plan.model.seq, plan.model.vocab, e);
  if (!rc && plan.data.val_spec.n)
    rc = zt_data_open(&val_data, &plan.data.val_spec, plan.data.token_bytes,
                      plan.model.seq, plan.model.vocab, e);
  if (!rc) zt_plan_record_data(&plan, &train_data, &val_data);
  rc = agree(world, rc, e);
  if (!rc) {
    rc = zt_grid_init(&grid, plan.parallel.dp, plan.parallel.tp, plan.parallel.pp, e);
    grid_up = !rc;
    /* every rank knows the widest TP group: all refuse alike, rank 0 says it */
    if (!rc && grid.tp_nodes > 1) {
      char at[512];
      zt_grid_describe(&grid, at, sizeof at);
      if (plan.parallel.strict)
        rc = zt_err_set(e, ZT_EINPUT, "parallel.strict: tp = %d spans %d nodes, the most ranks "
                        "on one node being %d (%s); start at least %d ranks per node (mpirun "
                        "--map-by ppr:%d:node, srun --ntasks-per-node=%d), or lower tp",
                        grid.tp, grid.tp_nodes, zt_grid_max_node_ranks(&grid), at, grid.tp, grid.tp,
                        grid.tp);
      else if (rank0)
        fprintf(stderr, "ztrain: warning: tp = %d spans %d nodes (%s): its all-reduces cross "
                "the network on every layer; keep tp <= ranks per node (parallel.strict = true "
                "refuses this)\n", grid.tp, grid.tp_nodes, at);
    }
  }
  zt_stage_cfg stage = {0};
  int piped = plan.parallel.pp > 1;
  if (!rc && piped)
    rc = zt_pipe_stage(&plan.pipeline.schedule, plan.pipeline.first, plan.pipeline.last,
                       grid.pp_rank, &stage, e);
  /* the planner's estimate of this rank against the memory it may use */
  zt_memplan mplan = {0};
  if (!rc) rc = zt_memplan_check(&plan, world->rank, omp_get_max_threads(), be->host_visible, e);
  if (!rc) rc = zt_memplan_rank(&plan, world->rank, omp_get_max_threads(), &mplan, e);
  /* the empty process: MPI, Lua, the BLAS and the data files up, nothing
   * of the model; the peak from here on is what the plan estimates */
  int64_t base_rss = -1, hwm = -1;
  if (!rc) {
    zt_rss_reset_peak();
    zt_rss_read(&base_rss, &hwm);
  }
  if (!rc) rc = zt_model_init(&model, &plan.model, be, plan.train.micro_batch,
                              &grid.tp_comm, piped ? &stage : NULL, e);
  zt_pipe_stage_free(&stage);
  rc = agree(world, rc, e);
  if (!rc)
    rc = zt_trainer_init(&tr, &plan.train, &model, &grid, &plan.parallel.zero,
                         &plan.pipeline.schedule, &train_data, val_data.n ? &val_data : NULL,
                         plan.data.shuffle, e);
  rc = agree(world, rc, e);
  zt_ckpt_state cs = {.m = &model, .z = tr.zero, .grid = &grid, .step = &tr.t,
                      .skipped = &tr.skipped, .scaler = &tr.scaler, .plan_json = plan.json,
                      .script_text = plan.script_text,
                      .global_batch = plan.train.global_batch, .samples = train_data.samples,
                      .seed = plan.train.seed};
  char hf_ckpt[4200] = "";
  if (!rc && a->load && zt_hf_is_dir(a->load))
    rc = load_hf(a->load, &plan.model, world, hf_ckpt, sizeof hf_ckpt, e);
  if (!rc && a->load) rc = timed_ckpt(0, *hf_ckpt ? hf_ckpt : a->load, &cs, e);
  /* an imported Hugging Face model carries no data record to compare */
  if (!rc && a->load && !*hf_ckpt && rank0) warn_data_change(a->load, &plan, (long long)tr.t);
  if (*hf_ckpt && rank0) unlink(hf_ckpt);
  if (!rc && a->resume) {
    char used[4096];
    rc = zt_ckpt_dir_resume(plan.ckpt.dir, &cs, used, sizeof used, e);
    if (!rc && rank0)
      printf(*used ? "resuming from %s (step %lld)\n" : "no checkpoint in %s: starting at step 0\n",
             *used ? used : plan.ckpt.dir, (long long)tr.t);
    if (!rc && rank0 && *used) warn_data_change(used, &plan, (long long)tr.t);
  }
  /* --load past the end would train nothing and look like success;
   * --steps 0 is the way to only load (and --save). A resumed run that
   * is done is a requeued job that finished: nothing to do, exit 0. */
  if (!rc && a->load && plan.train.steps > 0 && tr.t >= plan.train.steps)
    rc = zt_err_set(e, ZT_EINPUT, "--load %s is at step %lld but train.steps is %lld: nothing to "
                    "train (train.steps counts from step 0, not from the checkpoint); use --steps "
                    "%lld to train %lld more, or --steps 0 to only load%s", a->load,
                    (long long)tr.t, (long long)plan.train.steps,
                    (long long)(tr.t + plan.train.steps), (long long)plan.train.steps,
                    a->save ? " and --save" : "");
  rc = agree(world, rc, e);
  if (!rc && ckpt_dir) rc = zt_ckpt_dir_make(plan.ckpt.dir, world, ZT_EINPUT, e);
  if (!rc) {
    zt_peak pk;
    /* a declared peak needs no probe */
    int declared = plan.train.peak_gflops > 0;
    zt_report_peak(be, rank0 && plan.train.log_every > 0 && !declared, &pk);
    double peak = declared ? plan.train.peak_gflops : zt_report_peak_gflops(&pk);
    /* MFU per rank against a rank's peak: a step's tokens are the global
     * batch's, which dp ranks share and every tp and pp rank works on a
     * part of */
    rc = zt_report_open(&rep, rank0, a->metrics, plan.train.log_every, tr.t, plan.train.steps,
                        zt_model_flops_per_token(&model) / world->size, peak, e);
    rep.gemm = pk;
    rep.scratch_bytes = zt_model_gemm_scratch(&model);
  }
  rc = agree(world, rc, e);
  double trace_origin = zt_timer_now(); /* just after agree's collective: about the same moment everywhere */
  if (!rc && a->trace) {
    char label[96];
    snprintf(label, sizeof label, "rank %d (pp %d, dp %d, tp %d)", world->rank, grid.pp_rank,
             grid.dp_rank, grid.tp_rank);
    rc = zt_trace_start(world->rank, label, e);
  }
  rc = agree(world, rc, e);
  if (!rc && rank0) print_banner(&plan, &model, &tr, &rep, threads_why);
  if (!rc && rank0) print_placement(&grid);
  if (!rc && rank0)
    printf("memory plan: %.1f MiB at peak on rank 0 above the empty process (%.1f MiB); "
           "ztrain plan shows every rank\n", mplan.peak_bytes / 1048576.0, base_rss / 1048576.0);
  while (!rc && tr.t < plan.train.steps) {
    zt_step_stats st;
    char where[32];
    snprintf(where, sizeof where, "step:%lld", (long long)tr.t + 1);
    zt_watchdog_test_stop(where);
    rc = zt_trainer_step(&tr, &st, e); /* a failure is the same on every rank */
    zt_trainer_bytes(&tr, &st.state_bytes, &st.buffer_bytes);
    st.act_bytes = (int64_t)model.act_bytes;
    zt_report_step(&rep, &st);
    if (rc) break; /* before any checkpoint of this state */
    int last = st.step == plan.train.steps;
    if (tr.has_val && ((plan.train.eval_every && st.step % plan.train.eval_every == 0) || last))
      zt_report_eval(&rep, st.step, zt_trainer_eval(&tr, plan.data.val_batches));
    int stop = any_signal(&grid.world);
    const char *kill_at = getenv("ZT_TEST_KILL_AT_STEP"); /* test hook: a crash */
    if (kill_at && atoll(kill_at) == st.step && world->rank == world->size - 1) raise(SIGKILL);
    if ((plan.ckpt.every && st.step % plan.ckpt.every == 0) || stop) {
      char path[4096];
      /* a stop is the last chance: that save is synchronous, after the one
       * in the background (HDF5 runs on one thread at a time) */
      if (stop) rc = zt_ckpt_async_wait(&bg, e);
      int async = plan.ckpt.async && !stop;
      double t0 = zt_timer_now();
      if (!rc) rc = zt_ckpt_dir_save(plan.ckpt.dir, plan.ckpt.keep, &cs, async ? &bg : NULL, path,
                                     sizeof path, e);
      /* a stop says so itself, below; one in the background when it is done */
      if (!rc && !stop && !async && rank0) {
        char at[64];
        snprintf(at, sizeof at, ", step %lld", (long long)tr.t);
        say_ckpt(path, "written", zt_timer_now() - t0, at);
      }
      if (!rc && stop && rank0)
        printf("ztrain: %s: checkpoint %s written at step %lld; stopping\n",
               stop == SIGTERM ? "SIGTERM" : stop == SIGUSR2 ? "SIGUSR2" : "SIGUSR1", path,
               (long long)tr.t);
    }
    if (stop) break;
  }
  if (!rc && grid_up) report_memory(world, &rep, base_rss, &mplan);
  zt_err bg_err = {0};
  int bg_rc = zt_ckpt_async_wait(&bg, &bg_err); /* before anything else touches HDF5 */
  if (!rc && bg_rc) rc = bg_rc, *e = bg_err;
  if (!rc && a->save) rc = timed_ckpt(1, a->save, &cs, e);

  if (a->trace && zt_trace_on()) {
    int trc = write_trace(a->trace, world, trace_origin, e);
    if (!rc) rc = trc;
  }
  zt_report_close(&rep);
  zt_trainer_free(&tr);
  if (model.params) zt_model_free(&model);
  if (grid_up) zt_grid_free(&grid);
  zt_data_close(&train_data);
  zt_data_close(&val_data);
  zt_plan_free(&plan);
  return rc;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "tokenize")) return tokenize_main(argc, argv);
  if (argc > 1 && !strcmp(argv[1], "schedule")) return schedule_main(argc, argv);
  if (argc > 1 && (!strcmp(argv[1], "eval") || !strcmp(argv[1], "sample")))
    return zt_infer_main(argc, argv);
  if (argc > 1 && !strcmp(argv[1], "report")) return zt_runreport_main(argc - 1, argv + 1);
  if (argc > 1 && !strcmp(argv[1], "plan")) return zt_plan_main(argc - 1, argv + 1);
  cli_args a;
  zt_err e = {0};
  /* getopt reorders argv; a restart with other GEMM kernels gets it as given */
  char **argv_given = malloc(((size_t)argc + 1) * sizeof *argv_given);
  if (argv_given) memcpy(argv_given, argv, ((size_t)argc + 1) * sizeof *argv_given);
  int rc = parse_args(argc, argv, &a, &e);
  if (rc == 'h') { fputs(usage, stdout); return 0; }
  /* before anything uses BLAS and before MPI starts: may restart the program */
  char gemm_why[512];
  if (zt_cpu_gemm_select(argv_given ? argv_given : argv, gemm_why, sizeof gemm_why)) {
    fprintf(stderr, "ztrain: error: %s\n", gemm_why);
    return ZT_ERUNTIME;
  }
  free(argv_given);
  if (rc == 'V') {
    char gemm[256], other[320];
    zt_cpu_gemm_describe(gemm, sizeof gemm, other, sizeof other);
    printf("ztrain %s (CPU backend: BLAS + OpenMP; CUDA devices visible: %d)\nGEMM: %s%s%s\n",
           ZT_VERSION, zt_backend_cuda_devices(), gemm, other[0] ? "; " : "", other);
    for (size_t i = 0; i < sizeof zt_cpu_gemm_path()->warning / sizeof *zt_cpu_gemm_path()->warning; i++)
      if (zt_cpu_gemm_path()->warning[i][0])
        fprintf(stderr, "ztrain: warning: %s\n", zt_cpu_gemm_path()->warning[i]);
    return 0;
  }
  zt_comm world;
  char why[256] = "";
  /* the default timeout watches start-up until the script gives its own */
  int wrc = zt_comm_init(&argc, &argv, &world, "cli", ZT_WATCHDOG_DEFAULT_S, why);
  if (wrc && world.rank == 0)
    fprintf(stderr, "ztrain: %s: %s\n", wrc == -2 ? "error" : "warning: no hang watchdog", why);
  if (wrc == -2) rc = ZT_ERUNTIME, e.msg[0] = 0; /* every rank saw it; nothing more to say */
  if (!rc) {
    char threads_why[160];
    zt_cli_set_threads(threads_why, sizeof threads_why);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    rc = train_main(&a, &world, threads_why, &e);
  }
  if (rc && world.rank == 0 && e.msg[0]) fprintf(stderr, "ztrain: error: %s\n", e.msg);
  for (int i = 0; i < a.nstmts; i++) free(a.stmts[i]);
  free(a.stmts);
  zt_dsconfig_free(&a.ds);
  if (wrc == -2) zt_comm_abort(1); /* the missing ranks never will */
  zt_comm_finalize(&world);
  return rc;
}
