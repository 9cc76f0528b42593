// stand_in/xent: compiled only while kernels/cuda/xent.cu does not exist
// (CMakeLists.txt checks), so that the CUDA backend's table links before
// the cross-entropy kernels (branch cuda-gemm-attn) are merged. Each entry
// reports itself through the sticky error and does nothing; with the real
// file present this one is not built, and can be deleted.
#include "kernels/cuda/cuda_impl.h"

#define ZT_MISSING(fn) zt_cuda_fail(fn, "not in this build (kernels/cuda/xent.cu missing)", \
                                    __FILE__, __LINE__)

extern "C" void zt_cuda_xent_fwd_bwd(zt_stream *, zt_dtype, void *, float *, const int32_t *,
                                     int, int, float) {
  ZT_MISSING("zt_cuda_xent_fwd_bwd");
}
extern "C" void zt_cuda_xent_max(zt_stream *, zt_dtype, float *, const void *, int, int) {
  ZT_MISSING("zt_cuda_xent_max");
}
extern "C" void zt_cuda_xent_sumexp(zt_stream *, zt_dtype, float *, const void *,
                                    const int32_t *, int, int, int) {
  ZT_MISSING("zt_cuda_xent_sumexp");
}
extern "C" void zt_cuda_xent_finish(zt_stream *, zt_dtype, void *, float *, const float *,
                                    const int32_t *, int, int, int, float) {
  ZT_MISSING("zt_cuda_xent_finish");
}
