/* test_comm: the collective interface (parallel/comm.h) over every element
 * type. Run under mpirun -np P, 2 <= P <= 8 (ctest: 2 and 3; exit 77,
 * "skipped", otherwise). Every rank knows every rank's inputs (a
 * function of rank and index), so each computes the expected result
 * locally and compares bit for bit:
 *   - all-reduce (sum, max, min; blocking and not), reduce-scatter (sum,
 *     max, min; blocking, and non-blocking in place; one member with no
 *     part), all-gather (both), broadcast from every root, gather, gatherv,
 *     and a ring of isend/irecv, for f32, f64, i32, i64, u64, bf16, fp16
 *     and u8. Inputs are multiples of 1/8 in [-1, 1] (floats), integers in
 *     [-8, 8] (signed) or [0, 16] (unsigned), so every partial sum is
 *     exact in every type and a 16-bit sum must equal the exact sum
 *     rounded once;
 *   - integer sums wrap (u64 modulo 2^64, u8 modulo 2^8); i64 carries
 *     values past 2^32;
 *   - a NaN on one rank makes a 16-bit sum, max and min NaN;
 *   - 16-bit sums that round (inputs in [1, 2), 2^17 elements, which MPI
 *     reduces in segments): at P = 2, one rounding, bitwise the exact sum
 *     rounded once; at any P within (P-1)u/(1-(P-1)u) of the sum of
 *     magnitudes (u = 2^-8 for bf16, 2^-11 for fp16: one rounding per
 *     addition), and the same bits on every rank;
 *   - after every call, the call, its bytes per operation and per type
 *     against the formulas of comm.h (all-reduce 2n(p-1)/p, reduce-scatter
 *     and all-gather all parts but this rank's, broadcast n, gather and
 *     send what this rank sends, n in bytes of the type), the group's
 *     sequence number (the watchdog's numbering) up by one per collective
 *     and unchanged by transfers; at the end, bytes per type add up to
 *     bytes per operation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "src/core/half.h"
#include "src/core/rng.h"
#include "tests/unit/mpi_check.h"

static int rank, P, failures;

static const zt_dtype all_types[] = {ZT_F32, ZT_F64, ZT_I32, ZT_I64,
                                     ZT_U64, ZT_BF16, ZT_F16, ZT_U8};
#define NTYPES (sizeof all_types / sizeof *all_types)
static const char *const redop_names[] = {"sum", "max", "min"};

static int is_float(zt_dtype t) {
  return t == ZT_F32 || t == ZT_F64 || t == ZT_BF16 || t == ZT_F16;
}
static int is_unsigned(zt_dtype t) { return t == ZT_U64 || t == ZT_U8; }

/* Element i of buf as a double, and the reverse (rounded once for 16 bit;
 * every value the test stores is exact in its type). */
static double get(const void *buf, zt_dtype t, size_t i) {
  switch (t) {
    case ZT_F32: return ((const float *)buf)[i];
    case ZT_F64: return ((const double *)buf)[i];
    case ZT_I32: return ((const int32_t *)buf)[i];
    case ZT_I64: return (double)((const int64_t *)buf)[i];
    case ZT_U64: return (double)((const uint64_t *)buf)[i];
    case ZT_BF16: return zt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case ZT_F16: return zt_f16_to_f32(((const uint16_t *)buf)[i]);
    case ZT_U8: return ((const uint8_t *)buf)[i];
    case ZT_DTYPE_COUNT: break;
  }
  return NAN;
}

static void put(void *buf, zt_dtype t, size_t i, double v) {
  switch (t) {
    case ZT_F32: ((float *)buf)[i] = (float)v; return;
    case ZT_F64: ((double *)buf)[i] = v; return;
    case ZT_I32: ((int32_t *)buf)[i] = (int32_t)v; return;
    case ZT_I64: ((int64_t *)buf)[i] = (int64_t)v; return;
    case ZT_U64: ((uint64_t *)buf)[i] = (uint64_t)v; return;
    case ZT_BF16: ((uint16_t *)buf)[i] = zt_bf16_from_f32((float)v); return;
    case ZT_F16: ((uint16_t *)buf)[i] = zt_f16_from_f32((float)v); return;
    case ZT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; return;
    case ZT_DTYPE_COUNT: break;
  }
}

/* Rank r's element i: small enough that every partial sum is exact. */
static double input(zt_dtype t, int r, size_t i) {
  int v = (int)((7u * (unsigned)r + 3u * (unsigned)i + 5u) % 17u);
  if (is_unsigned(t)) return v;
  return is_float(t) ? (v - 8) / 8.0 : v - 8;
}

static void *fill(zt_dtype t, int r, size_t n) {
  void *b = calloc(n ? n : 1, zt_dtype_size(t));
  for (size_t i = 0; i < n; i++) put(b, t, i, input(t, r, i));
  return b;
}

/* The reduction of element i over all ranks, exact, stored once. */
static double reduced(zt_dtype t, zt_redop op, size_t i) {
  double acc = input(t, 0, i);
  for (int r = 1; r < P; r++) {
    double x = input(t, r, i);
    acc = op == ZT_SUM ? acc + x : op == ZT_MAX ? fmax(acc, x) : fmin(acc, x);
  }
  return acc;
}

/* ---- counters -------------------------------------------------------------- */

typedef struct {
  uint64_t calls[ZT_OP_COUNT], bytes[ZT_OP_COUNT], dtype[ZT_DTYPE_COUNT], seq, p2p;
} snap;

static snap take(const zt_comm *c) {
  snap s;
  memcpy(s.calls, c->calls, sizeof s.calls);
  memcpy(s.bytes, c->bytes, sizeof s.bytes);
  for (int t = 0; t < ZT_DTYPE_COUNT; t++) s.dtype[t] = zt_comm_dtype_bytes(c, (zt_dtype)t);
  s.seq = c->seq;
  s.p2p = c->p2p;
  return s;
}

/* Since `b`: one call of op, `want` bytes on op and on t and nowhere
 * else, the sequence number up by one for a collective, the transfer
 * count for a send or receive. */
static void check_counted(const zt_comm *c, const snap *b, zt_comm_op op, zt_dtype t,
                          double want, const char *what) {
  snap a = take(c);
  uint64_t w = (uint64_t)(want + 0.5);
  int p2p = op == ZT_OP_SEND || op == ZT_OP_RECV;
  CHECK(a.calls[op] - b->calls[op] == 1, "%s: %llu calls counted", what,
        (unsigned long long)(a.calls[op] - b->calls[op]));
  CHECK(a.bytes[op] - b->bytes[op] == w, "%s: %llu bytes counted, formula %llu", what,
        (unsigned long long)(a.bytes[op] - b->bytes[op]), (unsigned long long)w);
  CHECK(a.dtype[t] - b->dtype[t] == w, "%s: %llu bytes counted for %s, formula %llu", what,
        (unsigned long long)(a.dtype[t] - b->dtype[t]), zt_dtype_name(t), (unsigned long long)w);
  uint64_t others = 0;
  for (int k = 0; k < ZT_DTYPE_COUNT; k++) others += k == (int)t ? 0 : a.dtype[k] - b->dtype[k];
  CHECK(others == 0, "%s: %llu bytes counted for other types", what, (unsigned long long)others);
  CHECK(a.seq - b->seq == (uint64_t)!p2p, "%s: sequence number moved by %llu", what,
        (unsigned long long)(a.seq - b->seq));
  CHECK(a.p2p - b->p2p == (uint64_t)p2p, "%s: transfers moved by %llu", what,
        (unsigned long long)(a.p2p - b->p2p));
}

static double ring(size_t bytes) { return 2.0 * (double)bytes * (P - 1) / P; }

/* The first element where got and want differ (bitwise), or -1. */
static long first_diff(const void *got, const void *want, size_t n, zt_dtype t) {
  size_t s = zt_dtype_size(t);
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)got + i * s, (const char *)want + i * s, s)) return (long)i;
  return -1;
}

#define SAME(got, want, n, t, ...)                                                   \
  do {                                                                               \
    long d_ = first_diff(got, want, n, t);                                           \
    char w_[96];                                                                     \
    snprintf(w_, sizeof w_, __VA_ARGS__);                                            \
    CHECK(d_ < 0, "%s: element %ld is %g, want %g", w_, d_, get(got, t, (size_t)d_), \
          get(want, t, (size_t)d_));                                                 \
  } while (0)

/* ---- the operations, one type at a time ----------------------------------- */

static void test_allreduce(zt_comm *c, zt_dtype t) {
  const size_t n = 37;
  void *want = calloc(n, zt_dtype_size(t));
  for (int op = ZT_SUM; op <= ZT_MIN; op++) {
    for (size_t i = 0; i < n; i++) put(want, t, i, reduced(t, (zt_redop)op, i));
    for (int nb = 0; nb < 2; nb++) {
      void *x = fill(t, rank, n);
      snap b = take(c);
      if (nb) {
        zt_req r;
        zt_comm_iallreduce(c, x, n, t, (zt_redop)op, &r);
        zt_comm_wait(&r);
      } else {
        zt_comm_allreduce(c, x, n, t, (zt_redop)op);
      }
      char what[64];
      snprintf(what, sizeof what, "%sallreduce %s %s", nb ? "i" : "", redop_names[op],
               zt_dtype_name(t));
      SAME(x, want, n, t, "%s", what);
      check_counted(c, &b, ZT_OP_ALLREDUCE, t, ring(n * zt_dtype_size(t)), what);
      free(x);
    }
  }
  free(want);
}

/* Parts of reduce-scatter and all-gather: member 1 has none, the others
 * differ in size. */
static void parts(int *counts, int *displs, size_t *total) {
  *total = 0;
  for (int r = 0; r < P; r++) {
    counts[r] = r == 1 ? 0 : 3 + 2 * r;
    displs[r] = (int)*total;
    *total += (size_t)counts[r];
  }
}

static void test_reduce_scatter(zt_comm *c, zt_dtype t) {
  int counts[8], displs[8];
  size_t total, s = zt_dtype_size(t);
  parts(counts, displs, &total);
  size_t mine = (size_t)counts[rank];
  void *want = calloc(mine + 1, s);
  for (int op = ZT_SUM; op <= ZT_MIN; op++) {
    for (size_t i = 0; i < mine; i++) put(want, t, i, reduced(t, (zt_redop)op, displs[rank] + i));
    for (int nb = 0; nb < 2; nb++) {
      void *x = fill(t, rank, total), *out = calloc(mine + 1, s);
      snap b = take(c);
      if (nb) { /* in place: the part lands at the start of x */
        zt_req r;
        zt_comm_ireduce_scatter(c, x, x, counts, t, (zt_redop)op, &r);
        zt_comm_wait(&r);
        memcpy(out, x, mine * s);
      } else {
        zt_comm_reduce_scatter(c, x, out, counts, t, (zt_redop)op);
      }
      char what[64];
      snprintf(what, sizeof what, "%sreduce_scatter %s %s", nb ? "i" : "", redop_names[op],
               zt_dtype_name(t));
      SAME(out, want, mine, t, "%s", what);
      check_counted(c, &b, ZT_OP_REDUCE_SCATTER, t, (double)(total - mine) * s, what);
      free(x);
      free(out);
    }
  }
  free(want);
}

static void test_allgather(zt_comm *c, zt_dtype t) {
  int counts[8], displs[8];
  size_t total, s = zt_dtype_size(t);
  parts(counts, displs, &total);
  void *want = calloc(total, s);
  for (int r = 0; r < P; r++)
    for (int i = 0; i < counts[r]; i++) put(want, t, displs[r] + i, input(t, r, displs[r] + i));
  for (int nb = 0; nb < 2; nb++) {
    void *x = calloc(total, s), *mine = fill(t, rank, total);
    memcpy((char *)x + displs[rank] * s, (char *)mine + displs[rank] * s, counts[rank] * s);
    snap b = take(c);
    if (nb) {
      zt_req r;
      zt_comm_iallgather(c, x, counts, displs, t, &r);
      zt_comm_wait(&r);
    } else {
      zt_comm_allgather(c, x, counts, displs, t);
    }
    char what[64];
    snprintf(what, sizeof what, "%sallgather %s", nb ? "i" : "", zt_dtype_name(t));
    SAME(x, want, total, t, "%s", what);
    check_counted(c, &b, ZT_OP_ALLGATHER, t, (double)(total - counts[rank]) * s, what);
    free(x);
    free(mine);
  }
  free(want);
}

static void test_bcast_gather(zt_comm *c, zt_dtype t) {
  const size_t n = 11;
  size_t s = zt_dtype_size(t);
  for (int root = 0; root < P; root++) {
    void *x = fill(t, rank, n), *want = fill(t, root, n);
    snap b = take(c);
    zt_comm_bcast(c, x, n, t, root);
    char what[64];
    snprintf(what, sizeof what, "bcast %s from %d", zt_dtype_name(t), root);
    SAME(x, want, n, t, "%s", what);
    check_counted(c, &b, ZT_OP_BCAST, t, (double)(n * s), what);
    free(x);
    free(want);
  }
  /* gather n of each to the last member */
  int root = P - 1, counts[8], displs[8];
  size_t total;
  parts(counts, displs, &total);
  void *x = fill(t, rank, total > n ? total : n), *all = calloc(n * P, s), *want = calloc(n * P, s);
  for (int r = 0; r < P; r++)
    for (size_t i = 0; i < n; i++) put(want, t, r * n + i, input(t, r, i));
  snap b = take(c);
  zt_comm_gather(c, x, all, n, t, root);
  char what[64];
  snprintf(what, sizeof what, "gather %s", zt_dtype_name(t));
  if (rank == root) SAME(all, want, n * P, t, "%s", what);
  check_counted(c, &b, ZT_OP_GATHER, t, rank == root ? 0 : (double)(n * s), what);
  /* gatherv of the parts to member 0 */
  void *allv = calloc(total + 1, s), *wantv = calloc(total + 1, s);
  for (int r = 0; r < P; r++)
    for (int i = 0; i < counts[r]; i++) put(wantv, t, displs[r] + i, input(t, r, i));
  b = take(c);
  zt_comm_gatherv(c, x, allv, counts, displs, t, 0);
  snprintf(what, sizeof what, "gatherv %s", zt_dtype_name(t));
  if (rank == 0) SAME(allv, wantv, total, t, "%s", what);
  check_counted(c, &b, ZT_OP_GATHER, t, rank == 0 ? 0 : (double)counts[rank] * s, what);
  free(x);
  free(all);
  free(want);
  free(allv);
  free(wantv);
}

/* Each member sends to the next and receives from the previous. */
static void test_p2p(zt_comm *c, zt_dtype t) {
  const size_t n = 13;
  int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  void *x = fill(t, rank, n), *in = calloc(n, zt_dtype_size(t)), *want = fill(t, prev, n);
  zt_req rs, rr;
  char what[64];
  snap b = take(c);
  zt_comm_irecv(c, in, n, t, prev, 5, &rr);
  snprintf(what, sizeof what, "irecv %s", zt_dtype_name(t));
  check_counted(c, &b, ZT_OP_RECV, t, 0, what);
  b = take(c);
  zt_comm_isend(c, x, n, t, next, 5, &rs);
  snprintf(what, sizeof what, "isend %s", zt_dtype_name(t));
  check_counted(c, &b, ZT_OP_SEND, t, (double)(n * zt_dtype_size(t)), what);
  zt_comm_wait(&rr);
  zt_comm_wait(&rs);
  SAME(in, want, n, t, "isend/irecv %s", zt_dtype_name(t));
  free(x);
  free(in);
  free(want);
}

/* ---- beyond small exact inputs -------------------------------------------- */

static void test_wrap(zt_comm *c) {
  uint64_t u[3], uw[3] = {0};
  uint8_t b[3], bw[3] = {0};
  int64_t l[3], lw[3] = {0};
  for (int i = 0; i < 3; i++) {
    for (int r = 0; r < P; r++) {
      uw[i] += UINT64_MAX - (uint64_t)(3 * r + i); /* wraps in the sum */
      bw[i] = (uint8_t)(bw[i] + 200 + r + i);
      lw[i] += ((int64_t)1 << 40) * (r + 1) - i;
    }
    u[i] = UINT64_MAX - (uint64_t)(3 * rank + i);
    b[i] = (uint8_t)(200 + rank + i);
    l[i] = ((int64_t)1 << 40) * (rank + 1) - i;
  }
  zt_comm_allreduce(c, u, 3, ZT_U64, ZT_SUM);
  zt_comm_allreduce(c, b, 3, ZT_U8, ZT_SUM);
  zt_comm_allreduce(c, l, 3, ZT_I64, ZT_SUM);
  CHECK(!memcmp(u, uw, sizeof u), "u64 sum does not wrap modulo 2^64: %llu, want %llu",
        (unsigned long long)u[0], (unsigned long long)uw[0]);
  CHECK(!memcmp(b, bw, sizeof b), "u8 sum does not wrap modulo 2^8: %u, want %u", b[0], bw[0]);
  CHECK(!memcmp(l, lw, sizeof l), "i64 sum past 2^32: %lld, want %lld", (long long)l[0],
        (long long)lw[0]);
}

static void test_half_nan(zt_comm *c) {
  const zt_dtype ts[2] = {ZT_BF16, ZT_F16};
  for (int k = 0; k < 2; k++)
    for (int op = ZT_SUM; op <= ZT_MIN; op++) {
      uint16_t x[2];
      put(x, ts[k], 0, rank == P - 1 ? NAN : 1.0);
      put(x, ts[k], 1, rank + 1.0);
      zt_comm_allreduce(c, x, 2, ts[k], (zt_redop)op);
      double want1 = op == ZT_SUM ? P * (P + 1) / 2.0 : op == ZT_MAX ? P : 1;
      CHECK(isnan(get(x, ts[k], 0)) && get(x, ts[k], 1) == want1,
            "%s %s with a NaN on one rank: %g, %g", zt_dtype_name(ts[k]), redop_names[op],
            get(x, ts[k], 0), get(x, ts[k], 1));
    }
}

/* 16-bit sums that round: within the bound of one rounding per addition,
 * one correct rounding at P = 2, the same bits everywhere. */
static void test_half_rounding(zt_comm *c) {
  const zt_dtype ts[2] = {ZT_BF16, ZT_F16};
  const double units[2] = {0x1p-8, 0x1p-11};
  const size_t n = (size_t)1 << 17;
  for (int k = 0; k < 2; k++) {
    zt_dtype t = ts[k];
    uint16_t one = t == ZT_BF16 ? 0x3f80 : 0x3c00, mant = t == ZT_BF16 ? 0x7f : 0x3ff;
    uint16_t *x = malloc(n * 2), *all = malloc(n * 2 * P);
    uint64_t key = zt_rng_key(3, zt_dtype_name(t));
    double u = units[k], gamma = (P - 1) * u / (1 - (P - 1) * u), worst = 0;
    long bad = 0, not_once = 0;
    for (size_t i = 0; i < n; i++) {
      uint32_t w[4];
      zt_rng_philox(key, i, w); /* one draw per element, a word per rank */
      x[i] = one | (uint16_t)(w[rank % 4] & mant);
    }
    snap b = take(c);
    zt_comm_allreduce(c, x, n, t, ZT_SUM);
    check_counted(c, &b, ZT_OP_ALLREDUCE, t, ring(n * 2), "allreduce sum with rounding");
    for (size_t i = 0; i < n; i++) {
      uint32_t w[4];
      zt_rng_philox(key, i, w);
      double exact = 0, mag = 0;
      for (int r = 0; r < P; r++) {
        uint16_t h = one | (uint16_t)(w[r % 4] & mant);
        double v = t == ZT_BF16 ? zt_bf16_to_f32(h) : zt_f16_to_f32(h);
        exact += v;
        mag += fabs(v);
      }
      double got = get(x, t, i), err = fabs(got - exact) / mag;
      worst = err > worst ? err : worst;
      bad += err > gamma;
      if (P == 2) {
        float f = (float)exact; /* double rounding is harmless: float has 2p+2 bits */
        uint16_t once = t == ZT_BF16 ? zt_bf16_from_f32(f) : zt_f16_from_f32(f);
        not_once += x[i] != once;
      }
    }
    CHECK(bad == 0, "%s sum with rounding: %ld elements beyond %.3g of the magnitudes (worst %.3g)",
          zt_dtype_name(t), bad, gamma, worst);
    CHECK(not_once == 0, "%s sum of 2 ranks: %ld elements not the exact sum rounded once",
          zt_dtype_name(t), not_once);
    /* the same bits on every rank */
    int counts[8], displs[8];
    for (int r = 0; r < P; r++) {
      counts[r] = (int)n;
      displs[r] = (int)n * r;
    }
    memcpy(all + n * rank, x, n * 2);
    zt_comm_allgather(c, all, counts, displs, t);
    long differ = 0;
    for (int r = 0; r < P; r++) differ += memcmp(all + n * r, x, n * 2) != 0;
    CHECK(differ == 0, "%s sum with rounding: %ld ranks hold other bits", zt_dtype_name(t), differ);
    if (rank == 0)
      printf("  %s sum of %d ranks, %zu elements in [1, 2): worst error %.3g of the magnitudes "
             "(bound %.3g)%s\n",
             zt_dtype_name(t), P, n, worst, gamma,
             P == 2 ? ", each the exact sum rounded once" : "");
    free(x);
    free(all);
  }
}

int main(int argc, char **argv) {
  zt_comm world;
  char why[256] = "";
  /* a hang is reported within a minute instead of at ctest's timeout */
  if (zt_comm_init(&argc, &argv, &world, "world", 60, why) == -2) {
    fprintf(stderr, "test_comm: %s\n", why);
    return 1;
  }
  rank = world.rank;
  P = world.size;
  if (P < 2 || P > 8) {
    if (rank == 0) fprintf(stderr, "test_comm: run with 2 to 8 ranks (got %d): skipped\n", P);
    zt_comm_finalize(&world);
    return 77;
  }
  for (size_t k = 0; k < NTYPES; k++) {
    zt_dtype t = all_types[k];
    int before = failures;
    test_allreduce(&world, t);
    test_reduce_scatter(&world, t);
    test_allgather(&world, t);
    test_bcast_gather(&world, t);
    test_p2p(&world, t);
    if (rank == 0)
      printf("  %-4s allreduce, reduce_scatter (sum, max, min; blocking and not), allgather, "
             "bcast, gather, gatherv, isend/irecv: %s\n",
             zt_dtype_name(t), failures == before ? "exact, bytes as the formulas" : "FAILED");
  }
  test_wrap(&world);
  test_half_nan(&world);
  test_half_rounding(&world);

  uint64_t by_type = 0;
  for (int t = 0; t < ZT_DTYPE_COUNT; t++) by_type += zt_comm_dtype_bytes(&world, (zt_dtype)t);
  CHECK(by_type == zt_comm_total_bytes(&world), "bytes per type add up to %llu, per operation %llu",
        (unsigned long long)by_type, (unsigned long long)zt_comm_total_bytes(&world));

  int32_t total = failures;
  zt_comm_allreduce(&world, &total, 1, ZT_I32, ZT_SUM);
  if (rank == 0) printf("test_comm: %d ranks, %s\n", P, total ? "FAILED" : "passed");
  zt_comm_finalize(&world);
  return total ? 1 : 0;
}
