/* test_tp: tensor parallelism reproduces the single process. Run under
 * mpirun -np P with P = 2, 3 or 4 (exit 77, "skipped", for other sizes).
 * Every rank builds each model twice from the same seed: at tp = P over
 * MPI_COMM_WORLD, and whole (tp comm NULL). Then:
 *   - after init, each rank's piece is bit-identical to the logical
 *     elements of the whole model it maps to (topology-free init);
 *   - two micro-batches of forward + backward (gradients accumulate): the
 *     losses agree to 1e-6 relative and are the same on every rank;
 *   - each parameter's gradient piece, mapped to logical indices with
 *     zt_shard_runs, agrees with the whole model's gradient to 1e-5
 *     relative L2 per tensor (pieces summed over the ranks);
 *   - tensors that are whole on every rank (norms, positions, row-parallel
 *     biases) get bit-identical gradients on all ranks, so they need no
 *     reduction over tp.
 * Models: gpt tied, gpt untied, llama with kv_heads = P (GQA) and with
 * kv_heads = heads = 2P (MHA); head dim 8, 2 layers, seq 16, vocab 96. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "src/core/rng.h"
#include "src/model/model.h"

#define LOSS_TOL 1e-6
#define GRAD_TOL 1e-5
#define B 2
#define T 16

static int rank, failures;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "rank %d: FAIL: ", rank);            \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
    }                                                      \
  } while (0)

/* Host copy of a device buffer. */
static float *fetch(const zt_model *m, const float *dev, int64_t n) {
  float *h = malloc((size_t)n * sizeof *h);
  if (!h) abort();
  m->be->download(h, dev, (size_t)n * sizeof *h);
  return h;
}

/* Sums of squared differences between a piece and its logical elements of
 * the whole tensor, and of squares of the latter. */
typedef struct { const float *piece, *whole; double d2, r2; int exact; } cmp_ctx;
static void cmp_run(void *p, int64_t local, int64_t global, int64_t n) {
  cmp_ctx *c = p;
  for (int64_t i = 0; i < n; i++) {
    double a = c->piece[local + i], b = c->whole[global + i];
    c->d2 += (a - b) * (a - b);
    c->r2 += b * b;
    c->exact &= c->piece[local + i] == c->whole[global + i];
  }
}

/* Every rank's whole-tensor piece against rank 0's, bit for bit. */
static int same_on_all_ranks(const float *x, int64_t n) {
  float *r0 = malloc((size_t)n * sizeof *r0);
  if (!r0) abort();
  memcpy(r0, x, (size_t)n * sizeof *r0);
  MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = !memcmp(r0, x, (size_t)n * sizeof *r0), all;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  free(r0);
  return all;
}

static void run_case(const char *label, const zt_model_cfg *cfg, zt_comm *tp) {
  const zt_backend *be = zt_backend_cpu();
  zt_model whole, part;
  zt_err e;
  int rc = zt_model_init(&whole, cfg, be, B, NULL, &e);
  if (!rc) rc = zt_model_init(&part, cfg, be, B, tp, &e);
  CHECK(!rc, "%s: init: %s", label, e.msg);
  if (rc) return;
  zt_model_init_weights(&whole, 1234);
  zt_model_init_weights(&part, 1234);

  /* weights: each piece is exactly its logical elements */
  float *ww = fetch(&whole, whole.w, whole.numel), *pw = fetch(&part, part.w, part.numel);
  int bad_init = 0;
  for (int i = 0; i < part.n_params; i++) {
    const zt_tensor_desc *t = &part.params[i].t;
    cmp_ctx c = {pw + t->offset, ww + whole.params[i].t.offset, 0, 0, 1};
    zt_shard_runs(t, &c, cmp_run);
    CHECK(c.exact, "%s: %s after init differs from the tp = 1 model", label, t->name);
    bad_init += !c.exact;
  }

  /* two micro-batches, gradients accumulating; tokens from every shard */
  int N = B * cfg->seq;
  int32_t *tok = malloc(2 * (size_t)N * sizeof *tok), *tgt = tok + N;
  double worst_loss = 0;
  for (int mb = 0; mb < 2; mb++) {
    uint64_t key = zt_rng_key(99 + (uint64_t)mb, "tokens");
    for (int n = 0; n < 2 * N; n++) tok[n] = (int32_t)zt_rng_below(key, (uint64_t)n, (uint64_t)cfg->vocab);
    double lw = zt_model_step(&whole, tok, tgt, 1, 1.0f / N);
    double lp = zt_model_step(&part, tok, tgt, 1, 1.0f / N);
    double rel = fabs(lp - lw) / fabs(lw), lmin, lmax;
    worst_loss = fmax(worst_loss, rel);
    CHECK(rel <= LOSS_TOL, "%s: micro-batch %d loss %.9g vs tp = 1 %.9g (rel %.2e)", label,
          mb, lp, lw, rel);
    MPI_Allreduce(&lp, &lmin, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&lp, &lmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lmin == lmax, "%s: loss differs across TP ranks (%.9g..%.9g)", label, lmin, lmax);
  }

  /* gradients, tensor by tensor */
  float *wg = fetch(&whole, whole.g, whole.numel), *pg = fetch(&part, part.g, part.numel);
  double worst = 0;
  const char *worst_name = "";
  int n_whole = 0, whole_same = 1;
  for (int i = 0; i < part.n_params; i++) {
    const zt_tensor_desc *t = &part.params[i].t;
    cmp_ctx c = {pg + t->offset, wg + whole.params[i].t.offset, 0, 0, 1};
    zt_shard_runs(t, &c, cmp_run);
    double s[2] = {c.d2, c.r2};
    MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double rel = s[1] > 0 ? sqrt(s[0] / s[1]) : sqrt(s[0]);
    CHECK(rel <= GRAD_TOL, "%s: gradient of %s rel L2 %.2e", label, t->name, rel);
    if (rel > worst) worst = rel, worst_name = t->name;
    if (t->shard.dim < 0) {
      int same = same_on_all_ranks(pg + t->offset, t->numel);
      CHECK(same, "%s: gradient of whole tensor %s differs across TP ranks", label, t->name);
      whole_same &= same;
      n_whole++;
    }
  }
  if (rank == 0)
    printf("  %-14s tp=%d: weights %s; loss rel %.1e; worst grad rel L2 %.1e (%s); "
           "%d whole tensors' grads %s on all ranks\n",
           label, part.tp_size, bad_init ? "DIFFER" : "bit-identical", worst_loss, worst,
           worst_name, n_whole, whole_same ? "identical" : "DIFFER");
  free(ww); free(pw); free(wg); free(pg); free(tok);
  zt_model_free(&whole);
  zt_model_free(&part);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (P < 2 || P > 4) {
    if (rank == 0) fprintf(stderr, "test_tp: run with 2, 3 or 4 ranks (got %d): skipped\n", P);
    MPI_Finalize();
    return 77;
  }
  zt_comm tp;
  zt_comm_wrap(&tp, "tp", MPI_COMM_WORLD, 0);

  /* head dim 8: dim 16P, 2P heads, every cut divisible by P */
  zt_model_cfg gpt = {.arch = ZT_ARCH_GPT, .vocab = 96, .seq = T, .dim = 16 * P,
                      .layers = 2, .heads = 2 * P, .kv_heads = 2 * P,
                      .ffn_dim = 64 * P, .norm_eps = 1e-5f, .tied = 1};
  zt_model_cfg untied = gpt;
  untied.tied = 0;
  zt_model_cfg llama = {.arch = ZT_ARCH_LLAMA, .vocab = 96, .seq = T, .dim = 16 * P,
                        .layers = 2, .heads = 2 * P, .kv_heads = P, .ffn_dim = 40 * P,
                        .norm_eps = 1e-5f, .rope_theta = 10000};
  zt_model_cfg mha = llama;
  mha.kv_heads = 2 * P;
  run_case("gpt tied", &gpt, &tp);
  run_case("gpt untied", &untied, &tp);
  run_case("llama gqa", &llama, &tp);
  run_case("llama mha", &mha, &tp);

  /* the group ran collectives: bytes were counted on it */
  CHECK(tp.calls[ZT_OP_ALLREDUCE] > 0, "no all-reduce was counted on the tp group");

  int total;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("test_tp: %d ranks, %s\n", P, total ? "FAILED" : "passed");
  MPI_Finalize();
  return total ? 1 : 0;
}
