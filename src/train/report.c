/* report: see report.h. */
#include "src/train/report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/gemm_path.h"
#include "parallel/comm.h"
#include "src/core/timer.h"

int zt_report_open(zt_report *r, int active, const char *metrics_path,
                   int log_every, int64_t first_step, int64_t total_steps,
                   double flops_per_token, double peak_gflops, zt_err *e) {
  memset(r, 0, sizeof *r);
  r->active = active;
  r->log_every = log_every;
  r->first_step = first_step;
  r->total_steps = total_steps;
  r->flops_per_token = flops_per_token;
  r->peak_flops = peak_gflops * 1e9;
  r->tty = isatty(STDERR_FILENO);
  r->t_start = zt_timer_now();
  if (active && metrics_path) {
    r->metrics = fopen(metrics_path, "w");
    if (!r->metrics)
      return zt_err_set(e, ZT_EINPUT, "cannot write metrics file %s: %s",
                        metrics_path, strerror(errno));
  }
  return ZT_OK;
}

static void write_json(zt_report *r, json_t *obj) {
  if (r->metrics) {
    json_dumpf(obj, r->metrics, JSON_COMPACT | JSON_REAL_PRECISION(17));
    fputc('\n', r->metrics);
    fflush(r->metrics); /* a crash loses at most the line being written */
  }
  json_decref(obj);
}

/* JSON has no NaN or infinity: such a value is written as null (jansson
 * refuses to make a real of it, which used to leave an empty line). */
static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* printf writes a NaN with its sign bit as "-nan"; a NaN has no sign
 * worth reading. */
static double readable(double x) { return isnan(x) ? fabs(x) : x; }

static void fmt_eta(char *buf, size_t n, double s) {
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else
    snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

void zt_report_step(zt_report *r, const zt_step_stats *st) {
  if (!r->active) return;
  r->tokens_done += (double)st->tokens;
  double elapsed = zt_timer_now() - r->t_start;
  double tok_s = r->tokens_done / elapsed;
  double step_tok_s = (double)st->tokens / (st->ms * 1e-3);
  double mfu = r->peak_flops > 0 ? 100.0 * step_tok_s * r->flops_per_token / r->peak_flops : 0;

  json_t *o = json_pack("{s:I, s:o, s:o, s:o, s:I, s:o, s:{s:I, s:I}, s:I, s:I, s:I}", "step",
                        (json_int_t)st->step, "loss", jnum(st->loss), "lr", jnum(st->lr),
                        "grad_norm", jnum(st->grad_norm), "tokens", (json_int_t)st->tokens,
                        "ms", jnum(st->ms), "bytes", "dp", (json_int_t)st->bytes_dp, "tp",
                        (json_int_t)st->bytes_tp, "state_bytes",
                        (json_int_t)st->state_bytes, "buffer_bytes",
                        (json_int_t)st->buffer_bytes, "act_bytes", (json_int_t)st->act_bytes);
  /* a key of its own, after the others: readers of the older lines keep working */
  if (o) json_object_set_new(o, "scratch_bytes", json_integer((json_int_t)r->scratch_bytes));
  if (o)
    json_object_set_new(o, "bytes_inter_node",
                        json_pack("{s:I, s:I}", "dp", (json_int_t)st->bytes_dp_inter, "tp",
                                  (json_int_t)st->bytes_tp_inter));
  /* the plain line's tokens/s and MFU, so that a report need not redo them;
   * MFU as a fraction like the bubble, only where a peak is known */
  if (o) json_object_set_new(o, "tok_s", jnum(step_tok_s));
  if (o && r->peak_flops > 0) json_object_set_new(o, "mfu", jnum(mfu / 100));
  if (o && st->pipeline)
    json_object_set_new(o, "bubble", json_pack("{s:o, s:o}", "measured", jnum(st->bubble),
                                               "simulated", jnum(st->bubble_sim)));
  if (o && st->scaling) {
    json_object_set_new(o, "loss_scale", json_real(st->loss_scale));
    json_object_set_new(o, "skipped", json_boolean(st->skipped));
  } else if (o && st->skipped) {
    json_object_set_new(o, "skipped", json_true());
  }
  write_json(r, o);
  int64_t done = st->step - r->first_step, left = r->total_steps - st->step;
  if (r->tty) {
    char eta[32];
    fmt_eta(eta, sizeof eta, done > 0 ? elapsed / (double)done * (double)left : 0);
    fprintf(stderr, "\r\033[Kstep %lld/%lld  loss %.4f  %.0f tok/s  ETA %s",
            (long long)st->step, (long long)r->total_steps, readable(st->loss), tok_s, eta);
    if (!left) fputc('\n', stderr);
    fflush(stderr);
  }
  if (r->log_every > 0 && (st->step % r->log_every == 0 || !left)) {
    if (r->tty) fprintf(stderr, "\r\033[K");
    printf("step %lld/%lld | loss %.4f | lr %.3e | grad_norm %.4f | %.1f ms | "
           "%.0f tok/s | MFU %.1f%%",
           (long long)st->step, (long long)r->total_steps, readable(st->loss), st->lr,
           readable(st->grad_norm), st->ms, step_tok_s, mfu);
    if (st->bytes_dp || st->bytes_tp)
      printf(" | dp %.2f MB tp %.2f MB", st->bytes_dp / 1e6, st->bytes_tp / 1e6);
    if (st->pipeline)
      printf(" | bubble %.1f%% (simulated %.1f%%)", 100 * st->bubble, 100 * st->bubble_sim);
    printf("\n");
    fflush(stdout);
  }
  if (st->skipped && !st->bad) { /* an overflow the scaler answers: routine */
    if (r->tty) fprintf(stderr, "\r\033[K");
    printf("step %lld: gradient overflow at loss scale %.9g: update skipped; loss scale %.9g "
           "from the next step\n", (long long)st->step, st->loss_scale, st->next_scale);
    fflush(stdout);
  } else if (st->skipped) {
    if (r->tty) fprintf(stderr, "\r\033[K");
    fprintf(stderr, "ztrain: step %lld: loss %.6g, grad norm %.6g", (long long)st->step,
            readable(st->loss), readable(st->grad_norm));
    if (st->scaling)
      fprintf(stderr, " at loss scale %.9g%s", st->loss_scale,
              st->scaling == 2 ? " (its minimum)" : "");
    fprintf(stderr, ": update skipped (");
    if (st->bad_run >= st->bad_limit)
      fprintf(stderr, "%lld in a row: stopping)", (long long)st->bad_run);
    else
      fprintf(stderr, "%lld in a row, stop after %d)", (long long)st->bad_run, st->bad_limit);
    fprintf(stderr, "; %s\n", st->nonfinite);
    fflush(stderr);
  }
}

void zt_report_eval(zt_report *r, int64_t step, double val_loss) {
  if (!r->active) return;
  write_json(r, json_pack("{s:I, s:o}", "step", (json_int_t)step, "val_loss", jnum(val_loss)));
  if (r->tty) fprintf(stderr, "\r\033[K");
  printf("step %lld/%lld | val_loss %.4f\n", (long long)step,
         (long long)r->total_steps, readable(val_loss));
  fflush(stdout);
}

void zt_report_memory(zt_report *r, int n, const double *m) {
  if (!r->active) return;
  for (int k = 0; k < n; k++) {
    double base = m[3 * k], hwm = m[3 * k + 1], plan = m[3 * k + 2], used = hwm - base;
    if (base < 0 || hwm < 0) {
      printf("memory rank %d: not measured (no /proc/self/status)\n", k);
      continue;
    }
    printf("memory rank %d: peak %.1f MiB above the empty process (high-water mark %.1f MiB, "
           "baseline %.1f MiB), planned %.1f MiB (measured/planned %.3f)\n",
           k, used / 1048576.0, hwm / 1048576.0, base / 1048576.0, plan / 1048576.0,
           plan > 0 ? used / plan : 0.0);
  }
  fflush(stdout);
}

void zt_report_close(zt_report *r) {
  if (r->metrics) fclose(r->metrics);
  r->metrics = NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int zt_report_measure_peak_gflops(const zt_backend *be, double *rates, int n_rates) {
  /* Large enough to reach BLAS's steady state (~25 ms a call on two idle
   * cores); the first call also wakes the thread pool, so it does not
   * count. One timing under load can read far off (the cores taken by
   * other work for part of it, or not): several, for their spread. */
  const int n = 1536;
  size_t bytes = (size_t)n * n * sizeof(float);
  float *a = be->alloc(ZT_MEM_DEVICE, bytes), *b = be->alloc(ZT_MEM_DEVICE, bytes);
  float *c = be->alloc(ZT_MEM_DEVICE, bytes);
  zt_stream *s = be->stream_new();
  int got = 0;
  if (a && b && c && s)
    for (int i = 0; i <= n_rates; i++) {
      double t0 = zt_timer_now();
      be->gemm(s, ZT_F32, ZT_F32, 0, 1, n, n, n, 1, a, n, b, n, 0, c, n);
      be->stream_sync(s);
      double dt = zt_timer_now() - t0;
      if (i > 0 && dt > 0) rates[got++] = 2.0 * n * n * n / dt / 1e9;
    }
  be->free(ZT_MEM_DEVICE, a);
  be->free(ZT_MEM_DEVICE, b);
  be->free(ZT_MEM_DEVICE, c);
  if (s) be->stream_free(s);
  qsort(rates, (size_t)got, sizeof *rates, cmp_double);
  return got;
}

static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

int zt_report_rank_cores(void) {
  int n = zt_cpu_cores() / zt_comm_node_sharing();
  return n > 0 ? n : 1;
}

void zt_report_peak(const zt_backend *be, int measure, zt_peak *pk) {
  memset(pk, 0, sizeof *pk);
  const zt_gemm_path *gp = zt_cpu_gemm_path();
  pk->threads = omp_get_max_threads();
  /* this rank's share: the node's other ranks on the same cores compute too */
  pk->cores = zt_report_rank_cores();
  pk->flops_per_cycle = gp->flops_per_cycle;
  pk->ghz = zt_cpu_clock_ghz(&pk->clock_from);
  /* threads beyond the cores add no FLOPs */
  int used = pk->threads < pk->cores ? pk->threads : pk->cores;
  pk->cpu = used * pk->ghz * pk->flops_per_cycle;
  if (!measure) return;
  double w0 = zt_timer_now(), c0 = cpu_seconds();
  double rates[ZT_PEAK_TIMINGS];
  pk->timings = zt_report_measure_peak_gflops(be, rates, ZT_PEAK_TIMINGS);
  if (pk->timings) {
    pk->slowest = rates[0];
    pk->median = rates[pk->timings / 2];
    pk->measured = rates[pk->timings - 1]; /* the cores reached at least this */
  }
  double wall = zt_timer_now() - w0, cpu = cpu_seconds() - c0;
  pk->cpu_share = wall > 0 ? cpu / (wall * pk->threads) : 0;
  /* A third: wrong kernels or shared cores give a fraction of that (SSE
   * kernels on AVX-512: an eighth), while a part with one FMA unit where
   * two are assumed, or a clock somewhat below the stated one, stays
   * above it. */
  if (pk->cpu <= 0 || pk->measured >= pk->cpu / 3) return;
  char why[400] = "";
  size_t k = 0;
  if (gp->gemm_isa != ZT_ISA_UNKNOWN && gp->gemm_isa < gp->cpu_isa)
    k += (size_t)snprintf(why + k, sizeof why - k, "; the GEMM kernels (%s, %s) are below the CPU's ISA (%s)",
                          gp->onednn ? gp->onednn_lib : gp->core, zt_cpu_isa_name(gp->gemm_isa),
                          zt_cpu_isa_name(gp->cpu_isa));
  if (k < sizeof why && pk->threads > pk->cores)
    k += (size_t)snprintf(why + k, sizeof why - k, "; more threads (%d) than cores (%d)", pk->threads, pk->cores);
  if (k < sizeof why && pk->cpu_share < 0.75)
    k += (size_t)snprintf(why + k, sizeof why - k,
                          "; the cores are busy with other work (the probe's threads got %.0f%% of them)",
                          100 * pk->cpu_share);
  if (!why[0])
    snprintf(why, sizeof why, "; cause not found (a clock below %.2f GHz from power or thermal "
             "limits, or a BLAS slow on this CPU?)", pk->ghz);
  snprintf(pk->warning, sizeof pk->warning, "GEMM runs at %.0f GFLOP/s per rank, %.0f%% of the "
           "CPU's peak %.0f:%s", pk->measured, 100 * pk->measured / pk->cpu, pk->cpu, why + 1);
}

double zt_report_peak_gflops(const zt_peak *pk) {
  return pk->measured > pk->cpu ? pk->measured : pk->cpu;
}

void zt_report_print_gemm(const zt_peak *pk, FILE *out) {
  char desc[256], other[320];
  zt_cpu_gemm_describe(desc, sizeof desc, other, sizeof other);
  fprintf(out, "GEMM: %s", desc);
  if (pk->measured > 0)
    fprintf(out, ", %.0f GFLOP/s per rank measured (best of %d timings; median %.0f, slowest %.0f)",
            pk->measured, pk->timings, pk->median, pk->slowest);
  if (pk->cpu > 0)
    fprintf(out, ", CPU peak %.0f (%d thread%s x %.2f GHz x %d FLOP/cycle of %s; clock: %s)",
            pk->cpu, pk->threads < pk->cores ? pk->threads : pk->cores,
            (pk->threads < pk->cores ? pk->threads : pk->cores) > 1 ? "s" : "", pk->ghz,
            pk->flops_per_cycle, zt_cpu_isa_name(zt_cpu_gemm_path()->cpu_isa), pk->clock_from);
  else
    fprintf(out, ", CPU peak unknown (no clock or ISA found)");
  if (other[0]) fprintf(out, "; %s", other);
  fputc('\n', out);
  fflush(out);
  const zt_gemm_path *gp = zt_cpu_gemm_path();
  for (size_t i = 0; i < sizeof gp->warning / sizeof *gp->warning; i++)
    if (gp->warning[i][0]) fprintf(stderr, "ztrain: warning: %s\n", gp->warning[i]);
  if (pk->warning[0]) fprintf(stderr, "ztrain: warning: %s\n", pk->warning);
  fflush(stderr);
}
