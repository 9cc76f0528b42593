// backend_cuda: the CUDA implementation of the kernels.h contract: its
// table, the sticky first failure (zt_cuda_fail), memory of each kind,
// copies, streams and events. The ops are in ops.cu and norms.cu (this
// backend's own kernels), gemm.cu (cuBLASLt), attn.cu and xent.cu.
//
// One device per process: zt_backend_cuda binds it to the calling thread
// (the CUDA runtime's current device is per host thread), and the entries
// that allocate or create (alloc, streams, events) bind it again on any
// other thread that calls them, so nothing lands on device 0 by default.
// Ops need no binding: a kernel launched on a stream of another device
// fails, and that failure is reported like any other.
//
// Copies (cudaMemcpyAsync with cudaMemcpyDefault: unified addressing tells
// device, pinned and pageable memory apart) and what the caller must do,
// per the CUDA runtime's "API synchronization behavior":
//  - device <-> device, device <-> pinned: asynchronous. A pinned source
//    must stay unchanged, and a pinned destination unread, until the
//    stream has passed the copy (stream_sync, or event_sync on an event
//    recorded after it), as the contract says for any host read.
//  - pageable host memory (ZT_MEM_HOST, malloc, a stack variable) to the
//    device: the runtime copies the source into a staging buffer before
//    cudaMemcpyAsync returns ("the function will return once the pageable
//    buffer has been copied to the staging memory"), so the source may be
//    reused or go out of scope as soon as copy returns; the DMA to the
//    device may still be in flight, ordered on the stream as usual.
//  - device to pageable host memory: the call returns once the copy is
//    complete, i.e. it waits for the stream's earlier work (a hidden
//    synchronisation; pinned memory avoids it). The caller still
//    stream_syncs before reading, as the contract says.
//  - host to host: synchronous.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/ops_cuda.cuh"

// ---- the sticky first failure ----

static pthread_mutex_t zt_fail_lock = PTHREAD_MUTEX_INITIALIZER;
static int zt_failed;          // under zt_fail_lock
static char zt_fail_msg[512];  // the first failure, under zt_fail_lock

extern "C" void zt_cuda_fail(const char *what, const char *msg, const char *file, int line) {
  const char *base = file ? strrchr(file, '/') : NULL;
  base = base ? base + 1 : (file ? file : "?");
  pthread_mutex_lock(&zt_fail_lock);
  if (!zt_failed) {
    zt_failed = 1;
    snprintf(zt_fail_msg, sizeof zt_fail_msg, "%s failed (%s:%d): %s", what ? what : "?", base,
             line, msg ? msg : "?");
  }
  pthread_mutex_unlock(&zt_fail_lock);
}

static int cuda_error(char *msg, size_t n) {
  pthread_mutex_lock(&zt_fail_lock);
  int failed = zt_failed;
  if (n) snprintf(msg, n, "%s", failed ? zt_fail_msg : "");
  pthread_mutex_unlock(&zt_fail_lock);
  return failed;
}

// ---- the device ----

static pthread_mutex_t zt_init_lock = PTHREAD_MUTEX_INITIALIZER;
static int zt_device = -1;              // the process's device, once chosen
static thread_local int zt_bound = -1;  // the device this thread last set

// The process's device current on this thread (a thread-local compare when
// it already is).
static void zt_bind(void) {
  if (zt_bound != zt_device && zt_device >= 0) {
    ZT_CUDA_CHECK(cudaSetDevice(zt_device));
    zt_bound = zt_device;
  }
}

extern "C" int zt_backend_cuda_devices(void) {
  int n = 0;
  // Without a driver or device this returns an error: that means "no GPU".
  // The error is cleared so that no later check mistakes it for its own.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// A kernel that does nothing: whether this build has code for the device.
__global__ void zt_probe_kernel(void) {}

// ---- memory ----

static void *cuda_alloc(zt_mem_kind kind, size_t bytes) {
  void *p = NULL;
  size_t b = bytes ? bytes : 1;
  if (kind == ZT_MEM_HOST) return calloc(1, b);
  zt_bind();
  if (kind == ZT_MEM_PINNED) {
    if (cudaHostAlloc(&p, b, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is alloc's NULL, no sticky failure
      return NULL;
    }
    memset(p, 0, b);
    return p;
  }
  if (cudaMalloc(&p, b) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  // cudaMemset is asynchronous to the host and our streams do not wait for
  // the legacy default stream (they are non-blocking): wait for the zeros
  // here, so that no stream can see the buffer before them. Allocation is
  // no hot path.
  ZT_CUDA_CHECK(cudaMemsetAsync(p, 0, b, 0));
  ZT_CUDA_CHECK(cudaStreamSynchronize(0));
  return p;
}

static void cuda_free(zt_mem_kind kind, void *p) {
  if (!p) return;
  if (kind == ZT_MEM_HOST) {
    free(p);
    return;
  }
  zt_bind();
  if (kind == ZT_MEM_PINNED) ZT_CUDA_CHECK(cudaFreeHost(p));
  else ZT_CUDA_CHECK(cudaFree(p));
}

static void cuda_copy(zt_stream *s, void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return;
  ZT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, zt_cuda_stream(s)));
}

// dst is device or pinned memory (what the trainer zeroes: gradients, step
// sums); cudaMemsetAsync refuses plain pageable host memory.
static void cuda_memzero(zt_stream *s, void *dst, size_t bytes) {
  if (!bytes) return;
  ZT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, zt_cuda_stream(s)));
}

// ---- execution ----

static zt_stream *cuda_stream_new(void) {
  zt_stream *s = (zt_stream *)calloc(1, sizeof *s);
  if (!s) return NULL;
  zt_bind();
  // Non-blocking: no implicit ordering with the legacy default stream,
  // which a library may use; streams are ordered by events only.
  if (cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    free(s);
    return NULL;
  }
  return s;
}

static void cuda_stream_free(zt_stream *s) {
  if (!s) return;
  zt_bind();
  ZT_CUDA_CHECK(cudaStreamDestroy(s->s));
  free(s);
}

static void cuda_stream_sync(zt_stream *s) { ZT_CUDA_CHECK(cudaStreamSynchronize(zt_cuda_stream(s))); }

static zt_event *cuda_event_new(void) {
  zt_event *e = (zt_event *)calloc(1, sizeof *e);
  if (!e) return NULL;
  zt_bind();
  // Ordering only: timing would make record and wait heavier.
  if (cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    free(e);
    return NULL;
  }
  return e;
}

static void cuda_event_free(zt_event *e) {
  if (!e) return;
  zt_bind();
  ZT_CUDA_CHECK(cudaEventDestroy(e->e));
  free(e);
}

static void cuda_event_record(zt_event *e, zt_stream *s) {
  ZT_CUDA_CHECK(cudaEventRecord(e->e, zt_cuda_stream(s)));
}

static void cuda_event_wait(zt_stream *s, zt_event *e) {
  ZT_CUDA_CHECK(cudaStreamWaitEvent(zt_cuda_stream(s), e->e, 0));
}

static void cuda_event_sync(zt_event *e) { ZT_CUDA_CHECK(cudaEventSynchronize(e->e)); }

static int cuda_has_dtype(zt_dtype t) { return t == ZT_F32 || t == ZT_BF16 || t == ZT_F16; }

// ---- stream-ordered scratch (ops_cuda.cuh) ----

void *zt_cuda_scratch(cudaStream_t s, size_t bytes, const char *what) {
  void *p = NULL;
  cudaError_t rc = cudaMallocAsync(&p, bytes ? bytes : 1, s);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    zt_cuda_fail(what, cudaGetErrorString(rc), __FILE__, __LINE__);
    return NULL;
  }
  return p;
}

void zt_cuda_scratch_free(cudaStream_t s, void *p) {
  if (p) ZT_CUDA_CHECK(cudaFreeAsync(p, s));
}

// Unified addressing: the runtime knows every pointer's memory type.
static int cuda_is_device(const void *p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); // a plain host pointer on old runtimes: not an error to keep
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static const zt_backend zt_cuda_table = {
    .name = "cuda",
    .host_visible = 0,
    .is_device = cuda_is_device,
    .has_dtype = cuda_has_dtype,
    .error = cuda_error,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .memzero = cuda_memzero,
    .stream_new = cuda_stream_new,
    .stream_free = cuda_stream_free,
    .stream_sync = cuda_stream_sync,
    .event_new = cuda_event_new,
    .event_free = cuda_event_free,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_sync = cuda_event_sync,
    .gemm = zt_cuda_gemm,
    .gemm_scratch = zt_cuda_gemm_scratch,
    /* the kernels allocate no host memory inside a call (device scratch comes
     * from the stream-ordered pool, the planner's workspace row) */
    .op_scratch = NULL,
    .embed_fwd = zt_cuda_embed_fwd,
    .embed_bwd = zt_cuda_embed_bwd,
    .layernorm_fwd = zt_cuda_layernorm_fwd,
    .layernorm_bwd = zt_cuda_layernorm_bwd,
    .rmsnorm_fwd = zt_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = zt_cuda_rmsnorm_bwd,
    .bias_fwd = zt_cuda_bias_fwd,
    .bias_bwd = zt_cuda_bias_bwd,
    .gelu_fwd = zt_cuda_gelu_fwd,
    .gelu_bwd = zt_cuda_gelu_bwd,
    .swiglu_fwd = zt_cuda_swiglu_fwd,
    .swiglu_bwd = zt_cuda_swiglu_bwd,
    .rope_fwd = zt_cuda_rope_fwd,
    .rope_bwd = zt_cuda_rope_bwd,
    .attn_fwd = zt_cuda_attn_fwd,
    .attn_bwd = zt_cuda_attn_bwd,
    .attn_decode = zt_cuda_attn_decode,
    .xent_fwd_bwd = zt_cuda_xent_fwd_bwd,
    .xent_max = zt_cuda_xent_max,
    .xent_sumexp = zt_cuda_xent_sumexp,
    .xent_finish = zt_cuda_xent_finish,
    .add = zt_cuda_add,
    .convert = zt_cuda_convert,
    .sumsq = zt_cuda_sumsq,
    .count_nonfinite = zt_cuda_count_nonfinite,
    .adamw = zt_cuda_adamw,
};

// The reason for a NULL, and the CUDA error cleared (it is no op's failure).
static const zt_backend *zt_refuse(char *msg, size_t n, int device, const char *why,
                                   cudaError_t rc) {
  (void)cudaGetLastError();
  if (n) snprintf(msg, n, "CUDA device %d: %s%s%s", device, why, rc ? ": " : "",
                  rc ? cudaGetErrorString(rc) : "");
  return NULL;
}

extern "C" const zt_backend *zt_backend_cuda(int device, char *msg, size_t n) {
  if (n) msg[0] = 0;
  pthread_mutex_lock(&zt_init_lock);
  const zt_backend *be = NULL;
  cudaError_t rc;
  int count = zt_backend_cuda_devices();
  struct cudaFuncAttributes fa;
  int pools = 0;
  if (zt_device >= 0 && device != zt_device) {
    char why[96];
    snprintf(why, sizeof why, "this process already uses CUDA device %d (one per process)",
             zt_device);
    be = zt_refuse(msg, n, device, why, cudaSuccess);
  } else if (device < 0 || device >= count) {
    char why[64];
    snprintf(why, sizeof why, "no such device (%d visible)", count);
    be = zt_refuse(msg, n, device, why, cudaSuccess);
  } else if ((rc = cudaSetDevice(device)) != cudaSuccess) {
    be = zt_refuse(msg, n, device, "cannot be made current", rc);
  } else if ((rc = cudaFree(0)) != cudaSuccess) {  // creates the context now
    be = zt_refuse(msg, n, device, "no context", rc);
  } else if ((rc = cudaFuncGetAttributes(&fa, zt_probe_kernel)) != cudaSuccess) {
    be = zt_refuse(msg, n, device,
                   "this build has no code for its architecture (CMAKE_CUDA_ARCHITECTURES)", rc);
  } else if ((rc = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device)) !=
                 cudaSuccess ||
             !pools) {
    be = zt_refuse(msg, n, device, "no stream-ordered allocator (cudaMallocAsync)", rc);
  } else {
    if (zt_device < 0) {
      // The ops' scratch comes from the default pool; by default it gives
      // its memory back at every synchronisation and maps it again at the
      // next cudaMallocAsync. Keep up to 256 MiB cached instead.
      cudaMemPool_t pool;
      if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = (uint64_t)256 << 20;
        ZT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
      }
      zt_device = device;
    }
    zt_bound = device;
    be = &zt_cuda_table;
  }
  pthread_mutex_unlock(&zt_init_lock);
  return be;
}
