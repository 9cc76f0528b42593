/* ops_f16: ops_impl.h with activations and compute weights held in IEEE
 * fp16 and every computation in float (mixed precision). */
#include "kernels/cpu/gemm_path.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/f16_simd.h"
#define REAL float
#define STORE uint16_t
#define LD zt_f16_to_f32
#define ST zt_f16_from_f32
#define LD_N zt_f16_to_f32_fast_n
#define ST_N zt_f16_from_f32_fast_n
#define ST_BY_ARRAY /* F16C's; ST is an integer emulation */
#define FN(name) zt_cpu_f16_##name
#define GEMM zt_cpu_sgemm /* the f32 build's: gemm_path.h */
#define EXP zt_expf
#define TANH zt_tanhf
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/attn_impl.h"
