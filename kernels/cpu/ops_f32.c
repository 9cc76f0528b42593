/* ops_f32: the CPU backend's float instantiation of ops_impl.h. */
#include "kernels/cpu/ops.h"
#define REAL float
#define FN(name) zt_cpu_f32_##name
#define GEMM cblas_sgemm
#define EXP zt_expf
#define TANH zt_tanhf
#include "kernels/cpu/ops_impl.h"
