/* ops_bf16.h: what ops_impl.h needs for the bf16 build (bf16 storage,
 * float compute, the f32 build's GEMM), all but FN. ops_bf16.c makes the
 * backend's build from it; a test instantiates ops_impl.h once more under
 * another FN with a smaller GEMM scratch budget, on these same
 * definitions, so it tests the loops that train. */
#ifndef ZT_CPU_OPS_BF16_H
#define ZT_CPU_OPS_BF16_H

#include <stdint.h>

#include "kernels/cpu/gemm_path.h"
#include "src/core/half.h"

#define REAL float
#define STORE uint16_t
#define LD zt_bf16_to_f32
#define ST zt_bf16_from_f32
#define LD_N zt_bf16_to_f32_n
#define ST_N zt_bf16_from_f32_n
#define GEMM zt_cpu_sgemm /* the f32 build's: gemm_path.h */
#define EXP zt_expf
#define TANH zt_tanhf

#endif
