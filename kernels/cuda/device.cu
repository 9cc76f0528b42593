// device: what this build can see of CUDA. The CUDA backend (cuBLAS GEMMs,
// NCCL collectives, its own kernels) is a later issue; this file proves the
// toolchain links and tells the CLI how many devices a process could use.
#include <cuda_runtime.h>

extern "C" int zt_backend_cuda_devices(void) {
  int n = 0;
  // Without a driver or device this returns an error: that means "no GPU".
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}
