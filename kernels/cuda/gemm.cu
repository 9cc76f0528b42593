// gemm: the contract's GEMM (kernels/kernels.h) on cuBLASLt. Row-major
// C[m,n] = alpha op(A) op(B) + beta C with row strides lda, ldb, ldc; A and
// B of dtype t, C of dtype tc (t, or fp32 for weight gradients), products
// summed in fp32 (CUBLAS_COMPUTE_32F; TF32 for fp32 operands only after
// zt_cuda_gemm_allow_tf32(1)).
//
// cuBLAS is column-major, and a row-major X[r,c] with row stride ld is the
// column-major X^T[c,r] with the same ld. So C^T = op(B)^T op(A)^T is
// computed: cuBLAS's A is our b (its op = tb), its B is our a (op = ta),
// its m and n are our n and m.
//
// What cuBLASLt needs per shape (descriptors, the heuristic's algorithm)
// is made once and kept in a small table keyed by everything that can
// change the choice, pointer alignment included: the heuristic assumes
// 256-byte aligned pointers unless told otherwise, and model buffers are
// often offset (the k, v columns of qkv). Where cuBLASLt offers no
// algorithm, cublasGemmEx (which takes any alignment) runs instead.
//
// beta = 0 does not read C (cuBLAS's BLAS rule; the test fills C with NaN
// to check it). Each stream gets its own workspace, since two streams'
// GEMMs may run at once. The table and handles are behind one mutex: the
// ops may be called from more than one host thread.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/ops_cuda.cuh"

#define GEMM_WORKSPACE ((size_t)32 << 20) /* NVIDIA's advice for Hopper */
#define GEMM_STREAMS 8                     /* streams with a workspace of their own */
#define GEMM_CACHE 128                     /* shapes remembered, replaced round-robin */

typedef struct gemm_key {
  int t, tc, ta, tb, m, n, k, lda, ldb, ldc;
  int align_a, align_b, align_c; /* bytes, a power of two up to 256 */
  int tf32;
  int has_ws; /* the algorithm may use the stream's workspace */
} gemm_key;

typedef struct gemm_plan {
  gemm_key key;
  int used;
  int lt; /* 1: cuBLASLt with algo; 0: cublasGemmEx */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLAS's A (our b), B (our a), C = D */
  cublasLtMatmulAlgo_t algo;
} gemm_plan;

static pthread_mutex_t gemm_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t gemm_lt;
static cublasHandle_t gemm_blas;
static int gemm_tf32;
static gemm_plan gemm_plans[GEMM_CACHE];
static int gemm_next; /* the slot replaced when the table is full */
static struct {
  cudaStream_t s;
  void *ws;
} gemm_ws[GEMM_STREAMS];

#define GEMM_BLAS_CHECK(call)                                                        \
  do {                                                                               \
    cublasStatus_t st_ = (call);                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                              \
      zt_cuda_fail(#call, cublasGetStatusString(st_), __FILE__, __LINE__);           \
      ok = 0;                                                                        \
    }                                                                                \
  } while (0)

static cudaDataType_t gemm_type(zt_dtype t) {
  return t == ZT_BF16 ? CUDA_R_16BF : t == ZT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static int gemm_align(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int al = 1;
  while (al < 256 && !(a & (uintptr_t)al)) al <<= 1;
  return al;
}

// The stream's workspace (made on first use), or NULL when every slot is
// taken by other streams: cuBLASLt then picks among workspace-free
// algorithms. Caller holds gemm_lock.
static void *gemm_workspace(cudaStream_t s) {
  for (int i = 0; i < GEMM_STREAMS; i++)
    if (gemm_ws[i].ws && gemm_ws[i].s == s) return gemm_ws[i].ws;
  for (int i = 0; i < GEMM_STREAMS; i++)
    if (!gemm_ws[i].ws) {
      void *p = NULL;
      cudaError_t rc = cudaMalloc(&p, GEMM_WORKSPACE);
      if (rc != cudaSuccess) {
        // not fatal: the GEMMs run without a workspace, as on a full table
        (void)cudaGetLastError();
        return NULL;
      }
      gemm_ws[i].s = s, gemm_ws[i].ws = p;
      return p;
    }
  return NULL;
}

static void gemm_plan_free(gemm_plan *p) {
  if (!p->used) return;
  cublasLtMatrixLayoutDestroy(p->la);
  cublasLtMatrixLayoutDestroy(p->lb);
  cublasLtMatrixLayoutDestroy(p->lc);
  cublasLtMatmulDescDestroy(p->desc);
  memset(p, 0, sizeof *p);
}

static cublasComputeType_t gemm_compute(const gemm_key *k) {
  return k->t == ZT_F32 && k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// A plan for key (descriptors and the heuristic's first choice), or NULL
// on a failure already reported. Caller holds gemm_lock.
static gemm_plan *gemm_plan_for(const gemm_key *k) {
  for (int i = 0; i < GEMM_CACHE; i++)
    if (gemm_plans[i].used && !memcmp(&gemm_plans[i].key, k, sizeof *k)) return &gemm_plans[i];
  int ok = 1;
  if (!gemm_lt) GEMM_BLAS_CHECK(cublasLtCreate(&gemm_lt));
  if (!ok) return NULL;
  gemm_plan *p = &gemm_plans[gemm_next];
  gemm_next = (gemm_next + 1) % GEMM_CACHE;
  gemm_plan_free(p);
  cudaDataType_t ta = gemm_type((zt_dtype)k->t), tc = gemm_type((zt_dtype)k->tc);
  cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A = our b */
  cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's B = our a */
  GEMM_BLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, gemm_compute(k), CUDA_R_32F));
  if (!ok) return NULL;
  GEMM_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                 sizeof opa));
  GEMM_BLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                 sizeof opb));
  // column-major shapes as stored: our b is [k,n] row-major (tb = 0), that
  // is [n,k] column-major, or [n,k] row-major (tb = 1) = [k,n] column-major
  GEMM_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, ta, k->tb ? k->k : k->n,
                                             k->tb ? k->n : k->k, k->ldb));
  GEMM_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, ta, k->ta ? k->m : k->k,
                                             k->ta ? k->k : k->m, k->lda));
  GEMM_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, tc, k->n, k->m, k->ldc));
  if (!ok) {
    // a partly made plan: destroy what was made (the handles that are set)
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
    return NULL;
  }
  cublasLtMatmulPreference_t pref;
  GEMM_BLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  if (ok) {
    size_t ws = k->has_ws ? GEMM_WORKSPACE : 0;
    uint32_t al[4] = {(uint32_t)k->align_b, (uint32_t)k->align_a, (uint32_t)k->align_c,
                      (uint32_t)k->align_c};
    GEMM_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    GEMM_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
    GEMM_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
    GEMM_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
    GEMM_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof al[3]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    memset(&res, 0, sizeof res);
    // "not supported" is an answer here (no algorithm), not a failure
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(gemm_lt, p->desc, p->la, p->lb, p->lc,
                                                       p->lc, pref, 1, &res, &found);
    p->lt = ok && st == CUBLAS_STATUS_SUCCESS && found > 0 &&
            res.state == CUBLAS_STATUS_SUCCESS;
    if (p->lt) p->algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  if (!ok) {
    p->used = 1;
    gemm_plan_free(p);
    return NULL;
  }
  p->key = *k;
  p->used = 1;
  return p;
}

// C[m,n] = beta C (k = 0: no products; beta = 0 writes zeros, never reads
// C). Thread mapping: a grid-stride loop, one element at a time, row-major.
template <typename TC>
__global__ void gemm_scale_kernel(TC *c, int m, int n, int ldc, float beta) {
  size_t total = (size_t)m * n;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    TC *p = c + (e / n) * ldc + e % n;
    zt_st(p, beta == 0.f ? 0.f : beta * zt_ld(p));
  }
}

static void gemm_scale(cudaStream_t s, zt_dtype tc, void *c, int m, int n, int ldc,
                       float beta) {
  size_t total = (size_t)m * n, blocks = (total + 255) / 256;
  unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);
  ZT_DISPATCH_AS(tc, "gemm", TC, gemm_scale_kernel<TC><<<grid, 256, 0, s>>>((TC *)c, m, n, ldc, beta));
  ZT_CUDA_LAUNCHED("gemm_scale_kernel");
}

extern "C" void zt_cuda_gemm(zt_stream *s, zt_dtype t, zt_dtype tc, int ta, int tb, int m,
                             int n, int k, float alpha, const void *a, int lda, const void *b,
                             int ldb, float beta, void *c, int ldc) {
  int ok = 1;
  if (m <= 0 || n <= 0) return;
  if (!(t == ZT_F32 || t == ZT_BF16 || t == ZT_F16) || !(tc == t || tc == ZT_F32)) {
    // by number: zt_dtype_name has C linkage that tensor.h does not declare
    // to C++
    char msg[96];
    snprintf(msg, sizeof msg, "dtypes %d x %d -> %d not supported (zt_dtype values)", (int)t,
             (int)t, (int)tc);
    zt_cuda_fail("zt_cuda_gemm", msg, __FILE__, __LINE__);
    return;
  }
  cudaStream_t cs = zt_cuda_stream(s);
  if (k <= 0) {
    gemm_scale(cs, tc, c, m, n, ldc, beta);
    return;
  }
  gemm_key key;
  memset(&key, 0, sizeof key); /* memcmp'd: no stray bytes */
  key.t = t, key.tc = tc, key.ta = !!ta, key.tb = !!tb;
  key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
  key.align_a = gemm_align(a), key.align_b = gemm_align(b), key.align_c = gemm_align(c);
  key.tf32 = gemm_tf32;
  pthread_mutex_lock(&gemm_lock);
  void *ws = gemm_workspace(cs);
  key.has_ws = ws != NULL;
  gemm_plan *p = gemm_plan_for(&key);
  if (p && p->lt) {
    GEMM_BLAS_CHECK(cublasLtMatmul(gemm_lt, p->desc, &alpha, b, p->la, a, p->lb, &beta, c,
                                   p->lc, c, p->lc, &p->algo, ws, ws ? GEMM_WORKSPACE : 0, cs));
  } else if (p) {
    if (!gemm_blas) GEMM_BLAS_CHECK(cublasCreate(&gemm_blas));
    if (ok) GEMM_BLAS_CHECK(cublasSetStream(gemm_blas, cs));
    if (ok && ws) GEMM_BLAS_CHECK(cublasSetWorkspace(gemm_blas, ws, GEMM_WORKSPACE));
    if (ok)
      GEMM_BLAS_CHECK(cublasGemmEx(gemm_blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                                   gemm_type(t), ldb, a, gemm_type(t), lda, &beta, c,
                                   gemm_type(tc), ldc, gemm_compute(&key), CUBLAS_GEMM_DEFAULT));
  }
  pthread_mutex_unlock(&gemm_lock);
  (void)ok;
}

extern "C" void zt_cuda_gemm_allow_tf32(int allow) {
  pthread_mutex_lock(&gemm_lock);
  gemm_tf32 = !!allow;
  pthread_mutex_unlock(&gemm_lock);
}

extern "C" void zt_cuda_gemm_release(void) {
  pthread_mutex_lock(&gemm_lock);
  for (int i = 0; i < GEMM_CACHE; i++) gemm_plan_free(&gemm_plans[i]);
  gemm_next = 0;
  if (gemm_blas) cublasDestroy(gemm_blas);
  if (gemm_lt) cublasLtDestroy(gemm_lt);
  gemm_blas = NULL, gemm_lt = NULL;
  // cudaFree waits for the device: nothing still queued uses a workspace
  for (int i = 0; i < GEMM_STREAMS; i++) {
    if (gemm_ws[i].ws) ZT_CUDA_CHECK(cudaFree(gemm_ws[i].ws));
    gemm_ws[i].ws = NULL, gemm_ws[i].s = 0;
  }
  pthread_mutex_unlock(&gemm_lock);
}

extern "C" size_t zt_cuda_gemm_scratch(zt_dtype t, zt_dtype tc, int m, int n, int k) {
  (void)t, (void)tc, (void)m, (void)n, (void)k;
  return GEMM_WORKSPACE;
}
