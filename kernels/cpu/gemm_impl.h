/* gemm_impl: the GEMMs of ops_impl.h (included from it, at this point of
 * it, once per instantiation): on real operands through the includer's
 * GEMM (cblas), and in the 16-bit builds by widening panels of the
 * operands into per-thread scratch within a budget (gemm_plan sizes the
 * blocks; gemm_scratch_bytes reports from the same plan what the scratch
 * will hold). Not a header of its own: it uses ops_impl.h's FN, real,
 * store, LD_N and ST_N. */
#ifndef FN
#error "kernels/cpu/gemm_impl.h is part of ops_impl.h: include that"
#endif
/* GEMM on real operands: attention's tiles, and everything in the builds
 * whose store is real. */
static inline void FN(rgemm)(int ta, int tb, int m, int n, int k, real alpha, const real *a,
                             int lda, const real *b, int ldb, real beta, real *c, int ldc) {
  GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
       alpha, a, lda, b, ldb, beta, c, ldc);
}

#ifndef STORE
void FN(gemm)(int ta, int tb, int m, int n, int k, real alpha, const store *a,
              int lda, const store *b, int ldb, real beta, store *c, int ldc) {
  FN(rgemm)(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* C is real like everything else here: the same call as gemm. */
void FN(gemm_acc)(int ta, int tb, int m, int n, int k, real alpha, const store *a,
                  int lda, const store *b, int ldb, real beta, real *c, int ldc) {
  FN(rgemm)(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* The operands are real already: nothing is widened, nothing kept. */
size_t FN(gemm_scratch_bytes)(int m, int n, int k, int c16) {
  (void)m, (void)n, (void)k, (void)c16;
  return 0;
}

size_t FN(gemm_scratch_held)(void) { return 0; }
#else
/* 16-bit operands into real and back: dst[rows, cols] (dense) from src
 * (row stride ld), and the reverse. par: split the rows over threads (a
 * nested region inside attention's would run on one thread anyway). */
static void FN(widen)(real *dst, const store *src, size_t ld, int rows, int cols, int par) {
#pragma omp parallel for if (par)
  for (int r = 0; r < rows; r++) LD_N(dst + (size_t)r * cols, src + (size_t)r * ld, (size_t)cols);
}

static void FN(narrow)(store *dst, size_t ld, const real *src, int rows, int cols, int par) {
#pragma omp parallel for if (par)
  for (int r = 0; r < rows; r++) ST_N(dst + (size_t)r * ld, src + (size_t)r * cols, (size_t)cols);
}

/* The 16-bit GEMMs' scratch: one buffer per thread, grown as needed and
 * kept between calls (a GPT-2 panel is megabytes, and fresh pages on every
 * call cost their faults every call), freed when its thread ends. */
typedef struct { real *p; size_t n; } FN(scratch_t);
static tss_t FN(scratch_key);
static once_flag FN(scratch_once) = ONCE_FLAG_INIT;

static void FN(scratch_free)(void *s) {
  if (s) free(((FN(scratch_t) *)s)->p);
  free(s);
}

static void FN(scratch_init)(void) {
  if (tss_create(&FN(scratch_key), FN(scratch_free)) != thrd_success) {
    fprintf(stderr, "ztrain: no thread-specific key for the GEMM scratch\n");
    abort();
  }
}

/* What a scratch of n reals takes: the allocation below, so that the
 * figures reported are the bytes allocated. */
static size_t FN(scratch_bytes)(size_t n) { return (n * sizeof(real) + 63) / 64 * 64; }

/* n reals, 64-byte aligned, this thread's. The ops have no error path, and
 * a failure to find that much is no state to train on. */
static real *FN(gemm_scratch)(size_t n) {
  call_once(&FN(scratch_once), FN(scratch_init));
  FN(scratch_t) *s = tss_get(FN(scratch_key));
  if (!s && (!(s = calloc(1, sizeof *s)) || tss_set(FN(scratch_key), s) != thrd_success)) {
    fprintf(stderr, "ztrain: no memory for the GEMM scratch\n");
    abort();
  }
  if (s->n < n) {
    free(s->p);
    size_t bytes = FN(scratch_bytes)(n);
    if (!(s->p = aligned_alloc(64, bytes))) {
      fprintf(stderr, "ztrain: no memory for the GEMM scratch (%zu bytes)\n", bytes);
      abort();
    }
    s->n = n;
  }
  return s->p;
}

/* Scratch budget of one 16-bit GEMM, in reals (128 MiB). Within it, the
 * whole of A, B and (for a 16-bit C) C is widened and one float GEMM does
 * the product: the same call on the same values as the float build's, so
 * the result is its result rounded once, bit for bit. Every GEMM of a
 * GPT-2 124M block at 4 x 1024 rows fits (18M reals at the most, the
 * MLP's). Beyond it (an LM head), the one of A and B that fits in half of
 * it is widened whole once and the other goes in blocks of C's columns or
 * rows; when neither fits (a long k), k goes in blocks, their products
 * summed into C in float (a 16-bit C kept in real scratch until the last,
 * so still rounded once), and C's rows in blocks too if C is too large.
 * Each block's GEMM is a large one (the LM head's are 4096 x 5952 x 768 or
 * so), but the BLAS may group a block's sums otherwise than the whole's
 * (oneDNN does), so the last bits may differ from the float build's. */
#ifndef GEMM16_SCRATCH
#define GEMM16_SCRATCH ((size_t)32 << 20)
#endif
#ifndef GEMM16_PAR
#define GEMM16_PAR 16384 /* elements from which conversions use every thread */
/* How many of `whole` rows (or columns) of `per` reals fit in `budget`:
 * all, or a multiple of 64, at least 64. */
static inline int zt_gemm16_block(size_t budget, size_t per, int whole) {
  size_t b = budget / (per ? per : 1);
  return b >= (size_t)whole ? whole : b < 64 ? 64 : (int)(b / 64 * 64);
}
#endif

/* How gemm_wide cuts an m x n x k GEMM (c16: C is 16-bit) to fit the
 * budget: C's rows in blocks of *mb, its columns in blocks of *nb, k in
 * blocks of *kb. Returns the reals of scratch that takes; the GEMM
 * allocates from it and FN(gemm_scratch_bytes) reports from it, so the
 * figure a run reports is what its GEMMs hold. */
static size_t FN(gemm_plan)(int m, int n, int k, int c16, int *mbp, int *nbp, int *kbp) {
  size_t S = GEMM16_SCRATCH, K = (size_t)(k > 0 ? k : 0), M = (size_t)m, Nn = (size_t)n;
  size_t cc = c16 ? 1 : 0; /* a 16-bit C needs real scratch */
  int mb = m, nb = n, kb = k > 0 ? k : 1;
  if (K * Nn + M * K + cc * M * Nn <= S) {
  } else if (M * K <= S / 2) { /* A whole, C's columns in blocks */
    nb = zt_gemm16_block(S - M * K, K + cc * M, n);
  } else if (K * Nn <= S / 2) { /* B whole, C's rows in blocks */
    mb = zt_gemm16_block(S - K * Nn, K + cc * Nn, m);
  } else { /* k in blocks, and C's rows when C is large */
    if (cc * M * Nn > S / 2) mb = zt_gemm16_block(S / 2, Nn, m);
    kb = zt_gemm16_block(S - cc * (size_t)mb * Nn, (size_t)mb + Nn, k);
  }
  *mbp = mb, *nbp = nb, *kbp = kb;
  return (size_t)mb * kb + (size_t)kb * nb + cc * (size_t)mb * nb;
}

/* The scratch stays with the thread, grown to the largest GEMM it has run,
 * so what a thread holds is the largest of these over its GEMMs. */
size_t FN(gemm_scratch_bytes)(int m, int n, int k, int c16) {
  int mb, nb, kb;
  return m <= 0 || n <= 0 ? 0 : FN(scratch_bytes)(FN(gemm_plan)(m, n, k, c16, &mb, &nb, &kb));
}

size_t FN(gemm_scratch_held)(void) {
  call_once(&FN(scratch_once), FN(scratch_init));
  FN(scratch_t) *s = tss_get(FN(scratch_key));
  return s && s->p ? FN(scratch_bytes)(s->n) : 0;
}

/* C = alpha op(A) op(B) + beta C on 16-bit A and B, into a 16-bit c16 or a
 * real c32: A and B are widened (exactly) into scratch, the real GEMM
 * multiplies them (a product of 16-bit values is exact in float, and the
 * sums are float's: a GPU's 16-bit GEMM with float accumulation), and a
 * 16-bit C is rounded once at the end (widened first when beta != 0). */
static void FN(gemm_wide)(int ta, int tb, int m, int n, int k, real alpha, const store *a,
                          int lda, const store *b, int ldb, real beta, store *c16, real *c32,
                          int ldc) {
  if (m <= 0 || n <= 0) return;
  int mb, nb, kb;
  real *A = FN(gemm_scratch)(FN(gemm_plan)(m, n, k, c16 != NULL, &mb, &nb, &kb));
  real *B = A + (size_t)mb * kb, *C = B + (size_t)kb * nb;
  int a_i = -1, a_p = -1, b_p = -1, b_j = -1; /* the blocks in scratch */
  for (int j0 = 0; j0 < n; j0 += nb) {
    int nj = n - j0 < nb ? n - j0 : nb;
    for (int i0 = 0; i0 < m; i0 += mb) {
      int mi = m - i0 < mb ? m - i0 : mb;
      size_t c0 = (size_t)i0 * ldc + j0;
      real *Cb = c16 ? C : c32 + c0;
      int ldcw = c16 ? nj : ldc, par = (size_t)mi * nj >= GEMM16_PAR;
      /* k = 0 too: oneDNN then leaves C as it was where OpenBLAS scales
       * it by beta; whatever the float GEMM does to C, it does here */
      if (c16 && (beta != 0 || k <= 0)) FN(widen)(C, c16 + c0, (size_t)ldc, mi, nj, par);
      for (int p0 = 0; p0 == 0 || p0 < k; p0 += kb) {
        int kp = k - p0 < kb ? k - p0 : kb;
        kp = kp > 0 ? kp : 0;
        /* op(A)[mi, kp]: stored [k, m] when transposed, else [m, k] */
        if (a_i != i0 || a_p != p0) {
          par = (size_t)mi * kp >= GEMM16_PAR;
          if (ta) FN(widen)(A, a + (size_t)p0 * lda + i0, (size_t)lda, kp, mi, par);
          else FN(widen)(A, a + (size_t)i0 * lda + p0, (size_t)lda, mi, kp, par);
          a_i = i0, a_p = p0;
        }
        /* op(B)[kp, nj]: stored [n, k] when transposed, else [k, n] */
        if (b_p != p0 || b_j != j0) {
          par = (size_t)kp * nj >= GEMM16_PAR;
          if (tb) FN(widen)(B, b + (size_t)j0 * ldb + p0, (size_t)ldb, nj, kp, par);
          else FN(widen)(B, b + (size_t)p0 * ldb + j0, (size_t)ldb, kp, nj, par);
          b_p = p0, b_j = j0;
        }
        int ldaw = ta ? mi : (kp > 1 ? kp : 1), ldbw = tb ? (kp > 1 ? kp : 1) : nj;
        FN(rgemm)(ta, tb, mi, nj, kp, alpha, A, ldaw, B, ldbw, p0 ? 1 : beta, Cb, ldcw);
      }
      if (c16) FN(narrow)(c16 + c0, (size_t)ldc, C, mi, nj, (size_t)mi * nj >= GEMM16_PAR);
    }
  }
}

void FN(gemm)(int ta, int tb, int m, int n, int k, real alpha, const store *a, int lda,
              const store *b, int ldb, real beta, store *c, int ldc) {
  FN(gemm_wide)(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, NULL, ldc);
}

/* The weight gradient: 16-bit operands, accumulated into a real C. */
void FN(gemm_acc)(int ta, int tb, int m, int n, int k, real alpha, const store *a, int lda,
                  const store *b, int ldb, real beta, real *c, int ldc) {
  FN(gemm_wide)(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, NULL, c, ldc);
}
#endif
