/* ops_bf16: ops_impl.h with activations and compute weights held in
 * bfloat16 and every computation in float (mixed precision). */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_bf16.h"
#define FN(name) zt_cpu_bf16_##name
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/attn_impl.h"
