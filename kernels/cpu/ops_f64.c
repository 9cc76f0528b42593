/* ops_f64: double instantiation of ops_impl.h and attn_impl.h, for
 * gradient checks. */
#include "kernels/cpu/ops.h"
#define REAL double
#define FN(name) zt_cpu_f64_##name
#define GEMM cblas_dgemm
#define EXP exp
#define TANH tanh
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/attn_impl.h"
