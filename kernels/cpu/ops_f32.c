/* ops_f32: the CPU backend's float instantiation of ops_impl.h and
 * attn_impl.h. */
#include "kernels/cpu/gemm_path.h"
#include "kernels/cpu/ops.h"
#define REAL float
#define FN(name) zt_cpu_f32_##name
#define GEMM zt_cpu_sgemm /* oneDNN or OpenBLAS: gemm_path.h */
#define EXP zt_expf
#define TANH zt_tanhf
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/attn_impl.h"
