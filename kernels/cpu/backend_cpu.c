/* backend_cpu: the CPU implementation of the kernels.h table. Memory is
 * plain host memory, 64-byte aligned for the vector loops. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "kernels/kernels.h"

static void *cpu_alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (p) memset(p, 0, rounded);
  return p;
}

static void cpu_copy_bytes(void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
}

static void cpu_zero(float *x, size_t n) { memset(x, 0, n * sizeof *x); }

static void cpu_copy(float *dst, const float *src, size_t n) {
  memcpy(dst, src, n * sizeof *dst);
}

static const zt_backend cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = free,
    .upload = cpu_copy_bytes,
    .download = cpu_copy_bytes,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .gemm = zt_cpu_f32_gemm,
    .embed_fwd = zt_cpu_f32_embed_fwd,
    .embed_bwd = zt_cpu_f32_embed_bwd,
    .layernorm_fwd = zt_cpu_f32_layernorm_fwd,
    .layernorm_bwd = zt_cpu_f32_layernorm_bwd,
    .rmsnorm_fwd = zt_cpu_f32_rmsnorm_fwd,
    .rmsnorm_bwd = zt_cpu_f32_rmsnorm_bwd,
    .bias_fwd = zt_cpu_f32_bias_fwd,
    .bias_bwd = zt_cpu_f32_bias_bwd,
    .gelu_fwd = zt_cpu_f32_gelu_fwd,
    .gelu_bwd = zt_cpu_f32_gelu_bwd,
    .swiglu_fwd = zt_cpu_f32_swiglu_fwd,
    .swiglu_bwd = zt_cpu_f32_swiglu_bwd,
    .rope_fwd = zt_cpu_f32_rope_fwd,
    .rope_bwd = zt_cpu_f32_rope_bwd,
    .attn_fwd = zt_cpu_f32_attn_fwd,
    .attn_bwd = zt_cpu_f32_attn_bwd,
    .xent_fwd_bwd = zt_cpu_f32_xent_fwd_bwd,
    .xent_max = zt_cpu_f32_xent_max,
    .xent_sumexp = zt_cpu_f32_xent_sumexp,
    .xent_finish = zt_cpu_f32_xent_finish,
    .add = zt_cpu_f32_add,
    .scale = zt_cpu_f32_scale,
    .sumsq = zt_cpu_f32_sumsq,
    .adamw = zt_cpu_f32_adamw,
};

const zt_backend *zt_backend_cpu(void) { return &cpu; }

#ifndef ZT_HAVE_CUDA
int zt_backend_cuda_devices(void) { return 0; }
#endif
