/* memory (plan): see memory.h. */
#include "src/plan/memory.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/mpi_mem.h"
#include "src/train/pipe.h"

static const char *const row_names[ZT_MEM_ROWS] = {
    "params", "masters", "grads", "moments", "tied_copy", "activations", "comm", "mpi",
    "workspace", "other"};
static const char *const place_names[ZT_PLACES] = {"device", "host", "nvme"};

const char *zt_memplan_row_name(zt_mem_row r) { return row_names[r]; }

static double mib(int64_t b) { return (double)b / 1048576.0; }

/* The ZeRO engine's share: its states and buffers, as zt_zero_new sizes them. */
static int zero_rows(const zt_plan *p, const zt_model *m, zt_memplan *o, zt_err *e) {
  int *group = malloc((size_t)m->n_units * sizeof *group);
  if (!group) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  zt_zero_units u;
  zt_zero_cfg zc;
  zt_trainer_zero_of(m, &p->parallel.zero, group, &u, &zc);
  zt_zero_sizes z;
  int rc = zt_zero_plan_bytes(&zc, p->parallel.dp, o->dp_rank, m->numel, &u, &z);
  free(group);
  if (rc) return zt_err_set(e, ZT_ERUNTIME, "out of memory");
  static const zt_mem_row row[ZT_STATE_KINDS] = {ZT_MEM_PARAMS, ZT_MEM_MASTERS, ZT_MEM_GRADS,
                                                 ZT_MEM_MOMENTS, ZT_MEM_MOMENTS};
  for (int k = 0; k < ZT_STATE_KINDS; k++)
    for (int q = 0; q < ZT_PLACES; q++) o->bytes[row[k]][q] += z.placed[k][q];
  if (z.offload_staging) {
    o->bytes[ZT_MEM_WORKSPACE][ZT_PLACE_CPU] += z.offload_staging;
    o->offload_staging = z.offload_staging;
  }
  int st = zc.stage;
  const char *ps = st < 3 ? "whole" : "shard";
  snprintf(o->detail[ZT_MEM_PARAMS], sizeof o->detail[0], "%s, %s, %lld elements",
           zt_dtype_name(zc.param_dtype), ps, (long long)z.elems[ZT_STATE_PARAM]);
  if (z.placed[ZT_STATE_MASTER][ZT_PLACE_DEVICE] + z.placed[ZT_STATE_MASTER][ZT_PLACE_CPU] +
      z.placed[ZT_STATE_MASTER][ZT_PLACE_NVME])
    snprintf(o->detail[ZT_MEM_MASTERS], sizeof o->detail[0], "fp32, %s",
             st == 0 ? "whole" : "shard");
  else
    snprintf(o->detail[ZT_MEM_MASTERS], sizeof o->detail[0], "the params (fp32)");
  snprintf(o->detail[ZT_MEM_GRADS], sizeof o->detail[0], "fp32, %s", st < 2 ? "whole" : "shard");
  snprintf(o->detail[ZT_MEM_MOMENTS], sizeof o->detail[0], "fp32 x 2, %s",
           st == 0 ? "whole" : "shard");
  /* the MPI library's temporaries in the gradients' reduction over dp: the
   * whole buffer at stages 0-1 (16-bit where reduced so), the buckets in
   * flight at 2-3: the two largest with overlap (a bound: whether the
   * second arrives before the first is done is timing), else one */
  int64_t rb = zt_dtype_size(zc.reduce_dtype), mpi = 0;
  int dp = p->parallel.dp;
  if (st == 0) mpi = zt_mpimem_temp(ZT_MPIMEM_ALLREDUCE, m->numel * rb, dp, o->dp_rank);
  else if (st == 1) mpi = zt_mpimem_temp(ZT_MPIMEM_REDUCE_SCATTER, m->numel * rb, dp, o->dp_rank);
  else
    mpi = zt_mpimem_temp(ZT_MPIMEM_IREDUCE_SCATTER, z.bucket_elems * rb, dp, o->dp_rank);
  /* the second bucket's, which the timing may spare: counted, and said */
  int64_t maybe = st >= 2 && zc.overlap ? zt_mpimem_temp(ZT_MPIMEM_IREDUCE_SCATTER,
                                                         z.bucket_next * rb, dp, o->dp_rank) : 0;
  /* a tied copy's gradients, reduce-scattered over the last stage's dp group */
  int64_t tied = m->bytes.tied_copy
                     ? zt_mpimem_temp(ZT_MPIMEM_IREDUCE_SCATTER, m->bytes.tied_numel * 4, dp,
                                      o->dp_rank)
                     : 0;
  int64_t sure = mpi > tied ? mpi : tied, most = mpi + maybe > tied ? mpi + maybe : tied;
  o->bytes[ZT_MEM_MPI][ZT_PLACE_CPU] = most;
  o->timing_bytes = most - sure;
  if (o->bytes[ZT_MEM_MPI][ZT_PLACE_CPU])
    snprintf(o->detail[ZT_MEM_MPI], sizeof o->detail[0], "%s in the gradients' %s over dp%s",
             zt_mpimem_library(), st == 0 ? "all-reduce" : "reduce-scatter",
             o->timing_bytes ? " (with a second bucket in flight: a bound)" : "");
  int64_t comm = z.buckets + z.reduce16 + z.gather + z.param_stage;
  o->bytes[ZT_MEM_COMM][ZT_PLACE_DEVICE] += comm;
  int n = 0;
  char *d = o->detail[ZT_MEM_COMM];
  size_t cap = sizeof o->detail[0];
  if (z.buckets) n += snprintf(d + n, cap - n, "3 gradient buckets of %.1f MiB; ",
                               mib(z.bucket_elems * 4));
  if (z.reduce16) n += snprintf(d + n, cap - n, "16-bit gradients to reduce; ");
  if (z.gather) n += snprintf(d + n, cap - n, "3 gather buffers of %.1f MiB; ",
                              mib(z.gather / 3));
  if (z.param_stage) n += snprintf(d + n, cap - n, "2 staging buffers of %.1f MiB (params off the device); ",
                                   mib(z.param_stage / 2));
  return ZT_OK;
}

int zt_memplan_rank(const zt_plan *p, int rank, int threads, zt_memplan *o, zt_err *e) {
  const zt_parallel_cfg *pc = &p->parallel;
  memset(o, 0, sizeof *o);
  o->rank = rank;
  o->tp_rank = rank % pc->tp;
  o->dp_rank = rank / pc->tp % pc->dp;
  o->pp_rank = rank / (pc->tp * pc->dp);
  o->threads = threads;
  zt_stage_cfg stage = {0};
  int piped = pc->pp > 1, rc = ZT_OK;
  if (piped)
    rc = zt_pipe_stage(&p->pipeline.schedule, p->pipeline.first, p->pipeline.last, o->pp_rank,
                       &stage, e);
  zt_model m = {0};
  /* the CPU backend's sizes: the backend a plan names is not started here */
  if (!rc)
    rc = zt_model_plan(&m, &p->model, zt_backend_cpu(), p->train.micro_batch, pc->tp, o->tp_rank,
                       piped ? &stage : NULL, e);
  for (int c = 0; !rc && c < m.n_chunks; c++) o->slots += m.chunks[c].n_slots;
  zt_pipe_stage_free(&stage);
  if (rc) return rc;
  const zt_model_bytes *b = &m.bytes;
  rc = zero_rows(p, &m, o, e);
  if (!rc) {
    o->bytes[ZT_MEM_TIED][ZT_PLACE_DEVICE] = (int64_t)b->tied;
    if (b->tied) snprintf(o->detail[ZT_MEM_TIED], sizeof o->detail[0], "embed.tokens, fp32 w+g%s",
                          m.dt == ZT_F32 ? "" : " and 16-bit");
    o->bytes[ZT_MEM_ACTS][ZT_PLACE_DEVICE] = (int64_t)(b->acts_slots + b->acts_recompute);
    o->block_kept = (int64_t)b->block_kept;
    o->block_input = (int64_t)b->block_input;
    o->kept_blocks = b->kept_blocks;
    o->recomputed_blocks = b->recomputed_blocks;
    snprintf(o->detail[ZT_MEM_ACTS], sizeof o->detail[0],
             "%d slot%s; %d block x slot kept (%.2f MiB each), %d recomputed (%.2f MiB input)",
             o->slots, o->slots == 1 ? "" : "s", b->kept_blocks, mib((int64_t)b->block_kept),
             b->recomputed_blocks, mib((int64_t)b->block_input));
    if (piped) {
      int64_t pb = zt_pipe_plan_bytes(&m);
      int64_t batch = 2 * (int64_t)m.B * m.cfg.seq * (int64_t)sizeof(int32_t);
      o->bytes[ZT_MEM_COMM][ZT_PLACE_DEVICE] += pb - batch;
      o->bytes[ZT_MEM_OTHER][ZT_PLACE_CPU] += batch;
      size_t n = strlen(o->detail[ZT_MEM_COMM]);
      snprintf(o->detail[ZT_MEM_COMM] + n, sizeof o->detail[0] - n, "pipeline transfers");
    }
    /* the passes call GEMMs from one thread, which keeps its scratch; the
     * ops' own scratch comes and goes inside a call, on every thread */
    const zt_backend *be = m.be;
    int64_t gemm = zt_model_gemm_scratch(&m);
    int64_t ops = be->op_scratch ? (int64_t)be->op_scratch(m.dt, m.cfg.seq, m.hd, m.vocab_local,
                                                           threads) : 0;
    o->bytes[ZT_MEM_WORKSPACE][ZT_PLACE_DEVICE] = (int64_t)b->scratch;
    o->bytes[ZT_MEM_WORKSPACE][ZT_PLACE_CPU] += gemm + ops;
    int dn = snprintf(o->detail[ZT_MEM_WORKSPACE], sizeof o->detail[0],
                      "pass scratch %.2f MiB, GEMM scratch %.2f MiB, ops' scratch %.2f MiB (%d "
                      "thread%s)", mib((int64_t)b->scratch), mib(gemm), mib(ops), threads,
                      threads > 1 ? "s" : "");
    if (o->offload_staging && dn > 0 && (size_t)dn < sizeof o->detail[0])
      snprintf(o->detail[ZT_MEM_WORKSPACE] + dn, sizeof o->detail[0] - (size_t)dn,
               ", offload staging %.2f MiB", mib(o->offload_staging));
    o->bytes[ZT_MEM_OTHER][ZT_PLACE_DEVICE] += zt_trainer_own_bytes(&m, pc->pp, m.B);
    o->bytes[ZT_MEM_OTHER][ZT_PLACE_CPU] += (int64_t)b->host;
  }
  zt_model_free(&m);
  if (rc) return rc;
  for (int r = 0; r < ZT_MEM_ROWS; r++)
    for (int k = 0; k < ZT_PLACES; k++) o->peak[k] += o->bytes[r][k];
  int device_is_host = pc->device != ZT_DEVICE_CUDA;
  o->peak_bytes = o->peak[ZT_PLACE_DEVICE] + (device_is_host ? o->peak[ZT_PLACE_CPU] : 0);
  o->peak_floor_bytes = o->peak_bytes - o->timing_bytes;
  return ZT_OK;
}

int zt_memplan_same(const zt_memplan *a, const zt_memplan *b) {
  return !memcmp(a->bytes, b->bytes, sizeof a->bytes) && a->pp_rank == b->pp_rank &&
         a->slots == b->slots;
}

json_t *zt_memplan_json(const zt_memplan *m) {
  json_t *br = json_object();
  for (int r = 0; r < ZT_MEM_ROWS; r++) {
    json_t *row = json_object();
    int64_t all = 0;
    for (int k = 0; k < ZT_PLACES; k++) {
      json_object_set_new(row, place_names[k], json_integer(m->bytes[r][k]));
      all += m->bytes[r][k];
    }
    json_object_set_new(row, "bytes", json_integer(all));
    json_object_set_new(row, "detail", json_string(m->detail[r]));
    json_object_set_new(br, row_names[r], row);
  }
  json_t *acts = json_pack("{s:I, s:I, s:i, s:i, s:i}", "block_kept_bytes",
                           (json_int_t)m->block_kept, "block_recomputed_bytes",
                           (json_int_t)m->block_input, "kept_blocks", m->kept_blocks,
                           "recomputed_blocks", m->recomputed_blocks, "slots", m->slots);
  json_t *peak = json_object();
  for (int k = 0; k < ZT_PLACES; k++) json_object_set_new(peak, place_names[k], json_integer(m->peak[k]));
  return json_pack("{s:i, s:i, s:i, s:i, s:I, s:I, s:o, s:o, s:o, s:i}", "rank", m->rank,
                   "dp_rank", m->dp_rank, "tp_rank", m->tp_rank, "pp_rank", m->pp_rank,
                   "peak_bytes", (json_int_t)m->peak_bytes, "peak_floor_bytes",
                   (json_int_t)m->peak_floor_bytes, "peak", peak, "breakdown", br, "activations",
                   acts, "threads", m->threads);
}

/* MiB below 10 GiB, else GiB */
static void size_str(int64_t b, char *s, size_t n) {
  if (!b) snprintf(s, n, "-");
  else if (b < (10LL << 30)) snprintf(s, n, "%.1f MiB", mib(b));
  else snprintf(s, n, "%.2f GiB", (double)b / 1073741824.0);
}

void zt_memplan_print(const zt_memplan *m, int last, FILE *f) {
  if (m->rank == last)
    fprintf(f, "rank %d (stage %d, dp rank %d, tp rank %d):\n", m->rank, m->pp_rank, m->dp_rank,
            m->tp_rank);
  else
    fprintf(f, "ranks %d-%d (stage %d; each holds this):\n", m->rank, last, m->pp_rank);
  fprintf(f, "  %-12s %12s %12s %12s  %s\n", "", "device", "host", "nvme", "what");
  for (int r = 0; r < ZT_MEM_ROWS; r++) {
    char c[ZT_PLACES][32];
    for (int k = 0; k < ZT_PLACES; k++) size_str(m->bytes[r][k], c[k], sizeof c[k]);
    fprintf(f, "  %-12s %12s %12s %12s  %s\n", row_names[r], c[0], c[1], c[2], m->detail[r]);
  }
  char c[ZT_PLACES][32], pk[32];
  for (int k = 0; k < ZT_PLACES; k++) size_str(m->peak[k], c[k], sizeof c[k]);
  size_str(m->peak_bytes, pk, sizeof pk);
  fprintf(f, "  %-12s %12s %12s %12s  peak of this process: %s\n", "total", c[0], c[1], c[2], pk);
}

/* What the process holds in host memory, the budget's kind. */
static int64_t host_need(int device_is_host, const zt_memplan *m) {
  return device_is_host ? m->peak[ZT_PLACE_DEVICE] + m->peak[ZT_PLACE_CPU]
                        : m->peak[ZT_PLACE_CPU];
}

int zt_memplan_check(const zt_plan *p, int rank, int threads, int device_is_host, zt_err *e) {
  const zt_mem_budget *b = &p->model.mem;
  if (b->avail <= 0) return ZT_OK;
  zt_memplan m;
  int rc = zt_memplan_rank(p, rank, threads, &m, e);
  /* the budget is host memory: what the process holds there (on a GPU
   * backend the device's memory is the device's business) */
  if (rc || host_need(device_is_host, &m) <= b->avail) return rc;
  const double gib = 1073741824.0;
  char fit[400] = "";
  size_t n = 0;
  zt_plan q = *p; /* the same plan with one thing changed: what would fit */
  for (int mb = p->train.micro_batch - 1; mb >= 1; mb--) {
    zt_memplan t;
    zt_err e2 = {0};
    q.train.micro_batch = mb;
    if (!zt_memplan_rank(&q, rank, threads, &t, &e2) && host_need(device_is_host, &t) <= b->avail) {
      n += (size_t)snprintf(fit + n, sizeof fit - n, "train.micro_batch = %d would fit (%.2f GiB); ",
                            mb, host_need(device_is_host, &t) / gib);
      break;
    }
  }
  q = *p;
  for (int z = p->parallel.zero.stage + 1; p->parallel.dp > 1 && z <= 3; z++) {
    zt_memplan t;
    zt_err e2 = {0};
    q.parallel.zero.stage = z;
    if (!zt_memplan_rank(&q, rank, threads, &t, &e2) && host_need(device_is_host, &t) <= b->avail) {
      n += (size_t)snprintf(fit + n, sizeof fit - n,
                            "parallel.zero = %d would fit (%.2f GiB: the states split over the %d "
                            "data-parallel ranks); ", z, host_need(device_is_host, &t) / gib,
                            p->parallel.dp);
      break;
    }
  }
  snprintf(fit + n, sizeof fit - n, "%s",
           n ? "or more ranks (tp, pp) share the rest"
             : "more ranks (tp, pp, or dp with ZeRO) share the weights and states; "
               "`ztrain plan` shows the breakdown");
  int64_t st = m.bytes[ZT_MEM_PARAMS][0] + m.bytes[ZT_MEM_PARAMS][1] + m.bytes[ZT_MEM_GRADS][0] +
               m.bytes[ZT_MEM_GRADS][1], opt = 0;
  for (int k = 0; k < ZT_PLACES; k++)
    opt += m.bytes[ZT_MEM_MASTERS][k] + m.bytes[ZT_MEM_MOMENTS][k];
  int64_t need = host_need(device_is_host, &m);
  int64_t acts = m.bytes[ZT_MEM_ACTS][0], rest = need - st - opt - acts;
  return zt_err_set(e, ZT_EINPUT,
                    "the model does not fit in memory: it needs %.2f GiB per rank (rank %d: "
                    "weights and gradients %.2f GiB, fp32 masters and AdamW moments %.2f GiB, "
                    "activations for micro_batch %d: %.2f GiB, buffers and workspace %.2f GiB) "
                    "but %.2f GiB is available (%s); %s",
                    need / gib, rank, st / gib, opt / gib, p->train.micro_batch,
                    acts / gib, rest / gib, b->avail / gib, b->source, fit);
}
