// stand_in/gemm: compiled only while kernels/cuda/gemm.cu does not exist
// (CMakeLists.txt checks), so that the CUDA backend's table links before
// the cuBLASLt GEMMs (branch cuda-gemm-attn) are merged. Each entry
// reports itself through the sticky error and does nothing; with the real
// file present this one is not built, and can be deleted.
#include "kernels/cuda/cuda_impl.h"

#define ZT_MISSING(fn) zt_cuda_fail(fn, "not in this build (kernels/cuda/gemm.cu missing)", \
                                    __FILE__, __LINE__)

extern "C" void zt_cuda_gemm(zt_stream *, zt_dtype, zt_dtype, int, int, int, int, int, float,
                             const void *, int, const void *, int, float, void *, int) {
  ZT_MISSING("zt_cuda_gemm");
}
extern "C" void zt_cuda_gemm_allow_tf32(int) {}
extern "C" void zt_cuda_gemm_release(void) {}
